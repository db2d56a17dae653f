package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/loadgen/report"
)

// reportWith builds a report whose clients have the given p99s (ms).
func reportWith(p99 map[string]float64, vitals *report.Vitals) *report.Report {
	r := &report.Report{Vitals: vitals}
	for _, name := range []string{"feed", "search", bulkClient} {
		if v, ok := p99[name]; ok {
			r.Clients = append(r.Clients, report.Client{Name: name, Latency: report.Latency{P99: v}})
		}
	}
	return r
}

func vitals(conns, firstDials, lastDials, goroutines float64) *report.Vitals {
	return &report.Vitals{
		First: report.Sample{MemcachedDials: firstDials},
		Last:  report.Sample{MemcachedDials: lastDials},
		Peak:  report.Sample{MemcachedConns: conns, MemcachedDials: lastDials, Goroutines: goroutines},
	}
}

func TestMedianRatioOverRounds(t *testing.T) {
	without := reportWith(map[string]float64{"feed": 10, "search": 10}, nil)
	rounds := []round{
		{reportWith(map[string]float64{"feed": 11, "search": 4, bulkClient: 900}, vitals(64, 64, 64, 40)), without},
		{reportWith(map[string]float64{"feed": 30, "search": 12}, nil), without},
		{reportWith(map[string]float64{"feed": 12, "search": 13}, vitals(60, 64, 70, 55)), without},
	}
	ratios := ratiosOf(rounds)
	if got := strings.Join(ratios.clients, ","); got != "feed,search" {
		t.Fatalf("clients %q, want feed,search (bulk left out)", got)
	}
	if got := ratios.median("feed"); got != 1.2 {
		t.Errorf("feed median %.2f, want 1.20 (of 1.1, 3.0, 1.2)", got)
	}
	median, single := ratios.worst()
	if median != 1.2 || single != 3.0 {
		t.Errorf("worst median %.2f and single round %.2f, want 1.20 and 3.00", median, single)
	}

	v, ok := worstOver(rounds)
	if !ok {
		t.Fatal("no vitals found, but two rounds carry them")
	}
	if want := (worstVitals{conns: 64, dialRise: 6, goroutines: 55}); v != want {
		t.Errorf("worst vitals %+v, want %+v", v, want)
	}

	var md bytes.Buffer
	targets(&md, rounds, ratios, 64, 1000, "test")
	for _, want := range []string{"worst client's median 1.20 (worst single round 3.00) | met", "at most +6 during a run | **not met**"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("targets table lacks %q:\n%s", want, md.String())
		}
	}
}

func TestMedianOfEvenRounds(t *testing.T) {
	r := p99Ratios{clients: []string{"feed"}, byRound: []map[string]float64{{"feed": 1}, {"feed": 4}, {"feed": 2}, {"feed": 3}}}
	if got := r.median("feed"); got != 2.5 {
		t.Errorf("median of 1, 4, 2, 3 = %.2f, want 2.5", got)
	}
}

func TestRSSUnderMemoryLimit(t *testing.T) {
	const mib = 1 << 20
	memory := func(rss, limit float64) *report.Vitals {
		return &report.Vitals{Peak: report.Sample{RSSBytes: rss * mib, MemoryLimitBytes: limit * mib}}
	}
	without := reportWith(map[string]float64{"feed": 10}, nil)
	for _, tc := range []struct {
		name  string
		peaks [][2]float64 // RSS and limit in MiB, per round
		want  string
	}{
		{"under", [][2]float64{{100, 512}, {120, 512}}, "peak 120 MiB of 512 MiB | met"},
		{"one round over", [][2]float64{{100, 512}, {600, 512}}, "peak 600 MiB of 512 MiB | **not met**"},
		{"no limit set", [][2]float64{{100, float64(report.NoMemoryLimit) / mib}}, "peak 100 MiB; no memory limit set | **not met**"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rounds []round
			for _, p := range tc.peaks {
				rounds = append(rounds, round{reportWith(map[string]float64{"feed": 10}, memory(p[0], p[1])), without})
			}
			var md bytes.Buffer
			targets(&md, rounds, ratiosOf(rounds), 64, 0, "")
			if !strings.Contains(md.String(), tc.want) {
				t.Errorf("targets table lacks %q:\n%s", tc.want, md.String())
			}
		})
	}
}
