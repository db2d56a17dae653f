package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/bench/throughput"
)

// Tests that a round's ratio is of items per second, each side over its
// own leg's length, and that the report shows every round in order with
// the spread.
func TestPeerReportShowsEachRoundsRatio(t *testing.T) {
	sluice := throughput.Result{Items: 30000, Seconds: 2} // 15,000/s
	peer := throughput.Result{Items: 40000, Seconds: 4}   // 10,000/s
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
