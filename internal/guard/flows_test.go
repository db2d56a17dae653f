package guard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/queue"
)

// Tests that a flood of invented names cannot starve a listed client: the
// names share admission.unlisted_flows flows, so with the listed client
// and 500 names all backlogged the listed client still gets its one
// share in (unlisted_flows + 1), and the queue holds no more flows than
// that. Waits are an hour, so only releases (not time) decide.
func TestFloodOfNamesCannotStarveListedClient(t *testing.T) {
	cfg := budget.DefaultConfig()
	cfg.Clients["feed"] = budget.Budget{ItemsPerSecond: 1, Burst: 1, MaxInflightItems: 1}
	q, err := queue.New(queue.Config{Capacity: 1, MaxWaiters: 4096, Target: time.Hour, Interval: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hold, err := q.Acquire(ctx, queue.Request{Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		client  string
		release func()
	}
	granted := make(chan grant, 4096)
	enqueue := func(client string) {
		flow, weight := flowOf(cfg, client)
		before := q.Stats().Waiting
		go func() {
			release, err := q.Acquire(ctx, queue.Request{Cost: 1, Flow: flow, Weight: weight})
			if err == nil {
				granted <- grant{client, release}
			}
		}()
		for q.Stats().Waiting == before && ctx.Err() == nil {
			time.Sleep(100 * time.Microsecond)
		}
	}
	for range 50 {
		enqueue("feed")
	}
	for i := range 500 {
		enqueue(fmt.Sprintf("invented-%d", i))
	}
	if s := q.Stats(); s.Flows > cfg.Flows()+1 {
		t.Errorf("%d flows held for 1 listed client and 500 names, want at most %d", s.Flows, cfg.Flows()+1)
	}
	const grants = 180
	feed := 0
	hold()
	for range grants {
		select {
		case g := <-granted:
			if g.client == "feed" {
				feed++
			}
			g.release()
		case <-ctx.Done():
			t.Fatal("no grant")
		}
	}
	cancel() // the rest give up
	if want := grants/(cfg.Flows()+1) - 2; feed < want {
		t.Errorf("listed client got %d of %d grants against 500 invented names, want at least %d (one share in %d)", feed, grants, want, cfg.Flows()+1)
	}
}
