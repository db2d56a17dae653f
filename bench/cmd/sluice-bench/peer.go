package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/sluice-dev/sluice/bench/cputime"
	"github.com/sluice-dev/sluice/bench/throughput"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/loadgen"
	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
)

// peerCase is one workload run against sluice and the bare peer.
type peerCase struct {
	name   string
	batch  int
	single bool    // GetPostRecord rather than GetPostRecords
	zipf   float64 // 0: round-robin over the URIs
}

// parseCases reads --cases: "1", "50", "1000" (GetPostRecords of that
// size), "single" (GetPostRecord) and "zipfN" (GetPostRecords of N URIs
// drawn from a zipf distribution with exponent s).
func parseCases(spec string, s float64) ([]peerCase, error) {
	var out []peerCase
	for _, f := range strings.Split(spec, ",") {
		switch {
		case f == "single":
			out = append(out, peerCase{name: "GetPostRecord", batch: 1, single: true})
		case strings.HasPrefix(f, "zipf"):
			n, err := strconv.Atoi(strings.TrimPrefix(f, "zipf"))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("case %q: want zipfN with N ≥ 1", f)
			}
			out = append(out, peerCase{name: fmt.Sprintf("zipf s=%.2g, batch %d", s, n), batch: n, zipf: s})
		default:
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("case %q: want a batch size, single or zipfN", f)
			}
			out = append(out, peerCase{name: fmt.Sprintf("batch %d", n), batch: n})
		}
	}
	return out, nil
}

// sideTotals adds up one server's rounds of one case.
type sideTotals struct {
	requests, items, found, errors int64
	seconds                        float64
	server, memcached, client      time.Duration
	firstError                     string
}

func (t *sideTotals) add(r throughput.Result, cpu pathCPU) {
	t.requests += r.Requests
	t.items += r.Items
	t.found += r.Found
	t.errors += r.Errors
	t.seconds += r.Seconds
	t.client += cpu.procs[0]
	t.server += cpu.procs[1]
	t.memcached += cpu.procs[2]
	if t.firstError == "" {
		t.firstError = r.FirstError
	}
}

func (t sideTotals) itemsPerSec() float64 { return float64(t.items) / max(t.seconds, 1e-9) }
func (t sideTotals) reqPerSec() float64   { return float64(t.requests) / max(t.seconds, 1e-9) }
func (t sideTotals) perReq(d time.Duration) float64 {
	return float64(d.Nanoseconds()) / 1e3 / float64(max(t.requests, 1))
}
func (t sideTotals) perItem(d time.Duration) float64 {
	return float64(d.Nanoseconds()) / 1e3 / float64(max(t.items, 1))
}

type peerOutcome struct {
	c            peerCase
	sluice, peer sideTotals
	// rounds is each round's sluice/peer items/s ratio, in order: the
	// spread a reader needs to tell a difference from the machine's noise.
	rounds []float64
}

// roundRatio is one round's sluice/peer items/s ratio.
func roundRatio(sluice, peer throughput.Result) float64 {
	return sluice.ItemsPerSec / max(peer.ItemsPerSec, 1e-9)
}

// formatRounds lists round ratios in the order run, two decimals each.
func formatRounds(rounds []float64) string {
	parts := make([]string, len(rounds))
	for i, r := range rounds {
		parts[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(parts, ", ")
}

func peerBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	uris := fs.String("uris", "", "URI file from sluice seed")
	sluiceAddr := fs.String("sluice", "127.0.0.1:50051", "sluice gRPC address")
	peerAddr := fs.String("peer", "127.0.0.1:50071", "bare peer gRPC address (same memcached)")
	sluicePID := fs.Int("sluice-pid", 0, "sluice's pid")
	peerPID := fs.Int("peer-pid", 0, "the peer's pid")
	mcPID := fs.Int("memcached-pid", 0, "memcached's pid")
	mcAddr := fs.String("memcached", "127.0.0.1:11211", "the memcached both servers read")
	concurrency := fs.Int("concurrency", 16, "workers, each with one request in flight")
	duration := fs.Duration("duration", 6*time.Second, "length of each leg (one server, one round)")
	rounds := fs.Int("rounds", 2, "rounds per case; each round runs both servers, the order alternating")
	cases := fs.String("cases", "1,50,1000,single,zipf1,zipf50", "workloads (see parseCases)")
	zipfS := fs.Float64("zipf-s", 1.1, "zipf exponent of the zipf cases (> 1)")
	md := fs.String("md", "", "Markdown fragment to write")
	noWarm := fs.Bool("no-warm", false, "skip the warm-up (memcached already holds every URI)")
	controlAddr := fs.String("control", "", "a second sluice of the same binary (same memcached, a copy of the store): the control cases run sluice against it, to show the machine's noise; empty: no control")
	controlPID := fs.Int("control-pid", 0, "the second sluice's pid (with --control)")
	controlCases := fs.String("control-cases", "zipf1,50", "workloads of the control (see parseCases)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sluicePID <= 0 || *peerPID <= 0 || *mcPID <= 0 {
		return fmt.Errorf("--sluice-pid, --peer-pid and --memcached-pid are all required")
	}
	if *controlAddr != "" && *controlPID <= 0 {
		return fmt.Errorf("--control needs --control-pid")
	}
	if err := positive(map[string]int64{"--concurrency": int64(*concurrency), "--duration": int64(*duration), "--rounds": int64(*rounds)}); err != nil {
		return err
	}
	cs, err := parseCases(*cases, *zipfS)
	if err != nil {
		return err
	}
	var controls []peerCase
	if *controlAddr != "" {
		if controls, err = parseCases(*controlCases, *zipfS); err != nil {
			return fmt.Errorf("--control-cases: %w", err)
		}
	}
	list, err := scenario.ReadURIs(*uris)
	if err != nil {
		return err
	}
	if !*noWarm {
		if err := warmFully(ctx, *sluiceAddr, *mcAddr, list); err != nil {
			return err
		}
	}
	sluiceSide := side{"sluice", *sluiceAddr, cputime.NewMeter(0, *sluicePID, *mcPID)}
	run := comparison{uris: list, conc: *concurrency, d: *duration, rounds: *rounds}
	outcomes, err := run.each(ctx, cs, sluiceSide, side{"peer", *peerAddr, cputime.NewMeter(0, *peerPID, *mcPID)})
	if err != nil {
		return err
	}
	var controlled []peerOutcome
	if len(controls) > 0 {
		if controlled, err = run.each(ctx, controls, sluiceSide, side{"control", *controlAddr, cputime.NewMeter(0, *controlPID, *mcPID)}); err != nil {
			return err
		}
	}
	return writeMD(*md, func(w io.Writer) {
		peerReport(w, outcomes, *concurrency, *duration, *rounds)
		controlReport(w, controlled)
	})
}

// side is one server of a comparison and the meter of its CPU.
type side struct {
	name, addr string
	meter      *cputime.Meter
}

// comparison runs cases against two servers in turn with one client.
type comparison struct {
	uris   []string
	conc   int
	d      time.Duration
	rounds int
}

// each runs every case against first and second, rounds times, the
// order swapped each round, and returns each case's totals (first's as
// sluice, second's as peer) and round ratios.
func (cmp comparison) each(ctx context.Context, cs []peerCase, first, second side) ([]peerOutcome, error) {
	sides := [2]side{first, second}
	var outcomes []peerOutcome
	for _, c := range cs {
		o := peerOutcome{c: c}
		for r := range cmp.rounds {
			var results [2]throughput.Result
			for k := range 2 {
				i := (r + k) % 2
				fmt.Fprintf(os.Stderr, "peer: %s, round %d, %s\n", c.name, r+1, sides[i].name)
				res, cpu, err := peerLeg(ctx, sides[i].addr, sides[i].meter, c, cmp.uris, cmp.conc, cmp.d, uint64(r+1))
				if err != nil {
					return nil, err
				}
				results[i] = res
				if i == 0 {
					o.sluice.add(res, cpu)
				} else {
					o.peer.add(res, cpu)
				}
			}
			o.rounds = append(o.rounds, roundRatio(results[0], results[1]))
		}
		outcomes = append(outcomes, o)
	}
	return outcomes, nil
}

// warmFully reads every URI through sluice, then again each one that
// memcached still lacks (a refill is best effort and gives up on a busy
// machine), until memcached holds them all: the peer reads only
// memcached, so a key missing there would be a not-found on one side only.
//
// A warm-up batch that fails (a busy machine can make the store miss the
// deadline) is not fatal: its URIs are missing and read again.
func warmFully(ctx context.Context, target, mcAddr string, uris []string) error {
	if err := loadgen.Warm(ctx, target, uris, 200, 4, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "peer: warm-up: %v; reading what memcached lacks again\n", err)
	}
	mc := memcache.New(mcAddr)
	mc.Timeout = 5 * time.Second
	defer mc.Close()
	for range 10 {
		var missing []string
		for from := 0; from < len(uris); from += 100 {
			chunk := uris[from:min(from+100, len(uris))]
			keys := make([]string, len(chunk))
			for i, u := range chunk {
				keys[i] = cache.Key(u)
			}
			got, err := mc.GetMulti(keys)
			if err != nil {
				return fmt.Errorf("peer: check the warm cache: %w", err)
			}
			for i, k := range keys {
				if _, ok := got[k]; !ok {
					missing = append(missing, chunk[i])
				}
			}
		}
		fmt.Fprintf(os.Stderr, "peer: %d of %d URIs not in memcached after warm-up\n", len(missing), len(uris))
		if len(missing) == 0 {
			return nil
		}
		if err := loadgen.Warm(ctx, target, missing, 50, 2, nil); err != nil {
			fmt.Fprintf(os.Stderr, "peer: warm-up: %v\n", err)
		}
	}
	return fmt.Errorf("peer: memcached still lacks some URIs after 10 warm-ups")
}

// peerLeg runs one case against one server and returns its result and
// the CPU each process used meanwhile.
func peerLeg(ctx context.Context, addr string, meter *cputime.Meter, c peerCase, uris []string, conc int, d time.Duration, seed uint64) (throughput.Result, pathCPU, error) {
	b := throughput.NewBatches(uris, c.batch, false)
	if c.zipf > 0 {
		var err error
		if b, err = throughput.NewZipfBatches(uris, c.batch, c.zipf, seed); err != nil {
			return throughput.Result{}, pathCPU{}, err
		}
	}
	var res throughput.Result
	cpu, err := measureCPU(meter, func() (err error) {
		if c.single {
			res, err = throughput.GRPCSingle(ctx, c.name, addr, conc, d, b)
		} else {
			res, err = throughput.GRPC(ctx, c.name, addr, conc, c.batch, d, b)
		}
		return err
	})
	return res, cpu, err
}

func peerReport(w io.Writer, outs []peerOutcome, conc int, d time.Duration, rounds int) {
	fmt.Fprintf(w, "## 4. sluice beside the bare peer\n\n")
	fmt.Fprintf(w, "The bare peer (`bench/peer`) is the server a team would write without sluice: grpc-go and gomemcache, GetMulti in chunks of %d under an errgroup, cached bytes copied straight into the response, no guard, no metrics. Both servers read the same warm memcached; the same client (%d closed-loop workers) ran each case for %v per leg, %d rounds, the servers alternating (the order swapped each round), and the figures add up every round; each round's ratio is shown below the table. CPU is user + system time from `/proc/PID/stat`, divided by requests or items served. sluice runs with its defaults, among them `guard.gc_percent` 400 (GOGC, which its soft memory limit makes safe); the peer, which has no memory limit, with Go's default GOGC of 100.\n\n", 100, conc, d, rounds)
	fmt.Fprintln(w, "| case | sluice items/s | peer items/s | **items/s ratio** | sluice req/s | peer req/s | **req/s ratio** | sluice CPU µs/req | peer CPU µs/req | **CPU/req ratio** | sluice µs/item | peer µs/item | memcached µs/item, sluice / peer | errors / not found, sluice / peer |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, o := range outs {
		s, p := o.sluice, o.peer
		fmt.Fprintf(w, "| %s | %.0f | %.0f | **%.2f** | %.0f | %.0f | **%.2f** | %.1f | %.1f | **%.2f** | %.2f | %.2f | %.2f / %.2f | %d, %d / %d, %d |\n",
			o.c.name, s.itemsPerSec(), p.itemsPerSec(), s.itemsPerSec()/p.itemsPerSec(),
			s.reqPerSec(), p.reqPerSec(), s.reqPerSec()/p.reqPerSec(),
			s.perReq(s.server), p.perReq(p.server), s.perReq(s.server)/p.perReq(p.server),
			s.perItem(s.server), p.perItem(p.server), s.perItem(s.memcached), p.perItem(p.memcached),
			s.errors, s.items-s.found, p.errors, p.items-p.found)
	}
	writeRoundRatios(w, outs)
	for _, o := range outs {
		for _, side := range []struct {
			n string
			t sideTotals
		}{{"sluice", o.sluice}, {"peer", o.peer}} {
			if side.t.firstError != "" {
				fmt.Fprintf(w, "\nFirst error of %s, %s: `%s`\n", side.n, o.c.name, side.t.firstError)
			}
		}
	}
	// Three decimals: a ratio just under its target must not print as the target.
	fmt.Fprintf(w, "\nTargets:\n\n")
	for _, o := range outs {
		s, p := o.sluice, o.peer
		cpu := s.perReq(s.server) / p.perReq(p.server)
		switch {
		case o.c.zipf > 0:
			r := s.itemsPerSec() / p.itemsPerSec()
			fmt.Fprintf(w, "- %s: items/s ratio %.3f (target ≥ 1.5: %s); memcached CPU per item %.2f µs through sluice against %.2f µs through the peer\n", o.c.name, r, verdict(r >= 1.5), s.perItem(s.memcached), p.perItem(p.memcached))
		case o.c.batch == 50:
			r := s.itemsPerSec() / p.itemsPerSec()
			fmt.Fprintf(w, "- %s: items/s ratio %.3f (target ≥ 1.0: %s); server CPU per request ratio %.3f (target ≤ 1.15: %s)\n", o.c.name, r, verdict(r >= 1.0), cpu, verdict(cpu <= 1.15))
		case o.c.batch == 1:
			r := s.reqPerSec() / p.reqPerSec()
			fmt.Fprintf(w, "- %s: requests/s ratio %.3f (target ≥ 0.9: %s); server CPU per request ratio %.3f (target ≤ 1.15: %s)\n", o.c.name, r, verdict(r >= 0.9), cpu, verdict(cpu <= 1.15))
		default:
			fmt.Fprintf(w, "- %s: items/s ratio %.3f; server CPU per request ratio %.3f (target ≤ 1.15: %s)\n", o.c.name, s.itemsPerSec()/p.itemsPerSec(), cpu, verdict(cpu <= 1.15))
		}
	}
}

// writeRoundRatios shows each round's items/s ratio beside the whole
// run's: two servers measured in turn on a shared machine drift apart
// from leg to leg, and the spread says how much of a difference is noise.
func writeRoundRatios(w io.Writer, outs []peerOutcome) {
	fmt.Fprintf(w, "\nEach round's items/s ratio (sluice / peer), in the order run:\n\n")
	for _, o := range outs {
		fmt.Fprintf(w, "- %s: %s (spread %.2f–%.2f)\n", o.c.name, formatRounds(o.rounds), slices.Min(o.rounds), slices.Max(o.rounds))
	}
}

// controlReport shows the control: sluice against a second sluice of the
// same binary, measured as the peer was. Two servers measured in turn on
// a shared machine drift apart from leg to leg; the control's ratios,
// which would all be 1 on a quiet machine, are how far they drifted in
// this run.
func controlReport(w io.Writer, outs []peerOutcome) {
	if len(outs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nControl: the same client, rounds and legs, sluice against a second sluice process of the same binary and config (the same memcached, a copy of the store). Identical servers would give 1; how far these ratios stray from it is this run's noise, against which the ratios above are read.\n\n")
	fmt.Fprintln(w, "| case | sluice items/s | second sluice items/s | **items/s ratio** | rounds |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|")
	for _, o := range outs {
		fmt.Fprintf(w, "| %s | %.0f | %.0f | **%.2f** | %s |\n", o.c.name, o.sluice.itemsPerSec(), o.peer.itemsPerSec(), o.sluice.itemsPerSec()/o.peer.itemsPerSec(), formatRounds(o.rounds))
	}
}
