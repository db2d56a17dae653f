// Package grafana_test checks the shipped Grafana dashboard's JSON
// without a Grafana: its panel ids are unique. internal/app's
// TestPerClientObservability runs every query of the dashboard against a
// real Prometheus.
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
	ID     int     `json:"id"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

// Tests that every panel of the dashboard, rows and the panels inside
// collapsed rows included, has an id of its own: Grafana addresses
// panels by id (links to one panel, the panel editor, library panels),
// so two panels with one id are one panel to it.
func TestDashboardPanelIDsAreUnique(t *testing.T) {
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
	walk(dash.Panels)
	if len(first) < 30 {
		t.Errorf("only %d panels with an id; the dashboard lost its panels", len(first))
	}
}
