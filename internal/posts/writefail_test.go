package posts

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-dev/sluice/internal/store"
)

// landsThenFails is a store whose writes land and then answer an error,
// as a CQL write does when its coordinator times out after applying it.
// A real store cannot be made to answer so on cue.
type landsThenFails struct{ store.Store }

var errLostAnswer = errors.New("landsThenFails: the write's answer was lost")

func (l landsThenFails) Put(ctx context.Context, recs []store.Record) error {
	if err := l.Store.Put(ctx, recs); err != nil {
		return err
	}
	return errLostAnswer
}

func (l landsThenFails) Delete(ctx context.Context, uris []string) (int, error) {
	if _, err := l.Store.Delete(ctx, uris); err != nil {
		return 0, err
	}
	return 0, errLostAnswer
}

// Tests that a write whose outcome is unknown (it failed, but may have
// landed) still invalidates the cache: a read after it answers what the
// store holds, not what was cached before.
func TestFailedWriteStillInvalidates(t *testing.T) {
	svc, _, recs := newService(t, 2)
	ctx := testCtx(t, 4)
	uris := []string{recs[0].URI, recs[1].URI}
	warm := func() {
		t.Helper()
		if res, _, err := svc.Get(ctx, uris); err != nil {
			t.Fatal(err)
		} else if _, _, err := svc.Get(ctx, uris); err != nil || !res[0].Found {
			t.Fatalf("warming the cache: %v %+v", err, res)
		}
	}
	warm()
	svc.store = landsThenFails{svc.store}

	rewritten := newVersion(recs[0])
	if _, err := svc.Put(ctx, []store.Record{rewritten}); !errors.Is(err, errLostAnswer) {
		t.Fatalf("Put = %v, want the store's error", err)
	}
	res, _, err := svc.Get(ctx, uris[:1])
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res[0].Record.JSON); got != string(rewritten.JSON) {
		t.Errorf("after a Put that landed but failed, read the version it replaced (from cache %v), want the one stored", res[0].FromCache)
	}

	warm()
	if _, err := svc.Delete(ctx, uris[1:]); !errors.Is(err, errLostAnswer) {
		t.Fatalf("Delete = %v, want the store's error", err)
	}
	if res, _, err := svc.Get(ctx, uris[1:]); err != nil || res[0].Found {
		t.Errorf("after a Delete that landed but failed, read found=%v (from cache %v), %v; want not found", res[0].Found, res[0].FromCache, err)
	}

	warm()
	if _, err := svc.Update(ctx, uris[0], func(r *store.Record) bool { r.Tags = []string{"late"}; return true }); !errors.Is(err, errLostAnswer) {
		t.Fatalf("Update = %v, want the store's error", err)
	}
	if res, _, err := svc.Get(ctx, uris[:1]); err != nil || len(res[0].Record.Tags) != 1 {
		t.Errorf("after an Update that landed but failed, read tags %v (from cache %v), %v; want [late]", res[0].Record.Tags, res[0].FromCache, err)
	}
}

// Tests that a CID the store could not keep is refused by the write
// rules, naming the record, before anything is written.
func TestPutRefusesAnUnstorableCID(t *testing.T) {
	for _, tc := range []struct{ name, cid, want string }{
		{"too long", strings.Repeat("b", store.MaxCIDBytes+1), "over the 256-byte limit"},
		{"not UTF-8", "bafy\xff", "not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, _, recs := newService(t, 2)
			ctx := testCtx(t, 4)
			good, bad := newVersion(recs[0]), newVersion(recs[1])
			bad.CID = tc.cid
			_, err := svc.Put(ctx, []store.Record{good, bad})
			var invalid *InvalidRecordError
			if !errors.As(err, &invalid) || invalid.Index != 1 || !strings.Contains(invalid.Reason, tc.want) {
				t.Fatalf("Put = %v, want InvalidRecordError for records[1] saying %q", err, tc.want)
			}
			if rec, _, _ := svc.Stored(ctx, good.URI); string(rec.JSON) != string(recs[0].JSON) {
				t.Errorf("the refused batch's other record was written: %s", rec.JSON)
			}
		})
	}
}

// Tests that a record UpsertMany refuses is named by its position in the
// caller's list, not among the records that changed.
func TestUpsertManyNamesTheRefusedRecordByItsPosition(t *testing.T) {
	svc, _, recs := newService(t, 1)
	ctx := testCtx(t, 4)
	bad := strings.Replace(recs[0].URI, recs[0].URI[strings.LastIndex(recs[0].URI, "/")+1:], "3kbadrecord22", 1)
	err := svc.UpsertMany(ctx, []string{recs[0].URI, bad}, func(r *store.Record, existed bool) bool {
		if existed {
			return false // unchanged: the refused record is the only one changed
		}
		r.JSON = []byte(`{"$type":"app.bsky.feed.like"}`)
		return true
	})
	var invalid *InvalidRecordError
	if !errors.As(err, &invalid) || invalid.Index != 1 || invalid.URI != bad {
		t.Fatalf("UpsertMany = %v, want InvalidRecordError for records[1] (%s)", err, bad)
	}
}

// forWriteReads is the embedded store, noting whether each read was made
// as a write's (store.ForWrite). Which consistency a read gets is the CQL
// store's (tested there); that the write path asks for it is this
// package's.
type forWriteReads struct {
	*batchStore
	plain, forWrite atomic.Int64
}

func (f *forWriteReads) note(ctx context.Context) {
	if store.IsForWrite(ctx) {
		f.forWrite.Add(1)
	} else {
		f.plain.Add(1)
	}
}

func (f *forWriteReads) Get(ctx context.Context, uri string) (store.Record, error) {
	f.note(ctx)
	return f.batchStore.Get(ctx, uri)
}

func (f *forWriteReads) GetMany(ctx context.Context, uris []string) (map[string]store.Record, error) {
	f.note(ctx)
	return f.batchStore.GetMany(ctx, uris)
}

// Tests that every read a write makes (Update, UpsertMany, StoredMany)
// asks the store for the write's consistency, and reads for answers do
// not.
func TestReadsOfWritesAskForTheWriteConsistency(t *testing.T) {
	svc, bs, recs := newBatchService(t, 2)
	f := &forWriteReads{batchStore: bs}
	svc.store = f
	ctx := testCtx(t, 4)
	uris := []string{recs[0].URI, recs[1].URI}
	tag := func(r *store.Record) bool { r.Tags = append(r.Tags, "t"); return true }
	if _, err := svc.Update(ctx, uris[0], tag); err != nil {
		t.Fatal(err)
	}
	if err := svc.UpsertMany(ctx, uris, func(r *store.Record, _ bool) bool { return tag(r) }); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.StoredMany(ctx, uris); err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.Stored(ctx, uris[0]); err != nil {
		t.Fatal(err)
	}
	if p, w := f.plain.Load(), f.forWrite.Load(); p != 0 || w < 4 {
		t.Errorf("the reads of writes: %d plain, %d as a write's; want none plain", p, w)
	}
	if _, _, err := svc.Get(ctx, uris); err != nil {
		t.Fatal(err)
	}
	if p := f.plain.Load(); p == 0 {
		t.Error("a read for an answer (a cache miss) was made as a write's")
	}
}
