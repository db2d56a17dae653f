package guard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Tests end to end that heavy callers who together ask for several
// times the process-wide item limit are shed early, never left to wait
// out their deadline: eight callers under their own names, three
// requests of 1,000 items each in flight per caller, against a limit of
// 4,000 items and a handler that takes 20ms a request. Every answer is
// OK or Unavailable (shed, with RetryInfo), and none DeadlineExceeded.
// Only codes are asserted, so a busy machine changes how many are shed,
// not the outcome; the deadlines (5s) are far longer than the queue's
// longest wait (100ms).
func TestHeavyCallersAreShedNotTimedOut(t *testing.T) {
	cfg := testConfig()
	cfg.MaxInflightItems, cfg.MinInflightItems = 4000, 4000
	cfg.Admission = budget.DefaultConfig()
	cfg.Admission.Default = budget.Budget{ItemsPerSecond: 10_000_000, Burst: 1_000_000, MaxInflightItems: 1_000_000}
	impl := &delayedRecords{postRecords: newPostRecords()}
	impl.delay.Store(int64(20 * time.Millisecond))
	srv, err := guard.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client := sluicev1.NewPostRecordsClient(serveImpl(t, srv, impl))
	batch := uris(1000)
	var (
		mu    sync.Mutex
		codeN = map[codes.Code]int{}
		other []error
		wg    sync.WaitGroup
	)
	for c := range 8 {
		md := metadata.Pairs("x-client-id", fmt.Sprintf("heavy-%d", c+1))
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 25 {
					ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 5*time.Second)
					_, err := client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: batch})
					cancel()
					st := status.Convert(err)
					mu.Lock()
					codeN[st.Code()]++
					if st.Code() == codes.DeadlineExceeded {
						other = append(other, fmt.Errorf("DeadlineExceeded: %v", err))
					}
					if st.Code() == codes.Unavailable && retryDelay(st) <= 0 {
						other = append(other, fmt.Errorf("Unavailable without RetryInfo: %v", err))
					}
					mu.Unlock()
					if st.Code() == codes.Unavailable {
						time.Sleep(5 * time.Millisecond) // a caller that backs off a little
					}
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("codes: %v", codeN)
	if n := codeN[codes.DeadlineExceeded]; n > 0 {
		t.Errorf("%d of %d heavy requests ended DeadlineExceeded, want 0: a request that cannot be admitted in time is shed with Unavailable", n, 8*3*25)
	}
	for c, n := range codeN {
		if c != codes.OK && c != codes.Unavailable && c != codes.DeadlineExceeded {
			t.Errorf("%d heavy requests ended %v, want only OK or Unavailable", n, c)
		}
	}
	if codeN[codes.OK] == 0 || codeN[codes.Unavailable] == 0 {
		t.Errorf("codes %v: want some served and some shed, or the test did not overload the limit", codeN)
	}
	for _, err := range other {
		t.Error(err)
	}
}

// retryDelay is the RetryInfo delay st carries, 0 without one.
func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			return r.GetRetryDelay().AsDuration()
		}
	}
	return 0
}
