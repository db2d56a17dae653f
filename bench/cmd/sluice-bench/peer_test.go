package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/bench/throughput"
)

// Tests that a round's ratio is of items per second (each side's own
// rate, not its item count), and that the report shows every round in
// order with the spread.
func TestPeerReportShowsEachRoundsRatio(t *testing.T) {
	sluice := throughput.Result{Items: 30000, Seconds: 2, ItemsPerSec: 15000}
	peer := throughput.Result{Items: 40000, Seconds: 4, ItemsPerSec: 10000}
	if got := roundRatio(sluice, peer); got != 1.5 {
		t.Fatalf("roundRatio = %v, want 1.5 (15,000/s against 10,000/s)", got)
	}
	var out bytes.Buffer
	writeRoundRatios(&out, []peerOutcome{
		{c: peerCase{name: "zipf s=1.1, batch 1"}, rounds: []float64{1.52, 1.21, 1.37}},
		{c: peerCase{name: "batch 50"}, rounds: []float64{1.1}},
	})
	for _, want := range []string{
		"- zipf s=1.1, batch 1: 1.52, 1.21, 1.37 (spread 1.21–1.52)\n",
		"- batch 50: 1.10 (spread 1.10–1.10)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// Tests that the control section is written only when a control ran,
// with each case's whole-run ratio and its rounds.
func TestControlReportShowsTheSameBinarysSpread(t *testing.T) {
	var none bytes.Buffer
	controlReport(&none, nil)
	if none.Len() != 0 {
		t.Errorf("no control ran, yet the report says:\n%s", none.String())
	}
	var out bytes.Buffer
	controlReport(&out, []peerOutcome{{
		c:      peerCase{name: "zipf s=1.1, batch 1"},
		sluice: sideTotals{items: 60000, seconds: 4},
		peer:   sideTotals{items: 48000, seconds: 4},
		rounds: []float64{1.3, 1.2},
	}})
	if want := "| zipf s=1.1, batch 1 | 15000 | 12000 | **1.25** | 1.30, 1.20 |\n"; !strings.Contains(out.String(), want) {
		t.Errorf("control report lacks %q:\n%s", want, out.String())
	}
}
