// Binary sluice-bench runs the measurements of `make bench` that are not
// open-loop load (those are sluice-load's) and writes each part of
// docs/benchmarks.md as a Markdown fragment:
//
//	sluice-bench cachehit  --target ADDR --memcached ADDR --uris FILE --md OUT   cache-hit path vs raw GetMulti
//	sluice-bench coldpath  --target ADDR --metrics URL --uris FILE --out JSON    every read a cache miss
//	sluice-bench storeread --data-dir DIR --uris FILE --sluice JSON --md OUT     the store read directly, and the ratio
//	sluice-bench incident  --sluice A --sluice-nobulk B --naive C --naive-nobulk D --md OUT
//	sluice-bench peer      --sluice ADDR --peer ADDR --sluice-pid P --peer-pid P --memcached-pid P --uris FILE --md OUT
//	sluice-bench writepath --on ADDR --off ADDR --uris FILE --md OUT                writes and reads, journal follower on vs disabled
//
// scripts/bench.sh drives it; see docs/benchmarks.md for the commands.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/sluice-dev/sluice/bench/cputime"
	"github.com/sluice-dev/sluice/bench/throughput"
	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/loadgen"
	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
	"github.com/sluice-dev/sluice/internal/promtext"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "sluice-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: sluice-bench cachehit|coldpath|storeread|incident|peer|capacity|fairshare|writepath [flags]")
	}
	switch args[0] {
	case "cachehit":
		return cacheHit(ctx, args[1:])
	case "coldpath":
		return coldPath(ctx, args[1:])
	case "storeread":
		return storeRead(ctx, args[1:])
	case "incident":
		return incident(args[1:])
	case "peer":
		return peerBench(ctx, args[1:])
	case "capacity":
		return capacity(ctx, args[1:])
	case "fairshare":
		return fairShare(args[1:])
	case "writepath":
		return writePath(ctx, args[1:])
	}
	return fmt.Errorf("unknown part %q; use cachehit, coldpath, storeread, incident, peer, capacity, fairshare or writepath", args[0])
}

// common are the flags every closed-loop part shares.
type common struct {
	uris        string
	concurrency int
	batch       int
	duration    time.Duration
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.uris, "uris", "", "URI file from sluice seed")
	fs.IntVar(&c.concurrency, "concurrency", 16, "workers, each with one request in flight")
	fs.IntVar(&c.batch, "batch", 50, "URIs per request")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long each path is measured")
}

// parse parses args into fs, whose flags include c's, checks c's counts
// and reads c's URI file.
func (c *common) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return scenario.ReadURIs(c.uris)
}

// check refuses counts that would measure nothing.
func (c *common) check() error {
	return positive(map[string]int64{"--concurrency": int64(c.concurrency), "--batch": int64(c.batch), "--duration": int64(c.duration)})
}

// positive refuses any flag, by name, whose value is below 1: zero
// workers or rounds measure nothing and turn every ratio into NaN.
// --duration's value is in nanoseconds.
func positive(flags map[string]int64) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		if v := flags[name]; v < 1 {
			got := fmt.Sprint(v)
			if name == "--duration" {
				got = time.Duration(v).String()
			}
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, got))
		}
	}
	return errors.Join(errs...)
}

func cacheHit(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cachehit", flag.ContinueOnError)
	var c common
	c.register(fs)
	target := fs.String("target", "127.0.0.1:50051", "sluice gRPC address")
	mc := fs.String("memcached", "127.0.0.1:11211", "the memcached sluice uses")
	md := fs.String("md", "", "Markdown fragment to write")
	serverPID := fs.Int("server-pid", 0, "sluice's pid, to report the CPU each path used (with --memcached-pid)")
	memcachedPID := fs.Int("memcached-pid", 0, "memcached's pid")
	uris, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if err := loadgen.Warm(ctx, *target, uris, 1000, 4, os.Stderr); err != nil {
		return err
	}
	meter := cputime.NewMeter(0, *serverPID, *memcachedPID)
	fmt.Fprintf(os.Stderr, "cachehit: sluice GetPostRecords, %d workers × %d URIs, %v\n", c.concurrency, c.batch, c.duration)
	var sl throughput.Result
	slCPU, err := measureCPU(meter, func() (err error) {
		sl, err = throughput.GRPC(ctx, "sluice GetPostRecords (gRPC)", *target, c.concurrency, c.batch, c.duration, throughput.NewBatches(uris, c.batch, false))
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "cachehit: raw GetMulti, %d workers × %d keys, %v\n", c.concurrency, c.batch, c.duration)
	var raw throughput.Result
	rawCPU, err := measureCPU(meter, func() error {
		raw = throughput.GetMulti(ctx, *mc, c.concurrency, c.batch, c.duration, throughput.NewBatches(uris, c.batch, false))
		return nil
	})
	if err != nil {
		return err
	}
	ratio := sl.ItemsPerSec / raw.ItemsPerSec
	return writeMD(*md, func(w io.Writer) {
		fmt.Fprintf(w, "## 1. Cache-hit path\n\n")
		fmt.Fprintf(w, "%d workers, each with one request of %d URIs in flight, for %v per path, on a warm cache (every URI read once through sluice first).\n\n", c.concurrency, c.batch, c.duration)
		resultTable(w, sl, raw)
		fmt.Fprintf(w, "\n**sluice / raw GetMulti = %.2f** (target ≥ 0.70: %s).\n", ratio, verdict(ratio >= 0.70))
		if *serverPID > 0 && *memcachedPID > 0 {
			cpuTable(w, []string{sl.Name, raw.Name}, []pathCPU{slCPU, rawCPU}, []int64{sl.Items, raw.Items})
		}
	})
}

// pathCPU is the CPU time each process (client, sluice, memcached) and
// the whole machine used while one path was measured.
type pathCPU struct {
	procs             []time.Duration
	busy, machineTime time.Duration
}

// measureCPU runs f and returns the CPU time each of meter's processes
// and the machine used meanwhile.
func measureCPU(meter *cputime.Meter, f func() error) (pathCPU, error) {
	before, err := sampleCPU(meter)
	if err != nil {
		return pathCPU{}, err
	}
	if err := f(); err != nil {
		return pathCPU{}, err
	}
	after, err := sampleCPU(meter)
	if err != nil {
		return pathCPU{}, err
	}
	return pathCPU{
		procs:       cputime.Since(before.procs, after.procs),
		busy:        after.busy - before.busy,
		machineTime: after.machineTime - before.machineTime,
	}, nil
}

// sampleCPU returns the CPU time used so far by meter's processes and by
// the machine.
func sampleCPU(meter *cputime.Meter) (pathCPU, error) {
	procs, err := meter.Sample()
	if err != nil {
		return pathCPU{}, err
	}
	busy, total, err := cputime.Machine()
	return pathCPU{procs: procs, busy: busy, machineTime: total}, err
}

// cpuTable writes where each path's CPU went, per item, and what that
// implies for the throughput ratio on a machine the paths saturate.
func cpuTable(w io.Writer, names []string, cpu []pathCPU, items []int64) {
	fmt.Fprintf(w, "\nWhere the CPU went (user + system time of each process while its path ran, from `/proc/PID/stat` and `getrusage`):\n\n")
	fmt.Fprintln(w, "| path | client µs/item | sluice µs/item | memcached µs/item | all three µs/item | machine busy |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	perItem, serverPerItem := make([]float64, len(cpu)), make([]float64, len(cpu))
	for i, c := range cpu {
		n := float64(max(items[i], 1))
		us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
		var all time.Duration
		for _, d := range c.procs {
			all += d
		}
		perItem[i], serverPerItem[i] = us(all), us(c.procs[1])
		fmt.Fprintf(w, "| %s | %.2f | %.2f | %.2f | %.2f | %.0f%% |\n", names[i], us(c.procs[0]), us(c.procs[1]), us(c.procs[2]), perItem[i], 100*c.busy.Seconds()/max(c.machineTime.Seconds(), 1e-9))
	}
	fmt.Fprintf(w, "\nAll three processes share the same cores, so with the machine near saturation items/s follows CPU per item: raw / sluice CPU per item = **%.2f**, the ratio the throughput can reach on this machine unless sluice's own share shrinks. The sluice path pays memcached's work too, plus gRPC and protobuf on both sides of the call.\n", perItem[1]/perItem[0])
	withoutServer := perItem[0] - serverPerItem[0]
	fmt.Fprintf(w, "\nThe ceiling on this machine: if sluice itself used no CPU at all, the sluice path would still cost its client and memcached %.2f µs/item, and the ratio could reach at most **%.2f**.\n", withoutServer, perItem[1]/withoutServer)
}

func coldPath(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("coldpath", flag.ContinueOnError)
	var c common
	c.register(fs)
	target := fs.String("target", "127.0.0.1:50051", "sluice gRPC address (its memcached must be empty)")
	metrics := fs.String("metrics", "http://127.0.0.1:8080/metrics", "sluice /metrics")
	out := fs.String("out", "", "JSON result to write")
	uris, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	before, err := scrape(*metrics)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "coldpath: sluice, each of %d URIs once, %d workers × %d URIs\n", len(uris), c.concurrency, c.batch)
	res, err := throughput.GRPC(ctx, "sluice GetPostRecords, every read a miss", *target, c.concurrency, c.batch, c.duration, throughput.NewBatches(uris, c.batch, true))
	if err != nil {
		return err
	}
	after, err := scrape(*metrics)
	if err != nil {
		return err
	}
	cr := coldResult{Result: res,
		CacheHits:   after.Sum("sluice_cache_hits_total", nil) - before.Sum("sluice_cache_hits_total", nil),
		CacheMisses: after.Sum("sluice_cache_misses_total", nil) - before.Sum("sluice_cache_misses_total", nil),
		StoreReads:  after.Sum("sluice_store_reads_total", nil) - before.Sum("sluice_store_reads_total", nil),
	}
	// The same reads again, on the cache the cold pass filled: sluice's
	// own warm path, the ceiling of its cold path on this machine. Only
	// the URIs the cold pass read, and its misses counted, so a pass cut
	// short by its duration does not pass for a warm one.
	fmt.Fprintf(os.Stderr, "coldpath: sluice again, the same URIs once more, on the warm cache\n")
	read := uris[:min(len(uris), int(res.Items))]
	if cr.Warm, err = throughput.GRPC(ctx, "sluice GetPostRecords, the same URIs again, on the warm cache", *target, c.concurrency, c.batch, c.duration, throughput.NewBatches(read, c.batch, true)); err != nil {
		return err
	}
	warmed, err := scrape(*metrics)
	if err != nil {
		return err
	}
	cr.WarmMisses = warmed.Sum("sluice_cache_misses_total", nil) - after.Sum("sluice_cache_misses_total", nil)
	raw, _ := json.MarshalIndent(cr, "", "  ")
	return os.WriteFile(*out, raw, 0o644)
}

// coldResult is sluice's cold-path figure with the cache's own counts,
// and the same reads repeated on the warm cache.
type coldResult struct {
	throughput.Result
	Warm        throughput.Result `json:"warm"`
	WarmMisses  float64           `json:"warm_cache_misses"`
	CacheHits   float64           `json:"cache_hits"`
	CacheMisses float64           `json:"cache_misses"`
	StoreReads  float64           `json:"store_reads"`
}

func storeRead(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("storeread", flag.ContinueOnError)
	var c common
	c.register(fs)
	dataDir := fs.String("data-dir", ".data", "the store sluice served (sluice must be stopped)")
	fanout := fs.Int("fanout", 50, "parallel reads per batch (sluice's per-request concurrency)")
	sluiceJSON := fs.String("sluice", "", "coldpath result to compare with")
	md := fs.String("md", "", "Markdown fragment to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := errors.Join(c.check(), positive(map[string]int64{"--fanout": int64(*fanout)})); err != nil {
		return err
	}
	var cold coldResult
	raw, err := os.ReadFile(*sluiceJSON)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &cold); err != nil {
		return fmt.Errorf("%s: %w", *sluiceJSON, err)
	}
	uris, err := scenario.ReadURIs(c.uris)
	if err != nil {
		return err
	}
	st, err := boltstore.Open(filepath.Join(*dataDir, app.StoreFile), boltstore.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	fmt.Fprintf(os.Stderr, "storeread: each of %d URIs once, %d workers × %d URIs, %d parallel reads per batch\n", len(uris), c.concurrency, c.batch, *fanout)
	direct := throughput.StoreRead(ctx, st, c.concurrency, c.batch, *fanout, c.duration, throughput.NewBatches(uris, c.batch, true))
	fmt.Fprintf(os.Stderr, "storeread: each of %d URIs once, %d workers × %d URIs, one GetMany per batch\n", len(uris), c.concurrency, c.batch)
	batched := throughput.StoreBatchRead(ctx, st, c.concurrency, c.batch, c.duration, throughput.NewBatches(uris, c.batch, true))
	return writeMD(*md, func(w io.Writer) {
		fmt.Fprintf(w, "## 3. Cold path\n\n")
		fmt.Fprintf(w, "Every URI of the seeded set read once, in order, through a sluice whose memcached was empty (%d workers × %d URIs; sluice reads each request's misses in one read transaction); then the same URIs read directly from the embedded store (bbolt) with the same workers, once with %d parallel point reads per batch and once with one read transaction per batch. sluice counted %.0f cache hits, %.0f misses and %.0f store reads during its run.\n\n",
			c.concurrency, c.batch, *fanout, cold.CacheHits, cold.CacheMisses, cold.StoreReads)
		rows := []throughput.Result{cold.Result, cold.Warm, direct, batched}
		if cold.Warm.ItemsPerSec == 0 { // a result written before the warm pass was measured
			rows = slices.Delete(rows, 1, 2)
		}
		resultTable(w, rows...)
		fmt.Fprintf(w, "\n**sluice cold / store direct = %.2f** against one read transaction per batch (target ≥ 0.5: %s), %.2f against point reads. The cold path also reads memcached (a miss) and writes every record back to it (adds, pipelined: one round trip per server per 500 records), which the direct reads do not.\n",
			cold.ItemsPerSec/batched.ItemsPerSec, verdict(cold.ItemsPerSec/batched.ItemsPerSec >= 0.5), cold.ItemsPerSec/direct.ItemsPerSec)
		writeColdCeiling(w, cold, batched)
	})
}

// writeColdCeiling sets the cold path beside sluice's own warm path, the
// same reads answered from memcached with no store read at all, which no
// cold read through sluice can beat.
func writeColdCeiling(w io.Writer, cold coldResult, batched throughput.Result) {
	if cold.Warm.ItemsPerSec == 0 {
		return
	}
	if cold.WarmMisses > 0 {
		fmt.Fprintf(w, "\nThe same URIs read again through the same sluice missed memcached %.0f times, so that pass is no ceiling.\n", cold.WarmMisses)
		return
	}
	need := 0.5 * batched.ItemsPerSec
	fmt.Fprintf(w, "\nThe same URIs read again through the same sluice, every one a memcached hit (0 misses counted): %.0f items/s, so the cold path runs at **%.2f** of sluice's warm path. The target asks for %.0f items/s, %.2f× what this sluice answers with no store read at all on this machine, where the client, sluice and memcached share the cores: a ceiling the cold path cannot pass whatever the store read costs.\n",
		cold.Warm.ItemsPerSec, cold.ItemsPerSec/cold.Warm.ItemsPerSec, need, need/cold.Warm.ItemsPerSec)
}

func resultTable(w io.Writer, rs ...throughput.Result) {
	fmt.Fprintln(w, "| path | workers | batch | requests | items | found | errors | seconds | items/s |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %d | %.1f | %.0f |\n", r.Name, r.Concurrency, r.Batch, r.Requests, r.Items, r.Found, r.Errors, r.Seconds, r.ItemsPerSec)
	}
	for _, r := range rs {
		if r.FirstError != "" {
			fmt.Fprintf(w, "\nFirst error of %s: `%s`\n", r.Name, r.FirstError)
		}
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func writeMD(path string, body func(io.Writer)) error {
	if path == "" {
		body(os.Stdout)
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	body(f)
	return f.Close()
}

func scrape(url string) (promtext.Families, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return promtext.Scrape(ctx, nil, url)
}
