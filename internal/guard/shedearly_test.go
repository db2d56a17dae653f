package guard_test

import (
	"context"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tests that a request waiting for item capacity that never frees is
// shed with Unavailable and RetryInfo before its deadline, when only the
// admission deadline can end its wait: the queue interval (1 minute) is
// far longer than the caller's deadline (300 ms), so the controlled-delay
// rule never sheds it, and a write holds all the capacity without
// finishing. A guard that waited to the deadline itself would lose the
// race with the caller's deadline, which started earlier, and the caller
// would see DeadlineExceeded instead of being told to retry. Only the
// code and that the call returned before its deadline are asserted, not
// how long it took.
func TestCapacityWaitIsShedBeforeTheDeadline(t *testing.T) {
	cfg := testConfig()
	cfg.MinInflightItems, cfg.MaxInflightItems = 1000, 1000
	cfg.QueueTarget, cfg.QueueInterval = time.Minute, time.Minute
	impl := newPostRecords()
	impl.blockWrites = make(chan struct{})
	f := start(t, cfg, impl)
	release := holdItems(t, f, 1000) // all of the capacity

	ctx, cancel := context.WithTimeout(as(t, "feed").context(), 300*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(1)})
	returned := time.Now()
	if status.Code(err) == codes.DeadlineExceeded {
		t.Fatalf("a request that could not be admitted waited out its deadline: %v; want Unavailable before it", err)
	}
	st := wantCode(t, err, codes.Unavailable)
	if !returned.Before(deadline) {
		t.Errorf("the shed request returned %v after its deadline, want before it", returned.Sub(deadline))
	}
	if retryDelay(st) <= 0 {
		t.Errorf("shed without RetryInfo: %v", st.Details())
	}
	if got := impl.started(); len(got) != 0 {
		t.Errorf("the read handler ran for calls of %v URIs, want none", got)
	}
	waitIdle(t, f, 1000)
	release()
}
