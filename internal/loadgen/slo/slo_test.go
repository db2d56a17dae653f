package slo

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/loadgen/report"
)

func sample() *report.Report {
	return &report.Report{Clients: []report.Client{
		{Name: "feed", OK: 990, Errors: 10, Codes: map[string]int64{"Unavailable": 10}, ItemsPerSec: 5000,
			Latency: report.Latency{P50: 2, P90: 8, P99: 40, P999: 90, Max: 120}},
		{Name: "bulk", OK: 0, Errors: 30, Latency: report.Latency{P99: 3}},
	}}
}

// Tests that targets are met or missed by the figures they name.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		spec string
		met  []bool
	}{
		{"client=feed,p99<50ms", []bool{true}},
		{"client=feed,p99<40ms", []bool{false}},
		{"client=feed,p99<=40ms", []bool{true}},
		{"client=feed,p99.9<0.1s,max<=120ms", []bool{true}},
		{"client=feed,errors=0", []bool{false}},
		{"client=feed,error_rate<2%", []bool{true}},
		{"client=feed,error_rate<0.005", []bool{false}},
		{"client=feed,items/s>=5000", []bool{true}},
		{"client=bulk,errors=0", []bool{false}},
		{"client=nobody,errors=0", []bool{false}},
		{"p99<50ms", []bool{true, true}},
		{"errors<20", []bool{true, false}},
		{"p50<=2000us", []bool{true, true}},
	} {
		target, err := Parse(tc.spec)
		if err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		res := Check(target, sample())
		if len(res) != len(tc.met) {
			t.Fatalf("%s: %d results, want %d", tc.spec, len(res), len(tc.met))
		}
		for i, r := range res {
			if r.Met != tc.met[i] {
				t.Errorf("%s [%s]: met=%v, want %v (%s)", tc.spec, r.Client, r.Met, tc.met[i], r.Detail)
			}
		}
		if Met(res) != !containsFalse(tc.met) {
			t.Errorf("%s: Met = %v", tc.spec, Met(res))
		}
	}
}

func containsFalse(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return true
		}
	}
	return false
}

// Tests that malformed targets are refused with a message naming the
// term.
func TestParseErrors(t *testing.T) {
	for spec, want := range map[string]string{
		"client=feed":         "no condition",
		"client=,p99<1ms":     "needs a client name",
		"p99<50":              "needs a duration",
		"p98<5ms":             "unknown figure",
		"errors~0":            "no comparison",
		"errors=lots":         "needs a number",
		"client=feed,p99 5ms": "no comparison",
	} {
		if _, err := Parse(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", spec, err, want)
		}
	}
}
