package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/storetest"
)

const defaultTestTimeout = 30 * time.Second

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testContext returns a context that ends with the test or after
// defaultTestTimeout.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), defaultTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// tempPath returns a path in a fresh directory that does not exist yet, so
// Open must create it.
func tempPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "data", "sluice.db")
}

// mustOpen opens path and closes the store when the test ends.
func mustOpen(t *testing.T, path string, opts Options) *Store {
	t.Helper()
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// rec returns a small valid record numbered i.
func rec(i int) store.Record {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC).Add(time.Duration(i) * time.Minute)
	return store.Record{
		URI:       fmt.Sprintf("at://did:plc:abc/app.bsky.feed.post/3k%04d", i),
		CID:       fmt.Sprintf("bafyrei%04d", i),
		JSON:      fmt.Appendf(nil, `{"text":"post %d"}`, i),
		CreatedAt: at,
		IndexedAt: at.Add(time.Second),
	}
}

// sameRecord reports whether a and b are equal at microsecond precision.
func sameRecord(a, b store.Record) bool {
	return a.URI == b.URI && a.CID == b.CID && bytes.Equal(a.JSON, b.JSON) &&
		a.TakedownRef == b.TakedownRef && slices.Equal(a.Tags, b.Tags) && a.Gates == b.Gates &&
		a.CreatedAt.Truncate(time.Microsecond).Equal(b.CreatedAt.Truncate(time.Microsecond)) &&
		a.IndexedAt.Truncate(time.Microsecond).Equal(b.IndexedAt.Truncate(time.Microsecond))
}

// editFile runs fn in a bbolt write transaction on the closed store file at
// path, to plant states the package itself never writes.
func editFile(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatalf("bolt.Open: %v", err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatalf("bolt Update: %v", err)
	}
}

// Tests that Store honours the store.Store contract.
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(tempPath(t), Options{})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

// Tests that Store honours the store.Journal contract.
func TestJournalContract(t *testing.T) {
	storetest.RunJournal(t, func(t *testing.T) store.Store {
		s, err := Open(tempPath(t), Options{JournalOrigin: storetest.JournalOrigin})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

// Tests that writes drop journal entries older than the retention, so the
// journal stays bounded with no background task.
func TestJournalPrunedByWrites(t *testing.T) {
	ctx := testContext(t)
	s, err := Open(tempPath(t), Options{JournalRetention: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	recs := make([]store.Record, 100)
	for i := range recs {
		recs[i] = rec(i)
	}
	if err := s.Put(ctx, recs); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if n, _ := s.JournalLen(); n != len(recs) {
		t.Fatalf("journal holds %d entries after %d writes, want %d", n, len(recs), len(recs))
	}
	time.Sleep(60 * time.Millisecond)
	if err := s.Put(ctx, recs[:1]); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if n, _ := s.JournalLen(); n != 1 {
		t.Fatalf("journal holds %d entries after the retention passed and one more write, want 1", n)
	}
}

// Tests that records written before Close are there after reopening.
func TestDurableAcrossReopen(t *testing.T) {
	ctx := testContext(t)
	path := tempPath(t)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	want := []store.Record{rec(1), rec(2), rec(3)}
	if err := s.Put(ctx, want); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if _, err := s.Delete(ctx, []string{rec(2).URI}); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s = mustOpen(t, path, Options{})
	for _, r := range []store.Record{rec(1), rec(3)} {
		got, err := s.Get(ctx, r.URI)
		if err != nil || !sameRecord(got, r) {
			t.Errorf("after reopen Get(%q) = %+v, %v; want %+v", r.URI, got, err, r)
		}
	}
	if _, err := s.Get(ctx, rec(2).URI); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after reopen Get(deleted) error = %v, want ErrNotFound", err)
	}
}

// Tests that a second Open of a file in use fails, within its timeout, with
// an error that says why, and succeeds once the file is released.
func TestOpenLocked(t *testing.T) {
	path := tempPath(t)
	first, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}

	start := time.Now()
	_, err = Open(path, Options{Timeout: 100 * time.Millisecond})
	elapsed := time.Since(start)
	want := fmt.Sprintf("boltstore: open %s: database is locked by another process (timeout 100ms)", path)
	if err == nil || err.Error() != want {
		t.Fatalf("second Open error = %v, want %q", err, want)
	}
	if elapsed > 5*time.Second {
		t.Errorf("second Open took %v, want about 100ms", elapsed)
	}

	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	mustOpen(t, path, Options{Timeout: 100 * time.Millisecond})
}

// Tests that Open refuses files whose schema it does not know.
func TestOpenSchemaVersion(t *testing.T) {
	tests := []struct {
		name    string
		plant   func(tx *bolt.Tx) error
		wantErr string
	}{
		{
			name: "newer",
			plant: func(tx *bolt.Tx) error {
				return tx.Bucket(metaBucket).Put(schemaKey, binary.AppendUvarint(nil, 99))
			},
			wantErr: "schema version 99 is newer than this build reads (1)",
		},
		{
			name: "older",
			plant: func(tx *bolt.Tx) error {
				return tx.Bucket(metaBucket).Put(schemaKey, binary.AppendUvarint(nil, 0))
			},
			wantErr: "schema version 0 is older than 1",
		},
		{
			name:    "unreadable",
			plant:   func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Put(schemaKey, []byte{0xff}) },
			wantErr: "unreadable schema version",
		},
		{
			name:    "missing meta",
			plant:   func(tx *bolt.Tx) error { return tx.DeleteBucket(metaBucket) },
			wantErr: "records bucket has no schema version",
		},
		{
			name:    "missing records",
			plant:   func(tx *bolt.Tx) error { return tx.DeleteBucket(recordsBucket) },
			wantErr: "records bucket missing",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tempPath(t)
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			editFile(t, path, tt.plant)
			s, err = Open(path, Options{})
			if err == nil {
				_ = s.Close()
				t.Fatalf("Open succeeded, want error containing %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open error = %v, want it to name %s and contain %q", err, path, tt.wantErr)
			}
		})
	}
}

// Tests that Open refuses out-of-range options.
func TestOpenInvalidOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
	}{
		{"negative timeout", Options{Timeout: -time.Second}},
		{"negative URI length", Options{MaxURILength: -1}},
		{"URI length over bbolt key limit", Options{MaxURILength: bolt.MaxKeySize + 1}},
		{"negative record bytes", Options{MaxRecordBytes: -1}},
		{"record bytes over ceiling", Options{MaxRecordBytes: maxRecordBytesCeiling + 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if s, err := Open(tempPath(t), tt.opts); err == nil {
				_ = s.Close()
				t.Fatalf("Open(%+v) succeeded, want error", tt.opts)
			}
		})
	}
}

// Tests that Put enforces the configured limits and JSON validity, storing
// nothing from a batch with one bad record.
func TestPutLimits(t *testing.T) {
	opts := Options{MaxURILength: 64, MaxRecordBytes: 32}
	withURI := func(n int) store.Record {
		r := rec(1)
		r.URI = "at://" + strings.Repeat("x", n-len("at://"))
		return r
	}
	withJSON := func(js string) store.Record {
		r := rec(1)
		r.JSON = []byte(js)
		return r
	}
	tests := []struct {
		name    string
		rec     store.Record
		wantErr string // "" means the record is accepted
	}{
		{"URI at limit", withURI(64), ""},
		{"URI over limit", withURI(65), "URI is 65 bytes, over the 64-byte limit"},
		{"empty URI", store.Record{JSON: []byte(`{}`)}, "empty URI"},
		{"JSON at limit", withJSON(`"` + strings.Repeat("a", 30) + `"`), ""},
		{"JSON over limit", withJSON(`"` + strings.Repeat("a", 31) + `"`), "JSON is 33 bytes, over the 32-byte limit"},
		{"invalid JSON", withJSON(`{"text":`), "JSON is not valid"},
		{"empty JSON", withJSON(""), "JSON is not valid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			s := mustOpen(t, tempPath(t), opts)
			other := rec(2)
			err := s.Put(ctx, []store.Record{other, tt.rec})
			n, cerr := s.Count()
			if cerr != nil {
				t.Fatalf("Count: %v", cerr)
			}
			if tt.wantErr == "" {
				if err != nil || n != 2 {
					t.Fatalf("Put = %v with %d stored, want nil with 2", err, n)
				}
				return
			}
			if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "record 1") {
				t.Fatalf("Put error = %v, want ErrInvalid naming record 1 and %q", err, tt.wantErr)
			}
			if n != 0 {
				t.Fatalf("%d records stored after failed Put, want 0", n)
			}
		})
	}
}

// Tests that Count follows puts, replacements and deletes.
func TestCount(t *testing.T) {
	ctx := testContext(t)
	s := mustOpen(t, tempPath(t), Options{})
	wantCount := func(want int) {
		t.Helper()
		if n, err := s.Count(); err != nil || n != want {
			t.Fatalf("Count = %d, %v; want %d, nil", n, err, want)
		}
	}
	wantCount(0)
	if err := s.Put(ctx, []store.Record{rec(1), rec(2), rec(3), rec(1)}); err != nil {
		t.Fatalf("Put: %v", err)
	}
	wantCount(3)
	if _, err := s.Delete(ctx, []string{rec(2).URI, rec(2).URI}); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	wantCount(2)
}

// Tests that Scan visits every record once, in URI byte order.
func TestScan(t *testing.T) {
	ctx := testContext(t)
	s := mustOpen(t, tempPath(t), Options{})
	in := []store.Record{rec(3), rec(1), rec(20), rec(2)}
	if err := s.Put(ctx, in); err != nil {
		t.Fatalf("Put: %v", err)
	}
	var got []store.Record
	err := s.Scan(ctx, func(r store.Record) error {
		got = append(got, r)
		return nil
	})
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	want := []store.Record{rec(1), rec(2), rec(3), rec(20)}
	if len(got) != len(want) {
		t.Fatalf("Scan visited %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if !sameRecord(got[i], want[i]) {
			t.Errorf("Scan record %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	got[0].JSON[0] = 'X'
	if r, err := s.Get(ctx, want[0].URI); err != nil || !sameRecord(r, want[0]) {
		t.Errorf("after mutating a scanned record, Get = %+v, %v; want %+v", r, err, want[0])
	}
}

// Tests that Scan stops at the first error from fn or from its context.
func TestScanStops(t *testing.T) {
	ctx := testContext(t)
	s := mustOpen(t, tempPath(t), Options{})
	if err := s.Put(ctx, []store.Record{rec(1), rec(2), rec(3)}); err != nil {
		t.Fatalf("Put: %v", err)
	}
	stop := errors.New("stop")
	calls := 0
	err := s.Scan(ctx, func(store.Record) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("Scan with failing fn = %v after %d calls, want stop after 1", err, calls)
	}

	cctx, cancel := context.WithCancel(ctx)
	calls = 0
	err = s.Scan(cctx, func(store.Record) error {
		calls++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("Scan with cancelled ctx = %v after %d calls, want context.Canceled after 1", err, calls)
	}
}

// Tests that a corrupt value fails Get and Scan with an error naming the
// URI, not with ErrNotFound.
func TestCorruptValue(t *testing.T) {
	ctx := testContext(t)
	path := tempPath(t)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	uri := rec(7).URI
	editFile(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(recordsBucket).Put([]byte(uri), []byte{9, 1, 2})
	})
	s = mustOpen(t, path, Options{})

	_, err = s.Get(ctx, uri)
	if err == nil || errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), uri) ||
		!strings.Contains(err.Error(), "unknown encoding version 9") {
		t.Errorf("Get(corrupt) error = %v, want one naming %s and the encoding version", err, uri)
	}
	err = s.Scan(ctx, func(store.Record) error { return nil })
	if err == nil || !strings.Contains(err.Error(), uri) {
		t.Errorf("Scan(corrupt) error = %v, want one naming %s", err, uri)
	}
}

// Tests that a closed store reports ErrUnavailable rather than panicking.
func TestClosedStoreUnavailable(t *testing.T) {
	ctx := testContext(t)
	s, err := Open(tempPath(t), Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := s.Get(ctx, rec(1).URI); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Get after Close error = %v, want ErrUnavailable", err)
	}
	if err := s.Put(ctx, []store.Record{rec(1)}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Put after Close error = %v, want ErrUnavailable", err)
	}
	if _, err := s.Delete(ctx, []string{rec(1).URI}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Delete after Close error = %v, want ErrUnavailable", err)
	}
	if _, err := s.Count(); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Count after Close error = %v, want ErrUnavailable", err)
	}
}

// Tests that a write waiting behind another (whose commit a slow disk
// holds up) gives up at its context's end, having written nothing,
// instead of waiting for bbolt's writer lock for as long as that takes;
// the write before it is not disturbed.
func TestWaitingWriteHonoursItsDeadline(t *testing.T) {
	s := mustOpen(t, tempPath(t), Options{})
	slowDisk, err := s.db.Begin(true) // holds bbolt's writer lock
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- s.Put(context.Background(), []store.Record{rec(1)}) }()
	for len(s.writer) == 0 { // the first write has its turn
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	go func() { second <- s.Put(ctx, []store.Record{rec(2)}) }()
	select {
	case err := <-second:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("waiting write = %v, want its deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("a write waiting for its turn outlived its deadline by 10s")
	}
	if err := slowDisk.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the write that had its turn: %v", err)
	}
	if _, err := s.Get(testContext(t), rec(2).URI); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of the record whose write gave up = %v, want not found", err)
	}
}
