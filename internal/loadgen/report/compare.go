package report

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"
)

// Compare writes two runs side by side, client by client (clients of
// either run, in A's order then B's), with the ratio B/A of each figure,
// then the vital signs' peaks.
func Compare(w io.Writer, a, b *Report, nameA, nameB string) error {
	fmt.Fprintf(w, "A = %s (%s, %.1fs)\nB = %s (%s, %.1fs)\n\n", nameA, a.Scenario, a.ElapsedSeconds, nameB, b.Scenario, b.ElapsedSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "client\tfigure\tA\tB\tB/A\t")
	for _, name := range clientNames(a, b) {
		ca, cb := a.Client(name), b.Client(name)
		for _, row := range compareRows {
			var va, vb float64
			if ca != nil {
				va = row.get(ca)
			}
			if cb != nil {
				vb = row.get(cb)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", name, row.name, cell(va, ca != nil), cell(vb, cb != nil), ratio(va, vb, ca != nil && cb != nil))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if a.Vitals == nil && b.Vitals == nil {
		return nil
	}
	fmt.Fprintln(w, "\nserver vital signs, peak")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tA\tB\t")
	for _, f := range figures {
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", f.name, peak(a, f), peak(b, f))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

var compareRows = []struct {
	name string
	get  func(*Client) float64
}{
	{"requests", func(c *Client) float64 { return float64(c.Sent) }},
	{"ok", func(c *Client) float64 { return float64(c.OK) }},
	{"errors", func(c *Client) float64 { return float64(c.Errors) }},
	{"dropped", func(c *Client) float64 { return float64(c.Dropped) }},
	{"items/s", func(c *Client) float64 { return c.ItemsPerSec }},
	{"p50 ms", func(c *Client) float64 { return c.Latency.P50 }},
	{"p90 ms", func(c *Client) float64 { return c.Latency.P90 }},
	{"p99 ms", func(c *Client) float64 { return c.Latency.P99 }},
	{"p99.9 ms", func(c *Client) float64 { return c.Latency.P999 }},
	{"max ms", func(c *Client) float64 { return c.Latency.Max }},
}

func clientNames(a, b *Report) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range []*Report{a, b} {
		for _, c := range r.Clients {
			if !seen[c.Name] {
				seen[c.Name] = true
				out = append(out, c.Name)
			}
		}
	}
	return out
}

func cell(v float64, present bool) string {
	if !present {
		return "-"
	}
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmtMS(v)
}

func ratio(a, b float64, present bool) string {
	if !present || a == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", b/a)
}

func peak(r *Report, f figure) string {
	if r.Vitals == nil {
		return "-"
	}
	return orUnknown(f, f.get(r.Vitals.Peak))
}
