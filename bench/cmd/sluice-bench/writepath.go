package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/bench/throughput"
	"github.com/sluice-dev/sluice/internal/loadgen"
	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
)

// writePath measures the write path with the invalidation journal's
// follower on and disabled: two servers on copies of one store, each with
// its own memcached, measured in turn (the order swapped each round) with
// the same writers and readers, and reported as ratios on / disabled.
func writePath(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("writepath", flag.ContinueOnError)
	on := fs.String("on", "", "gRPC address of the sluice with the journal follower on (the default)")
	off := fs.String("off", "", "gRPC address of the sluice with journal.disabled: true")
	urisFile := fs.String("uris", "", "URI file from sluice seed")
	writers := fs.Int("writers", 4, "workers each rewriting one record per request, back to back")
	readers := fs.Int("readers", 8, "workers each reading one batch per request, back to back")
	batch := fs.Int("batch", 50, "URIs per read")
	written := fs.Int("written", 1000, "how many of the URIs (the first ones) the writers rewrite")
	duration := fs.Duration("duration", 5*time.Second, "how long each server is measured per round")
	rounds := fs.Int("rounds", 2, "rounds; each measures both servers")
	md := fs.String("md", "", "Markdown fragment to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *on == "" || *off == "" {
		return errors.New("writepath: --on and --off are required")
	}
	if err := positive(map[string]int64{"--writers": int64(*writers), "--readers": int64(*readers), "--batch": int64(*batch),
		"--written": int64(*written), "--duration": int64(*duration), "--rounds": int64(*rounds)}); err != nil {
		return err
	}
	uris, err := scenario.ReadURIs(*urisFile)
	if err != nil {
		return err
	}
	if *written > len(uris) {
		return fmt.Errorf("writepath: --written %d is more than the %d URIs in %s", *written, len(uris), *urisFile)
	}
	for _, target := range []string{*on, *off} {
		if err := loadgen.Warm(ctx, target, uris, 1000, 4, os.Stderr); err != nil {
			return err
		}
	}
	servers := []struct{ name, target string }{{"journal on", *on}, {"journal disabled", *off}}
	all := make([][]throughput.WritePathResult, 2)
	for r := range *rounds {
		for k := range 2 {
			i := (k + r) % 2 // swap the order each round
			fmt.Fprintf(os.Stderr, "writepath: round %d, %s: %d writers, %d readers × %d URIs, %v\n", r+1, servers[i].name, *writers, *readers, *batch, *duration)
			res, err := throughput.WritePath(ctx, servers[i].name, servers[i].target, *writers, *readers, *duration, uris[:*written], throughput.NewBatches(uris, *batch, false))
			if err != nil {
				return err
			}
			all[i] = append(all[i], res)
		}
	}
	return writeMD(*md, func(w io.Writer) { writePathMD(w, all, *written, *duration, *rounds) })
}

// writePathSum is one server's figures over every round.
type writePathSum struct {
	name                   string
	writes, writeErrs      int64
	reads, readErrs        int64
	seconds                float64
	writesPerSec, p50, p99 float64
	firstErr               string
}

func sumWritePath(rs []throughput.WritePathResult) writePathSum {
	s := writePathSum{name: rs[0].Name}
	var lat []float64
	for _, r := range rs {
		s.writes += r.Writes
		s.writeErrs += r.WriteErrors
		s.reads += r.Reads
		s.readErrs += r.ReadErrors
		s.seconds += r.Seconds
		lat = append(lat, r.ReadLatencies...)
		if s.firstErr == "" {
			s.firstErr = r.FirstError
		}
	}
	s.writesPerSec = float64(s.writes) / s.seconds
	s.p50, s.p99 = quantile(lat, 0.50), quantile(lat, 0.99)
	return s
}

// quantile returns the q-quantile of xs (nearest rank), 0 for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	// The ceil(q·n)-th smallest; the slack keeps a product such as
	// 0.07 × 100 = 7.000000000000001 at its rank.
	rank := int(math.Ceil(q*float64(len(xs)) - 1e-9))
	return xs[min(len(xs)-1, max(rank-1, 0))]
}

func writePathMD(w io.Writer, all [][]throughput.WritePathResult, written int, d time.Duration, rounds int) {
	r0 := all[0][0]
	fmt.Fprintf(w, "## 6. Write path: the journal follower on and disabled\n\n")
	fmt.Fprintf(w, "Two sluice servers on copies of the seeded store, each with its own memcached, one with the defaults (journal follower on) and one with `journal: {disabled: true}`, measured in turn for %v each, %d rounds, the order swapped each round. In each run %d writers rewrite the first %d seeded posts (one record per `PutPostRecords`, a new CID each time, so each write invalidates a cached entry) while %d readers read batches of %d URIs of the whole set on a warm cache. The store writes its journal row in the record's transaction either way; `disabled` turns off the follower (its polls, owed-tombstone retries and the distrust of keys and servers that missed tombstones), so the ratio is the follower's cost beside the journal row's.\n\n",
		d, rounds, r0.Writers, written, r0.Readers, r0.Batch)
	fmt.Fprintln(w, "| server | writes | writes/s | write errors | reads | read errors | read p50 ms | read p99 ms |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	sums := []writePathSum{sumWritePath(all[0]), sumWritePath(all[1])}
	for _, s := range sums {
		fmt.Fprintf(w, "| %s | %d | %.0f | %d | %d | %d | %.2f | %.2f |\n", s.name, s.writes, s.writesPerSec, s.writeErrs, s.reads, s.readErrs, 1000*s.p50, 1000*s.p99)
	}
	on, off := sums[0], sums[1]
	fmt.Fprintf(w, "\n**journal on / disabled: writes/s %.2f, read p50 %.2f, read p99 %.2f** (every round pooled).\n\n", on.writesPerSec/off.writesPerSec, on.p50/off.p50, on.p99/off.p99)
	fmt.Fprintln(w, "| round | writes/s on / disabled | read p50 on / disabled | read p99 on / disabled |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|")
	for r := range all[0] {
		a, b := sumWritePath(all[0][r:r+1]), sumWritePath(all[1][r:r+1])
		fmt.Fprintf(w, "| %d | %.2f | %.2f | %.2f |\n", r+1, a.writesPerSec/b.writesPerSec, a.p50/b.p50, a.p99/b.p99)
	}
	for _, s := range sums {
		if s.firstErr != "" {
			fmt.Fprintf(w, "\nFirst error of %s: `%s`\n", s.name, s.firstErr)
		}
	}
}
