package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/internal/loadgen/report"
)

// bulkClient is the incident preset's oversized-batch client.
const bulkClient = "bulk"

func incident(args []string) error {
	fs := flag.NewFlagSet("incident", flag.ContinueOnError)
	sluiceWith := fs.String("sluice", "", "sluice-load JSON: incident against sluice (comma-separated, one per round)")
	sluiceWithout := fs.String("sluice-nobulk", "", "sluice-load JSON: incident without bulk against sluice (one per round, same order)")
	naiveWith := fs.String("naive", "", "sluice-load JSON: incident against the naive server")
	naiveWithout := fs.String("naive-nobulk", "", "sluice-load JSON: incident without bulk against the naive server")
	connCap := fs.Int("cap", 64, "sluice's --memcached-max-conns")
	goroutineBound := fs.Int("goroutine-bound", 0, "the goroutine bound sluice's config implies")
	boundNote := fs.String("goroutine-bound-note", "", "how the bound was computed")
	md := fs.String("md", "", "Markdown fragment to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rounds, err := readRounds(*sluiceWith, *sluiceWithout)
	if err != nil {
		return err
	}
	naive, err := readRounds(*naiveWith, *naiveWithout)
	if err != nil {
		return err
	}
	rs := [4]*report.Report{rounds[0].with, rounds[0].without, naive[0].with, naive[0].without}
	return writeMD(*md, func(w io.Writer) {
		fmt.Fprintf(w, "## 2. The `incident` preset: sluice beside the naive baseline\n\n")
		fmt.Fprintf(w, "Each server ran `incident` (normal clients plus `bulk`, 15,000–20,000 URIs at 3 req/s) and `incident --without bulk`, for %.0f s each, on its own fresh memcached, after a warm-up read of every URI. sluice ran %d rounds of the pair, each on a fresh sluice and memcached; the tables below show round 1, and the last table every round's ratios.\n\n", rs[0].ElapsedSeconds, len(rounds))
		fmt.Fprintln(w, "Latency is measured from each request's scheduled time, so it includes the harness's own send lag (last column): the load generator shares the 2 cores with the server and memcached, and building and encoding a 15,000–20,000-URI request (about 1.5 MB) delays its other clients' sends. The server does not decode such a message: the guard counts its URIs in the wire bytes and refuses it from the count.")
		fmt.Fprintln(w)
		normalTable(w, "sluice", rs[0], rs[1])
		normalTable(w, "naive baseline", rs[2], rs[3])
		bulkTable(w, rs[0], rs[2])
		vitalsTable(w, rs)
		ratios := ratiosOf(rounds)
		roundsTable(w, "sluice's p99 ratio (with bulk / without) in each round", ratios)
		targets(w, rounds, ratios, *connCap, *goroutineBound, *boundNote)
	})
}

// round is one pair of incident runs against the same server build: with
// the bulk client and without it.
type round struct{ with, without *report.Report }

// readRounds reads comma-separated lists of reports, with and without
// bulk, pairing them in order.
func readRounds(with, without string) ([]round, error) {
	ws, wos := strings.Split(with, ","), strings.Split(without, ",")
	if len(ws) != len(wos) {
		return nil, fmt.Errorf("incident: %d reports with bulk but %d without; give one of each per round", len(ws), len(wos))
	}
	out := make([]round, len(ws))
	for i := range ws {
		var err error
		if out[i].with, err = report.ReadJSON(ws[i]); err != nil {
			return nil, err
		}
		if out[i].without, err = report.ReadJSON(wos[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// p99Ratios holds each normal client's p99 with bulk over p99 without,
// in every round: clients in report order, byRound[i][client].
type p99Ratios struct {
	clients []string
	byRound []map[string]float64
}

func ratiosOf(rounds []round) p99Ratios {
	var t p99Ratios
	for i, r := range rounds {
		m := map[string]float64{}
		for _, c := range r.with.Clients {
			base := r.without.Client(c.Name)
			if c.Name == bulkClient || base == nil {
				continue
			}
			m[c.Name] = ratio(c.Latency.P99, base.Latency.P99)
			if i == 0 {
				t.clients = append(t.clients, c.Name)
			}
		}
		t.byRound = append(t.byRound, m)
	}
	return t
}

// median is client's median ratio over the rounds.
func (t p99Ratios) median(client string) float64 {
	vs := make([]float64, len(t.byRound))
	for i, m := range t.byRound {
		vs[i] = m[client]
	}
	slices.Sort(vs)
	if n := len(vs); n%2 == 0 {
		return (vs[n/2-1] + vs[n/2]) / 2
	}
	return vs[len(vs)/2]
}

// worst returns the highest client median and the highest ratio of any
// single round.
func (t p99Ratios) worst() (median, single float64) {
	for _, name := range t.clients {
		median = max(median, t.median(name))
	}
	for _, m := range t.byRound {
		for _, v := range m {
			single = max(single, v)
		}
	}
	return median, single
}

// roundsTable shows every round's p99 ratio per normal client and the
// median over rounds: one 40 s run on a shared 2-core machine is noisy.
func roundsTable(w io.Writer, title string, t p99Ratios) {
	fmt.Fprintf(w, "### %s\n\n| client |", title)
	for i := range t.byRound {
		fmt.Fprintf(w, " round %d |", i+1)
	}
	fmt.Fprintf(w, " median |\n|---|%s---:|\n", strings.Repeat("---:|", len(t.byRound)))
	for _, name := range t.clients {
		fmt.Fprintf(w, "| %s |", name)
		for _, m := range t.byRound {
			fmt.Fprintf(w, " %.2f |", m[name])
		}
		fmt.Fprintf(w, " **%.2f** |\n", t.median(name))
	}
	fmt.Fprintln(w)
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
		{"Go heap in use MiB", peakOf(func(s report.Sample) float64 { return s.HeapBytes / (1 << 20) })},
		{"Go memory limit MiB", func(v *report.Vitals) string { return limitMiB(v.Peak.MemoryLimitBytes) }},
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

func targets(w io.Writer, rounds []round, ratios p99Ratios, connCap, bound int, note string) {
	worstMedian, worstRound := ratios.worst()
	errs := int64(0)
	for _, r := range rounds {
		for _, c := range r.with.Clients {
			if c.Name != bulkClient {
				errs += c.Errors
			}
		}
	}
	fmt.Fprintln(w, "### Targets for sluice under `incident`")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured | verdict |")
	fmt.Fprintln(w, "|---|---|---|")
	fmt.Fprintf(w, "| normal clients' p99 ≤ 1.25× without bulk, median of %d rounds | worst client's median %.2f (worst single round %.2f) | %s |\n", len(rounds), worstMedian, worstRound, verdict(worstMedian <= 1.25))
	fmt.Fprintf(w, "| zero errors for normal clients, all rounds | %d | %s |\n", errs, verdict(errs == 0))
	if v, ok := worstOver(rounds); ok {
		fmt.Fprintf(w, "| memcached connections ≤ cap %d, all rounds | peak %s | %s |\n", connCap, num(v.conns), verdict(v.conns >= 0 && v.conns <= float64(connCap)))
		fmt.Fprintf(w, "| dials flat after warm-up, all rounds | at most +%s during a run | %s |\n", num(v.dialRise), verdict(v.dialRise == 0))
		fmt.Fprintf(w, "| TIME_WAIT toward memcached ≤ cap %d, all rounds | peak %s | %s |\n", connCap, num(v.timeWait), verdict(v.timeWait >= 0 && v.timeWait <= float64(connCap)))
		fmt.Fprintf(w, "| peak RSS under the Go memory limit, all rounds | %s | %s |\n", rssOfLimit(v.rss, v.limit), verdict(v.rss > 0 && v.limit > 0 && v.limit < report.NoMemoryLimit && v.rss < v.limit))
		if bound > 0 {
			fmt.Fprintf(w, "| goroutines under the config's bound %d (%s), all rounds | peak %s | %s |\n", bound, note, num(v.goroutines), verdict(v.goroutines < float64(bound)))
		}
	}
	fmt.Fprintln(w)
}

// worstVitals is the worst figure of each vital-sign target over the
// runs with bulk of every round.
type worstVitals struct {
	conns, dialRise, timeWait, goroutines float64
	// rss is the highest peak RSS, limit the lowest Go memory limit.
	rss, limit float64
}

// worstOver returns the highest peak of connections, TIME_WAIT,
// goroutines and RSS, the largest rise in dials during one run, and the
// lowest memory limit. ok is false when no run sampled the server.
func worstOver(rounds []round) (w worstVitals, ok bool) {
	for _, r := range rounds {
		v := r.with.Vitals
		if v == nil {
			continue
		}
		this := worstVitals{v.Peak.MemcachedConns, v.Last.MemcachedDials - v.First.MemcachedDials, v.Peak.MemcachedTWait, v.Peak.Goroutines, v.Peak.RSSBytes, v.Peak.MemoryLimitBytes}
		if !ok {
			w, ok = this, true
			continue
		}
		w = worstVitals{max(w.conns, this.conns), max(w.dialRise, this.dialRise), max(w.timeWait, this.timeWait), max(w.goroutines, this.goroutines),
			max(w.rss, this.rss), min(w.limit, this.limit)}
	}
	return w, ok
}

func peakOf(get func(report.Sample) float64) func(*report.Vitals) string {
	return func(v *report.Vitals) string { return num(get(v.Peak)) }
}

// limitMiB formats a Go memory limit in MiB: "none" when the runtime
// reports no limit.
func limitMiB(v float64) string {
	if v >= report.NoMemoryLimit {
		return "none"
	}
	return num(v / (1 << 20))
}

// rssOfLimit says the peak RSS against the memory limit, in MiB.
func rssOfLimit(rss, limit float64) string {
	if limit >= report.NoMemoryLimit {
		return fmt.Sprintf("peak %s MiB; no memory limit set", num(rss/(1<<20)))
	}
	return fmt.Sprintf("peak %s MiB of %s MiB", num(rss/(1<<20)), limitMiB(limit))
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
