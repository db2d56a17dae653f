package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// JournalOrigin is the origin RunJournal asks open to write under.
const JournalOrigin = "storetest-writer"

// RunJournal runs the invalidation journal's contract (store.Journal) as
// subtests of t. open(t) returns a fresh, empty store, with an empty
// journal, that writes under JournalOrigin and implements store.Journal.
func RunJournal(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, s store.Store, j store.Journal)
	}{
		{"WritesAreJournaled", testWritesAreJournaled},
		{"WindowIsHalfOpen", testWindowIsHalfOpen},
		{"InvalidPutNotJournaled", testInvalidPutNotJournaled},
		{"GapBeyondRetention", testGapBeyondRetention},
		{"StopsAtCallbackError", testStopsAtCallbackError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			j, ok := s.(store.Journal)
			if !ok {
				t.Fatalf("%T does not implement store.Journal", s)
			}
			ctx, cancel := context.WithTimeout(t.Context(), defaultTestTimeout)
			defer cancel()
			tt.fn(ctx, t, s, j)
		})
	}
}

// changes reads the journal between from and to, or fails the test.
func changes(ctx context.Context, t *testing.T, j store.Journal, from, to time.Time) []store.Change {
	t.Helper()
	var out []store.Change
	if err := j.Changes(ctx, from, to, func(c store.Change) error {
		out = append(out, c)
		return nil
	}); err != nil {
		t.Fatalf("Changes(%v, %v): %v", from, to, err)
	}
	return out
}

// Tests that every Put record and every existing deleted URI leaves one
// entry, with the writer's origin and a time within the write, in time
// order; a delete of a missing URI leaves none.
func testWritesAreJournaled(ctx context.Context, t *testing.T, s store.Store, j store.Journal) {
	before := time.Now().Add(-time.Millisecond)
	a, b, c := record(1, 1), record(2, 1), record(3, 1)
	mustPut(ctx, t, s, a, b)
	mustPut(ctx, t, s, c)
	if _, err := s.Delete(ctx, []string{a.URI, "at://did:plc:none/app.bsky.feed.post/3kmissing"}); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	after := time.Now().Add(time.Millisecond)
	got := changes(ctx, t, j, before, after)
	var uris []string
	for i, ch := range got {
		uris = append(uris, ch.URI)
		if ch.Origin != JournalOrigin {
			t.Errorf("change %d origin = %q, want %q", i, ch.Origin, JournalOrigin)
		}
		if ch.At.Before(before) || !ch.At.Before(after) {
			t.Errorf("change %d at %v, outside the writes' [%v, %v)", i, ch.At, before, after)
		}
		if i > 0 && ch.At.Before(got[i-1].At) {
			t.Errorf("change %d at %v is before change %d at %v: not in time order", i, ch.At, i-1, got[i-1].At)
		}
	}
	slices.Sort(uris)
	want := []string{a.URI, a.URI, b.URI, c.URI}
	slices.Sort(want)
	if !slices.Equal(uris, want) {
		t.Fatalf("journal URIs = %q, want %q", uris, want)
	}
}

// Tests that Changes returns entries with from <= At < to and no others.
func testWindowIsHalfOpen(ctx context.Context, t *testing.T, s store.Store, j store.Journal) {
	mustPut(ctx, t, s, record(1, 1))
	all := changes(ctx, t, j, time.Now().Add(-time.Minute), time.Now().Add(time.Minute))
	if len(all) != 1 {
		t.Fatalf("got %d changes, want 1", len(all))
	}
	at := all[0].At
	if n := len(changes(ctx, t, j, at, at.Add(time.Microsecond))); n != 1 {
		t.Errorf("Changes(at, at+1µs) = %d changes, want 1 (from is inclusive)", n)
	}
	if n := len(changes(ctx, t, j, at.Add(-time.Second), at)); n != 0 {
		t.Errorf("Changes(at-1s, at) = %d changes, want 0 (to is exclusive)", n)
	}
	if n := len(changes(ctx, t, j, at.Add(time.Microsecond), at.Add(time.Minute))); n != 0 {
		t.Errorf("Changes(at+1µs, …) = %d changes, want 0", n)
	}
}

// Tests that a refused batch leaves no journal entry.
func testInvalidPutNotJournaled(ctx context.Context, t *testing.T, s store.Store, j store.Journal) {
	before := time.Now().Add(-time.Millisecond)
	bad := record(2, 1)
	bad.JSON = []byte("{not json")
	if err := s.Put(ctx, []store.Record{record(1, 1), bad}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("Put with an invalid record = %v, want ErrInvalid", err)
	}
	if got := changes(ctx, t, j, before, time.Now().Add(time.Minute)); len(got) != 0 {
		t.Fatalf("a refused Put left %d journal entries: %+v", len(got), got)
	}
}

// Tests that asking for entries older than the retention fails with
// ErrJournalGap instead of answering with what is left.
func testGapBeyondRetention(ctx context.Context, t *testing.T, _ store.Store, j store.Journal) {
	if j.Retention() <= 0 {
		t.Fatalf("Retention() = %v, want positive", j.Retention())
	}
	from := time.Now().Add(-j.Retention() - time.Minute)
	err := j.Changes(ctx, from, time.Now(), func(store.Change) error { return nil })
	if !errors.Is(err, store.ErrJournalGap) {
		t.Fatalf("Changes from beyond the retention = %v, want ErrJournalGap", err)
	}
}

// Tests that the callback's error stops the read and is returned.
func testStopsAtCallbackError(ctx context.Context, t *testing.T, s store.Store, j store.Journal) {
	mustPut(ctx, t, s, record(1, 1), record(2, 1), record(3, 1))
	stop := errors.New("stop")
	calls := 0
	err := j.Changes(ctx, time.Now().Add(-time.Minute), time.Now().Add(time.Minute), func(store.Change) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("Changes = %v after %d calls, want the callback's error after 1", err, calls)
	}
}
