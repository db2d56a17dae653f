package posts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/testenv"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gatedStore wraps a real store: it counts Get calls and can hold a Get
// for one URI after it has read, until released. A real store cannot be
// paused at that instant, which is what these tests need.
type gatedStore struct {
	store.Store
	gets     atomic.Int64
	delay    time.Duration
	mu       sync.Mutex  // guards reached and failURI
	failURI  string      // batch reads asking for it fail (gatedBatchStore)
	panics   atomic.Bool // the next batch read panics (gatedBatchStore)
	holdURI  string
	reached  chan struct{}
	released chan struct{}
}

func (g *gatedStore) Get(ctx context.Context, uri string) (store.Record, error) {
	g.gets.Add(1)
	rec, err := g.Store.Get(ctx, uri)
	time.Sleep(g.delay)
	g.holdIf(uri == g.holdURI)
	return rec, err
}

// holdIf holds the caller until released if held is set and no call is
// held yet.
func (g *gatedStore) holdIf(held bool) {
	if !held {
		return
	}
	g.mu.Lock()
	reached := g.reached
	g.reached = nil
	g.mu.Unlock()
	if reached != nil {
		close(reached)
		<-g.released
	}
}

// gatedBatchStore is a gatedStore that also reads in batches
// (store.BatchReader), as the CQL and embedded stores do: each URI a
// GetMany asks for counts as one read, and a GetMany that asks for the
// held URI is held. A GetMany that asks for failURI fails, as a CQL
// group that failed fails its batch read; one whose context ended while
// it was held returns the context's error.
type gatedBatchStore struct {
	*gatedStore
	batch store.BatchReader
}

func (g gatedBatchStore) GetMany(ctx context.Context, uris []string) (map[string]store.Record, error) {
	g.gets.Add(int64(len(uris)))
	if g.panics.CompareAndSwap(true, false) {
		panic("gatedBatchStore: a batch read panics, as asked")
	}
	recs, err := g.batch.GetMany(ctx, uris)
	time.Sleep(g.delay)
	g.holdIf(slices.Contains(uris, g.holdURI))
	g.mu.Lock()
	failURI := g.failURI
	g.mu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case failURI != "" && slices.Contains(uris, failURI):
		return nil, fmt.Errorf("%w: the group holding %s failed", store.ErrUnavailable, failURI)
	}
	return recs, err
}

// answer is the outcome of one Get.
type answer struct {
	res []Result
	err error
}

// getLater runs svc.Get(ctx, uris) on a goroutine of its own; its answer
// comes on the channel it returns.
func getLater(ctx context.Context, svc *Service, uris ...string) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		res, _, err := svc.Get(ctx, uris)
		done <- answer{res, err}
	}()
	return done
}

// readShapes are the two ways the read path reads misses from a store:
// one coalesced Get per URI, or batch reads shared between requests.
var readShapes = []struct {
	name  string
	batch bool
}{{"one by one", false}, {"in batches", true}}

// hold has g hold the next Get of uri, once it has read, until
// released is closed; the channel it returns is closed when one is held.
func (g *gatedStore) hold(uri string) <-chan struct{} {
	g.holdURI, g.reached, g.released = uri, make(chan struct{}), make(chan struct{})
	return g.reached
}

// newVersion is r with other text.
func newVersion(r store.Record) store.Record {
	r.JSON = bytes.Replace(r.JSON, []byte(`"text":"`), []byte(`"text":"v2 `), 1)
	return r
}

func newService(t *testing.T, n int) (*Service, *gatedStore, []store.Record) {
	t.Helper()
	return newServiceReading(t, n, false)
}

// newServiceReading is newService over a store that reads in batches
// when batch is set.
func newServiceReading(t *testing.T, n int, batch bool) (*Service, *gatedStore, []store.Record) {
	t.Helper()
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	gen := synth.New(3, 10)
	recs := make([]store.Record, n)
	for i := range recs {
		recs[i] = gen.Next()
	}
	if err := bolt.Put(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	cfg := cache.DefaultConfig()
	cfg.Servers = []string{testenv.StartMemcached(t).Addr()}
	cfg.TombstoneTTL = 3 * time.Second
	c, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	gs := &gatedStore{Store: bolt}
	if batch {
		return New(aturi.PostCollection, c, gatedBatchStore{gs, bolt}, DefaultWriteLimits()), gs, recs
	}
	return New(aturi.PostCollection, c, gs, DefaultWriteLimits()), gs, recs
}

func testCtx(t *testing.T, limit int) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return fanout.WithLimit(ctx, limit)
}

// Tests that concurrent misses of the same URI cause one store read.
func TestConcurrentMissesShareOneStoreRead(t *testing.T) {
	for _, shape := range readShapes {
		t.Run(shape.name, func(t *testing.T) {
			svc, gs, recs := newServiceReading(t, 1, shape.batch)
			gs.delay = 100 * time.Millisecond
			const callers = 32
			ctx := testCtx(t, callers)
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, _, err := svc.Get(ctx, []string{recs[0].URI})
					if err == nil && !res[0].Found {
						err = errors.New("not found")
					}
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if n := gs.gets.Load(); n > 2 {
				t.Errorf("%d concurrent misses made %d store reads, want 1 (2 at most if a caller arrived after the first read returned)", callers, n)
			}
			if svc.Coalesced() == 0 {
				t.Error("no read was coalesced")
			}
		})
	}
}

// Tests that a read which fetched the old version before a write cannot
// put it back into the cache after the write: the write's tombstone
// makes the refill's memcached add fail.
func TestSlowReadCannotRefillAStaleVersion(t *testing.T) {
	for _, shape := range readShapes {
		t.Run(shape.name, func(t *testing.T) {
			svc, gs, recs := newServiceReading(t, 1, shape.batch)
			target := recs[0]
			reached := gs.hold(target.URI)
			ctx := testCtx(t, 4)

			readDone := getLater(ctx, svc, target.URI)
			<-reached // the slow read holds the old version

			updated := newVersion(target)
			if _, err := svc.Put(ctx, []store.Record{updated}); err != nil {
				t.Fatal(err)
			}
			close(gs.released)
			if old := <-readDone; old.err != nil || !bytes.Equal(old.res[0].Record.JSON, target.JSON) {
				t.Fatalf("the slow read should have returned the version it read (error %v)", old.err)
			}
			for i := range 3 {
				res, _, err := svc.Get(ctx, []string{target.URI})
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(res[0].Record.JSON, updated.JSON) {
					t.Fatalf("read %d after the write returned the stale version (from cache: %v)", i, res[0].FromCache)
				}
			}
		})
	}
}

// Tests that a read which begins after a write was acknowledged never
// answers the old version by sharing a store read that began before the
// write (reads of one URI share one store read while it is in flight).
func TestReadAfterWriteSharesNoOlderRead(t *testing.T) {
	for _, shape := range readShapes {
		t.Run(shape.name, func(t *testing.T) {
			svc, gs, recs := newServiceReading(t, 1, shape.batch)
			target := recs[0]
			reached := gs.hold(target.URI)
			ctx := testCtx(t, 4)
			firstDone := make(chan struct{})
			go func() {
				defer close(firstDone)
				_, _, _ = svc.Get(ctx, []string{target.URI})
			}()
			<-reached // the first read holds the old version, still in flight

			updated := newVersion(target)
			if _, err := svc.Put(ctx, []store.Record{updated}); err != nil {
				t.Fatal(err)
			}
			after := getLater(ctx, svc, target.URI)
			// Time for the read after the write to join the one in flight; were
			// it slower, it would read on its own and the test would pass
			// without showing anything, never fail wrongly.
			time.Sleep(500 * time.Millisecond)
			close(gs.released)
			<-firstDone
			if a := <-after; a.err != nil || !bytes.Equal(a.res[0].Record.JSON, updated.JSON) {
				t.Fatalf("a read begun after the write was acknowledged: error %v, or the old version returned", a.err)
			}
			t.Logf("reads that shared a store read: %d (2 when the read after the write joined the one in flight)", svc.Coalesced())
		})
	}
}

// Tests that a request which joined another's batch read is not failed
// by it: when the shared read fails (a part of the leader's batch that
// did not hold the waiter's URI failed, or the leader gave up), the
// waiter reads its URI on its own and answers it.
func TestWaiterOutlivesAFailedSharedRead(t *testing.T) {
	for _, c := range []struct {
		name string
		fail func(gs *gatedStore, failing string, cancelLeader context.CancelFunc)
	}{
		{"a group without the waiter's URI failed", func(gs *gatedStore, failing string, _ context.CancelFunc) { gs.failURI = failing }},
		{"the leader gave up", func(_ *gatedStore, _ string, cancelLeader context.CancelFunc) { cancelLeader() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc, gs, recs := newServiceReading(t, 2, true)
			shared, failing := recs[0], recs[1]
			reached := gs.hold(shared.URI)
			ctx := testCtx(t, 4)
			leaderCtx, cancelLeader := context.WithCancel(ctx)
			defer cancelLeader()
			leaderDone := getLater(leaderCtx, svc, shared.URI, failing.URI)
			<-reached // the leader's batch read, holding both URIs, is under way
			waiter := getLater(ctx, svc, shared.URI)
			// Time for the waiter to join the read in flight; were it
			// slower, it would read on its own and the test would pass
			// without showing anything, never fail wrongly.
			time.Sleep(500 * time.Millisecond)
			gs.mu.Lock()
			c.fail(gs, failing.URI, cancelLeader)
			gs.mu.Unlock()
			close(gs.released)
			if a := <-leaderDone; a.err == nil {
				t.Fatal("the leader's read succeeded; the test did not fail it")
			}
			gs.mu.Lock()
			gs.failURI = ""
			gs.mu.Unlock()
			got := <-waiter
			if got.err != nil {
				t.Fatalf("the waiter failed with the shared read: %v", got.err)
			}
			if !got.res[0].Found || !bytes.Equal(got.res[0].Record.JSON, shared.JSON) {
				t.Fatalf("the waiter answered %+v, want the stored record", got.res[0])
			}
			if svc.Coalesced() == 0 {
				t.Error("the waiter did not join the leader's read; nothing was shown")
			}
		})
	}
}

// Tests that a batch read that panics leaves no shared read behind: a
// later read of the same URI is answered, not kept waiting for a read
// that will never land.
func TestPanickedBatchReadIsNotWaitedFor(t *testing.T) {
	svc, gs, recs := newServiceReading(t, 1, true)
	ctx := testCtx(t, 4)
	gs.panics.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the batch read did not panic")
			}
		}()
		_, _, _ = svc.Get(ctx, []string{recs[0].URI})
	}()
	later, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, _, err := svc.Get(later, []string{recs[0].URI})
	if err != nil || !res[0].Found {
		t.Fatalf("a read after the panic: %+v, %v; want the record", res, err)
	}
}

// Tests that two read-modify-writes of one record on a replica never
// lose one's change: a takedown set while a gate-flag update of the same
// post is between its read and its write is kept, and so is the flag.
func TestUpdatesOfOneRecordKeepBothChanges(t *testing.T) {
	svc, gs, recs := newService(t, 1)
	target := recs[0]
	reached := gs.hold(target.URI)
	ctx := testCtx(t, 4)
	gateDone := make(chan error)
	go func() {
		_, err := svc.Update(ctx, target.URI, func(r *store.Record) bool { r.Gates.HasThreadGate = true; return true })
		gateDone <- err
	}()
	<-reached // the gate update has read the record and not written it yet
	takedownDone := make(chan error)
	go func() {
		_, err := svc.Update(ctx, target.URI, func(r *store.Record) bool { r.TakedownRef = "mod:1"; return true })
		takedownDone <- err
	}()
	// Time for the takedown to be written, were nothing to stop it.
	time.Sleep(200 * time.Millisecond)
	close(gs.released)
	for _, done := range []chan error{gateDone, takedownDone} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	rec, _, err := svc.Stored(ctx, target.URI)
	if err != nil {
		t.Fatal(err)
	}
	if rec.TakedownRef != "mod:1" || !rec.Gates.HasThreadGate {
		t.Fatalf("stored takedown %q, thread gate %v: want both changes kept", rec.TakedownRef, rec.Gates.HasThreadGate)
	}
}

// Tests that a store failure fails the whole batch, never a partial
// answer, and that cache hits in the same batch do not hide it.
func TestStoreFailureFailsTheBatch(t *testing.T) {
	svc, _, recs := newService(t, 3)
	ctx := testCtx(t, 4)
	if _, _, err := svc.Get(ctx, []string{recs[0].URI}); err != nil { // warm one
		t.Fatal(err)
	}
	svc.store = failingStore{svc.store}
	_, _, err := svc.Get(ctx, []string{recs[0].URI, recs[1].URI, recs[2].URI})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v, want store.ErrUnavailable", err)
	}
	res, _, err := svc.Get(ctx, []string{recs[0].URI})
	if err != nil || !res[0].FromCache {
		t.Fatalf("a cached record should still be served: %v %+v", err, res)
	}
}

type failingStore struct{ store.Store }

func (failingStore) Get(context.Context, string) (store.Record, error) {
	return store.Record{}, store.ErrUnavailable
}

// batchStore wraps the real embedded store, which reads in batches, and
// records what the service asked of it.
type batchStore struct {
	*boltstore.Store
	gets    atomic.Int64
	batches [][]string
	fail    bool
}

func (b *batchStore) Get(ctx context.Context, uri string) (store.Record, error) {
	b.gets.Add(1)
	return b.Store.Get(ctx, uri)
}

func (b *batchStore) GetMany(ctx context.Context, uris []string) (map[string]store.Record, error) {
	b.batches = append(b.batches, uris)
	if b.fail {
		return nil, store.ErrUnavailable
	}
	return b.Store.GetMany(ctx, uris)
}

// newBatchService is newService over a store that reads in batches.
func newBatchService(t *testing.T, n int) (*Service, *batchStore, []store.Record) {
	t.Helper()
	svc, gs, recs := newService(t, n)
	bs := &batchStore{Store: gs.Store.(*boltstore.Store)}
	svc.store = bs
	return svc, bs, recs
}

// Tests that with a store that reads in batches, a request's misses are
// read in one call, each unique URI once, and answered in order.
func TestMissesAreReadInOneBatch(t *testing.T) {
	svc, bs, recs := newBatchService(t, 4)
	ctx := testCtx(t, 4)
	if _, _, err := svc.Get(ctx, []string{recs[0].URI, recs[1].URI}); err != nil { // warm two
		t.Fatal(err)
	}
	bs.batches = nil
	missing := "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3kmissing"
	uris := []string{recs[0].URI, recs[2].URI, missing, recs[3].URI, recs[2].URI, recs[1].URI}
	res, _, err := svc.Get(ctx, uris)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs.batches) != 1 || len(bs.batches[0]) != 3 {
		t.Fatalf("store batch reads = %q, want one of the 3 unique misses", bs.batches)
	}
	if n := bs.gets.Load(); n != 0 {
		t.Errorf("%d point reads, want 0 when the store reads in batches", n)
	}
	for i, uri := range uris {
		wantFound := uri != missing
		if res[i].Record.URI != uri || res[i].Found != wantFound {
			t.Errorf("result %d = %s found=%v, want %s found=%v", i, res[i].Record.URI, res[i].Found, uri, wantFound)
		}
	}
	if !bytes.Equal(res[1].Record.JSON, recs[2].JSON) {
		t.Errorf("result 1 JSON = %s, want %s", res[1].Record.JSON, recs[2].JSON)
	}
}

// Tests that a failed batch read fails the whole request, as a failed
// point read does.
func TestFailedBatchReadFailsTheRequest(t *testing.T) {
	svc, bs, recs := newBatchService(t, 2)
	bs.fail = true
	_, _, err := svc.Get(testCtx(t, 4), []string{recs[0].URI, recs[1].URI})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v, want store.ErrUnavailable", err)
	}
}

// Tests that a batch with repeated and missing URIs is answered at every
// position, in request order, from the store and the cache together and
// from the cache alone, and that each distinct URI is counted once and
// read from the store at most once.
func TestRepeatsAreAnsweredAtEachPosition(t *testing.T) {
	svc, gs, recs := newService(t, 3)
	missing := "at://did:plc:abcdefghijklmnopqrstuvwx/app.bsky.feed.post/3kmissing"
	uris := []string{recs[1].URI, recs[0].URI, recs[1].URI, missing, recs[2].URI, missing, recs[0].URI}
	want := []string{recs[1].URI, recs[0].URI, recs[1].URI, "", recs[2].URI, "", recs[0].URI}
	if _, _, err := svc.Get(testCtx(t, 8), []string{recs[0].URI}); err != nil {
		t.Fatal(err) // recs[0] is cached: the first pass mixes hits and misses
	}
	for _, pass := range []struct {
		name   string
		counts Counts
		reads  int64 // store reads so far, the warm-up's included
	}{
		{"store and cache", Counts{FromCache: 1, FromStore: 2, NotFound: 1}, 4},
		{"cache", Counts{FromCache: 3, NotFound: 1}, 4}, // the missing URI is cached as missing
	} {
		res, counts, err := svc.Get(testCtx(t, 8), uris)
		if err != nil {
			t.Fatalf("%s: %v", pass.name, err)
		}
		if len(res) != len(uris) {
			t.Fatalf("%s: %d results for %d URIs", pass.name, len(res), len(uris))
		}
		for i, r := range res {
			if r.Record.URI != uris[i] || r.Found != (want[i] != "") {
				t.Errorf("%s: result %d = %s found=%v, want %s found=%v", pass.name, i, r.Record.URI, r.Found, uris[i], want[i] != "")
			}
			if r.Found && !bytes.Equal(r.Record.JSON, recordByURI(recs, uris[i]).JSON) {
				t.Errorf("%s: result %d holds another record's JSON", pass.name, i)
			}
		}
		if counts != pass.counts {
			t.Errorf("%s: counts %+v, want %+v", pass.name, counts, pass.counts)
		}
		if n := gs.gets.Load(); n != pass.reads {
			t.Errorf("%s: %d store reads so far, want %d (the warm-up's, then each distinct miss once)", pass.name, n, pass.reads)
		}
	}
}

func recordByURI(recs []store.Record, uri string) store.Record {
	for _, r := range recs {
		if r.URI == uri {
			return r
		}
	}
	return store.Record{}
}

// Tests positions: distinct URIs in first-seen order, and where each
// request position's URI is among them.
func TestPositions(t *testing.T) {
	for _, tc := range []struct {
		in, unique []string
		at         []int
	}{
		{in: nil, unique: nil},
		{in: []string{"a"}, unique: []string{"a"}},
		{in: []string{"a", "b", "c"}, unique: []string{"a", "b", "c"}},
		{in: []string{"a", "a"}, unique: []string{"a"}, at: []int{0, 0}},
		{in: []string{"a", "b", "a", "c", "b", "d"}, unique: []string{"a", "b", "c", "d"}, at: []int{0, 1, 0, 2, 1, 3}},
	} {
		unique, at := positions(tc.in)
		if !slices.Equal(unique, tc.unique) || !slices.Equal(at, tc.at) {
			t.Errorf("positions(%q) = %q, %v; want %q, %v", tc.in, unique, at, tc.unique, tc.at)
		}
	}
}

// Tests that GetEncoded answers a record read from the store with the
// encoding the cache was refilled with, and that it is the record: the
// same bytes a later read finds in the cache, decoding to what was stored.
// Get answers it decoded.
func TestGetEncodedKeepsStoreReadsEncoding(t *testing.T) {
	svc, _, recs := newService(t, 2)
	ctx := testCtx(t, 4)
	missing := "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3kabsentxyz22"
	uris := []string{recs[0].URI, missing}
	cold, counts, err := svc.GetEncoded(ctx, uris)
	if err != nil {
		t.Fatal(err)
	}
	if counts.FromStore != 1 || counts.NotFound != 1 || cold.At(0).FromCache {
		t.Fatalf("first read: counts %+v, want one record from the store and one not found", counts)
	}
	if cold.At(0).Wire == nil || cold.At(1).Wire != nil || cold.At(1).Found {
		t.Fatalf("first read: wire %d bytes for the stored record, %d for the missing one (found %v); want the encoding, and none for a missing record", len(cold.At(0).Wire), len(cold.At(1).Wire), cold.At(1).Found)
	}
	var pr sluicev1.PostRecord
	if err := proto.Unmarshal(cold.At(0).Wire, &pr); err != nil {
		t.Fatalf("the store read's encoding does not decode: %v", err)
	}
	if got := FromProto(&pr); got.URI != recs[0].URI || got.CID != recs[0].CID || !bytes.Equal(got.JSON, recs[0].JSON) {
		t.Errorf("the store read's encoding decodes to %+v, want the stored record %+v", got, recs[0])
	}
	warm, counts, err := svc.GetEncoded(ctx, uris[:1])
	if err != nil || counts.FromCache != 1 || !bytes.Equal(warm.At(0).Wire, cold.At(0).Wire) {
		t.Errorf("second read: counts %+v, err %v; want the cache's bytes equal to the first answer's", counts, err)
	}
	other, _, err := svc.Get(ctx, []string{recs[1].URI})
	if err != nil || other[0].Wire != nil || other[0].Record.CID != recs[1].CID {
		t.Errorf("Get of a store read: %+v, %v; want the decoded record and no wire bytes", other[0], err)
	}
}

// Tests that GetEncoded answers a URI asked more than once at each of its
// positions, in request order, from one read.
func TestGetEncodedRepeatedURIs(t *testing.T) {
	svc, _, recs := newService(t, 3)
	ctx := testCtx(t, 4)
	uris := []string{recs[0].URI, recs[1].URI, recs[0].URI, recs[2].URI, recs[0].URI, recs[1].URI}
	for pass := range 2 { // from the store, then from the cache
		answers, counts, err := svc.GetEncoded(ctx, uris)
		if err != nil {
			t.Fatal(err)
		}
		if answers.Len() != len(uris) {
			t.Fatalf("pass %d: %d answers for %d URIs", pass, answers.Len(), len(uris))
		}
		for i, uri := range uris {
			r := answers.At(i)
			var pr sluicev1.PostRecord
			if err := proto.Unmarshal(r.Wire, &pr); err != nil || !r.Found || pr.GetUri() != uri {
				t.Errorf("pass %d: answer %d = %q (found %v, err %v), want %s", pass, i, pr.GetUri(), r.Found, err, uri)
			}
		}
		if got := counts.FromStore + counts.FromCache; got != 3 {
			t.Errorf("pass %d: counts %+v, want the 3 distinct URIs read once each", pass, counts)
		}
	}
}

// The read path takes the service's collection as a valid NSID
// (aturi.ParseIn), so a service cannot be made for one that is not.
func TestNewRefusesAnInvalidCollection(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "app..post") {
			t.Errorf("New with collection app..post: panic %v, want one naming it", r)
		}
	}()
	New("app..post", nil, nil, WriteLimits{})
}

// Tests UpsertMany: a URI given twice is changed twice, a new record is
// created and checked, the changed records are read back through the
// cache as changed, and a change that breaks the write rules fails the
// call with nothing written.
func TestUpsertManyChangesEachRecordInOrder(t *testing.T) {
	svc, _, recs := newService(t, 1)
	ctx := testCtx(t, 4)
	a := recs[0]
	if _, _, err := svc.Get(ctx, []string{a.URI}); err != nil { // cached
		t.Fatal(err)
	}
	fresh := strings.Replace(a.URI, a.URI[strings.LastIndex(a.URI, "/")+1:], "3knewrecord22", 1)
	var sawExisted []bool
	err := svc.UpsertMany(ctx, []string{a.URI, fresh, a.URI}, func(r *store.Record, existed bool) bool {
		sawExisted = append(sawExisted, existed)
		if !existed && len(r.JSON) == 0 {
			r.CID, r.JSON = "bafy-new", []byte(`{"$type":"app.bsky.feed.post","text":"new"}`)
		}
		r.Tags = append(r.Tags, "t")
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, true}; !slices.Equal(sawExisted, want) {
		t.Errorf("existed seen %v, want %v", sawExisted, want)
	}
	res, _, err := svc.Get(ctx, []string{a.URI, fresh})
	if err != nil {
		t.Fatal(err)
	}
	if got := res[0].Record.Tags; len(got) != 2 {
		t.Errorf("record given twice has tags %v through the cache, want two", got)
	}
	if !res[1].Found || res[1].Record.IndexedAt.IsZero() || len(res[1].Record.Tags) != 1 {
		t.Errorf("new record: %+v, want it created, indexed and tagged once", res[1])
	}
	bad := strings.Replace(fresh, "3knewrecord22", "3kbadrecord22", 1)
	err = svc.UpsertMany(ctx, []string{a.URI, bad}, func(r *store.Record, existed bool) bool {
		r.Tags = append(r.Tags, "u")
		if !existed {
			r.JSON = []byte(`{"$type":"app.bsky.feed.like"}`)
		}
		return true
	})
	var invalid *InvalidRecordError
	if !errors.As(err, &invalid) {
		t.Fatalf("UpsertMany with a record breaking the rules = %v, want InvalidRecordError", err)
	}
	if rec, _, _ := svc.Stored(ctx, a.URI); len(rec.Tags) != 2 {
		t.Errorf("after the failed call the record has tags %v, want it unchanged", rec.Tags)
	}
}

// Tests that UpsertMany is serialised with the other writes of its
// records: an Update of a record UpsertMany has read and not written yet
// waits for it, and both changes are kept.
func TestUpsertManyKeepsAConcurrentUpdate(t *testing.T) {
	svc, gs, recs := newService(t, 1)
	target := recs[0]
	reached := gs.hold(target.URI)
	ctx := testCtx(t, 4)
	manyDone := make(chan error)
	go func() {
		manyDone <- svc.UpsertMany(ctx, []string{target.URI}, func(r *store.Record, _ bool) bool { r.Gates.HasPostGate = true; return true })
	}()
	<-reached
	updateDone := make(chan error)
	go func() {
		_, err := svc.Update(ctx, target.URI, func(r *store.Record) bool { r.TakedownRef = "mod:2"; return true })
		updateDone <- err
	}()
	time.Sleep(200 * time.Millisecond) // time for the update to be written, were nothing to stop it
	close(gs.released)
	for _, done := range []chan error{manyDone, updateDone} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	rec, _, err := svc.Stored(ctx, target.URI)
	if err != nil {
		t.Fatal(err)
	}
	if rec.TakedownRef != "mod:2" || !rec.Gates.HasPostGate {
		t.Fatalf("stored takedown %q, post gate %v: want both changes kept", rec.TakedownRef, rec.Gates.HasPostGate)
	}
}
