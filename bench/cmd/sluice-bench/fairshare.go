package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/bench/throughput"
	"github.com/sluice-dev/sluice/internal/loadgen"
	"github.com/sluice-dev/sluice/internal/loadgen/report"
	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
)

// The fair-share part: in each round, on one fresh server, the cache-hit
// capacity (closed loop), then the four normal clients alone, with eight
// heavy callers at about 120% of capacity (preset fair-share), and with
// the trusted indexer's 20,000-URI batches split (preset split). Every
// figure is a ratio to the same round's baseline or capacity.

// capacityResult is what `sluice-bench capacity` writes.
type capacityResult struct {
	ItemsPerSec float64 `json:"items_per_sec"`
	Concurrency int     `json:"concurrency"`
	Batch       int     `json:"batch"`
	Seconds     float64 `json:"seconds"`
}

func capacity(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("capacity", flag.ContinueOnError)
	var c common
	c.register(fs)
	target := fs.String("target", "127.0.0.1:50051", "sluice gRPC address")
	out := fs.String("json", "", "file to write the result to")
	uris, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if err := loadgen.Warm(ctx, *target, uris, 1000, 4, os.Stderr); err != nil {
		return err
	}
	r, err := throughput.GRPC(ctx, "capacity", *target, c.concurrency, c.batch, c.duration, throughput.NewBatches(uris, c.batch, false))
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "capacity: %.0f cache-hit items/s (%d workers × %d URIs, %v)\n", r.ItemsPerSec, c.concurrency, c.batch, c.duration)
	b, err := json.Marshal(capacityResult{ItemsPerSec: r.ItemsPerSec, Concurrency: c.concurrency, Batch: c.batch, Seconds: c.duration.Seconds()})
	if err != nil {
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}

// fairRound is one round of the fair-share part.
type fairRound struct {
	capacity            capacityResult
	alone, heavy, split *report.Report
}

func fairShare(args []string) error {
	fs := flag.NewFlagSet("fairshare", flag.ContinueOnError)
	caps := fs.String("capacity", "", "sluice-bench capacity JSON, one per round (comma-separated)")
	alone := fs.String("alone", "", "sluice-load JSON: the normal clients alone, one per round")
	heavy := fs.String("heavy", "", "sluice-load JSON: preset fair-share, one per round")
	split := fs.String("split", "", "sluice-load JSON: preset split, one per round")
	loads := fs.String("loadavg", "", "the load average before each round (comma-separated)")
	md := fs.String("md", "", "Markdown fragment to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rounds, err := readFairRounds(*caps, *alone, *heavy, *split)
	if err != nil {
		return err
	}
	return writeMD(*md, func(w io.Writer) { fairReport(w, rounds, strings.Split(*loads, ",")) })
}

func readFairRounds(caps, alone, heavy, split string) ([]fairRound, error) {
	lists := [][]string{strings.Split(caps, ","), strings.Split(alone, ","), strings.Split(heavy, ","), strings.Split(split, ",")}
	for _, l := range lists[1:] {
		if len(l) != len(lists[0]) {
			return nil, fmt.Errorf("fairshare: give one capacity, alone, heavy and split file per round (got %d, %d, %d, %d)", len(lists[0]), len(lists[1]), len(lists[2]), len(lists[3]))
		}
	}
	out := make([]fairRound, len(lists[0]))
	for i := range out {
		b, err := os.ReadFile(lists[0][i])
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &out[i].capacity); err != nil {
			return nil, fmt.Errorf("fairshare: %s: %w", lists[0][i], err)
		}
		for j, dst := range []**report.Report{&out[i].alone, &out[i].heavy, &out[i].split} {
			if *dst, err = readJoined(lists[j+1][i]); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// readJoined reads one run's report. A run whose clients ran in several
// load-generator processes at once is given as their reports joined by
// "+" (the normal clients' first): its clients are theirs together, its
// vital signs the first's, its length the longest.
func readJoined(spec string) (*report.Report, error) {
	var joined *report.Report
	for _, path := range strings.Split(spec, "+") {
		r, err := report.ReadJSON(path)
		if err != nil {
			return nil, err
		}
		if joined == nil {
			joined = r
			continue
		}
		joined.Clients = append(joined.Clients, r.Clients...)
		joined.ElapsedSeconds = max(joined.ElapsedSeconds, r.ElapsedSeconds)
	}
	return joined, nil
}

// fairFigures are one round's figures for the targets.
type fairFigures struct {
	normalErrors     int64   // normal clients' failed requests, heavy run
	goodput          float64 // items/s answered to everyone, heavy run
	capacityShare    float64 // goodput / capacity
	heavyShares      []float64
	shareSpread      float64 // largest |share/mean - 1| among heavy callers
	heavyDeadline    int64   // heavy requests that ended DeadlineExceeded
	heavyOK, heavyEr int64
	splitOK, splitEr int64
	splitItems       int64
	splitNormalErr   int64
}

func figuresOf(r fairRound) fairFigures {
	var f fairFigures
	var heavyItems int64
	for _, c := range r.heavy.Clients {
		f.goodput += c.ItemsPerSec
		if r.alone.Client(c.Name) != nil {
			f.normalErrors += c.Errors
			continue
		}
		heavyItems += c.Items
		f.heavyDeadline += c.Codes["DeadlineExceeded"]
		f.heavyOK += c.OK
		f.heavyEr += c.Errors
	}
	f.capacityShare = f.goodput / max(r.capacity.ItemsPerSec, 1e-9)
	for _, c := range r.heavy.Clients {
		if r.alone.Client(c.Name) == nil {
			f.heavyShares = append(f.heavyShares, float64(c.Items)/max(float64(heavyItems), 1))
		}
	}
	mean := 1 / float64(max(len(f.heavyShares), 1))
	for _, s := range f.heavyShares {
		f.shareSpread = max(f.shareSpread, abs(s/mean-1))
	}
	for _, c := range r.split.Clients {
		if c.Name == scenario.SplitCaller {
			f.splitOK, f.splitEr, f.splitItems = c.OK, c.Errors, c.Items
		} else {
			f.splitNormalErr += c.Errors
		}
	}
	return f
}

func abs(x float64) float64 { return max(x, -x) }

func medianOf(vs []float64) float64 {
	vs = slices.Clone(vs)
	slices.Sort(vs)
	if n := len(vs); n%2 == 0 {
		return (vs[n/2-1] + vs[n/2]) / 2
	}
	return vs[len(vs)/2]
}

func fairReport(w io.Writer, rounds []fairRound, loads []string) {
	fmt.Fprintf(w, "## 5. Fair share under aggregate overload, and a trusted caller's split batches\n\n")
	fmt.Fprintf(w, "%d rounds, each on a fresh sluice and memcached (config/bench.yaml): the cache-hit capacity in a closed loop (%d workers × %d URIs, %.0f s), then %.0f s of each run: the four normal clients alone (`--preset fair-share --without heavy-1,…`), with eight heavy callers under their own names sending 1,000-URI batches (admitted in pieces of 100, `piece_items`), together at 120%% of the capacity just measured (`--preset fair-share --rate heavy-*=R`), and with the trusted `indexer` sending 20,000-URI batches, split into pieces of 100, at 50%% of it (`--preset split --rate indexer=R`). The normal clients run in one load-generator process and the heavy callers or the indexer in another, started together, as callers on other machines would be (the two still share the 2 cores with sluice and memcached). Every figure is against the same round's baseline or capacity.\n\n",
		len(rounds), rounds[0].capacity.Concurrency, rounds[0].capacity.Batch, rounds[0].capacity.Seconds, rounds[0].heavy.ElapsedSeconds)
	heavyRatios := ratiosOf(pairs(rounds, func(r fairRound) *report.Report { return r.heavy }))
	splitRatios := ratiosOf(pairs(rounds, func(r fairRound) *report.Report { return r.split }))
	figs := make([]fairFigures, len(rounds))
	for i, r := range rounds {
		figs[i] = figuresOf(r)
	}

	fmt.Fprintf(w, "| round | load avg before | capacity items/s | offered by heavy callers / capacity | goodput items/s | goodput / capacity | normal errors | heavy OK / errors | heavy DeadlineExceeded | heavy share spread | split: indexer OK / errors | split: normal errors |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, r := range rounds {
		f := figs[i]
		load := "n/a"
		if i < len(loads) && loads[i] != "" {
			load = loads[i]
		}
		fmt.Fprintf(w, "| %d | %s | %.0f | %.0f%% | %.0f | %.2f | %d | %d / %d %s | %d | ±%.0f%% | %d / %d %s | %d |\n",
			i+1, load, r.capacity.ItemsPerSec, 100*offered(r.heavy, r.alone)/max(r.capacity.ItemsPerSec, 1), f.goodput, f.capacityShare, f.normalErrors,
			f.heavyOK, f.heavyEr, heavyCodes(r), f.heavyDeadline, 100*f.shareSpread, f.splitOK, f.splitEr, codes(*clientOr(r.split, scenario.SplitCaller)), f.splitNormalErr)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Each heavy caller's share of the heavy callers' goodput, per round (equal weights, so 12.5%% each):\n\n")
	for i, f := range figs {
		parts := make([]string, len(f.heavyShares))
		for j, s := range f.heavyShares {
			parts[j] = fmt.Sprintf("%.1f%%", 100*s)
		}
		fmt.Fprintf(w, "- round %d: %s\n", i+1, strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)
	roundsTable(w, "Normal clients' p99 with the heavy callers / alone, in each round", heavyRatios)
	roundsTable(w, "Normal clients' p99 with the split indexer / alone, in each round", splitRatios)
	whereTimeWent(w, rounds)
	fmt.Fprintf(w, "Round 1, latency in ms:\n\n")
	normalTable(w, "sluice, heavy callers", rounds[0].heavy, rounds[0].alone)
	normalTable(w, "sluice, split indexer", rounds[0].split, rounds[0].alone)

	heavyWorst, heavySingle := heavyRatios.worst()
	splitWorst, _ := splitRatios.worst()
	var shares, spreads, deadlines, normalErrs, splitErrs, splitNormal []float64
	allItems := true
	for i, f := range figs {
		shares = append(shares, f.capacityShare)
		spreads = append(spreads, f.shareSpread)
		deadlines = append(deadlines, float64(f.heavyDeadline))
		normalErrs = append(normalErrs, float64(f.normalErrors))
		splitErrs = append(splitErrs, float64(f.splitEr))
		splitNormal = append(splitNormal, float64(f.splitNormalErr))
		allItems = allItems && f.splitOK > 0 && f.splitItems == f.splitOK*scenario.SplitBatch
		_ = i
	}
	fmt.Fprintf(w, "### Targets (medians of rounds; the worst round in brackets)\n\n")
	fmt.Fprintf(w, "| target | measured | met |\n|---|---|---|\n")
	fmt.Fprintf(w, "| normal clients' p99 with heavy callers ≤ 1.5× alone | %.2f× (single round up to %.2f×) | %s |\n", heavyWorst, heavySingle, verdict(heavyWorst <= 1.5))
	fmt.Fprintf(w, "| 0 normal-client errors with heavy callers | %.0f (%.0f) | %s |\n", medianOf(normalErrs), slices.Max(normalErrs), verdict(slices.Max(normalErrs) == 0))
	fmt.Fprintf(w, "| goodput ≥ 90%% of the measured capacity | %.0f%% (lowest %.0f%%) | %s |\n", 100*medianOf(shares), 100*slices.Min(shares), verdict(medianOf(shares) >= 0.9))
	fmt.Fprintf(w, "| heavy callers' shares within ±20%% of each other | ±%.0f%% (±%.0f%%) | %s |\n", 100*medianOf(spreads), 100*slices.Max(spreads), verdict(medianOf(spreads) <= 0.2))
	fmt.Fprintf(w, "| 0 heavy requests ended DeadlineExceeded | %.0f (%.0f) | %s |\n", medianOf(deadlines), slices.Max(deadlines), verdict(slices.Max(deadlines) == 0))
	fmt.Fprintf(w, "| indexer's 20,000-URI batches answered whole (records = 20,000 × OK) | %s, indexer errors %.0f (%.0f) | %s |\n", map[bool]string{true: "every round", false: "not every round"}[allItems], medianOf(splitErrs), slices.Max(splitErrs), verdict(allItems && slices.Max(splitErrs) == 0))
	fmt.Fprintf(w, "| normal clients' p99 with the split indexer ≤ 1.5× alone, 0 errors | %.2f×, errors %.0f (%.0f) | %s |\n", splitWorst, medianOf(splitNormal), slices.Max(splitNormal), verdict(splitWorst <= 1.5 && slices.Max(splitNormal) == 0))
	fmt.Fprintln(w)
	floorNote(w, rounds)
	disturbedNote(w, rounds)
	fmt.Fprintln(w, "Sheds carry RetryInfo (tested in internal/guard); the load generator counts codes only. Goodput counts every client's answered items per second of the run; capacity is the closed loop's, so a goodput share above 1 means the open loop kept the server busier than the closed loop did.")
}

// whereTimeWent sets the normal clients' latency as the harness saw it
// beside what sluice's own histograms counted over the same run: their
// requests from admission to response, and how long sluice's goroutines
// queued for the Go scheduler.
func whereTimeWent(w io.Writer, rounds []fairRound) {
	fmt.Fprintf(w, "### Where the normal clients' time went\n\n")
	fmt.Fprintf(w, "The harness times each request from its scheduled send to its answer; sluice's histograms time it from admission to response (`sluice_request_duration_seconds`) and count how long sluice's goroutines were runnable before the Go scheduler ran them (`sluice_go_sched_latency_seconds`, sampled by the runtime; time the kernel keeps a running thread off a core is not in it), between scrapes at the run's start and end. The harness and inside figures are medians over the four normal clients; the scheduler wait is the whole process's. The harness's p99 and the inside p99 are of different distributions and do not add up. The last column is the machine's own floor: the normal clients' load generator also timed a bare memcached get (one 500-byte value, one connection, every 5 ms, from its scheduled moment, as the clients are timed; `sluice-load --probe`), a round trip with no sluice in it that the same load delays.\n\n")
	fmt.Fprintf(w, "| round | run | harness p50 / p99 ms | inside sluice p50 / p99 ms | sluice's goroutines' wait for the scheduler p50 / p99 ms | bare memcached get from the harness p50 / p99 ms |\n|---:|---|---:|---:|---:|---:|\n")
	for i, r := range rounds {
		for _, run := range []struct {
			name string
			rep  *report.Report
		}{{"alone", r.alone}, {"heavy callers", r.heavy}, {"split indexer", r.split}} {
			var p50, p99, in50, in99 []float64
			for _, normal := range r.alone.Clients {
				c := run.rep.Client(normal.Name)
				if c == nil {
					continue
				}
				p50, p99 = append(p50, c.Latency.P50), append(p99, c.Latency.P99)
				if q, ok := serverLatency(run.rep, normal.Name); ok {
					in50, in99 = append(in50, q.P50Ms), append(in99, q.P99Ms)
				}
			}
			fmt.Fprintf(w, "| %d | %s | %s / %s | %s / %s | %s | %s |\n", i+1, run.name, msOf(p50), msOf(p99), msOf(in50), msOf(in99), cpuWait(run.rep), probeMS(run.rep))
		}
	}
	fmt.Fprintln(w)
}

// probeMS is the bare memcached get's p50 / p99 over run, if it was
// probed.
func probeMS(run *report.Report) string {
	p := run.Probe
	switch {
	case p == nil || p.OK+p.Errors == 0:
		return "n/a"
	case p.OK == 0:
		return fmt.Sprintf("all %d gets failed", p.Errors)
	case p.Errors > 0:
		return fmt.Sprintf("%.3g / %.3g (%d of %d gets failed)", p.Latency.P50, p.Latency.P99, p.Errors, p.OK+p.Errors)
	}
	return fmt.Sprintf("%.3g / %.3g", p.Latency.P50, p.Latency.P99)
}

// probeRatios is, per round, the bare memcached get's p99 in the run
// with over its p99 alone. Rounds without a probe in both, or whose
// probe had a failed get (its timeout would raise the floor), are left
// out.
func probeRatios(rounds []fairRound, with func(fairRound) *report.Report) []float64 {
	var out []float64
	for _, r := range rounds {
		if w, a := with(r).Probe, r.alone.Probe; clean(w) && clean(a) && a.Latency.P99 > 0 {
			out = append(out, w.Latency.P99/a.Latency.P99)
		}
	}
	return out
}

// clean reports whether a probe ran and every get it sent was answered.
func clean(p *report.Client) bool { return p != nil && p.OK > 0 && p.Errors == 0 }

// floorNote says how the machine's own floor moved under each load,
// beside the normal clients' ratios: a target below the floor's ratio is
// one no server on this machine could meet.
func floorNote(w io.Writer, rounds []fairRound) {
	heavy := probeRatios(rounds, func(r fairRound) *report.Report { return r.heavy })
	split := probeRatios(rounds, func(r fairRound) *report.Report { return r.split })
	if len(heavy) == 0 || len(split) == 0 {
		return
	}
	fmt.Fprintf(w, "The machine's floor under the same loads: a bare memcached get from the normal clients' load generator (no sluice in it) had a p99 %.2f× its p99 alone with the heavy callers (rounds: %s) and %.2f× with the split indexer (rounds: %s). A p99 ratio under that is more than this machine gives any round trip; the 1.5× targets are read against it.\n\n",
		medianOf(heavy), ratioList(heavy), medianOf(split), ratioList(split))
}

// disturbedFactor is how many times the quietest round's bare
// memcached get p99 alone a round's may be before that round's baseline
// is called disturbed.
const disturbedFactor = 2.0

// disturbedRounds lists the rounds (1-based) whose baseline, the run of
// the normal clients alone, was itself slowed: the bare memcached get's
// p99 in it was more than disturbedFactor times the quietest round's.
// The machine, not the load of that round, slowed it, so that round's
// p99 ratios read low. quietest is that lowest p99, 0 without probes.
func disturbedRounds(rounds []fairRound) (disturbed []int, quietest float64) {
	for _, r := range rounds {
		if p := r.alone.Probe; clean(p) && p.Latency.P99 > 0 && (quietest == 0 || p.Latency.P99 < quietest) {
			quietest = p.Latency.P99
		}
	}
	for i, r := range rounds {
		if p := r.alone.Probe; quietest > 0 && clean(p) && p.Latency.P99 > disturbedFactor*quietest {
			disturbed = append(disturbed, i+1)
		}
	}
	return disturbed, quietest
}

// disturbedNote names the rounds whose baseline was disturbed, so a
// reader does not take their low ratios for sluice's doing. The targets
// above still count every round.
func disturbedNote(w io.Writer, rounds []fairRound) {
	disturbed, quietest := disturbedRounds(rounds)
	if len(disturbed) == 0 {
		return
	}
	var parts []string
	for _, i := range disturbed {
		parts = append(parts, fmt.Sprintf("round %d (%.3g ms)", i, rounds[i-1].alone.Probe.Latency.P99))
	}
	list := parts[len(parts)-1]
	if len(parts) > 1 {
		list = strings.Join(parts[:len(parts)-1], ", ") + " and " + list
	}
	fmt.Fprintf(w, "Disturbed baselines: in %s the bare memcached get's p99 with the normal clients alone was more than %.0f× the quietest round's %.3g ms. The machine itself was slower while those baselines ran, so the p99 ratios against them read low; the targets above still count every round.\n\n",
		list, disturbedFactor, quietest)
}

func ratioList(vs []float64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf("%.2f×", v)
	}
	return strings.Join(parts, ", ")
}

// serverLatency is client's latency inside sluice over run, if the run
// read sluice's metrics.
func serverLatency(run *report.Report, client string) (report.Quantiles, bool) {
	if run.Vitals == nil || run.Vitals.Latency == nil {
		return report.Quantiles{}, false
	}
	q, ok := run.Vitals.Latency.Clients[client]
	return q, ok
}

func cpuWait(run *report.Report) string {
	if run.Vitals == nil || run.Vitals.Latency == nil || run.Vitals.Latency.CPUWait == nil {
		return "n/a"
	}
	q := run.Vitals.Latency.CPUWait
	return fmt.Sprintf("%.3g / %.3g", q.P50Ms, q.P99Ms)
}

// msOf is the median of vs in ms, or n/a.
func msOf(vs []float64) string {
	if len(vs) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.3g", medianOf(vs))
}

// pairs turns fair-share rounds into (with, baseline) pairs for ratiosOf.
func pairs(rounds []fairRound, with func(fairRound) *report.Report) []round {
	out := make([]round, len(rounds))
	for i, r := range rounds {
		out[i] = round{with: with(r), without: r.alone}
	}
	return out
}

func clientOr(r *report.Report, name string) *report.Client {
	if c := r.Client(name); c != nil {
		return c
	}
	return &report.Client{Name: name}
}

// heavyCodes sums the heavy callers' error codes.
func heavyCodes(r fairRound) string {
	sum := report.Client{Codes: map[string]int64{}}
	for _, c := range r.heavy.Clients {
		if r.alone.Client(c.Name) == nil {
			for k, v := range c.Codes {
				sum.Codes[k] += v
			}
		}
	}
	return codes(sum)
}

// offered is the heavy callers' offered items/s: requests scheduled
// times URIs each (the fair-share preset's fixed 1,000), over the run.
func offered(heavy, alone *report.Report) float64 {
	var n int64
	for _, c := range heavy.Clients {
		if alone.Client(c.Name) == nil {
			n += c.Scheduled * 1000
		}
	}
	return float64(n) / max(heavy.ElapsedSeconds, 1e-9)
}
