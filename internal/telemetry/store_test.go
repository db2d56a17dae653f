package telemetry

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/promtext"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
)

// Tests that an instrumented store reads in batches exactly when its
// backend does, and that a batch read is counted per URI asked for, with
// one latency sample of op get_many.
func TestInstrumentedStoreKeepsBatchReads(t *testing.T) {
	tel, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	ctx := context.Background()
	now := time.Now()
	recs := []store.Record{
		{URI: "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3k1", CID: "c1", JSON: []byte(`{}`), CreatedAt: now, IndexedAt: now},
		{URI: "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3k2", CID: "c2", JSON: []byte(`{}`), CreatedAt: now, IndexedAt: now},
	}
	if err := bolt.Put(ctx, recs); err != nil {
		t.Fatal(err)
	}

	plain, err := tel.InstrumentStore(struct{ store.Store }{bolt})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := plain.(store.BatchReader); ok {
		t.Error("a store without batch reads was instrumented as one with them")
	}
	st, err := tel.InstrumentStore(bolt)
	if err != nil {
		t.Fatal(err)
	}
	br, ok := st.(store.BatchReader)
	if !ok {
		t.Fatal("the embedded store's batch reads were lost by instrumenting it")
	}
	got, err := br.GetMany(ctx, []string{recs[0].URI, recs[1].URI, recs[0].URI[:len(recs[0].URI)-1] + "9"})
	if err != nil || len(got) != 2 {
		t.Fatalf("GetMany: %d records, %v; want 2", len(got), err)
	}

	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	fams, err := promtext.Scrape(ctx, nil, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"sluice_store_reads_total", map[string]string{"result": "found"}, 2},
		{"sluice_store_reads_total", map[string]string{"result": "not_found"}, 1},
		{"sluice_store_read_duration_seconds", map[string]string{"op": "get_many"}, 1},
		{"sluice_store_read_duration_seconds", map[string]string{"op": "get"}, 0},
	} {
		if got := fams.Sum(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
