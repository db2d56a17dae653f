// Package throughput measures closed-loop throughput for `make bench`:
// a fixed number of workers each send batches back to back, and the
// result is items per second. It compares sluice's gRPC read path with
// the ceilings beneath it — raw gomemcache GetMulti on the same keys,
// and the embedded store read directly — at the same concurrency.
//
// It is benchmark code: it starts its workers through an errgroup whose
// limit is the concurrency, and it is never part of `sluice serve`.
package throughput

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/store"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// Result is one measured path.
type Result struct {
	Name        string  `json:"name"`
	Concurrency int     `json:"concurrency"`
	Batch       int     `json:"batch"`
	Requests    int64   `json:"requests"`
	Items       int64   `json:"items"`
	Found       int64   `json:"found"`
	Errors      int64   `json:"errors"`
	Seconds     float64 `json:"seconds"`
	ItemsPerSec float64 `json:"items_per_sec"`
	FirstError  string  `json:"first_error,omitempty"`
}

// Batches hands out batches of URIs to workers: in order, each URI once
// (once=true, stopping when the list is exhausted), round and round, or
// drawn from a zipf distribution over the list (NewZipfBatches).
type Batches struct {
	uris  []string
	size  int
	once  bool
	count atomic.Int64

	mu   sync.Mutex
	zipf *rand.Zipf // nil unless skewed
}

// NewZipfBatches returns batches of size URIs each drawn independently
// with P(rank k) ∝ 1/(1+k)^s (s > 1) over uris, in their order: the first
// URI is the hottest. The same seed gives the same sequence.
func NewZipfBatches(uris []string, size int, s float64, seed uint64) (*Batches, error) {
	if s <= 1 {
		return nil, fmt.Errorf("throughput: zipf s is %v; it must be above 1", s)
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return &Batches{uris: uris, size: size, zipf: rand.NewZipf(r, s, 1, uint64(len(uris)-1))}, nil
}

// NewBatches returns batches of size over uris.
func NewBatches(uris []string, size int, once bool) *Batches {
	return &Batches{uris: uris, size: size, once: once}
}

// Next returns the next batch, or nil when once and exhausted.
func (b *Batches) Next() []string {
	if b.zipf != nil {
		return b.nextZipf()
	}
	i := int(b.count.Add(1) - 1)
	from := i * b.size
	if b.once {
		if from >= len(b.uris) {
			return nil
		}
		return b.uris[from:min(from+b.size, len(b.uris))]
	}
	from %= len(b.uris) - b.size + 1
	return b.uris[from : from+b.size]
}

func (b *Batches) nextZipf() []string {
	out := make([]string, b.size)
	b.mu.Lock()
	for i := range out {
		out[i] = b.uris[b.zipf.Uint64()]
	}
	b.mu.Unlock()
	return out
}

// op reads one batch and returns how many items were found.
type op func(ctx context.Context, batch []string) (found int, err error)

// loop runs concurrency workers calling do on batches until duration
// passes or the batches run out.
func loop(ctx context.Context, name string, concurrency, size int, duration time.Duration, b *Batches, do op) Result {
	res := Result{Name: name, Concurrency: concurrency, Batch: size}
	var requests, items, found, errs atomic.Int64
	var firstErr atomic.Value
	// stop ends the loop; requests themselves run on ctx, so none is cut
	// off by the measurement's end and the last ones count in full.
	stop, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	g := new(errgroup.Group)
	g.SetLimit(concurrency)
	start := time.Now()
	for range concurrency {
		g.Go(func() error {
			for stop.Err() == nil && ctx.Err() == nil {
				batch := b.Next()
				if batch == nil {
					return nil
				}
				n, err := do(ctx, batch)
				requests.Add(1)
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				items.Add(int64(min(len(batch), size)))
				found.Add(int64(n))
			}
			return nil
		})
	}
	_ = g.Wait()
	res.Seconds = time.Since(start).Seconds()
	res.Requests, res.Items, res.Found, res.Errors = requests.Load(), items.Load(), found.Load(), errs.Load()
	res.ItemsPerSec = float64(res.Items) / res.Seconds
	if e, ok := firstErr.Load().(string); ok {
		res.FirstError = e
	}
	return res
}

// GRPC measures sluice's GetPostRecords at target.
func GRPC(ctx context.Context, name, target string, concurrency, size int, duration time.Duration, b *Batches) (Result, error) {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(512<<20)))
	if err != nil {
		return Result{}, fmt.Errorf("throughput: connect to %s: %w", target, err)
	}
	defer conn.Close()
	client := sluicev1.NewPostRecordsClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, "x-client-id", "bench")
	return loop(ctx, name, concurrency, size, duration, b, func(ctx context.Context, batch []string) (int, error) {
		resp, err := client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: batch})
		if err != nil {
			return 0, err
		}
		n := 0
		for _, r := range resp.GetRecords() {
			if r.GetFound() {
				n++
			}
		}
		return n, nil
	}), nil
}

// GRPCSingle measures GetPostRecord at target: one URI per request, the
// first of each batch b hands out.
func GRPCSingle(ctx context.Context, name, target string, concurrency int, duration time.Duration, b *Batches) (Result, error) {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return Result{}, fmt.Errorf("throughput: connect to %s: %w", target, err)
	}
	defer conn.Close()
	client := sluicev1.NewPostRecordsClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, "x-client-id", "bench")
	return loop(ctx, name, concurrency, 1, duration, b, func(ctx context.Context, batch []string) (int, error) {
		r, err := client.GetPostRecord(ctx, &sluicev1.GetPostRecordRequest{Uri: batch[0]})
		if err != nil {
			return 0, err
		}
		if r.GetFound() {
			return 1, nil
		}
		return 0, nil
	}), nil
}

// GetMulti measures raw gomemcache GetMulti of the keys sluice uses for
// the same URIs, with an idle pool as large as the concurrency (so every
// worker keeps its connection).
func GetMulti(ctx context.Context, addr string, concurrency, size int, duration time.Duration, b *Batches) Result {
	mc := memcache.New(addr)
	mc.MaxIdleConns = concurrency
	mc.Timeout = 2 * time.Second
	defer mc.Close()
	return loop(ctx, "raw gomemcache GetMulti", concurrency, size, duration, b, func(_ context.Context, batch []string) (int, error) {
		keys := make([]string, len(batch))
		for i, u := range batch {
			keys[i] = cache.Key(u)
		}
		got, err := mc.GetMulti(keys)
		return len(got), err
	})
}

// StoreRead measures reading each batch from st directly, the batch's
// reads run in parallel up to fanout (as sluice's per-request
// concurrency does).
func StoreRead(ctx context.Context, st store.Store, concurrency, size, fanout int, duration time.Duration, b *Batches) Result {
	return loop(ctx, "store read directly", concurrency, size, duration, b, func(ctx context.Context, batch []string) (int, error) {
		var found atomic.Int64
		g, ctx := errgroup.WithContext(ctx)
		g.SetLimit(fanout)
		for _, u := range batch {
			g.Go(func() error {
				_, err := st.Get(ctx, u)
				switch {
				case err == nil:
					found.Add(1)
				case errors.Is(err, store.ErrNotFound):
				default:
					return err
				}
				return nil
			})
		}
		err := g.Wait()
		return int(found.Load()), err
	})
}

// StoreBatchRead is StoreRead with each batch read in one call to the
// store's GetMany (for the embedded store, one read transaction), as
// sluice reads a request's misses.
func StoreBatchRead(ctx context.Context, st store.BatchReader, concurrency, size int, duration time.Duration, b *Batches) Result {
	return loop(ctx, "store read directly, one GetMany per batch", concurrency, size, duration, b, func(ctx context.Context, batch []string) (int, error) {
		recs, err := st.GetMany(ctx, batch)
		return len(recs), err
	})
}

// WritePathResult is one mixed run: writers putting records while readers
// read batches, against one server.
type WritePathResult struct {
	Name         string  `json:"name"`
	Writers      int     `json:"writers"`
	Readers      int     `json:"readers"`
	Batch        int     `json:"batch"`
	Seconds      float64 `json:"seconds"`
	Writes       int64   `json:"writes"`
	WriteErrors  int64   `json:"write_errors"`
	WritesPerSec float64 `json:"writes_per_sec"`
	Reads        int64   `json:"reads"`
	ReadErrors   int64   `json:"read_errors"`
	// ReadLatencies are every successful read's latency, in seconds.
	ReadLatencies []float64 `json:"-"`
	FirstError    string    `json:"first_error,omitempty"`
}

// WritePath measures sluice's write path at target beside its reads:
// writers workers each rewrite their own share of writeURIs, one record
// per PutPostRecords, back to back, with a new CID each time (so every
// write invalidates a cached entry), while readers workers read batches
// from b. It returns the writes per second and every read's latency.
func WritePath(ctx context.Context, name, target string, writers, readers int, duration time.Duration, writeURIs []string, b *Batches) (WritePathResult, error) {
	if writers < 1 || len(writeURIs) < writers {
		return WritePathResult{}, fmt.Errorf("throughput: %d writers need at least as many URIs to write, got %d", writers, len(writeURIs))
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return WritePathResult{}, fmt.Errorf("throughput: connect to %s: %w", target, err)
	}
	defer conn.Close()
	client := sluicev1.NewPostRecordsClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, "x-client-id", "bench")
	res := WritePathResult{Name: name, Writers: writers, Readers: readers, Batch: b.size}
	var writes, writeErrs, reads, readErrs atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) { firstErr.CompareAndSwap(nil, err.Error()) }
	lat := make([][]float64, readers)
	stop, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	gw := new(errgroup.Group)
	gw.SetLimit(writers)
	gr := new(errgroup.Group)
	gr.SetLimit(readers)
	start := time.Now()
	for w := range writers {
		share := (len(writeURIs) - w + writers - 1) / writers // writeURIs[w], [w+writers], …
		gw.Go(func() error {
			for i := 0; stop.Err() == nil && ctx.Err() == nil; i++ {
				uri := writeURIs[w+writers*(i%share)]
				rec := &sluicev1.PostRecord{Uri: uri, Cid: fmt.Sprintf("bafyreiwritepath%02d%08d", w, i),
					Record: []byte(`{"$type":"app.bsky.feed.post","text":"rewritten by the write-path benchmark","createdAt":"2024-11-05T14:30:15Z"}`)}
				if _, err := client.PutPostRecords(ctx, &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{rec}}); err != nil {
					writeErrs.Add(1)
					fail(err)
					continue
				}
				writes.Add(1)
			}
			return nil
		})
	}
	for r := range readers {
		gr.Go(func() error {
			for stop.Err() == nil && ctx.Err() == nil {
				t0 := time.Now()
				_, err := client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: b.Next()})
				if err != nil {
					readErrs.Add(1)
					fail(err)
					continue
				}
				reads.Add(1)
				lat[r] = append(lat[r], time.Since(t0).Seconds())
			}
			return nil
		})
	}
	_, _ = gw.Wait(), gr.Wait()
	res.Seconds = time.Since(start).Seconds()
	res.Writes, res.WriteErrors, res.Reads, res.ReadErrors = writes.Load(), writeErrs.Load(), reads.Load(), readErrs.Load()
	res.WritesPerSec = float64(res.Writes) / res.Seconds
	for _, l := range lat {
		res.ReadLatencies = append(res.ReadLatencies, l...)
	}
	if e, ok := firstErr.Load().(string); ok {
		res.FirstError = e
	}
	return res, nil
}
