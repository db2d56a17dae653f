package client

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tests that a refusal whose advised delay runs past the caller's
// deadline is returned at once, with its code, instead of sleeping out
// the deadline and answering a bare context error.
func TestRetryDelayPastDeadlineFailsAtOnce(t *testing.T) {
	f := &fakeConn{limits: fakeLimits(1000, 1000, 1000, 1e6)}
	f.get = func(context.Context, []string) error { return withRetry(codes.ResourceExhausted, time.Hour) }
	c := fakeClient(t, f)
	// Half the deadline is ample for a call that does not wait, on a
	// busy machine too; one that waits takes all of it.
	const deadline = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	_, err := c.GetPostRecords(ctx, fakeURIs(10))
	if took := time.Since(start); took > deadline/2 {
		t.Errorf("took %v waiting for an hour's retry delay with %v of deadline", took, deadline)
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("err = %v (code %v), want the server's ResourceExhausted", err, status.Code(err))
	}
}

// Tests that pacing does not wait past the caller's deadline: a chunk
// the budget admits only in seconds fails at once.
func TestPaceWaitPastDeadlineFailsAtOnce(t *testing.T) {
	f := &fakeConn{limits: fakeLimits(100, 100, 100, 0.01)}
	c := fakeClient(t, f)
	// The bucket starts full less GetLimits' item; 99 more empty it, and
	// the next 100 take hours at 0.01 items/s.
	if _, err := c.GetPostRecords(context.Background(), fakeURIs(99)); err != nil {
		t.Fatal(err)
	}
	const deadline = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	_, err := c.GetPostRecords(ctx, fakeURIs(100))
	if took := time.Since(start); took > deadline/2 {
		t.Errorf("took %v waiting for a pace of hours with %v of deadline", took, deadline)
	}
	if err == nil {
		t.Fatal("no error")
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("err = %v (code %v), want DeadlineExceeded", err, status.Code(err))
	}
}

// Tests that chunks retried in parallel can draw backoff jitter at the
// same time (run with -race).
func TestParallelBackoffJitter(t *testing.T) {
	f := &fakeConn{limits: fakeLimits(10, 1000, 1000, 1e9)}
	var tried sync.Map
	f.get = func(_ context.Context, uris []string) error {
		if _, again := tried.LoadOrStore(uris[0], true); !again {
			return status.Error(codes.Unavailable, "shed")
		}
		return nil
	}
	c := fakeClient(t, f, WithParallelism(8), WithBackoff(time.Microsecond, time.Microsecond), WithRetryBudget(1, 1000))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			uris := fakeURIs(400)
			records, err := c.GetPostRecords(context.Background(), uris)
			if err != nil {
				t.Error(err)
				return
			}
			checkAligned(t, records, uris)
		})
	}
	wg.Wait()
}

// Tests that concurrent calls on one Client together stay within the
// caller's in-flight items, as each call alone does.
func TestConcurrentCallsShareInflightCap(t *testing.T) {
	const cap = 200
	f := &fakeConn{limits: fakeLimits(100, 100, cap, 1e9)}
	var inflight, over atomic.Int64
	f.get = func(ctx context.Context, uris []string) error {
		n := int64(len(uris))
		defer inflight.Add(-n)
		if inflight.Add(n) > cap {
			over.Add(1)
			return withRetry(codes.ResourceExhausted, time.Millisecond)
		}
		time.Sleep(5 * time.Millisecond)
		return nil
	}
	c := fakeClient(t, f, WithParallelism(2), WithRetryBudget(0.1, 1))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			uris := fakeURIs(400)
			records, err := c.GetPostRecords(context.Background(), uris)
			if err != nil {
				t.Error(err)
				return
			}
			checkAligned(t, records, uris)
		})
	}
	wg.Wait()
	if n := over.Load(); n > 0 {
		t.Errorf("%d chunks were sent over the in-flight cap of %d", n, cap)
	}
}

// Tests that a budget lowered on the server while the Client runs is
// followed: the chunk refused as larger than the new burst is split to
// the limits fetched again, and the call succeeds.
func TestRefetchesLimitsWhenBurstShrinks(t *testing.T) {
	f := &fakeConn{limits: fakeLimits(1000, 1000, 4000, 1e9)}
	var burst atomic.Int64
	burst.Store(1000)
	f.get = func(_ context.Context, uris []string) error {
		if int64(len(uris)) > burst.Load() {
			return status.Error(codes.ResourceExhausted, "over budget: larger than the burst")
		}
		return nil
	}
	c := fakeClient(t, f)
	if l := c.Limits(); l.ChunkSize != 1000 {
		t.Fatalf("limits %+v", l)
	}
	f.setLimits(fakeLimits(1000, 300, 4000, 1e9))
	burst.Store(300)
	uris := fakeURIs(1500)
	records, err := c.GetPostRecords(context.Background(), uris)
	if err != nil {
		t.Fatalf("after the burst shrank: %v", err)
	}
	checkAligned(t, records, uris)
	if l := c.Limits(); l.ChunkSize != 300 || l.Burst != 300 {
		t.Errorf("limits %+v, want the new burst of 300", l)
	}
}

// Tests that the limits are fetched again after limitsMaxAge, so that a
// raised budget is used without restarting the caller.
func TestRefetchesLimitsWhenOld(t *testing.T) {
	f := &fakeConn{limits: fakeLimits(1000, 250, 1000, 1000)}
	c := fakeClient(t, f)
	f.setLimits(fakeLimits(1000, 500, 1000, 5000))
	if _, err := c.GetPostRecords(context.Background(), fakeURIs(10)); err != nil {
		t.Fatal(err)
	}
	if l := c.Limits(); l.Burst != 250 {
		t.Fatalf("limits fetched again within their max age: %+v", l)
	}
	c.ageLimits(limitsMaxAge + time.Second)
	if _, err := c.GetPostRecords(context.Background(), fakeURIs(10)); err != nil {
		t.Fatal(err)
	}
	if l := c.Limits(); l.Burst != 500 || l.ItemsPerSecond != 5000 || l.ChunkSize != 250 {
		t.Errorf("limits %+v, want the raised budget (burst 500, 5000/s, chunks of 250 for 4 × 1000 in flight)", l)
	}
}

// Tests that backoff stays positive however many attempts are allowed.
func TestBackoffDoesNotOverflow(t *testing.T) {
	c := &Client{opts: defaults()}
	for attempt := 1; attempt <= 200; attempt++ {
		d, retry := c.retryDelay(status.Error(codes.Unavailable, "x"), attempt)
		if !retry || d < c.opts.baseBackoff/2 || d > c.opts.maxBackoff {
			t.Fatalf("attempt %d: delay %v (retry %v), want within [%v, %v]", attempt, d, retry, c.opts.baseBackoff/2, c.opts.maxBackoff)
		}
	}
}

// Tests that chunks left over after a call failed spend none of the
// local pace: the next call finds the budget the failed one did not use.
func TestFailedCallLeavesPaceUnspent(t *testing.T) {
	f := &fakeConn{limits: fakeLimits(25, 100, 100, 10)}
	f.get = func(_ context.Context, uris []string) error {
		if uris[0] == "bad" {
			return status.Error(codes.InvalidArgument, "not a post AT-URI")
		}
		return nil
	}
	c := fakeClient(t, f, WithParallelism(1))
	// GetLimits took 1 item and the refused chunk 25: 74 are left.
	if _, err := c.GetPostRecords(context.Background(), append([]string{"bad"}, fakeURIs(99)...)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("err = %v, want InvalidArgument", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	uris := fakeURIs(70)
	records, err := c.GetPostRecords(ctx, uris)
	if err != nil {
		t.Fatalf("70 items with 74 left in the pace: %v", err)
	}
	checkAligned(t, records, uris)
}
