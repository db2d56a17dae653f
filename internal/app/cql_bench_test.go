package app

import (
	"context"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/gocql/gocql"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/bench/cputime"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// benchBatch is the URIs per request of the cold-path benchmark.
const benchBatch = 500

// BenchmarkColdPathCQL measures cold-path throughput on Cassandra: a
// batch whose every URI misses the cache (memcached is flushed before
// each read that goes through it), read through sluice over gRPC, against
// the same batch read directly with gocql — one token-aware
// single-partition SELECT per URI at LOCAL_ONE, at the method's
// concurrency (50) — in the same run, taking turns. It reports items/s of
// both and their ratio, and, to show which layer keeps what, the same
// batch read at the same concurrency through two of sluice's layers
// alone: its CQL store (query slots, retry policy, speculative attempt)
// and its read path in process (cache miss, coalesced store reads,
// refill; no gRPC, no guard). Through gRPC the guard serves the batch as
// it serves any: in pieces of piece_items, two at a time, each with the
// method's fan-out.
func BenchmarkColdPathCQL(b *testing.B) {
	cfg := cqltest.Keyspace(b, "sluice_bench_cold")
	mc := testenv.SharedMemcached(b)
	srv, a, seeded := startBenchServer(b, cfg, mc)
	conc := getPolicy(b).Concurrency
	direct := directSession(b, cfg)
	flusher := memcache.New(mc)
	ctx := metadata.AppendToOutgoingContext(b.Context(), "x-client-id", "bench")
	readers := []coldReader{
		{name: "gocql", read: func(uris []string) { readDirect(b, ctx, direct, uris, conc) }},
		{name: "store", read: func(uris []string) { readStore(b, ctx, a.Store, uris, conc) }},
		{name: "posts", cached: true, read: func(uris []string) { readPosts(b, ctx, a.Posts, uris, conc) }},
		{name: "sluice", cached: true, read: func(uris []string) { readViaSluice(b, ctx, srv, uris) }},
	}
	took := make([]time.Duration, len(readers))
	meter, parts := cpuMeter()
	cpu := make([][]time.Duration, len(readers))   // per reader, per part
	busy := make([][2]time.Duration, len(readers)) // per reader: the machine's busy and total CPU time
	b.ResetTimer()
	for i := range b.N {
		uris := seeded[(i*benchBatch)%len(seeded):][:benchBatch]
		for turn := range readers {
			k := (i + turn) % len(readers) // each reader goes first in turn
			// Untimed: the garbage of the reader before is collected
			// now, not during this one's turn, and memcached is
			// emptied for a reader that goes through it.
			b.StopTimer()
			runtime.GC()
			if readers[k].cached {
				if err := flusher.FlushAll(); err != nil {
					b.Fatalf("flush memcached: %v", err)
				}
			}
			b.StartTimer()
			start := time.Now()
			before, err := meter.Sample()
			if err != nil {
				b.Fatal(err)
			}
			busy0, total0, err := cputime.Machine()
			if err != nil {
				b.Fatal(err)
			}
			readers[k].read(uris)
			took[k] += time.Since(start)
			// The reader's garbage is collected inside its CPU window
			// (not its time), so each reader is charged its own.
			runtime.GC()
			busy1, total1, err := cputime.Machine()
			if err != nil {
				b.Fatal(err)
			}
			after, err := meter.Sample()
			if err != nil {
				b.Fatal(err)
			}
			cpu[k] = addTimes(cpu[k], cputime.Since(before, after))
			busy[k][0] += busy1 - busy0
			busy[k][1] += total1 - total0
		}
	}
	items := float64(b.N * benchBatch)
	for k, r := range readers {
		b.ReportMetric(items/took[k].Seconds(), r.name+"-items/s")
		b.ReportMetric(busy[k][0].Seconds()/busy[k][1].Seconds(), r.name+"-machine-busy")
		for p, part := range parts {
			b.ReportMetric(float64(cpu[k][p].Microseconds())/items, r.name+"-"+part+"-µs/item")
		}
		if k > 0 {
			b.ReportMetric(took[0].Seconds()/took[k].Seconds(), r.name+"/gocql")
		}
	}
}

// cpuMeter measures the CPU time of this process (the benchmark's
// client, sluice and the driver: "proc") and, when their pids are given
// in SLUICE_BENCH_CASSANDRA_PID and SLUICE_BENCH_MEMCACHED_PID (as
// scripts/bench-cql.sh gives them), of the Cassandra node and memcached;
// parts names what it measures, in order.
func cpuMeter() (*cputime.Meter, []string) {
	pids, parts := []int{0}, []string{"proc"}
	for _, p := range []struct{ env, part string }{{"SLUICE_BENCH_CASSANDRA_PID", "cassandra"}, {"SLUICE_BENCH_MEMCACHED_PID", "memcached"}} {
		if pid, err := strconv.Atoi(os.Getenv(p.env)); err == nil && pid > 0 {
			pids, parts = append(pids, pid), append(parts, p.part)
		}
	}
	return cputime.NewMeter(pids...), parts
}

// addTimes adds add to sum, element by element; a nil sum is zeros.
func addTimes(sum, add []time.Duration) []time.Duration {
	if sum == nil {
		sum = make([]time.Duration, len(add))
	}
	for i := range add {
		sum[i] += add[i]
	}
	return sum
}

// coldReader is one way BenchmarkColdPathCQL reads a batch; cached ones
// go through memcached, which is flushed before each of their reads.
type coldReader struct {
	name   string
	cached bool
	read   func(uris []string)
}

// startBenchServer serves cfg's keyspace through a real sluice with
// memcached at mc, after writing the posts it returns the URIs of. The
// process runs under the memory plan `sluice serve` applies (its soft
// memory limit and GOGC), as a deployed sluice does, until the benchmark
// ends; the other readers of the benchmark share the process and so the
// plan.
func startBenchServer(b *testing.B, cfg cqlstore.Config, mc string) (sluicev1.PostRecordsClient, *App, []string) {
	b.Helper()
	c := DefaultConfig()
	c.GRPCAddr, c.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	c.Cache.Servers, c.CQL = []string{mc}, cfg
	applyMemoryPlan(b, c)
	a, err := New(c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	uris := seedBench(b, a.Store, 10*benchBatch)
	grpcLis, httpLis, err := a.Listen()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, grpcLis, httpLis) }()
	conn, err := grpc.NewClient(grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		conn.Close()
		cancel()
		<-served
		a.Close()
	})
	return sluicev1.NewPostRecordsClient(conn), a, uris
}

// applyMemoryPlan applies c's memory plan to the process, as `sluice
// serve` does at start, and restores the runtime's settings when b ends.
func applyMemoryPlan(b *testing.B, c Config) {
	limit, gcPercent := debug.SetMemoryLimit(-1), debug.SetGCPercent(-1)
	debug.SetGCPercent(gcPercent)
	plan := c.MemoryPlan()
	membudget.Apply(plan.Limit, plan.GCPercent)
	b.Cleanup(func() {
		debug.SetMemoryLimit(limit)
		debug.SetGCPercent(gcPercent)
	})
}

func seedBench(b *testing.B, st store.Store, n int) []string {
	b.Helper()
	gen := synth.New(7, 500)
	recs := make([]store.Record, n)
	uris := make([]string, n)
	for i := range recs {
		recs[i] = gen.Next()
		uris[i] = recs[i].URI
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := st.Put(fanout.WithLimit(ctx, 32), recs); err != nil {
		b.Fatalf("seed: %v", err)
	}
	return uris
}

// directSession is a gocql session configured as the CQL store's read
// session: token-aware, LOCAL_ONE, the same connections per host.
func directSession(b *testing.B, cfg cqlstore.Config) *gocql.Session {
	b.Helper()
	cc := gocql.NewCluster(cfg.Hosts...)
	cc.Keyspace, cc.Consistency, cc.NumConns = cfg.Keyspace, gocql.LocalOne, cfg.NumConns
	cc.PoolConfig.HostSelectionPolicy = gocql.TokenAwareHostPolicy(gocql.DCAwareRoundRobinPolicy(cfg.DC))
	s, err := cc.CreateSession()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	return s
}

func readViaSluice(b *testing.B, ctx context.Context, c sluicev1.PostRecordsClient, uris []string) {
	resp, err := c.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris})
	if err != nil {
		b.Fatalf("sluice: %v", err)
	}
	for i, r := range resp.Records {
		if !r.GetFound() {
			b.Fatalf("sluice: %s not found", uris[i])
		}
	}
}

// readStore reads uris with sluice's CQL store's batch read, conc
// groups at once.
func readStore(b *testing.B, ctx context.Context, st store.Store, uris []string, conc int) {
	recs, err := st.(store.BatchReader).GetMany(fanout.WithLimit(ctx, conc), uris)
	if err != nil {
		b.Fatalf("store: %v", err)
	}
	if len(recs) != len(uris) {
		b.Fatalf("store: %d records for %d URIs, all stored", len(recs), len(uris))
	}
}

// readPosts reads uris through sluice's read path in process, with the
// fan-out limit the guard gives a request of the method.
func readPosts(b *testing.B, ctx context.Context, p *posts.Service, uris []string, conc int) {
	answers, counts, err := p.GetEncoded(fanout.WithLimit(ctx, conc), uris)
	if err != nil {
		b.Fatalf("posts: %v", err)
	}
	if answers.Len() != len(uris) || counts.FromStore != len(uris) {
		b.Fatalf("posts: %d answers for %d URIs, %d read from the store (want all: the cache was flushed, every URI is stored)", answers.Len(), len(uris), counts.FromStore)
	}
}

func readDirect(b *testing.B, ctx context.Context, s *gocql.Session, uris []string, conc int) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for _, uri := range uris {
		g.Go(func() error {
			var cid string
			var js []byte
			var created, indexed int64
			return s.Query(`SELECT cid, json, created_at_us, indexed_at_us FROM records WHERE uri = ?`, uri).
				WithContext(gctx).Idempotent(true).Scan(&cid, &js, &created, &indexed)
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatalf("gocql: %v", err)
	}
}
