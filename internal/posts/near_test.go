package posts

import (
	"fmt"
	"path/filepath"
	"sync"
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
// TTL long enough that nothing expires during the test) in front of a
// real memcached, over a real embedded store holding n records.
func newNearService(t *testing.T, n int) (*Service, *nearcache.Cache, []store.Record) {
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
	c, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	near, err := nearcache.New(nearcache.Config{TTL: nearcache.MaxTTL, MaxBytes: 1 << 20}, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { near.Close() })
	return New(aturi.PostCollection, near, bolt, DefaultWriteLimits()), near, recs
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
// the near cache held it.
func TestNearCacheNeverServesARecordAfterThisReplicaChangedIt(t *testing.T) {
	svc, near, recs := newNearService(t, 3)
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
}

// Tests the same under concurrency: readers hammer one record while it
// is rewritten; every read that starts after a write returned sees that
// version or a later one.
func TestNearCacheConcurrentReadsSeeEveryAcknowledgedWrite(t *testing.T) {
	svc, _, recs := newNearService(t, 1)
	ctx := testCtx(t, 16)
	uri := recs[0].URI
	var mu sync.RWMutex
	acked := -1 // the last version whose write returned
	const versions = 30
	stop := make(chan struct{})
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.RLock()
				floor := acked
				mu.RUnlock()
				res, _, err := svc.Get(ctx, []string{uri})
				if err != nil {
					errs <- err
					return
				}
				var v int
				if _, err := fmt.Sscanf(res[0].Record.CID, "v%d", &v); err != nil {
					v = -1
				}
				if v < floor {
					errs <- fmt.Errorf("read started after version %d was written returned version %d (from cache %v)", floor, v, res[0].FromCache)
					return
				}
			}
		}()
	}
	for v := range versions {
		rec := recs[0]
		rec.CID = fmt.Sprintf("v%d", v)
		if _, err := svc.Put(ctx, []store.Record{rec}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		acked = v
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
