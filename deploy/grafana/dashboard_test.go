// Package grafana_test checks the shipped Grafana dashboard's JSON
// without a Grafana: its panel ids are unique and no two panels overlap.
// internal/app's TestPerClientObservability runs every query of the
// dashboard against a real Prometheus.
package grafana_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// panel is the part of a dashboard panel this test reads; a collapsed
// row holds its panels inside it.
type panel struct {
	ID      int     `json:"id"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	GridPos struct {
		X, Y, W, H int
	} `json:"gridPos"`
}

// readDashboard reads the shipped dashboard's panels.
func readDashboard(t *testing.T) []panel {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("dashboards", "sluice.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	return dash.Panels
}

// Tests that no two panels of one level (the dashboard, or one collapsed
// row) share a cell of Grafana's 24-column grid. Grafana pushes one of
// two overlapping panels down when it loads them, so the sections an
// operator sees are not the ones the file lays out: a panel lands under
// another section's heading.
func TestDashboardPanelsDoNotOverlap(t *testing.T) {
	var check func([]panel)
	check = func(panels []panel) {
		for i, a := range panels {
			ga := a.GridPos
			if ga.W == 0 || ga.H == 0 || ga.X+ga.W > 24 {
				t.Errorf("panel %q has gridPos %+v; want a width and height, within 24 columns", a.Title, ga)
			}
			for _, b := range panels[i+1:] {
				gb := b.GridPos
				if ga.X < gb.X+gb.W && gb.X < ga.X+ga.W && ga.Y < gb.Y+gb.H && gb.Y < ga.Y+ga.H {
					t.Errorf("panel %q (%+v) overlaps panel %q (%+v)", a.Title, ga, b.Title, gb)
				}
			}
			check(a.Panels)
		}
	}
	panels := readDashboard(t)
	check(panels)
	if len(panels) < 30 {
		t.Errorf("only %d panels; the dashboard lost its panels", len(panels))
	}
}

// Tests that every panel of the dashboard, rows and the panels inside
// collapsed rows included, has an id of its own: Grafana addresses
// panels by id (links to one panel, the panel editor, library panels),
// so two panels with one id are one panel to it.
func TestDashboardPanelIDsAreUnique(t *testing.T) {
	first := map[int]string{}
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			if p.ID == 0 {
				t.Errorf("panel %q has no id", p.Title)
			} else if title, dup := first[p.ID]; dup {
				t.Errorf("panel id %d is used twice: by %q and by %q; give one of them an id no other panel has", p.ID, title, p.Title)
			} else {
				first[p.ID] = p.Title
			}
			walk(p.Panels)
		}
	}
	walk(readDashboard(t))
	if len(first) < 30 {
		t.Errorf("only %d panels with an id; the dashboard lost its panels", len(first))
	}
}

// unitPanel is the part of a panel TestDashboardUnitsMatchQueries reads.
type unitPanel struct {
	Title       string      `json:"title"`
	Panels      []unitPanel `json:"panels"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options any    `json:"options"`
			} `json:"matcher"`
			Properties []struct {
				ID    string `json:"id"`
				Value any    `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// metricName finds the metric names a query reads.
var metricName = regexp.MustCompile(`\b([a-z_][a-z0-9_]*)\s*(\{|\[|\)|$)`)

// queryUnit is the Grafana unit of what a query returns, when it can
// tell: a quantile of a _seconds histogram, or gauges read as they are
// (no rate) whose names all end in _seconds or _bytes. "" otherwise.
func queryUnit(expr string) string {
	if m := regexp.MustCompile(`histogram_quantile\([^,]+,.*?([a-z_]+)_bucket`).FindStringSubmatch(expr); m != nil {
		if strings.HasSuffix(m[1], "_seconds") {
			return "s"
		}
		return ""
	}
	if strings.Contains(expr, "rate(") || strings.Contains(expr, "increase(") || strings.Contains(expr, "/") {
		return ""
	}
	unit := ""
	for _, m := range metricName.FindAllStringSubmatch(expr, -1) {
		var u string
		switch name := m[1]; {
		case strings.HasSuffix(name, "_seconds"):
			u = "s"
		case strings.HasSuffix(name, "_bytes"):
			u = "bytes"
		default:
			continue
		}
		if unit != "" && unit != u {
			return ""
		}
		unit = u
	}
	return unit
}

// Tests that every query of a panel is drawn in its own unit: a query of
// seconds in a panel of bytes (or the reverse) without an override for
// its refId puts a GC pause of 5 ms on a bytes axis, as "0.005 B" beside
// hundreds of MiB of heap, where no pause can ever be seen.
func TestDashboardUnitsMatchQueries(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("dashboards", "sluice.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []unitPanel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	checked := 0
	var walk func([]unitPanel)
	walk = func(panels []unitPanel) {
		for _, p := range panels {
			for _, target := range p.Targets {
				want := queryUnit(target.Expr)
				if want == "" {
					continue
				}
				got := p.FieldConfig.Defaults.Unit
				for _, o := range p.FieldConfig.Overrides {
					if o.Matcher.ID != "byFrameRefID" || o.Matcher.Options != target.RefID {
						continue
					}
					for _, prop := range o.Properties {
						if u, ok := prop.Value.(string); ok && prop.ID == "unit" {
							got = u
						}
					}
				}
				if (got == "s" || got == "bytes") && got != want {
					t.Errorf("panel %q: query %s (%s) returns %s but is drawn in %s; give it an override of its own unit", p.Title, target.RefID, target.Expr, want, got)
				}
				checked++
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	if checked < 10 {
		t.Errorf("only %d queries with a known unit; the test no longer reads the dashboard", checked)
	}
}
