package guard

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"github.com/sluice-dev/sluice/internal/guard/queue"
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
	// The controlled-delay wait is longer than the test, so that only
	// the latest start can end the wait.
	cfg.QueueTarget, cfg.QueueInterval = 10*time.Second, 10*time.Second
	s := newMemoryServer(t, cfg)
	for range minSamples {
		s.service.observe(getPostRecords, 1, 1200*time.Millisecond) // expected 900ms, start margin 1.8s
	}
	held := holdRequestSlot(t, s, "other")
	released := make(chan struct{})
	var retaken queue.Grant
	defer func() {
		<-released
		retaken.Release()
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
		held.Release()
		retaken, _ = s.requests.Take(context.Background(), queue.Request{Cost: 1, Flow: "other"})
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
	defer holdRequestSlot(t, s, "other").Release()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
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

// holdRequestSlot takes one of s's request slots in flow's name, failing
// t if none is free.
func holdRequestSlot(t *testing.T, s *Server, flow string) queue.Grant {
	t.Helper()
	// StartBy now: a free slot is taken at once; with none free the
	// request is refused, not queued.
	g, err := s.requests.Take(context.Background(), queue.Request{Cost: 1, Flow: flow, StartBy: time.Now()})
	if err != nil {
		t.Fatalf("take a request slot: %v", err)
	}
	return g
}

// Tests that with every request slot taken, the next slot freed goes to
// a caller under its fair share, not to a heavy caller that asked
// before it: request slots are queued fairly across clients, as items
// are, so a flood of one caller's requests cannot put a light caller
// behind them.
func TestFreedRequestSlotGoesToTheCallerUnderItsShare(t *testing.T) {
	cfg := memoryConfig(512 * membudget.MiB)
	cfg.MaxInflightRequests = 1
	cfg.QueueTarget, cfg.QueueInterval = 10*time.Second, 10*time.Second // nobody is shed for waiting
	generous := budget.Budget{ItemsPerSecond: 1000, Burst: 1000, MaxInflightItems: 1000}
	cfg.Admission.Clients = map[string]budget.Budget{"indexer": generous, "feed": generous}
	s := newMemoryServer(t, cfg)
	held := holdRequestSlot(t, s, "indexer")

	admittedOrder := make(chan string, 4)
	done := make(chan struct{})
	var wg sync.WaitGroup
	admit := func(client string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			a, _, err := s.admit(ctx, getPostRecords, client, 1, false)
			if err != nil {
				admittedOrder <- client + ": " + err.Error()
				return
			}
			admittedOrder <- client
			<-done
			a.release()
		}()
	}
	defer func() {
		close(done)
		wg.Wait()
	}()
	waitForSlotWaiters := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); s.requests.Stats().Waiting < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d requests wait for a slot after 10s, want %d", s.requests.Stats().Waiting, n)
			}
		}
	}
	for i := range 3 {
		admit("indexer")
		waitForSlotWaiters(i + 1)
	}
	admit("feed")
	waitForSlotWaiters(4)

	held.Release()
	if first := <-admittedOrder; first != "feed" {
		t.Fatalf("the freed slot went to %q, want feed: it asked after three of the indexer's requests, but the indexer already held the slot", first)
	}
}
