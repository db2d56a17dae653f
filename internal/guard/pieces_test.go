package guard_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"google.golang.org/grpc/codes"
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

// waitFor waits until cond holds, failing the test with what it waited
// for if that takes more than 5 s.
func waitFor(t *testing.T, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
		time.Sleep(time.Millisecond)
	}
}

// waitIdle waits until only want items are in flight and nobody waits for
// capacity.
func waitIdle(t *testing.T, f *fixture, want int64) {
	t.Helper()
	waitFor(t, func() string {
		return fmt.Sprintf("after the batch ended: %d items in flight, %+v in the queue; want %d in flight and nobody waiting", f.srv.InflightItems(), f.srv.QueueStats(), want)
	}, func() bool {
		q := f.srv.QueueStats()
		return f.srv.InflightItems() == want && q.Waiting == 0 && q.InUse == want
	})
}

// piecesConfig serves batches in pieces of 100 under a fixed limit of
// 1,000 items in flight.
func piecesConfig() guard.Config {
	cfg := testConfig()
	cfg.PieceItems = 100
	cfg.MinInflightItems, cfg.MaxInflightItems = 1000, 1000
	return cfg
}

// holdItems starts a write of n records that its handler holds until it
// receives from impl.blockWrites, and waits until it holds its n items.
// The returned release lets the write finish and checks it succeeded.
func holdItems(t *testing.T, f *fixture, n int) (release func()) {
	t.Helper()
	records := make([]*sluicev1.PostRecord, n)
	for i, u := range uris(n) {
		records[i] = &sluicev1.PostRecord{Uri: "at://held/" + u}
	}
	held := make(chan error, 1)
	go func() {
		_, err := f.client.PutPostRecords(as(t, "writer").context(), &sluicev1.PutPostRecordsRequest{Records: records})
		held <- err
	}()
	waitFor(t, func() string {
		return fmt.Sprintf("a write of %d records was not admitted: %+v", n, f.srv.QueueStats())
	},
		func() bool { return f.srv.QueueStats().InUse >= int64(n) })
	return func() {
		t.Helper()
		select {
		case f.impl.blockWrites <- struct{}{}:
		case err := <-held:
			t.Fatalf("held write ended before it was let go: %v", err)
		}
		if err := <-held; err != nil {
			t.Fatalf("held write: %v", err)
		}
	}
}

// Tests that a piece whose handler fails fails the whole batch with the
// handler's code, and that the other pieces' items go back.
func TestFailedPieceFailsTheBatch(t *testing.T) {
	obs := &observer{}
	impl := newPostRecords()
	impl.failURI = uris(1000)[550] // in the sixth piece
	f := start(t, piecesConfig(), impl, guard.WithObserver(obs))

	_, err := as(t, "bulk").get(f, 1000)
	wantCode(t, err, codes.Internal)
	waitIdle(t, f, 0)
	if got := obs.codes(); !slices.Equal(got, []codes.Code{codes.Internal}) {
		t.Errorf("observer saw the batch finish with %v, want [Internal]", got)
	}
}

// Tests that a caller cancelling a batch part-way gives back its items,
// its request slot and its place in the queue: with one request slot, the
// next batch is served.
func TestCancelledBatchGivesEverythingBack(t *testing.T) {
	cfg := piecesConfig()
	cfg.MaxInflightRequests = 1
	impl := newPostRecords()
	impl.block = make(chan struct{})
	f := start(t, cfg, impl)

	ctx, cancel := context.WithCancel(as(t, "bulk").context())
	done := make(chan error, 1)
	go func() {
		_, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(1000)})
		done <- err
	}()
	for range 2 {
		select {
		case <-impl.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("the batch's first two pieces never reached the handler")
		}
	}
	cancel()
	wantCode(t, <-done, codes.Canceled)
	waitIdle(t, f, 0)
	close(impl.block)
	if _, err := as(t, "bulk").get(f, 1000); err != nil {
		t.Fatalf("the next batch after a cancelled one: %v", err)
	}
}

// Tests that a batch whose first piece is shed is refused before any
// work: the caller is told to retry (Unavailable), the observer counts a
// refusal, and the handler never sees the batch.
func TestFirstPieceShedRefusesTheBatch(t *testing.T) {
	obs := &observer{}
	impl := newPostRecords()
	impl.blockWrites = make(chan struct{})
	f := start(t, piecesConfig(), impl, guard.WithObserver(obs))
	release := holdItems(t, f, 1000) // all of the capacity

	_, err := as(t, "bulk").get(f, 1000)
	wantCode(t, err, codes.Unavailable)
	if got := obs.reasons(); !slices.Equal(got, []string{guard.ReasonOverload}) {
		t.Errorf("observer refusals %v, want [%s]", got, guard.ReasonOverload)
	}
	if got := impl.started(); len(got) != 0 {
		t.Errorf("the read handler saw pieces of %v, want none", got)
	}
	waitIdle(t, f, 1000)
	release()
}

// Tests that a batch whose later piece cannot start before the deadline
// fails as a whole, shed with Unavailable and RetryInfo before its
// deadline (not DeadlineExceeded after waiting it out), and gives back
// the items of the piece already served: nothing of it stays in flight
// or in the queue.
func TestLaterPieceShedFailsTheBatch(t *testing.T) {
	cfg := piecesConfig()
	p := cfg.Methods[getMany]
	p.Timeout = 500 * time.Millisecond
	cfg.Methods[getMany] = p
	impl := newPostRecords()
	impl.blockWrites = make(chan struct{})
	impl.block = make(chan struct{})
	f := start(t, cfg, impl)
	release := holdItems(t, f, 900)

	// The batch's first piece takes the last 100 items; its second waits,
	// as a continuation, until it can no longer start in time.
	_, err := as(t, "bulk").get(f, 300)
	st := wantCode(t, err, codes.Unavailable)
	if retryDelay(st) <= 0 {
		t.Errorf("batch whose second piece never fit was shed without RetryInfo: %v", st.Details())
	}
	if got := impl.started(); !slices.Equal(got, []int{100}) {
		t.Errorf("read handler calls by size %v, want one piece of 100", got)
	}
	waitIdle(t, f, 900)
	release()
}

// Tests that a pieced batch's service time, which the guard uses to
// refuse requests that cannot finish before their deadline, leaves out
// the time its pieces waited for capacity, as a whole request's does:
// after batches that each waited 500 ms behind a held write, a batch
// with 300 ms of deadline is still served, not refused as hopeless.
func TestPieceWaitsAreNotServiceTime(t *testing.T) {
	cfg := piecesConfig()
	cfg.QueueTarget, cfg.QueueInterval = 5*time.Second, 5*time.Second // waits are never shed
	impl := newPostRecords()
	impl.blockWrites = make(chan struct{})
	f := start(t, cfg, impl)

	const wait = 500 * time.Millisecond
	for round := range 8 { // the estimate's minimum samples
		release := holdItems(t, f, 1000)
		done := make(chan error, 1)
		go func() { _, err := as(t, "bulk").get(f, 1000); done <- err }()
		waitFor(t, func() string { return fmt.Sprintf("round %d: the batch never waited behind the held write", round) },
			func() bool { return f.srv.QueueStats().Waiting > 0 })
		time.Sleep(wait)
		release()
		if err := <-done; err != nil {
			t.Fatalf("round %d: batch that waited %v: %v", round, wait, err)
		}
	}
	ctx, cancel := context.WithTimeout(as(t, "bulk").context(), 3*wait/5)
	defer cancel()
	if _, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(1000)}); err != nil {
		t.Fatalf("a batch with %v of deadline, after batches that waited %v for capacity: %v", 3*wait/5, wait, err)
	}
}
