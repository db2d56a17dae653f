package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/loadgen/report"
)

// Tests that a run whose clients ran in two load-generator processes
// reads as one report: every client of both, the first's vital signs,
// the longer length.
func TestReadJoinedMergesTheProcessesOfOneRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r report.Report) string {
		path := filepath.Join(dir, name)
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	normal := write("normal.json", report.Report{ElapsedSeconds: 20.1, Vitals: &report.Vitals{},
		Clients: []report.Client{{Name: "feed", Items: 10}, {Name: "search", Items: 5}}})
	bulk := write("bulk.json", report.Report{ElapsedSeconds: 20.4,
		Clients: []report.Client{{Name: "heavy-1", Items: 1000}}})

	r, err := readJoined(normal + "+" + bulk)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Clients) != 3 || r.Client("feed") == nil || r.Client("heavy-1").Items != 1000 {
		t.Fatalf("clients %+v, want feed, search and heavy-1", r.Clients)
	}
	if r.Vitals == nil || r.ElapsedSeconds != 20.4 {
		t.Fatalf("vitals %v, elapsed %v: want the first's vitals and the longer run", r.Vitals, r.ElapsedSeconds)
	}
	if one, err := readJoined(normal); err != nil || len(one.Clients) != 2 {
		t.Fatalf("one report: %v clients, %v", len(one.Clients), err)
	}
}

// Tests that the fair-share report sets the normal clients' latency as
// the harness saw it beside sluice's own figures for the same run.
func TestWhereTimeWentSetsHarnessBesideServer(t *testing.T) {
	run := func(p99s, inside []float64, wait float64) *report.Report {
		r := &report.Report{Vitals: &report.Vitals{Latency: &report.ServerLatency{
			CPUWait: &report.Quantiles{Count: 100, P50Ms: 0.01, P99Ms: wait},
			Clients: map[string]report.Quantiles{},
		}}}
		for i, name := range []string{"feed", "thread", "notifications", "search"} {
			r.Clients = append(r.Clients, report.Client{Name: name, Latency: report.Latency{P50: 1, P99: p99s[i]}})
			r.Vitals.Latency.Clients[name] = report.Quantiles{Count: 10, P50Ms: 0.5, P99Ms: inside[i]}
		}
		return r
	}
	alone := run([]float64{3, 3, 4, 4}, []float64{1, 1, 1, 1}, 0.2)
	heavy := run([]float64{16, 18, 20, 22}, []float64{4, 6, 8, 10}, 3)
	heavy.Clients = append(heavy.Clients, report.Client{Name: "heavy-1", Latency: report.Latency{P99: 900}})
	split := run([]float64{10, 10, 10, 10}, []float64{2, 2, 2, 2}, 1)
	split.Vitals = nil // a run that did not read the metrics
	alone.Probe = &report.Client{OK: 100, Latency: report.Latency{P50: 0.06, P99: 0.5}}
	heavy.Probe = &report.Client{OK: 100, Latency: report.Latency{P50: 0.1, P99: 2.5}}

	var out strings.Builder
	rounds := []fairRound{{alone: alone, heavy: heavy, split: split}}
	whereTimeWent(&out, rounds)
	for _, want := range []string{
		"| 1 | alone | 1 / 3.5 | 0.5 / 1 | 0.01 / 0.2 | 0.06 / 0.5 |",
		"| 1 | heavy callers | 1 / 19 | 0.5 / 7 | 0.01 / 3 | 0.1 / 2.5 |",
		"| 1 | split indexer | 1 / 10 | n/a / n/a | n/a | n/a |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no line %q in\n%s", want, out.String())
		}
	}

	// The floor's ratios need a probe in every run compared.
	out.Reset()
	if floorNote(&out, rounds); out.Len() != 0 {
		t.Errorf("a floor note without the split run's probe: %q", out.String())
	}
	split.Probe = &report.Client{OK: 99, Errors: 1, Latency: report.Latency{P99: 1000}}
	if floorNote(&out, rounds); out.Len() != 0 {
		t.Errorf("a floor note from a probe whose get failed: %q", out.String())
	}
	split.Probe = &report.Client{OK: 100, Latency: report.Latency{P99: 1}}
	floorNote(&out, rounds)
	if want := "p99 5.00× its p99 alone with the heavy callers (rounds: 5.00×) and 2.00× with the split indexer"; !strings.Contains(out.String(), want) {
		t.Errorf("floor note %q; want %q", out.String(), want)
	}
}

// Tests that a round whose baseline the machine slowed is named: its
// bare memcached get's p99 alone is more than twice the quietest
// round's; a round with a failed get, or without a probe, is not judged.
func TestDisturbedBaselinesAreNamed(t *testing.T) {
	alone := func(p99 float64) fairRound {
		return fairRound{alone: &report.Report{Probe: &report.Client{OK: 100, Latency: report.Latency{P99: p99}}}}
	}
	rounds := []fairRound{alone(2.75), alone(14.4), alone(5.5), {alone: &report.Report{}}}
	rounds = append(rounds, fairRound{alone: &report.Report{Probe: &report.Client{OK: 99, Errors: 1, Latency: report.Latency{P99: 1000}}}})
	got, quietest := disturbedRounds(rounds)
	if !slices.Equal(got, []int{2}) || quietest != 2.75 {
		t.Fatalf("disturbed rounds %v against %v ms; want round 2 against 2.75 (round 3 is exactly twice the quietest)", got, quietest)
	}
	var out strings.Builder
	disturbedNote(&out, rounds)
	if want := "in round 2 (14.4 ms) the bare memcached get's p99 with the normal clients alone was more than 2× the quietest round's 2.75 ms"; !strings.Contains(out.String(), want) {
		t.Errorf("note %q; want %q", out.String(), want)
	}
	out.Reset()
	if disturbedNote(&out, rounds[:1]); out.Len() != 0 {
		t.Errorf("a note with no disturbed round: %q", out.String())
	}
}
