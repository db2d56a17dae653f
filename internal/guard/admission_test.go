package guard_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// slowRecords answers GetPostRecord after a fixed delay, counting the
// call as soon as it starts.
type slowRecords struct {
	*postRecords
	delay time.Duration
}

func (s slowRecords) GetPostRecord(ctx context.Context, req *sluicev1.GetPostRecordRequest) (*sluicev1.PostRecord, error) {
	rec, err := s.postRecords.GetPostRecord(ctx, req)
	time.Sleep(s.delay)
	return rec, err
}

// Tests that once the guard has seen how long a method takes, a request
// with less deadline left than that is refused before its handler runs.
// The handler takes 2s and the hopeless request has 1s, so the guard's
// refusal (which needs no work) has a whole second to reach the caller
// before the caller's own deadline, even on a busy machine.
func TestDeadlineShorterThanServiceTime(t *testing.T) {
	const took, hopeless = 2 * time.Second, time.Second
	obs := &observer{}
	impl := newPostRecords()
	srv, err := guard.New(testConfig(), guard.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	f := serveImpl(t, srv, slowRecords{impl, took})
	client := sluicev1.NewPostRecordsClient(f)
	// Enough samples for the estimate to be trusted, taken at once.
	warm := make(chan error, 10)
	for range cap(warm) {
		go func() {
			_, err := client.GetPostRecord(testContext(t, 30*time.Second), &sluicev1.GetPostRecordRequest{Uri: uris(1)[0]})
			warm <- err
		}()
	}
	for range cap(warm) {
		if err := <-warm; err != nil {
			t.Fatalf("warm-up GetPostRecord: %v", err)
		}
	}
	before := impl.calls.Load()
	_, err = client.GetPostRecord(testContext(t, hopeless), &sluicev1.GetPostRecordRequest{Uri: uris(1)[0]})
	st := wantCode(t, err, codes.DeadlineExceeded)
	if !strings.Contains(st.Message(), "shorter than the") || !strings.Contains(st.Message(), "requests of 1 items take now") {
		t.Errorf("message %q, want the guard's refusal naming the expected service time", st.Message())
	}
	if n := impl.calls.Load(); n != before {
		t.Errorf("handler ran %d more times, want the hopeless request refused before it", n-before)
	}
	if !slices.Contains(obs.reasons(), guard.ReasonDeadline) {
		t.Errorf("observer rejections %v, want %q", obs.reasons(), guard.ReasonDeadline)
	}
}

// Tests that a client over its budget is refused by the guard with
// ResourceExhausted, RetryInfo and QuotaFailure before its handler runs,
// and that SetBudgets takes effect at once.
func TestQuota(t *testing.T) {
	cfg := testConfig()
	cfg.Admission = budget.Config{
		Default: budget.DefaultConfig().Default,
		Clients: map[string]budget.Budget{"tiny": {ItemsPerSecond: 2, Burst: 10, MaxInflightItems: 10}},
	}
	obs := &observer{}
	f := start(t, cfg, newPostRecords(), guard.WithObserver(obs))
	ctx := metadata.AppendToOutgoingContext(testContext(t, 5*time.Second), "x-client-id", "tiny")
	// The bucket refills at 2 items/s from the first charge on: 5 more
	// items need 2.5s less what refilled in the meantime, and at most
	// 2 items/s × elapsed can have refilled, however slow the machine.
	const wantRetry = 2500 * time.Millisecond
	began := time.Now()
	if _, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(10)}); err != nil {
		t.Fatal(err)
	}
	calls := f.impl.calls.Load()
	_, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(5)})
	elapsed := time.Since(began)
	st := wantCode(t, err, codes.ResourceExhausted)
	var retry *errdetails.RetryInfo
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		}
	}
	if d := retry.GetRetryDelay().AsDuration(); retry == nil || d > wantRetry || d < wantRetry-elapsed {
		t.Errorf("RetryInfo %v, want between %v and %v (5 items at 2/s, less %v of refill)", retry, wantRetry-elapsed, wantRetry, elapsed)
	}
	if quota == nil || quota.GetViolations()[0].GetSubject() != "client:tiny" {
		t.Errorf("QuotaFailure %v, want subject client:tiny", quota)
	}
	if !strings.Contains(st.Message(), `client "tiny"`) || !strings.Contains(st.Message(), "2 items/s") {
		t.Errorf("message %q does not name the client and budget", st.Message())
	}
	if f.impl.calls.Load() != calls {
		t.Error("the handler ran for a request over budget")
	}
	if !slices.Contains(obs.reasons(), guard.ReasonQuota) {
		t.Errorf("observer rejections %v, want %q", obs.reasons(), guard.ReasonQuota)
	}

	// A request over the burst can never fit: no RetryInfo.
	_, err = f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(11)})
	st = wantCode(t, err, codes.ResourceExhausted)
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			t.Errorf("a request over the burst carries RetryInfo: %s", st.Message())
		}
	}

	next := cfg.Admission
	next.Clients = map[string]budget.Budget{"tiny": {ItemsPerSecond: 1000, Burst: 1000, MaxInflightItems: 1000}}
	if err := f.srv.SetBudgets(next); err != nil {
		t.Fatal(err)
	}
	// The client keeps its (empty) bucket, which now refills at 1000/s:
	// 5 items that needed 2.5s at the old rate fit after 20ms.
	time.Sleep(20 * time.Millisecond)
	if _, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(5)}); err != nil {
		t.Errorf("after SetBudgets raised the budget: %v", err)
	}
	if got := f.srv.Budget("tiny").Burst; got != 1000 {
		t.Errorf("Budget(tiny).Burst = %d, want 1000", got)
	}
}

// serveImpl serves impl through srv until the test ends and returns a
// connection to it.
func serveImpl(t testing.TB, srv *guard.Server, impl sluicev1.PostRecordsServer) *grpc.ClientConn {
	t.Helper()
	if err := srv.Register(&sluicev1.PostRecords_ServiceDesc, impl); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		srv.Drain(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return dial(t, lis.Addr().String())
}
