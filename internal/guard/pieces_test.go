package guard_test

import (
	"slices"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
)

// Tests that a batch over piece_items is served in pieces: no handler
// call sees more than a piece, only the pieces being worked on hold
// items, a small request from another caller is admitted while the batch
// is still in progress (with the whole batch admitted at once, it would
// find the item cap full), and the answer holds every record in order.
func TestBatchServedInPieces(t *testing.T) {
	cfg := testConfig()
	cfg.PieceItems, cfg.MaxInflightItems = 100, 1000
	impl := newPostRecords()
	impl.block = make(chan struct{})
	f := start(t, cfg, impl)

	batch := make(chan *sluicev1.GetPostRecordsResponse, 1)
	go func() {
		resp, err := as(t, "bulk").get(f, 1000)
		if err != nil {
			t.Errorf("batch: %v", err)
		}
		batch <- resp
	}()
	for range 2 {
		select {
		case <-impl.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("the batch's first two pieces never reached the handler")
		}
	}
	if got := f.srv.InflightItems(); got != 200 {
		t.Errorf("InflightItems() = %d with two pieces held, want 200 (not the batch's 1,000)", got)
	}
	// The handler holds the small request too, until it is released.
	small := make(chan error, 1)
	go func() {
		_, err := f.client.GetPostRecords(testContext(t, 5*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(1)})
		small <- err
	}()
	select {
	case <-impl.entered:
	case <-time.After(5 * time.Second):
		t.Fatalf("a 1-URI request did not reach its handler beside the batch's pieces (%d items in flight, cap 1,000)", f.srv.InflightItems())
	}
	close(impl.block)
	if err := <-small; err != nil {
		t.Fatalf("small request: %v", err)
	}
	resp := <-batch
	sizes := impl.started()
	if len(sizes) != 11 || slices.Index(sizes, 1) != 2 {
		t.Errorf("calls by size in order %v: want two pieces of 100, the small request, then eight more pieces", sizes)
	}
	if slices.Max(sizes) > 100 {
		t.Errorf("a handler call saw %d URIs, over piece_items 100", slices.Max(sizes))
	}
	want := uris(1000)
	if got := len(resp.GetRecords()); got != len(want) {
		t.Fatalf("answer holds %d records, want %d", got, len(want))
	}
	for i, r := range resp.GetRecords() {
		if r.GetUri() != want[i] {
			t.Fatalf("record %d is %q, want %q: the pieces were not joined in request order", i, r.GetUri(), want[i])
		}
	}
	if got := f.srv.InflightItems(); got != 0 {
		t.Errorf("InflightItems() = %d when idle, want 0", got)
	}
}

// Tests that writes, whose answer is a count, are admitted whole.
func TestWritesAreNotServedInPieces(t *testing.T) {
	cfg := testConfig()
	cfg.PieceItems = 100
	impl := newPostRecords()
	f := start(t, cfg, impl)
	records := make([]*sluicev1.PostRecord, 1000)
	for i, u := range uris(1000) {
		records[i] = &sluicev1.PostRecord{Uri: u}
	}
	resp, err := f.client.PutPostRecords(testContext(t, 5*time.Second), &sluicev1.PutPostRecordsRequest{Records: records})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetWritten() != 1000 || impl.calls.Load() != 1 {
		t.Errorf("written %d in %d handler calls, want 1,000 in one", resp.GetWritten(), impl.calls.Load())
	}
}
