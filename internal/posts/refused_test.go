package posts

import (
	"bytes"
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// Tests that a cached value the read path refuses (here bytes that are
// no record encoding, as another writer or a damaged item could leave)
// is answered from the store, counted, and replaced: its key is
// tombstoned, so once the tombstone expires a read refills the record
// and the next is a cache hit again. Without the tombstone the refill,
// an ADD, is refused by the bad value and every read of the URI goes to
// the store until the value expires.
func TestRefusedCachedValueIsReplaced(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	rec := synth.New(7, 10).Next()
	if err := bolt.Put(context.Background(), []store.Record{rec}); err != nil {
		t.Fatal(err)
	}
	mc := testenv.StartMemcached(t)
	cfg := cache.DefaultConfig()
	cfg.Servers = []string{mc.Addr()}
	cfg.TombstoneTTL = time.Second
	c, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var refused atomic.Int64
	svc := New(aturi.PostCollection, c, bolt, DefaultWriteLimits(), WithRefusedValues(func(collection string, n int) {
		if collection == aturi.PostCollection {
			refused.Add(int64(n))
		}
	}))

	raw := memcache.New(mc.Addr())
	garbage := []byte("\xff\xfenot a record")
	if err := raw.Set(&memcache.Item{Key: cache.Key(rec.URI), Value: garbage}); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 4)
	got, counts, err := svc.Get(ctx, []string{rec.URI})
	if err != nil || counts.FromStore != 1 || got[0].Record.CID != rec.CID {
		t.Fatalf("read over a bad value: counts %+v, err %v, cid %q; want the stored record (cid %q) from the store", counts, err, got[0].Record.CID, rec.CID)
	}
	if n := refused.Load(); n != 1 {
		t.Errorf("refused values counted: %d, want 1", n)
	}
	if it, err := raw.Get(cache.Key(rec.URI)); err == nil && bytes.Equal(it.Value, garbage) {
		t.Fatal("the refused value is still cached after the read")
	}

	deadline := time.Now().Add(20 * time.Second)
	for {
		got, counts, err := svc.Get(ctx, []string{rec.URI})
		if err != nil || got[0].Record.CID != rec.CID {
			t.Fatalf("read: %v, cid %q; want %q", err, got[0].Record.CID, rec.CID)
		}
		if counts.FromCache == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no read was a cache hit 20 s after the refused value was tombstoned (a 1 s tombstone)")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := refused.Load(); n != 1 {
		t.Errorf("refused values counted: %d, want 1 (the tombstone and the refill read as a miss and a hit, not as refusals)", n)
	}
}

// Tests that a refused cached value is counted and tombstoned even when
// the store read that should answer it fails: the read fails, but the
// bad value is on its way out, and the count shows it during the outage.
func TestRefusedCachedValueIsTombstonedWhenTheStoreFails(t *testing.T) {
	mc := testenv.StartMemcached(t)
	cfg := cache.DefaultConfig()
	cfg.Servers = []string{mc.Addr()}
	c, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var refused atomic.Int64
	svc := New(aturi.PostCollection, c, failingStore{}, DefaultWriteLimits(), WithRefusedValues(func(_ string, n int) { refused.Add(int64(n)) }))
	uri := synth.New(7, 10).Next().URI
	raw := memcache.New(mc.Addr())
	garbage := []byte("\xff\xfenot a record")
	if err := raw.Set(&memcache.Item{Key: cache.Key(uri), Value: garbage}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.Get(testCtx(t, 4), []string{uri}); err == nil {
		t.Fatal("a read over a bad value with the store down succeeded")
	}
	if n := refused.Load(); n != 1 {
		t.Errorf("refused values counted: %d, want 1", n)
	}
	if it, err := raw.Get(cache.Key(uri)); err == nil && bytes.Equal(it.Value, garbage) {
		t.Error("the refused value is still cached after the failed read")
	}
}
