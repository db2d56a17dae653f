package fanout

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Tests that Each never runs more calls at once than the context's limit.
func TestEachRespectsLimit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		limit, n   int
		wantActive int32
	}{
		{name: "unset limit runs serially", limit: 0, n: 20, wantActive: 1},
		{name: "limit below n", limit: 4, n: 40, wantActive: 4},
		{name: "limit above n", limit: 50, n: 3, wantActive: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.limit > 0 {
				ctx = WithLimit(ctx, tc.limit)
			}
			var active, peak atomic.Int32
			var calls atomic.Int32
			err := Each(ctx, tc.n, func(ctx context.Context, i int) error {
				cur := active.Add(1)
				for {
					p := peak.Load()
					if cur <= p || peak.CompareAndSwap(p, cur) {
						break
					}
				}
				time.Sleep(2 * time.Millisecond)
				active.Add(-1)
				calls.Add(1)
				return nil
			})
			if err != nil {
				t.Fatalf("Each: %v", err)
			}
			if got := calls.Load(); got != int32(tc.n) {
				t.Errorf("calls = %d, want %d", got, tc.n)
			}
			if got := peak.Load(); got != tc.wantActive {
				t.Errorf("peak concurrency = %d, want %d", got, tc.wantActive)
			}
		})
	}
}

// Tests that the first error stops scheduling and is returned. Calls
// after the failing one wait for the cancellation it causes, so a busy
// machine that delays the failing goroutine cannot let others run ahead.
func TestEachStopsOnError(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int32
	err := Each(WithLimit(context.Background(), 2), 1000, func(ctx context.Context, i int) error {
		calls.Add(1)
		switch {
		case i == 3:
			return boom
		case i > 3:
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
			}
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	if got := calls.Load(); got > 10 {
		t.Errorf("calls after error = %d, want scheduling to stop early", got)
	}
}

// Tests that a call waiting for a slot when another fails is never made:
// call 0 fails once call 2 waits for the slot call 1 holds until the
// context ends, so call 2 gets call 0's slot only after the cancellation.
func TestEachCallsNothingAfterAnError(t *testing.T) {
	boom := errors.New("boom")
	for round := range 20 {
		var third atomic.Bool
		err := Each(WithLimit(context.Background(), 2), 3, func(ctx context.Context, i int) error {
			switch i {
			case 0:
				time.Sleep(5 * time.Millisecond) // Each is then waiting to start call 2
				return boom
			case 1:
				<-ctx.Done()
			default:
				third.Store(true)
			}
			return nil
		})
		if !errors.Is(err, boom) {
			t.Fatalf("round %d: err = %v, want %v", round, err, boom)
		}
		if third.Load() {
			t.Fatalf("round %d: call 2 ran after call 0 failed and cancelled the fan-out", round)
		}
	}
}

// Tests that a cancelled parent context is reported even when no task failed.
func TestEachReportsCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(WithLimit(context.Background(), 2))
	cancel()
	err := Each(ctx, 5, func(ctx context.Context, i int) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// Tests that with one call at a time the first error stops the calls at
// once, and a context that ends stops the calls that follow.
func TestEachInOrderStops(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int32
	err := Each(WithLimit(context.Background(), 1), 1000, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	if got := calls.Load(); got != 4 {
		t.Errorf("calls = %d, want 4 (none after the failing one)", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	calls.Store(0)
	err = Each(ctx, 10, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 1 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("calls = %d, want 2 (none once the context ended)", got)
	}
}

// Tests that a fan-out of one call at a time starts no goroutine: its
// calls run on the caller's, as a single-record read's do.
func TestEachOneAtATimeRunsOnCaller(t *testing.T) {
	for _, tc := range []struct {
		name     string
		limit, n int
	}{
		{name: "one task", limit: 8, n: 1},
		{name: "limit one", limit: 1, n: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caller := goroutineID()
			var elsewhere atomic.Int32
			err := Each(WithLimit(context.Background(), tc.limit), tc.n, func(ctx context.Context, i int) error {
				if goroutineID() != caller {
					elsewhere.Add(1)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("Each: %v", err)
			}
			if got := elsewhere.Load(); got != 0 {
				t.Errorf("%d of %d calls ran on another goroutine, want 0", got, tc.n)
			}
		})
	}
}

// goroutineID is the running goroutine's number, from its stack trace's
// first line ("goroutine N [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	buf = bytes.TrimPrefix(buf, []byte("goroutine "))
	return string(buf[:bytes.IndexByte(buf, ' ')])
}

// Tests that a fan-out's calls run on at most its limit of goroutines,
// each making many calls, not on a new goroutine per call: a goroutine's
// stack then grows once for all its calls, not once per call.
func TestEachRunsCallsOnLimitGoroutines(t *testing.T) {
	const limit, n = 4, 400
	var mu sync.Mutex
	seen := map[string]int{}
	err := Each(WithLimit(context.Background(), limit), n, func(ctx context.Context, i int) error {
		id := goroutineID()
		mu.Lock()
		seen[id]++
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatalf("Each: %v", err)
	}
	calls := 0
	for _, c := range seen {
		calls += c
	}
	if calls != n {
		t.Fatalf("%d calls made, want %d", calls, n)
	}
	if len(seen) > limit {
		t.Errorf("the %d calls ran on %d goroutines, want at most the limit, %d", n, len(seen), limit)
	}
}
