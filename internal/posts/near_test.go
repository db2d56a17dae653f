package posts

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/nearcache"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// newNearService returns a Service reading through a near cache (with a
// TTL long enough that nothing expires during the test, built with opts)
// in front of a real memcached, over a real embedded store holding n
// records. memcached's tombstones last 2 s, the shortest that outlives a
// second (memcached counts whole seconds), so that a test can wait for a
// record to be cached again after a write.
func newNearService(t *testing.T, n int, opts ...nearcache.Option) (*Service, *nearcache.Cache, []store.Record) {
	t.Helper()
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	gen := synth.New(5, 10)
	recs := make([]store.Record, n)
	for i := range recs {
		recs[i] = gen.Next()
	}
	if err := bolt.Put(testCtx(t, 1), recs); err != nil {
		t.Fatal(err)
	}
	cfg := cache.DefaultConfig()
	cfg.Servers = []string{testenv.StartMemcached(t).Addr()}
	cfg.TombstoneTTL = nearTombstoneTTL
	c, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	near, err := nearcache.New(nearcache.Config{TTL: nearcache.MaxTTL, MaxBytes: 1 << 20}, c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { near.Close() })
	return New(aturi.PostCollection, near, bolt, DefaultWriteLimits()), near, recs
}

// nearTombstoneTTL is the tombstone lifetime of newNearService's
// memcached: an item set for 2 s lives between 1 s and 2 s.
const nearTombstoneTTL = 2 * time.Second

// nearChecks are the ways the near cache is built in front of the read
// path: as production builds it (internal/app), keeping only the entries
// CheckEntry accepts and answering them marked Checked, which the read
// path then does not check again; and without a check, every entry
// checked on every read. A record answered from memory under "checked"
// was accepted by CheckEntry and answered Checked: with the check, the
// near cache keeps nothing else.
var nearChecks = []struct {
	name string
	opts []nearcache.Option
}{
	{"checked", []nearcache.Option{nearcache.WithCheck(CheckEntry)}},
	{"unchecked", nil},
}

// warmNear reads uri until the near cache answers it.
func warmNear(t *testing.T, svc *Service, near *nearcache.Cache, uri string) {
	t.Helper()
	ctx := testCtx(t, 4)
	for range 5 {
		before := near.Stats().Hits
		if _, _, err := svc.Get(ctx, []string{uri}); err != nil {
			t.Fatal(err)
		}
		if near.Stats().Hits > before {
			return
		}
	}
	t.Fatal("five reads of one record and the near cache answered none")
}

// Tests that after a write, a delete or a takedown on this replica
// returns, no read is answered with the record as it was before, though
// the near cache held it; with the near cache built as production builds
// it and without the check.
func TestNearCacheNeverServesARecordAfterThisReplicaChangedIt(t *testing.T) {
	for _, nc := range nearChecks {
		t.Run(nc.name, func(t *testing.T) {
			svc, near, recs := newNearService(t, 3, nc.opts...)
			ctx := testCtx(t, 4)

			updated := newVersion(recs[0])
			updated.CID = "bafy-v2"
			warmNear(t, svc, near, recs[0].URI)
			if _, err := svc.Put(ctx, []store.Record{updated}); err != nil {
				t.Fatal(err)
			}
			res, _, err := svc.Get(ctx, []string{recs[0].URI})
			if err != nil || res[0].Record.CID != updated.CID {
				t.Fatalf("read after a write: CID %s (from cache %v), err %v; want CID %s", res[0].Record.CID, res[0].FromCache, err, updated.CID)
			}

			warmNear(t, svc, near, recs[1].URI)
			if _, err := svc.Delete(ctx, []string{recs[1].URI}); err != nil {
				t.Fatal(err)
			}
			if res, _, err := svc.Get(ctx, []string{recs[1].URI}); err != nil || res[0].Found {
				t.Fatalf("read after a delete: found %v (from cache %v), err %v; want not found", res[0].Found, res[0].FromCache, err)
			}

			warmNear(t, svc, near, recs[2].URI)
			if _, err := svc.Update(ctx, recs[2].URI, func(r *store.Record) bool { r.TakedownRef = "mod-1"; return true }); err != nil {
				t.Fatal(err)
			}
			if res, _, err := svc.Get(ctx, []string{recs[2].URI}); err != nil || res[0].Record.TakedownRef != "mod-1" {
				t.Fatalf("read after a takedown: takedown_ref %q (from cache %v), err %v; want mod-1", res[0].Record.TakedownRef, res[0].FromCache, err)
			}
		})
	}
}

// Tests the same under concurrency, with and without the check: readers
// hammer one record, alone (the near cache's Get) and in a batch
// (Lookup), while it is rewritten, and before each write the near cache
// answers the version written last (the test waits for that: the write's
// tombstone must expire and memcached be refilled first); every read
// that starts after a write returned sees that version or a later one.
// A read gives up after nearReadTimeout, so that, as the config check
// requires of request timeouts, no read that fetched the record before a
// write can refill memcached after the write's tombstone has gone.
func TestNearCacheConcurrentReadsSeeEveryAcknowledgedWrite(t *testing.T) {
	for _, nc := range nearChecks {
		t.Run(nc.name, func(t *testing.T) {
			svc, near, recs := newNearService(t, 2, nc.opts...)
			ctx := testCtx(t, 16)
			uri := recs[0].URI
			var mu sync.RWMutex
			var probing sync.RWMutex // held by each reader's read, alone by the writer's probes
			acked := -1              // the last version whose write returned
			const versions = 2
			stop := make(chan struct{})
			errs := make(chan error, 8)
			var wg sync.WaitGroup
			var readLast atomic.Int64 // readers that read after the last write
			for i := range 4 {
				uris := []string{uri}
				if i%2 == 1 {
					uris = append(uris, recs[1].URI)
				}
				wg.Go(func() {
					readsLast := false
					for {
						select {
						case <-stop:
							return
						default:
						}
						mu.RLock()
						floor := acked
						mu.RUnlock()
						rctx, cancel := context.WithTimeout(ctx, nearReadTimeout)
						probing.RLock()
						res, _, err := svc.Get(rctx, uris)
						probing.RUnlock()
						cancel()
						switch {
						case err != nil && rctx.Err() != nil && ctx.Err() == nil:
							continue // gave up: answered nothing
						case err != nil:
							errs <- err
							return
						}
						if v := cidVersion(res[0]); v < floor {
							errs <- fmt.Errorf("read of %d URIs started after version %d was written returned version %d (from cache %v)", len(uris), floor, v, res[0].FromCache)
							return
						}
						if floor == versions-1 && !readsLast {
							readsLast = true
							readLast.Add(1)
						}
					}
				})
			}
			defer func() { // also when the test fails early
				close(stop)
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Error(err)
				}
			}()

			// serving waits until the near cache answers the record, as
			// of version want: until a read of the writer's own, made
			// while the readers pause (so that the near cache's hits are
			// its own), is answered from memory, and returns that version.
			serving := func(want int) {
				t.Helper()
				for {
					probing.Lock()
					before := near.Stats().Hits
					res, _, err := svc.Get(ctx, []string{uri})
					fromNear := near.Stats().Hits > before
					probing.Unlock()
					if err != nil {
						t.Fatalf("waiting for the near cache to answer version %d: %v (near cache %+v)", want, err, near.Stats())
					}
					if v := cidVersion(res[0]); v != want {
						t.Fatalf("read after version %d was written returned version %d (from cache %v, from the near cache %v)", want, v, res[0].FromCache, fromNear)
					}
					if fromNear {
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			serving(-1)
			for v := range versions {
				rec := recs[0]
				rec.CID = fmt.Sprintf("v%d", v)
				if _, err := svc.Put(ctx, []store.Record{rec}); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				acked = v
				mu.Unlock()
				if v < versions-1 {
					serving(v)
				}
			}
			for readLast.Load() < 4 && len(errs) == 0 { // every reader reads the last version before they stop
				if ctx.Err() != nil {
					t.Fatalf("waiting for the readers to read after the last write: %v", ctx.Err())
				}
				time.Sleep(time.Millisecond)
			}
			if st := near.Stats(); st.Hits == 0 {
				t.Fatalf("the near cache answered no read (%+v): the test proves nothing", st)
			}
		})
	}
}

// nearReadTimeout bounds each concurrent read: it, the cache's timeout
// (the refill's bound, 250 ms) and memcached's second of rounding stay
// under nearTombstoneTTL.
const nearReadTimeout = 500 * time.Millisecond

// cidVersion is the version N of a record whose CID is "vN", -1 for any
// other (the record as first stored).
func cidVersion(r Result) int {
	var v int
	if _, err := fmt.Sscanf(r.Record.CID, "v%d", &v); err != nil {
		return -1
	}
	return v
}
