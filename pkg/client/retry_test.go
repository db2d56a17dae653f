package client

import (
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Tests that retries stay within the budget: the saved burst first, then
// one retry per 1/ratio requests.
func TestRetryBudget(t *testing.T) {
	b := newRetryBudget(0.1, 2)
	for i := range 2 {
		if !b.spend() {
			t.Fatalf("retry %d of the saved burst of 2 was not available", i+1)
		}
	}
	if b.spend() {
		t.Fatal("a third retry was allowed with the burst spent and no requests since")
	}
	for range 9 {
		b.earn()
	}
	if b.spend() {
		t.Fatal("retry allowed after 9 requests at ratio 0.1")
	}
	b.earn()
	if !b.spend() {
		t.Fatal("no retry after 10 requests at ratio 0.1")
	}
}

func withRetry(code codes.Code, d time.Duration) error {
	st, _ := status.New(code, "refused").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	return st.Err()
}

// Tests which errors are retried and how long the client waits.
func TestRetryDelay(t *testing.T) {
	o := defaults()
	o.rand = defaults().rand
	c := &Client{opts: o}
	for _, tc := range []struct {
		name     string
		err      error
		attempt  int
		retry    bool
		min, max time.Duration
	}{
		{"RetryInfo honoured", withRetry(codes.ResourceExhausted, time.Second), 1, true, time.Second, 1200 * time.Millisecond},
		{"shed with RetryInfo", withRetry(codes.Unavailable, 100*time.Millisecond), 2, true, 100 * time.Millisecond, 120 * time.Millisecond},
		{"Unavailable backoff 1", status.Error(codes.Unavailable, "x"), 1, true, 25 * time.Millisecond, 50 * time.Millisecond},
		{"Unavailable backoff 3", status.Error(codes.Unavailable, "x"), 3, true, 100 * time.Millisecond, 200 * time.Millisecond},
		{"backoff capped", status.Error(codes.Unavailable, "x"), 30, true, time.Second, 2 * time.Second},
		{"over burst: no RetryInfo", status.Error(codes.ResourceExhausted, "x"), 1, false, 0, 0},
		{"invalid", status.Error(codes.InvalidArgument, "x"), 1, false, 0, 0},
		{"deadline", status.Error(codes.DeadlineExceeded, "x"), 1, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 50 {
				d, retry := c.retryDelay(tc.err, tc.attempt)
				if retry != tc.retry {
					t.Fatalf("retry = %v, want %v", retry, tc.retry)
				}
				if retry && (d < tc.min || d > tc.max) {
					t.Fatalf("delay %v outside [%v, %v]", d, tc.min, tc.max)
				}
			}
		})
	}
}

// Tests the chunking chosen from the server's limits.
func TestChooseLimits(t *testing.T) {
	resp := func(maxItems, burst, inflight uint32) *sluicev1.GetLimitsResponse {
		return &sluicev1.GetLimitsResponse{
			Methods: []*sluicev1.MethodLimits{{Method: getPostRecords, MaxItems: maxItems, MaxUriLength: 512}},
			Budget:  &sluicev1.ClientBudget{Client: "c", ItemsPerSecond: 1000, Burst: burst, MaxInflightItems: inflight},
		}
	}
	for _, tc := range []struct {
		name                       string
		maxItems, burst, inflight  uint32
		parallelism                int
		wantChunk, wantParallelism int
	}{
		{"method limit", 1000, 5000, 5000, 4, 1000, 4},
		{"burst limit", 1000, 250, 5000, 4, 250, 4},
		{"in-flight shares chunks", 1000, 2000, 2000, 4, 500, 4},
		{"tiny in-flight", 1000, 2000, 3, 4, 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := chooseLimits(resp(tc.maxItems, tc.burst, tc.inflight), tc.parallelism)
			if err != nil {
				t.Fatal(err)
			}
			if l.ChunkSize != tc.wantChunk || l.Parallelism != tc.wantParallelism {
				t.Errorf("chunk %d × %d, want %d × %d", l.ChunkSize, l.Parallelism, tc.wantChunk, tc.wantParallelism)
			}
			if l.ChunkSize*l.Parallelism > int(tc.inflight) {
				t.Errorf("chunk %d × %d exceeds the in-flight cap %d", l.ChunkSize, l.Parallelism, tc.inflight)
			}
		})
	}
	if _, err := chooseLimits(&sluicev1.GetLimitsResponse{}, 4); err == nil {
		t.Error("empty limits accepted")
	}
}
