package guard

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tests that a request waiting for a request slot waits no longer than
// its deadline minus twice its expected service time, as it would for
// items: with every slot held it is shed then, with Unavailable and
// RetryInfo, not admitted later with too little time left to finish.
func TestRequestSlotWaitLeavesRoomToFinish(t *testing.T) {
	cfg := memoryConfig(512 * membudget.MiB)
	cfg.MaxInflightRequests = 1
	s := newMemoryServer(t, cfg)
	for range minSamples {
		s.service.observe(getPostRecords, 1, 1200*time.Millisecond) // expected 900ms, start margin 1.8s
	}
	if !s.requests.TryAcquire(1) {
		t.Fatal("the one request slot is taken")
	}
	released := make(chan struct{})
	defer func() {
		<-released
		s.requests.Release(1)
	}()
	// Latest start 4.2s in; the wait for capacity would end at 5.9s. The
	// slot frees at 5.5s, between the two, with room on either side for
	// a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	go func() {
		// The slot frees after the latest start that leaves room to
		// finish, before the end of the wait for capacity.
		time.Sleep(5500 * time.Millisecond)
		s.requests.Release(1)
		s.requests.Acquire(context.Background(), 1) //nolint:errcheck // taken back for the deferred release
		close(released)
	}()
	began := time.Now()
	admitted, _, err := s.admit(ctx, getPostRecords, "feed", 1, false)
	waited := time.Since(began)
	if err == nil {
		admitted.release()
		t.Fatalf("admitted after %v with %v of its deadline left, want shed by its latest start (4.2s)", waited, 6*time.Second-waited)
	}
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		t.Fatalf("after %v: %v, want Unavailable", waited, err)
	}
	retry := false
	for _, d := range st.Details() {
		_, ok := d.(*errdetails.RetryInfo)
		retry = retry || ok
	}
	if !retry {
		t.Errorf("shed without RetryInfo: %v", err)
	}
}

// Tests that a request shed before any work (here: no request slot
// within its wait) leaves its caller's budget as it was: its items go
// back to the caller's rate, so the retry its RetryInfo asks for is not
// paid for twice.
func TestShedRequestIsNotCharged(t *testing.T) {
	cfg := memoryConfig(512 * membudget.MiB)
	cfg.MaxInflightRequests = 1
	cfg.Admission.Clients = map[string]budget.Budget{"feed": {ItemsPerSecond: 1, Burst: 100, MaxInflightItems: 100}}
	s := newMemoryServer(t, cfg)
	if !s.requests.TryAcquire(1) {
		t.Fatal("the one request slot is taken")
	}
	defer s.requests.Release(1)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if admitted, _, err := s.admit(ctx, getPostRecords, "feed", 100, false); status.Code(err) != codes.Unavailable {
		if err == nil {
			admitted.release()
		}
		t.Fatalf("admit with every request slot held: %v, want Unavailable", err)
	}
	spent, refusal := s.budgets.Spend("feed", 100, time.Now())
	if refusal != nil {
		t.Fatalf("the caller's whole burst after a shed: %v, want it still there", refusal)
	}
	spent.Release()
}
