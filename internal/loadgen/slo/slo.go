// Package slo parses service-level targets for a load run and checks a
// report against them, so that a run can fail a deploy pipeline.
//
// A target is a comma-separated list of terms:
//
//	client=feed,p99<50ms,errors=0
//	p99.9<=200ms,error_rate<0.1%
//	client=bulk,dropped=0,items/s>=1000
//
// client=NAME selects one client (without it, every client must meet the
// target); the other terms compare a figure with a value:
//
//	p50 p90 p99 p99.9 max mean   latency, with a unit (ns, µs/us, ms, s)
//	errors dropped late          counts
//	error_rate                   errors / finished requests, a fraction or a percentage
//	items/s                      items answered per second
//
// with one of < <= = >= >. The package measures nothing.
package slo

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/loadgen/report"
)

// Target is one parsed --slo value.
type Target struct {
	Spec   string
	Client string // "" for every client
	Terms  []Term
}

// Term compares one figure with a value.
type Term struct {
	Figure string
	Op     string
	Value  float64 // milliseconds for latencies, a fraction for error_rate
}

var latencyFigures = map[string]func(report.Latency) float64{
	"p50":   func(l report.Latency) float64 { return l.P50 },
	"p90":   func(l report.Latency) float64 { return l.P90 },
	"p99":   func(l report.Latency) float64 { return l.P99 },
	"p99.9": func(l report.Latency) float64 { return l.P999 },
	"max":   func(l report.Latency) float64 { return l.Max },
	"mean":  func(l report.Latency) float64 { return l.Mean },
}

var countFigures = map[string]func(report.Client) float64{
	"errors":  func(c report.Client) float64 { return float64(c.Errors) },
	"dropped": func(c report.Client) float64 { return float64(c.Dropped) },
	"late":    func(c report.Client) float64 { return float64(c.Late) },
	"items/s": func(c report.Client) float64 { return c.ItemsPerSec },
	"error_rate": func(c report.Client) float64 {
		if n := c.OK + c.Errors; n > 0 {
			return float64(c.Errors) / float64(n)
		}
		return 0
	},
}

// ops in the order they must be tried (two-character operators first).
var ops = []string{"<=", ">=", "<", ">", "="}

// Parse parses one target, naming the term that is wrong.
func Parse(spec string) (Target, error) {
	t := Target{Spec: spec}
	for _, raw := range strings.Split(spec, ",") {
		term := strings.TrimSpace(raw)
		if term == "" {
			continue
		}
		if name, ok := strings.CutPrefix(term, "client="); ok {
			if name == "" {
				return Target{}, fmt.Errorf("slo %q: client= needs a client name", spec)
			}
			t.Client = name
			continue
		}
		parsed, err := parseTerm(term)
		if err != nil {
			return Target{}, fmt.Errorf("slo %q: %w", spec, err)
		}
		t.Terms = append(t.Terms, parsed)
	}
	if len(t.Terms) == 0 {
		return Target{}, fmt.Errorf("slo %q: no condition; write e.g. 'client=feed,p99<50ms,errors=0'", spec)
	}
	return t, nil
}

func parseTerm(term string) (Term, error) {
	for _, op := range ops {
		figure, value, ok := strings.Cut(term, op)
		if !ok {
			continue
		}
		figure, value = strings.TrimSpace(figure), strings.TrimSpace(value)
		v, err := parseValue(figure, value)
		if err != nil {
			return Term{}, fmt.Errorf("term %q: %w", term, err)
		}
		return Term{Figure: figure, Op: op, Value: v}, nil
	}
	return Term{}, fmt.Errorf("term %q has no comparison (one of < <= = >= >)", term)
}

func parseValue(figure, value string) (float64, error) {
	if _, ok := latencyFigures[figure]; ok {
		value = strings.Replace(value, "µs", "us", 1)
		d, err := time.ParseDuration(value)
		if err != nil {
			return 0, fmt.Errorf("%s needs a duration with a unit such as 50ms: %w", figure, err)
		}
		return float64(d) / float64(time.Millisecond), nil
	}
	if _, ok := countFigures[figure]; !ok {
		return 0, fmt.Errorf("unknown figure %q; use p50, p90, p99, p99.9, max, mean, errors, error_rate, dropped, late or items/s", figure)
	}
	scale := 1.0
	if figure == "error_rate" {
		if v, ok := strings.CutSuffix(value, "%"); ok {
			value, scale = v, 0.01
		}
	}
	v, err := strconv.ParseFloat(value, 64)
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("%s needs a number, got %q", figure, value)
	}
	return v * scale, nil
}

// Check compares every client the target selects; a target naming a
// client the report lacks is missed.
func Check(t Target, r *report.Report) []report.SLO {
	var out []report.SLO
	if t.Client != "" {
		c := r.Client(t.Client)
		if c == nil {
			return []report.SLO{{Spec: t.Spec, Client: t.Client, Met: false, Detail: "no such client in the run"}}
		}
		return []report.SLO{checkClient(t, *c)}
	}
	for _, c := range r.Clients {
		out = append(out, checkClient(t, c))
	}
	return out
}

func checkClient(t Target, c report.Client) report.SLO {
	res := report.SLO{Spec: t.Spec, Client: c.Name, Met: true}
	var parts []string
	for _, term := range t.Terms {
		got, unit := figure(term.Figure, c)
		ok := compare(got, term.Op, term.Value)
		mark := "ok"
		if !ok {
			mark, res.Met = "MISSED", false
		}
		parts = append(parts, fmt.Sprintf("%s=%s%s (want %s%s%s) %s", term.Figure, format(got), unit, term.Op, format(term.Value), unit, mark))
	}
	res.Detail = strings.Join(parts, "; ")
	return res
}

func figure(name string, c report.Client) (float64, string) {
	if f, ok := latencyFigures[name]; ok {
		return f(c.Latency), "ms"
	}
	return countFigures[name](c), ""
}

func compare(got float64, op string, want float64) bool {
	switch op {
	case "<":
		return got < want
	case "<=":
		return got <= want
	case ">":
		return got > want
	case ">=":
		return got >= want
	}
	return got == want
}

func format(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

// Met reports whether every result met its target.
func Met(results []report.SLO) bool {
	for _, r := range results {
		if !r.Met {
			return false
		}
	}
	return true
}
