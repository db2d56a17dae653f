package fanout

import (
	"context"
	"errors"
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

// Tests that the first error stops scheduling and is returned.
func TestEachStopsOnError(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int32
	err := Each(WithLimit(context.Background(), 2), 1000, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 3 {
			return boom
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

// Tests that a cancelled parent context is reported even when no task failed.
func TestEachReportsCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(WithLimit(context.Background(), 2))
	cancel()
	err := Each(ctx, 5, func(ctx context.Context, i int) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}
