package main

import (
	"flag"
	"fmt"
	"io"
	"math"

	"github.com/sluice-dev/sluice/internal/loadgen/report"
)

// bulkClient is the incident preset's oversized-batch client.
const bulkClient = "bulk"

func incident(args []string) error {
	fs := flag.NewFlagSet("incident", flag.ContinueOnError)
	sluiceWith := fs.String("sluice", "", "sluice-load JSON: incident against sluice")
	sluiceWithout := fs.String("sluice-nobulk", "", "sluice-load JSON: incident without bulk against sluice")
	naiveWith := fs.String("naive", "", "sluice-load JSON: incident against the naive server")
	naiveWithout := fs.String("naive-nobulk", "", "sluice-load JSON: incident without bulk against the naive server")
	connCap := fs.Int("cap", 64, "sluice's --memcached-max-conns")
	goroutineBound := fs.Int("goroutine-bound", 0, "the goroutine bound sluice's config implies")
	boundNote := fs.String("goroutine-bound-note", "", "how the bound was computed")
	md := fs.String("md", "", "Markdown fragment to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var rs [4]*report.Report
	for i, p := range []string{*sluiceWith, *sluiceWithout, *naiveWith, *naiveWithout} {
		r, err := report.ReadJSON(p)
		if err != nil {
			return err
		}
		rs[i] = r
	}
	return writeMD(*md, func(w io.Writer) {
		fmt.Fprintf(w, "## 2. The `incident` preset: sluice beside the naive baseline\n\n")
		fmt.Fprintf(w, "Each server ran `incident` (normal clients plus `bulk`, 15,000–20,000 URIs at 3 req/s) and `incident --without bulk`, for %.0f s each, on its own fresh memcached, after a warm-up read of every URI.\n\n", rs[0].ElapsedSeconds)
		fmt.Fprintln(w, "Latency is measured from each request's scheduled time, so it includes the harness's own send lag (last column): the load generator shares the 2 cores with the server and memcached, and building and encoding a 15,000–20,000-URI request (about 1.5 MB) delays its other clients' sends. The server does not decode such a message: the guard counts its URIs in the wire bytes and refuses it from the count.")
		fmt.Fprintln(w)
		normalTable(w, "sluice", rs[0], rs[1])
		normalTable(w, "naive baseline", rs[2], rs[3])
		bulkTable(w, rs[0], rs[2])
		vitalsTable(w, rs)
		targets(w, rs[0], rs[1], *connCap, *goroutineBound, *boundNote)
	})
}

// normalTable compares each normal client's p99 with and without bulk.
func normalTable(w io.Writer, server string, with, without *report.Report) {
	fmt.Fprintf(w, "### Normal clients against %s\n\n", server)
	fmt.Fprintln(w, "| client | requests | errors (with bulk) | error rate | p50 with / without ms | p99 with bulk ms | p99 without ms | ratio | p99.9 with ms | max with ms | harness send lag p99 with / without ms |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range with.Clients {
		if c.Name == bulkClient {
			continue
		}
		base := without.Client(c.Name)
		if base == nil {
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %d %s | %.2f%% | %.1f / %.1f | %.1f | %.1f | **%.2f** | %.1f | %.1f | %.1f / %.1f |\n", c.Name, c.Sent, c.Errors, codes(c), 100*errRate(c),
			c.Latency.P50, base.Latency.P50, c.Latency.P99, base.Latency.P99, ratio(c.Latency.P99, base.Latency.P99), c.Latency.P999, c.Latency.Max, c.SendLag.P99, base.SendLag.P99)
	}
	fmt.Fprintln(w)
}

func bulkTable(w io.Writer, sl, nv *report.Report) {
	fmt.Fprintln(w, "### The bulk client")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| server | requests | ok | errors by code | p50 ms | p99 ms | max ms | dropped |")
	fmt.Fprintln(w, "|---|---:|---:|---|---:|---:|---:|---:|")
	for _, x := range []struct {
		name string
		r    *report.Report
	}{{"sluice", sl}, {"naive", nv}} {
		if c := x.r.Client(bulkClient); c != nil {
			fmt.Fprintf(w, "| %s | %d | %d | %s | %.1f | %.1f | %.1f | %d |\n", x.name, c.Sent, c.OK, report.Codes(c.Codes), c.Latency.P50, c.Latency.P99, c.Latency.Max, c.Dropped)
		}
	}
	fmt.Fprintln(w)
}

func vitalsTable(w io.Writer, rs [4]*report.Report) {
	fmt.Fprintln(w, "### Server vital signs (peak during each run; dials as first → last sample)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| figure | sluice, incident | sluice, without bulk | naive, incident | naive, without bulk |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	rows := []struct {
		name string
		cell func(*report.Vitals) string
	}{
		{"memcached connections", peakOf(func(s report.Sample) float64 { return s.MemcachedConns })},
		{"memcached dials", func(v *report.Vitals) string {
			return fmt.Sprintf("%s → %s", num(v.First.MemcachedDials), num(v.Last.MemcachedDials))
		}},
		{"TIME_WAIT toward memcached", peakOf(func(s report.Sample) float64 { return s.MemcachedTWait })},
		{"goroutines", peakOf(func(s report.Sample) float64 { return s.Goroutines })},
		{"OS threads", peakOf(func(s report.Sample) float64 { return s.Threads })},
		{"RSS MiB", peakOf(func(s report.Sample) float64 { return s.RSSBytes / (1 << 20) })},
		{"cache errors", func(v *report.Vitals) string {
			return fmt.Sprintf("%s → %s", num(v.First.CacheErrors), num(v.Last.CacheErrors))
		}},
	}
	for _, row := range rows {
		fmt.Fprintf(w, "| %s |", row.name)
		for _, r := range rs {
			if r.Vitals == nil {
				fmt.Fprint(w, " n/a |")
				continue
			}
			fmt.Fprintf(w, " %s |", row.cell(r.Vitals))
		}
		fmt.Fprintln(w)
	}
	if v := rs[0].Vitals; v != nil {
		fmt.Fprintf(w, "\nSources: threads from `%s`, TIME_WAIT from `%s`.\n\n", v.Sources["threads"], v.Sources["time_wait"])
	}
}

func targets(w io.Writer, with, without *report.Report, connCap, bound int, note string) {
	worst, errs := 0.0, int64(0)
	for _, c := range with.Clients {
		if c.Name == bulkClient {
			continue
		}
		if base := without.Client(c.Name); base != nil {
			worst = max(worst, ratio(c.Latency.P99, base.Latency.P99))
		}
		errs += c.Errors
	}
	fmt.Fprintln(w, "### Targets for sluice under `incident`")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured | verdict |")
	fmt.Fprintln(w, "|---|---|---|")
	fmt.Fprintf(w, "| normal clients' p99 ≤ 1.25× without bulk | worst ratio %.2f | %s |\n", worst, verdict(worst <= 1.25))
	fmt.Fprintf(w, "| zero errors for normal clients | %d | %s |\n", errs, verdict(errs == 0))
	if v := with.Vitals; v != nil {
		fmt.Fprintf(w, "| memcached connections ≤ cap %d | peak %s | %s |\n", connCap, num(v.Peak.MemcachedConns), verdict(v.Peak.MemcachedConns >= 0 && v.Peak.MemcachedConns <= float64(connCap)))
		dials := v.Last.MemcachedDials - v.First.MemcachedDials
		fmt.Fprintf(w, "| dials flat after warm-up | +%s during the run | %s |\n", num(dials), verdict(dials == 0))
		fmt.Fprintf(w, "| TIME_WAIT toward memcached ≤ cap %d | peak %s | %s |\n", connCap, num(v.Peak.MemcachedTWait), verdict(v.Peak.MemcachedTWait >= 0 && v.Peak.MemcachedTWait <= float64(connCap)))
		if bound > 0 {
			fmt.Fprintf(w, "| goroutines under the config's bound %d (%s) | peak %s | %s |\n", bound, note, num(v.Peak.Goroutines), verdict(v.Peak.Goroutines < float64(bound)))
		}
	}
	fmt.Fprintln(w)
}

func peakOf(get func(report.Sample) float64) func(*report.Vitals) string {
	return func(v *report.Vitals) string { return num(get(v.Peak)) }
}

func num(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", v)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return a / b
}

func errRate(c report.Client) float64 {
	if n := c.OK + c.Errors; n > 0 {
		return float64(c.Errors) / float64(n)
	}
	return 0
}

func codes(c report.Client) string {
	if len(c.Codes) == 0 {
		return ""
	}
	return "(" + report.Codes(c.Codes) + ")"
}
