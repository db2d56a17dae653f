// Package storetest is the conformance suite every store.Store backend must
// pass.
//
// A backend's test calls Run with a function that opens a fresh, empty
// store; Run checks the contract documented on store.Store: not-found
// errors, replacement, all-or-nothing batches with invalid records, delete
// counts, ownership of returned JSON, context cancellation and concurrent
// use. Times are compared with time.Equal after truncating to a
// microsecond, the precision every backend keeps. The suite checks only the
// shared contract; backend limits, durability and locking belong in the
// backend's own tests.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluice-dev/sluice/internal/store"
)

// defaultTestTimeout bounds each subtest's context. The suite asserts what
// is stored, not how fast: the deadline is patient, since BatchPut1000
// reads its records back one Get at a time, and a remote store on a busy
// shared machine with the race detector can take tens of milliseconds a
// Get (30s was once not enough). It only stops a hung backend.
const defaultTestTimeout = 5 * time.Minute

// Run runs the contract suite as subtests of t. For each subtest it calls
// open(t) for a fresh, empty store and closes that store when the subtest
// ends; open may register its own cleanups (a temp dir, a dropped table),
// which run after the store is closed.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, s store.Store)
	}{
		{"GetMissing", testGetMissing},
		{"PutGet", testPutGet},
		{"Replace", testReplace},
		{"PutEmptyBatch", testPutEmptyBatch},
		{"BatchPut1000", testBatchPut1000},
		{"Delete", testDelete},
		{"DeleteMissing", testDeleteMissing},
		{"PutInvalidStoresNothing", testPutInvalidStoresNothing},
		{"ReturnedJSONIsOwned", testReturnedJSONIsOwned},
		{"PutDoesNotRetainJSON", testPutDoesNotRetainJSON},
		{"CancelledContext", testCancelledContext},
		{"Concurrent", testConcurrent},
		{"ModerationState", testModerationState},
		{"GetMany", testGetMany},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			ctx, cancel := context.WithTimeout(t.Context(), defaultTestTimeout)
			defer cancel()
			tt.fn(ctx, t, s)
		})
	}
}

// baseTime has nanoseconds so that backends are seen to keep microseconds.
var baseTime = time.Date(2024, 11, 5, 14, 30, 15, 123456789, time.UTC)

// record returns a distinct post record for i, versioned by v.
func record(i, v int) store.Record {
	created := baseTime.Add(time.Duration(i) * time.Second)
	return store.Record{
		URI:       fmt.Sprintf("at://did:plc:abc%d/app.bsky.feed.post/3k%06d", i%7, i),
		CID:       fmt.Sprintf("bafyrei%06dv%d", i, v),
		JSON:      fmt.Appendf(nil, `{"$type":"app.bsky.feed.post","text":"post %d version %d","createdAt":%q}`, i, v, created.Format(time.RFC3339Nano)),
		CreatedAt: created,
		IndexedAt: created.Add(1500 * time.Millisecond).In(time.FixedZone("x", 3600)),
	}
}

// collections returns one record from each of several collections, since
// the store is generic over them.
func collections() []store.Record {
	post := record(1, 1)
	like := store.Record{
		URI:       "at://did:plc:liker/app.bsky.feed.like/3kabc",
		CID:       "bafyreilike",
		JSON:      []byte(`{"$type":"app.bsky.feed.like","subject":{"uri":"` + post.URI + `","cid":"bafyrei"}}`),
		CreatedAt: baseTime,
		IndexedAt: baseTime.Add(time.Microsecond),
	}
	profile := store.Record{
		URI:       "at://did:plc:abc/app.bsky.actor.profile/self",
		CID:       "bafyreiprofile",
		JSON:      []byte(`{"$type":"app.bsky.actor.profile","displayName":"Ä b ç"}`),
		CreatedAt: baseTime.Add(-time.Hour),
		IndexedAt: baseTime,
	}
	return []store.Record{post, like, profile}
}

// diff describes how got differs from want, or returns "" if they are equal
// at microsecond precision.
func diff(want, got store.Record) string {
	us := time.Microsecond
	switch {
	case got.URI != want.URI:
		return fmt.Sprintf("URI = %q, want %q", got.URI, want.URI)
	case got.CID != want.CID:
		return fmt.Sprintf("CID = %q, want %q", got.CID, want.CID)
	case !bytes.Equal(got.JSON, want.JSON):
		return fmt.Sprintf("JSON = %s, want %s", got.JSON, want.JSON)
	case !got.CreatedAt.Truncate(us).Equal(want.CreatedAt.Truncate(us)):
		return fmt.Sprintf("CreatedAt = %v, want %v", got.CreatedAt, want.CreatedAt)
	case !got.IndexedAt.Truncate(us).Equal(want.IndexedAt.Truncate(us)):
		return fmt.Sprintf("IndexedAt = %v, want %v", got.IndexedAt, want.IndexedAt)
	case got.TakedownRef != want.TakedownRef:
		return fmt.Sprintf("TakedownRef = %q, want %q", got.TakedownRef, want.TakedownRef)
	case !slices.Equal(got.Tags, want.Tags):
		return fmt.Sprintf("Tags = %q, want %q", got.Tags, want.Tags)
	case got.Gates != want.Gates:
		return fmt.Sprintf("Gates = %+v, want %+v", got.Gates, want.Gates)
	}
	return ""
}

// mustPut stores recs or fails the test.
func mustPut(ctx context.Context, t *testing.T, s store.Store, recs ...store.Record) {
	t.Helper()
	if err := s.Put(ctx, recs); err != nil {
		t.Fatalf("Put(%d records): %v", len(recs), err)
	}
}

// wantRecord fails the test unless s holds want under want.URI.
func wantRecord(ctx context.Context, t *testing.T, s store.Store, want store.Record) {
	t.Helper()
	got, err := s.Get(ctx, want.URI)
	if err != nil {
		t.Fatalf("Get(%q): %v", want.URI, err)
	}
	if d := diff(want, got); d != "" {
		t.Fatalf("Get(%q): %s", want.URI, d)
	}
}

// wantNotFound fails the test unless Get(uri) reports store.ErrNotFound.
func wantNotFound(ctx context.Context, t *testing.T, s store.Store, uri string) {
	t.Helper()
	if _, err := s.Get(ctx, uri); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get(%q) error = %v, want store.ErrNotFound", uri, err)
	}
}

// Tests that Get of a URI never stored returns ErrNotFound.
func testGetMissing(ctx context.Context, t *testing.T, s store.Store) {
	wantNotFound(ctx, t, s, record(1, 1).URI)
}

// Tests that records of several collections round-trip unchanged.
func testPutGet(ctx context.Context, t *testing.T, s store.Store) {
	recs := collections()
	mustPut(ctx, t, s, recs...)
	for _, r := range recs {
		wantRecord(ctx, t, s, r)
	}
}

// Tests that a second Put of a URI replaces the first record entirely.
func testReplace(ctx context.Context, t *testing.T, s store.Store) {
	mustPut(ctx, t, s, record(1, 1))
	v2 := record(1, 2)
	v2.CreatedAt = v2.CreatedAt.Add(time.Minute)
	mustPut(ctx, t, s, v2)
	wantRecord(ctx, t, s, v2)
}

// Tests that an empty or nil batch is accepted and changes nothing.
func testPutEmptyBatch(ctx context.Context, t *testing.T, s store.Store) {
	mustPut(ctx, t, s)
	if err := s.Put(ctx, []store.Record{}); err != nil {
		t.Fatalf("Put(empty): %v", err)
	}
	wantNotFound(ctx, t, s, record(1, 1).URI)
}

// Tests that one Put of 1,000 records stores every one of them.
func testBatchPut1000(ctx context.Context, t *testing.T, s store.Store) {
	recs := make([]store.Record, 1000)
	for i := range recs {
		recs[i] = record(i, 1)
	}
	mustPut(ctx, t, s, recs...)
	for _, r := range recs {
		wantRecord(ctx, t, s, r)
	}
}

// Tests that Delete counts only the records that existed, removes them and
// leaves the others alone.
func testDelete(ctx context.Context, t *testing.T, s store.Store) {
	a, b, c := record(1, 1), record(2, 1), record(3, 1)
	mustPut(ctx, t, s, a, b, c)
	n, err := s.Delete(ctx, []string{a.URI, record(99, 1).URI, b.URI})
	if err != nil || n != 2 {
		t.Fatalf("Delete = %d, %v; want 2, nil", n, err)
	}
	wantNotFound(ctx, t, s, a.URI)
	wantNotFound(ctx, t, s, b.URI)
	wantRecord(ctx, t, s, c)
}

// Tests that deleting URIs that were never stored is not an error.
func testDeleteMissing(ctx context.Context, t *testing.T, s store.Store) {
	n, err := s.Delete(ctx, []string{record(1, 1).URI, record(2, 1).URI})
	if err != nil || n != 0 {
		t.Fatalf("Delete(missing) = %d, %v; want 0, nil", n, err)
	}
	if n, err := s.Delete(ctx, nil); err != nil || n != 0 {
		t.Fatalf("Delete(nil) = %d, %v; want 0, nil", n, err)
	}
}

// Tests that a batch with one invalid record fails with ErrInvalid and
// changes nothing: neither new records nor replacements are stored.
func testPutInvalidStoresNothing(ctx context.Context, t *testing.T, s store.Store) {
	old := record(1, 1)
	mustPut(ctx, t, s, old)
	fresh := record(2, 1)
	bad := record(3, 1)
	bad.URI = ""
	err := s.Put(ctx, []store.Record{record(1, 2), fresh, bad})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Put(batch with empty URI) error = %v, want store.ErrInvalid", err)
	}
	wantRecord(ctx, t, s, old)
	wantNotFound(ctx, t, s, fresh.URI)
}

// Tests that mutating a returned JSON slice does not change the store.
func testReturnedJSONIsOwned(ctx context.Context, t *testing.T, s store.Store) {
	want := record(1, 1)
	mustPut(ctx, t, s, want)
	got, err := s.Get(ctx, want.URI)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	whole := got.JSON[:cap(got.JSON)]
	for i := range whole {
		whole[i] = 'X'
	}
	wantRecord(ctx, t, s, want)
}

// Tests that mutating a record's JSON after Put does not change the store.
func testPutDoesNotRetainJSON(ctx context.Context, t *testing.T, s store.Store) {
	want := record(1, 1)
	in := want
	in.JSON = bytes.Clone(want.JSON)
	mustPut(ctx, t, s, in)
	for i := range in.JSON {
		in.JSON[i] = 'X'
	}
	wantRecord(ctx, t, s, want)
}

// Tests that every method fails with the context's error once it is
// cancelled, and that a cancelled Put or Delete changes nothing.
func testCancelledContext(ctx context.Context, t *testing.T, s store.Store) {
	kept := record(1, 1)
	mustPut(ctx, t, s, kept)
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Get(done, kept.URI); !errors.Is(err, context.Canceled) {
		t.Errorf("Get(cancelled) error = %v, want context.Canceled", err)
	}
	if err := s.Put(done, []store.Record{record(2, 1)}); !errors.Is(err, context.Canceled) {
		t.Errorf("Put(cancelled) error = %v, want context.Canceled", err)
	}
	if _, err := s.Delete(done, []string{kept.URI}); !errors.Is(err, context.Canceled) {
		t.Errorf("Delete(cancelled) error = %v, want context.Canceled", err)
	}
	wantRecord(ctx, t, s, kept)
	wantNotFound(ctx, t, s, record(2, 1).URI)
}

// Tests that 16 goroutines may Put and Get at once, on their own records
// and on one contended URI, without errors or torn records.
func testConcurrent(ctx context.Context, t *testing.T, s store.Store) {
	const workers, rounds = 16, 10
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for w := range workers {
		g.Go(func() error { return concurrentWorker(gctx, s, w, rounds) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// hotURI is the URI every concurrent worker writes.
const hotURI = "at://did:plc:hot/app.bsky.feed.post/3khot"

// hotRecord is worker w's version of the record under hotURI; its CID and
// JSON name the same writer, so a torn record is detectable.
func hotRecord(w, round int) store.Record {
	r := record(w, round)
	r.URI = hotURI
	r.CID = fmt.Sprintf("hot-%d-%d", w, round)
	r.JSON = fmt.Appendf(nil, `{"writer":"hot-%d-%d"}`, w, round)
	return r
}

// concurrentWorker writes and reads back its own records and the hot one.
func concurrentWorker(ctx context.Context, s store.Store, w, rounds int) error {
	for round := range rounds {
		own := record(1000+w*rounds+round, round)
		if err := s.Put(ctx, []store.Record{own, hotRecord(w, round)}); err != nil {
			return fmt.Errorf("worker %d: Put: %w", w, err)
		}
		got, err := s.Get(ctx, own.URI)
		if err != nil {
			return fmt.Errorf("worker %d: Get own: %w", w, err)
		}
		if d := diff(own, got); d != "" {
			return fmt.Errorf("worker %d: Get own: %s", w, d)
		}
		if err := checkHot(ctx, s); err != nil {
			return fmt.Errorf("worker %d: %w", w, err)
		}
	}
	return nil
}

// checkHot reads the contended record and checks it is one writer's whole
// version.
func checkHot(ctx context.Context, s store.Store) error {
	got, err := s.Get(ctx, hotURI)
	if err != nil {
		return fmt.Errorf("get hot: %w", err)
	}
	if want := fmt.Sprintf(`{"writer":%q}`, got.CID); string(got.JSON) != want {
		return fmt.Errorf("get hot: torn record: CID %q with JSON %s", got.CID, got.JSON)
	}
	return nil
}

// testModerationState checks that a takedown reference, tags and gate
// state round-trip, that replacing the record replaces them (a record
// written without them has none), and that over-limit state (or CID) is
// refused.
func testModerationState(ctx context.Context, t *testing.T, s store.Store) {
	r := record(1, 1)
	r.TakedownRef = "mod-action:42"
	r.Tags = []string{"hide", "rank:-1"}
	r.Gates = store.Gates{HasThreadGate: true, ViolatesEmbeddingRules: true}
	mustPut(ctx, t, s, r)
	got, err := s.Get(ctx, r.URI)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if d := diff(r, got); d != "" {
		t.Errorf("with moderation state: %s", d)
	}
	plain := record(1, 2)
	mustPut(ctx, t, s, plain)
	if got, err = s.Get(ctx, r.URI); err != nil {
		t.Fatalf("Get: %v", err)
	}
	if d := diff(plain, got); d != "" {
		t.Errorf("after replacing without moderation state: %s", d)
	}
	bad := record(2, 1)
	bad.Tags = []string{""}
	if err := s.Put(ctx, []store.Record{bad}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Put with an empty tag = %v, want ErrInvalid", err)
	}
	bad.Tags, bad.TakedownRef = nil, string(make([]byte, store.MaxTakedownRefBytes+1))
	if err := s.Put(ctx, []store.Record{bad}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Put with an over-long takedown_ref = %v, want ErrInvalid", err)
	}
	bad.TakedownRef, bad.CID = "", string(make([]byte, store.MaxCIDBytes+1))
	if err := s.Put(ctx, []store.Record{bad}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("Put with an over-long CID = %v, want ErrInvalid", err)
	}
}

// Tests that a backend that reads in batches (store.BatchReader) returns
// what Get would for every URI: found records whole, missing and
// duplicate URIs handled, JSON the caller owns, the context's error once
// it is cancelled. A backend without batch reads has nothing to check
// here (its reads are Get's, tested above), so it passes at once.
func testGetMany(ctx context.Context, t *testing.T, s store.Store) {
	br, ok := s.(store.BatchReader)
	if !ok {
		return
	}
	moderated := record(2, 1)
	moderated.TakedownRef, moderated.Tags = "mod-action:7", []string{"hide"}
	moderated.Gates = store.Gates{HasPostGate: true, ViolatesThreadGate: true}
	recs := append(collections(), moderated)
	mustPut(ctx, t, s, recs...)
	missing := record(99, 1).URI
	uris := []string{missing}
	for _, r := range recs {
		uris = append(uris, r.URI, r.URI)
	}
	got, err := br.GetMany(ctx, uris)
	if err != nil {
		t.Fatalf("GetMany(%d URIs): %v", len(uris), err)
	}
	if len(got) != len(recs) {
		t.Errorf("GetMany returned %d records, want %d (one per stored URI)", len(got), len(recs))
	}
	if r, ok := got[missing]; ok {
		t.Errorf("GetMany returned %+v for a URI never stored", r)
	}
	for _, want := range recs {
		r, ok := got[want.URI]
		if !ok {
			t.Fatalf("GetMany did not return %s", want.URI)
		}
		if d := diff(want, r); d != "" {
			t.Fatalf("GetMany %s: %s", want.URI, d)
		}
		for i := range r.JSON {
			r.JSON[i] = 'X'
		}
	}
	wantRecord(ctx, t, s, recs[0])
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := br.GetMany(done, uris); !errors.Is(err, context.Canceled) {
		t.Errorf("GetMany(cancelled) error = %v, want context.Canceled", err)
	}
}
