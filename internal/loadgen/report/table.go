package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable writes the per-client table and the vital signs as text.
func WriteTable(w io.Writer, r *Report) error {
	fmt.Fprintf(w, "scenario %s against %s, %.1fs\n\n", r.Scenario, r.Target, r.ElapsedSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "client\tmethod\tscheduled\tsent\tdropped\tlate\tok\terrors by code\titems/s\tp50 ms\tp90 ms\tp99 ms\tp99.9 ms\tmax ms\t")
	for _, c := range r.Clients {
		l := c.Latency
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n",
			c.Name, c.Method, c.Scheduled, c.Sent, c.Dropped, c.Late, c.OK, Codes(c.Codes), c.ItemsPerSec,
			fmtMS(l.P50), fmtMS(l.P90), fmtMS(l.P99), fmtMS(l.P999), fmtMS(l.Max))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	writeFirstErrors(w, r.Clients)
	if p := r.Probe; p != nil {
		l := p.Latency
		fmt.Fprintf(w, "\nthe machine's floor: %s, %d gets (%d failed), p50 %s p90 %s p99 %s p99.9 %s max %s ms\n",
			p.Name, p.OK+p.Errors, p.Errors, fmtMS(l.P50), fmtMS(l.P90), fmtMS(l.P99), fmtMS(l.P999), fmtMS(l.Max))
	}
	if r.Vitals != nil {
		fmt.Fprintln(w)
		if err := writeVitals(w, r.Vitals); err != nil {
			return err
		}
	}
	if len(r.SLO) > 0 {
		fmt.Fprintln(w)
		for _, s := range r.SLO {
			verdict := "met"
			if !s.Met {
				verdict = "MISSED"
			}
			fmt.Fprintf(w, "SLO %-6s %s [%s]: %s\n", verdict, s.Spec, s.Client, s.Detail)
		}
	}
	return nil
}

// writeFirstErrors writes each client's first error of each code, each
// on one line.
func writeFirstErrors(w io.Writer, clients []Client) {
	header := false
	for _, c := range clients {
		for _, code := range slices.Sorted(maps.Keys(c.FirstErrors)) {
			if !header {
				fmt.Fprintln(w, "\nfirst error of each code")
				header = true
			}
			fmt.Fprintf(w, "  %s, %s: %s\n", c.Name, code, strings.Join(strings.Fields(c.FirstErrors[code]), " "))
		}
	}
}

// Codes formats error counts by code, "-" when there are none.
func Codes(codes map[string]int64) string {
	if len(codes) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(codes)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, codes[k]))
	}
	return strings.Join(parts, " ")
}

func fmtMS(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// figure is one vital sign: its name, its key in Sources, and how to
// read and format it.
type figure struct {
	name, key string
	get       func(Sample) float64
	format    func(float64) string
}

func count(v float64) string { return fmt.Sprintf("%.0f", v) }
func mib(v float64) string   { return fmt.Sprintf("%.0f MiB", v/(1<<20)) }

// limit formats a memory limit; the Go runtime reports math.MaxInt64
// when none is set.
func limit(v float64) string {
	if v >= NoMemoryLimit {
		return "none"
	}
	return mib(v)
}

// NoMemoryLimit is the smallest go_gc_gomemlimit_bytes that means no
// limit is set: the runtime reports math.MaxInt64 when none is, and the
// naive baseline sets the most the guard accepts (1024 TiB), which no
// allocation reaches.
const NoMemoryLimit = 1 << 50

// Figures are the vital signs in report order.
var figures = []figure{
	{"goroutines", "goroutines", func(s Sample) float64 { return s.Goroutines }, count},
	{"OS threads", "threads", func(s Sample) float64 { return s.Threads }, count},
	{"RSS", "rss", func(s Sample) float64 { return s.RSSBytes }, mib},
	{"Go heap in use", "heap", func(s Sample) float64 { return s.HeapBytes }, mib},
	{"Go memory limit", "memory_limit", func(s Sample) float64 { return s.MemoryLimitBytes }, limit},
	{"memcached connections", "memcached_conns", func(s Sample) float64 { return s.MemcachedConns }, count},
	{"memcached dials (total)", "memcached_dials", func(s Sample) float64 { return s.MemcachedDials }, count},
	{"TIME_WAIT toward memcached", "time_wait", func(s Sample) float64 { return s.MemcachedTWait }, count},
	{"cache errors (total)", "cache_errors", func(s Sample) float64 { return s.CacheErrors }, count},
}

func writeVitals(w io.Writer, v *Vitals) error {
	fmt.Fprintf(w, "server vital signs (%d samples)\n", len(v.Samples))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tfirst\tpeak\tlast\tsource")
	for _, f := range figures {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.name, orUnknown(f, f.get(v.First)), orUnknown(f, f.get(v.Peak)), orUnknown(f, f.get(v.Last)), orDash(v.Sources[f.key]))
	}
	for _, e := range v.Errors {
		fmt.Fprintf(tw, "scrape error\t%s\n", e)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return writeServerLatency(w, v.Latency)
}

// writeServerLatency writes the latency the server's histograms counted
// over the run, beside the harness's own figures above.
func writeServerLatency(w io.Writer, l *ServerLatency) error {
	if l == nil {
		return nil
	}
	fmt.Fprintf(w, "\nlatency inside the server, from its histograms between scrapes at %.1f s and %.1f s\n", l.FromSeconds, l.ToSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tcount\tp50 ms\tp99 ms\tp99.9 ms\t")
	if q := l.CPUWait; q != nil {
		fmt.Fprintf(tw, "goroutines' wait for the scheduler (sampled)\t%.0f\t%.3g\t%.3g\t%.3g\t\n", q.Count, q.P50Ms, q.P99Ms, q.P999Ms)
	}
	for _, name := range slices.Sorted(maps.Keys(l.Clients)) {
		q := l.Clients[name]
		fmt.Fprintf(tw, "%s, admission to response\t%.0f\t%.3g\t%.3g\t%.3g\t\n", name, q.Count, q.P50Ms, q.P99Ms, q.P999Ms)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

func orUnknown(f figure, v float64) string {
	if v < 0 {
		return "n/a"
	}
	return f.format(v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
