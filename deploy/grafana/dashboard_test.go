// Package grafana_test checks the shipped Grafana dashboard's JSON
// without a Grafana: its panel ids are unique and no two panels overlap.
// internal/app's TestPerClientObservability runs every query of the
// dashboard against a real Prometheus.
package grafana_test

import (
	"encoding/json"
	"os"
	"path/filepath"
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
