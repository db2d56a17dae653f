package client

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Tests that the chunks a failed call never sent earn no retries: with a
// server shedding everything, retries stay the small share of requests
// the budget allows, however many chunks each call was cut into.
func TestUnsentChunksEarnNoRetries(t *testing.T) {
	f := &fakeConn{limits: fakeLimits(10, 1000, 1000, 1e9)}
	var sent atomic.Int64
	f.get = func(context.Context, []string) error {
		sent.Add(1)
		return status.Error(codes.Unavailable, "shed")
	}
	c := fakeClient(t, f, WithParallelism(1), WithBackoff(time.Microsecond, time.Microsecond))
	for c.retries.spend() { // the saved-up retries spent
	}
	const calls = 20
	for range calls {
		if _, err := c.GetPostRecords(context.Background(), fakeURIs(1000)); err == nil { // 100 chunks each
			t.Fatal("a call against a server shedding everything succeeded")
		}
	}
	n := sent.Load()
	if retries := n - calls; float64(retries) > 0.15*float64(n)+1 {
		t.Errorf("%d calls sent %d requests, %d of them retries (%.0f%%): the chunks never sent refilled the retry budget", calls, n, retries, 100*float64(retries)/float64(n))
	}
}

// Tests that a call stopped part-way fails with the caller's
// cancellation, rather than answering the chunks it never sent as
// empty. The stop falls while a chunk is in flight or before the next is
// launched, as the goroutines happen to run, so the call is made many
// times.
func TestCallStoppedBetweenChunksFails(t *testing.T) {
	f := &fakeConn{limits: fakeLimits(10, 1000, 1000, 1e9)}
	c := fakeClient(t, f, WithParallelism(1))
	for run := range 300 {
		ctx, cancel := context.WithCancel(context.Background())
		var sent atomic.Int64
		f.get = func(context.Context, []string) error {
			if sent.Add(1) == 3 {
				cancel() // the caller leaves as its third chunk is answered
			}
			return nil
		}
		records, err := c.GetPostRecords(ctx, fakeURIs(100))
		cancel()
		if err == nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("run %d: GetPostRecords = %d records, %v; want the caller's cancellation", run, len(records), err)
		}
	}
}

// hungLimits is a fakeConn whose GetLimits, once hang is set, answers
// only when its caller gives up; hung counts those waiting.
type hungLimits struct {
	*fakeConn
	hang atomic.Bool
	hung atomic.Int64
}

func (h *hungLimits) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if method == sluicev1.PostRecords_GetLimits_FullMethodName && h.hang.Load() {
		h.hung.Add(1)
		defer h.hung.Add(-1)
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	return h.fakeConn.Invoke(ctx, method, args, reply, opts...)
}

// Tests that a call whose limits are due for a refresh, while another
// call's refresh hangs, goes on with the limits in force once its own
// deadline comes, instead of waiting out the other call's.
func TestHungRefreshHoldsNoOtherCallPastItsDeadline(t *testing.T) {
	h := &hungLimits{fakeConn: &fakeConn{limits: fakeLimits(1000, 1000, 1000, 1e9)}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := New(ctx, h, "fake")
	if err != nil {
		t.Fatal(err)
	}
	c.ageLimits(limitsMaxAge + time.Second)
	h.hang.Store(true)
	first, stopFirst := context.WithCancel(ctx) // a caller without a deadline
	defer stopFirst()
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		_, _ = c.GetPostRecords(first, fakeURIs(5))
	}()
	for h.hung.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	second, stopSecond := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stopSecond()
	records, err := c.GetPostRecords(second, fakeURIs(5))
	if h.hung.Load() == 0 {
		t.Fatal("the first call's refresh ended before the second call returned: the test shows nothing")
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("second call: %v", err)
	}
	if err == nil {
		checkAligned(t, records, fakeURIs(5))
	}
	stopFirst()
	<-firstDone
}

// seenMetadata is a fakeConn noting the client name and criticality each
// GetPostRecords carried.
type seenMetadata struct {
	*fakeConn
	names, criticalities atomic.Value
}

func (s *seenMetadata) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if method == sluicev1.PostRecords_GetPostRecords_FullMethodName {
		md, _ := metadata.FromOutgoingContext(ctx)
		s.names.Store(md.Get(clientIDKey))
		s.criticalities.Store(md.Get(criticalityKey))
	}
	return s.fakeConn.Invoke(ctx, method, args, reply, opts...)
}

// Tests that the Client's own name and criticality are the ones a request
// carries, even when the caller's context already carries others (the
// server reads a key's first value).
func TestClientNameReplacesTheCallersMetadata(t *testing.T) {
	s := &seenMetadata{fakeConn: &fakeConn{limits: fakeLimits(1000, 1000, 1000, 1e9)}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, s, "bulk", WithCriticality(Batch))
	if err != nil {
		t.Fatal(err)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, clientIDKey, "frontend", criticalityKey, "interactive", "x-trace", "kept")
	if _, err := c.GetPostRecords(ctx, fakeURIs(3)); err != nil {
		t.Fatal(err)
	}
	names, _ := s.names.Load().([]string)
	crits, _ := s.criticalities.Load().([]string)
	if len(names) != 1 || names[0] != "bulk" || len(crits) != 1 || crits[0] != string(Batch) {
		t.Errorf("request carried names %q and criticalities %q; want only the Client's, bulk and %s", names, crits, Batch)
	}
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(clientIDKey)) != 1 || md.Get(clientIDKey)[0] != "frontend" {
		t.Errorf("the caller's own context was changed: %v", md)
	}
}
