package main

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
)

// Tests --rate: an exact name and a prefix pattern set those clients'
// rates (replacing steps) and leave the others alone; a malformed value or
// a pattern that matches no client is an error naming it.
func TestSetRates(t *testing.T) {
	clients := func() []scenario.Client {
		return []scenario.Client{
			{Name: "feed", Rate: 120},
			{Name: "heavy-1", Rate: 10},
			{Name: "heavy-2", Steps: []scenario.Step{{Rate: 5}}},
			{Name: "indexer", Rate: 2},
		}
	}
	cs := clients()
	if err := setRates(cs, "heavy-*=2.5, indexer=0.5"); err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{120, 2.5, 2.5, 0.5} {
		if cs[i].Rate != want || cs[i].Steps != nil {
			t.Errorf("%s: rate %v steps %v, want rate %v and no steps", cs[i].Name, cs[i].Rate, cs[i].Steps, want)
		}
	}
	for _, bad := range []string{"heavy-*", "heavy-*=fast", "feed=0", "nobody=3", "bulk*=1"} {
		if err := setRates(clients(), bad); err == nil || !strings.Contains(err.Error(), "--rate") {
			t.Errorf("--rate %q: %v, want an error", bad, err)
		}
	}
}
