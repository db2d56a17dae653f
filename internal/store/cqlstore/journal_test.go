package cqlstore_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocql/gocql"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
)

// cancelAfterRecordWrite cancels a context once a record INSERT or
// DELETE has been answered, as a caller that gives up, or a sibling
// write of the same batch that fails, does between a record's write and
// its journal row's.
type cancelAfterRecordWrite struct {
	mu     sync.Mutex
	cancel context.CancelFunc
}

func (o *cancelAfterRecordWrite) ObserveQuery(_ context.Context, q gocql.ObservedQuery) {
	if q.Err != nil || !strings.HasPrefix(q.Statement, "INSERT INTO records") && !strings.HasPrefix(q.Statement, "DELETE FROM records") {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cancel != nil {
		o.cancel()
	}
}

func (o *cancelAfterRecordWrite) arm(cancel context.CancelFunc) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cancel = cancel
}

// Tests that a record the store has changed gets its journal row even
// when the write's context is cancelled between the two statements: the
// record change cannot be taken back, and without its row other
// replicas would serve the old version until their cache entries
// expire.
func TestJournalRowFollowsAppliedRecordWrite(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_journal_cancel")
	obs := &cancelAfterRecordWrite{}
	cfg.QueryObserver = obs
	cfg.JournalOrigin = "w"
	s := mustOpen(t, cfg)
	defer s.Close()
	ctx := testContext(t)
	const uri = "at://did:plc:cancel/app.bsky.feed.post/3k1"
	rec := store.Record{URI: uri, CID: "c1", JSON: []byte(`{"text":"v1"}`)}

	for _, op := range []struct {
		name string
		do   func(context.Context) error
	}{
		{"put", func(ctx context.Context) error { return s.Put(ctx, []store.Record{rec}) }},
		{"delete", func(ctx context.Context) error { _, err := s.Delete(ctx, []string{uri}); return err }},
	} {
		before := time.Now().Add(-time.Millisecond)
		wctx, cancel := context.WithCancel(ctx)
		obs.arm(cancel)
		err := op.do(wctx)
		obs.arm(nil)
		cancel()
		t.Logf("%s with its context cancelled after the record write: %v", op.name, err)
		var journaled bool
		if err := s.Changes(ctx, before, time.Now().Add(time.Second), func(c store.Change) error {
			journaled = journaled || c.URI == uri
			return nil
		}); err != nil {
			t.Fatalf("Changes: %v", err)
		}
		if !journaled {
			t.Errorf("the %s changed the record but left no journal row", op.name)
		}
	}
}
