package guard_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// delayedRecords answers GetPostRecords after a delay the test changes.
type delayedRecords struct {
	*postRecords
	delay atomic.Int64 // nanoseconds
}

func (d *delayedRecords) GetPostRecords(ctx context.Context, req *sluicev1.GetPostRecordsRequest) (*sluicev1.GetPostRecordsResponse, error) {
	time.Sleep(time.Duration(d.delay.Load()))
	return d.postRecords.GetPostRecords(ctx, req)
}

// Tests end to end that the adaptive item limit falls when the service
// time per item rises (here a handler that becomes 20× slower, as a store
// read delay would make it) and recovers when it drops back. No latency
// is bounded: each phase runs until the limit has moved, within a
// generous test deadline.
func TestItemLimitFollowsServiceTime(t *testing.T) {
	cfg := testConfig()
	cfg.MaxInflightItems, cfg.MinInflightItems = 1000, 20
	cfg.AdaptiveInterval = 20 * time.Millisecond
	cfg.AdaptiveTolerance = 4 // room for a busy machine's jitter
	impl := &delayedRecords{postRecords: newPostRecords()}
	impl.delay.Store(int64(20 * time.Millisecond))
	srv, err := guard.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client := sluicev1.NewPostRecordsClient(serveImpl(t, srv, impl))
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, _ = client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(10)})
			}
		}()
	}
	waitFor := func(what string, cond func(int64) bool) {
		t.Helper()
		for !cond(srv.ItemLimit()) {
			if ctx.Err() != nil {
				t.Fatalf("item limit %d: never %s", srv.ItemLimit(), what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(500 * time.Millisecond) // floors learnt at the fast service time
	impl.delay.Store(int64(400 * time.Millisecond))
	waitFor("fell below 200 of 1000 while the handler was 20× slower", func(l int64) bool { return l < 200 })
	fell := srv.ItemLimit()
	if a := srv.Admission(); a.Capacity != fell && a.Capacity > 200 {
		t.Errorf("queue capacity %d, want the limit %d applied", a.Capacity, fell)
	}
	impl.delay.Store(int64(20 * time.Millisecond))
	waitFor("recovered above 500 once the handler was fast again", func(l int64) bool { return l > 500 })
	t.Logf("limit fell to %d and recovered to %d", fell, srv.ItemLimit())
}

// gatedRecords answers GetPostRecords once gate is closed.
type gatedRecords struct {
	*postRecords
	gate chan struct{}
}

func (g *gatedRecords) GetPostRecords(ctx context.Context, req *sluicev1.GetPostRecordsRequest) (*sluicev1.GetPostRecordsResponse, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.postRecords.GetPostRecords(ctx, req)
}

// Tests that a saturation reading is true while a request waits for items
// and once after a request was shed, and false otherwise: the item limit
// is fixed at 1,000 and one waiter fills the queue, so with one request
// of 1,000 items held in its handler a second waits and a third is shed.
func TestSaturationReadsWaitersAndSheds(t *testing.T) {
	cfg := testConfig()
	cfg.MaxInflightItems, cfg.MinInflightItems, cfg.PieceItems = 1000, 1000, 1000
	cfg.MaxQueuedRequests = 1
	// The waiter must wait until the test has read it, not be shed for
	// having waited a queue interval (100ms by default) on a busy machine.
	cfg.QueueInterval, cfg.QueueTarget = time.Minute, time.Minute
	impl := &gatedRecords{postRecords: newPostRecords(), gate: make(chan struct{})}
	srv, err := guard.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client := sluicev1.NewPostRecordsClient(serveImpl(t, srv, impl))
	saturated := srv.Saturation()
	if saturated() {
		t.Fatal("an idle guard read saturated")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	call := func() {
		defer wg.Done()
		_, _ = client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(1000)})
	}
	wg.Add(1)
	go call()
	for srv.InflightItems() < 1000 {
		if ctx.Err() != nil {
			t.Fatal("the first request was never admitted")
		}
		time.Sleep(time.Millisecond)
	}
	wg.Add(1)
	go call()
	for srv.Admission().Waiting == 0 {
		if ctx.Err() != nil {
			t.Fatal("the second request never waited")
		}
		time.Sleep(time.Millisecond)
	}
	if !saturated() {
		t.Fatal("a request waiting for items did not read saturated")
	}
	if _, err := client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris(1000)}); status.Code(err) != codes.Unavailable {
		t.Fatalf("third request: %v, want Unavailable (shed: the queue is full)", err)
	}
	close(impl.gate)
	wg.Wait()
	if a := srv.Admission(); a.Waiting != 0 || a.InUse != 0 {
		t.Fatalf("after every request ended: %d waiting, %d items in use", a.Waiting, a.InUse)
	}
	if !saturated() {
		t.Error("the reading after a shed did not read saturated")
	}
	if saturated() {
		t.Error("a second reading with nothing waiting and nothing shed since read saturated")
	}
}
