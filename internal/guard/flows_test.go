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
// names share admission.unlisted_flows flows, which together weigh at
// most admission.unlisted_weight, so with the listed client and 500 names
// all backlogged the listed client still gets its one share in
// (unlisted_flows + 1) with four flows (each at the default weight), and
// one in (unlisted_weight + 1) with the default 64 flows, which the flood
// holds every one of; the queue holds no more flows than that. Waits are
// an hour, so only releases (not time) decide.
func TestFloodOfNamesCannotStarveListedClient(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flows  int
		shares int // the flood's shares against the listed client's one
	}{
		{"four flows", 4, 4},
		{"default flows and weight", budget.DefaultUnlistedFlows, budget.DefaultUnlistedWeight},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := budget.DefaultConfig()
			cfg.UnlistedFlows = tc.flows
			cfg.Clients["feed"] = budget.Budget{ItemsPerSecond: 1, Burst: 1, MaxInflightItems: 1}
			feed, grants := floodAgainst(t, cfg, 500)
			if want := grants * 3 / 4 / (tc.shares + 1); feed < want {
				t.Errorf("listed client got %d of %d grants against 500 invented names, want at least %d (one share in %d)", feed, grants, want, tc.shares+1)
			}
		})
	}
}

// floodAgainst backlogs 50 requests of the listed client feed and one of
// each of names invented names in a held queue, then releases grants one
// by one and returns how many of the first grants went to feed.
func floodAgainst(t *testing.T, cfg budget.Config, names int) (feed, grants int) {
	q, ctx, cancel, hold := heldQueue(t)
	defer cancel() // the rest give up
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
	for i := range names {
		enqueue(fmt.Sprintf("invented-%d", i))
	}
	if s := q.Stats(); s.Flows > cfg.Flows()+1 {
		t.Errorf("%d flows held for 1 listed client and %d names, want at most %d", s.Flows, names, cfg.Flows()+1)
	}
	grants = 180
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
	return feed, grants
}

// Tests the unlisted flows' weights: the default budget's each while the
// flows in use weigh no more than admission.unlisted_weight together, an
// even part of it beyond, and the default again once the others have
// been quiet for unlistedIdle.
func TestUnlistedFlowsShareTheirWeight(t *testing.T) {
	cfg := budget.DefaultConfig()
	var flows unlistedFlows
	now := time.Unix(1_700_000_000, 0)
	weightOf := func(name string) float64 {
		_, w := flows.flowOf(cfg, name, now)
		return w
	}
	for i := range budget.DefaultUnlistedWeight {
		if w := weightOf(fmt.Sprintf("svc-%d", i)); w != 1 {
			t.Fatalf("unlisted caller %d of %d: weight %v, want the default 1", i+1, budget.DefaultUnlistedWeight, w)
		}
	}
	if w, want := weightOf("svc-ninth"), 8.0/9; w != want {
		t.Errorf("a ninth unlisted caller: weight %v, want %v (8 shared by 9)", w, want)
	}
	for i := range 1000 {
		weightOf(fmt.Sprintf("invented-%d", i))
	}
	if w, want := weightOf("invented-1"), 8.0/64; w != want {
		t.Errorf("with every flow held by a flood: weight %v, want %v (8 shared by 64)", w, want)
	}
	now = now.Add(unlistedIdle + recountEvery)
	if w := weightOf("svc-0"); w != 1 {
		t.Errorf("the only unlisted caller after the flood went quiet: weight %v, want the default 1", w)
	}
	cfg.Clients["feed"] = budget.Budget{ItemsPerSecond: 1, Burst: 1, MaxInflightItems: 1, Weight: 3}
	if _, w := flows.flowOf(cfg, "feed", now); w != 3 {
		t.Errorf("a listed client's weight %v, want its own 3", w)
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
