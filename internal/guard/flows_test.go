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
// that. Four unlisted flows, so that one share is many grants and a
// listed client pushed behind the names shows. Waits are an hour, so only
// releases (not time) decide.
func TestFloodOfNamesCannotStarveListedClient(t *testing.T) {
	cfg := budget.DefaultConfig()
	cfg.UnlistedFlows = 4
	cfg.Clients["feed"] = budget.Budget{ItemsPerSecond: 1, Burst: 1, MaxInflightItems: 1}
	q, ctx, cancel, hold := heldQueue(t)
	type grant struct {
		client  string
		release func()
	}
	granted := make(chan grant, 4096)
	var flows unlistedFlows
	enqueue := func(client string) {
		flow, weight := flows.flowOf(cfg, client, time.Now())
		before := q.Stats().Waiting
		go func() {
			g, err := q.Take(ctx, queue.Request{Cost: 1, Flow: flow, Weight: weight})
			if err == nil {
				granted <- grant{client, g.Release}
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
	if want := grants * 3 / 4 / (cfg.Flows() + 1); feed < want {
		t.Errorf("listed client got %d of %d grants against 500 invented names, want at least %d (one share in %d)", feed, grants, want, cfg.Flows()+1)
	}
}

// Tests that unlisted callers up to admission.unlisted_flows get a flow
// each, not the lottery of a hash: eight heavy callers under invented
// names, all backlogged, are granted equal shares (within one grant);
// a ninth name shares a held flow, and a flow whose holder went quiet
// for unlistedIdle is given to a new name.
func TestUnlistedCallersGetEqualShares(t *testing.T) {
	cfg := budget.DefaultConfig()
	n := cfg.Flows()
	var flows unlistedFlows
	now := time.Unix(1_700_000_000, 0)
	seen := map[string]string{}
	for i := range n {
		client := fmt.Sprintf("heavy-%d", i+1)
		flow, _ := flows.flowOf(cfg, client, now)
		if other, ok := seen[flow]; ok {
			t.Fatalf("%s and %s share flow %q while %d flows exist", client, other, flow, n)
		}
		seen[flow] = client
	}
	if again, _ := flows.flowOf(cfg, "heavy-1", now.Add(time.Second)); seen[again] != "heavy-1" {
		t.Errorf("heavy-1 moved to the flow of %q", seen[again])
	}
	if extra, _ := flows.flowOf(cfg, "heavy-extra", now.Add(time.Second)); seen[extra] == "" {
		t.Errorf("a name beyond %d got a flow of its own, %q", n, extra)
	}
	later := now.Add(unlistedIdle + 2*time.Second)
	for i := 1; i < n; i++ { // all but heavy-1, who went quiet
		flows.flowOf(cfg, fmt.Sprintf("heavy-%d", i+1), later)
	}
	if got, _ := flows.flowOf(cfg, "newcomer", later); seen[got] != "heavy-1" {
		t.Errorf("newcomer got the flow of %q, want the one quiet heavy-1 held", seen[got])
	}

	// Equal admission: 8 backlogged callers, capacity 1, grants decided
	// only by the fair order (waits are an hour).
	flows = unlistedFlows{}
	q, ctx, cancel, hold := heldQueue(t)
	type grant struct {
		client  string
		release func()
	}
	granted := make(chan grant, 4096)
	for range 20 {
		for i := range n {
			client := fmt.Sprintf("heavy-%d", i+1)
			flow, weight := flows.flowOf(cfg, client, time.Now())
			before := q.Stats().Waiting
			go func() {
				g, err := q.Take(ctx, queue.Request{Cost: 1, Flow: flow, Weight: weight})
				if err == nil {
					granted <- grant{client, g.Release}
				}
			}()
			for q.Stats().Waiting == before && ctx.Err() == nil {
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	hold()
	got := map[string]int{}
	const rounds = 10
	for range rounds * n {
		select {
		case g := <-granted:
			got[g.client]++
			g.release()
		case <-ctx.Done():
			t.Fatal("no grant")
		}
	}
	cancel()
	for i := range n {
		if c := got[fmt.Sprintf("heavy-%d", i+1)]; c < rounds-1 || c > rounds+1 {
			t.Errorf("grants by caller %v, want %d±1 each", got, rounds)
			break
		}
	}
}

// heldQueue returns a fair queue of capacity 1 whose one slot is held
// (release it with hold), with waits of an hour so that only releases
// decide the grants, and a context that ends with cancel, the test or
// 20 s, whichever is first.
func heldQueue(t *testing.T) (q *queue.Queue, ctx context.Context, cancel context.CancelFunc, hold func()) {
	t.Helper()
	q, err := queue.New(queue.Config{Capacity: 1, MaxWaiters: 4096, Target: time.Hour, Interval: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	g, err := q.Take(ctx, queue.Request{Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	hold = g.Release
	return q, ctx, cancel, hold
}
