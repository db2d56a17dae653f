package queue

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const defaultTestTimeout = 10 * time.Second

// fakeClock runs timers only when the test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at   time.Time
	f    func()
	done bool // fired or stopped
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.done
		t.done = true
		return was
	}
}

// Advance moves time forward by d, firing due timers in time order.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	for {
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.done && !t.at.After(target) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			break
		}
		next.done = true
		c.now = next.at
		c.mu.Unlock()
		next.f()
		c.mu.Lock()
	}
	c.now = target
	c.mu.Unlock()
}

// Tests the controlled-delay rule itself: N while the queue has been
// empty within the last N, M once it has stood for N, never past StartBy.
func TestMaxWait(t *testing.T) {
	cfg := DefaultConfig() // M 5ms, N 100ms
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name      string
		lastEmpty time.Time
		startBy   time.Time
		want      time.Duration
	}{
		{"empty just now", now, time.Time{}, 100 * time.Millisecond},
		{"empty 99ms ago", now.Add(-99 * time.Millisecond), time.Time{}, 100 * time.Millisecond},
		{"standing for 100ms", now.Add(-100 * time.Millisecond), time.Time{}, 5 * time.Millisecond},
		{"standing for a second", now.Add(-time.Second), time.Time{}, 5 * time.Millisecond},
		{"deadline sooner than N", now, now.Add(30 * time.Millisecond), 30 * time.Millisecond},
		{"deadline sooner than M", now.Add(-time.Second), now.Add(2 * time.Millisecond), 2 * time.Millisecond},
		{"deadline later than N", now, now.Add(time.Second), 100 * time.Millisecond},
		{"deadline passed", now, now.Add(-time.Millisecond), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cfg.MaxWait(now, tc.lastEmpty, tc.startBy); got != tc.want {
				t.Errorf("MaxWait = %v, want %v", got, tc.want)
			}
		})
	}
}

// Tests the serving order within one flow: oldest first normally, newest
// first in a standing queue, interactive before batch either way.
func TestPickWithinFlow(t *testing.T) {
	type w struct {
		id    int
		batch bool
	}
	mixed := []w{{1, true}, {2, false}, {3, false}, {4, true}}
	for _, tc := range []struct {
		name    string
		waiters []w
		lifo    bool
		want    int
	}{
		{"fifo", []w{{1, false}, {2, false}, {3, false}}, false, 1},
		{"lifo", []w{{1, false}, {2, false}, {3, false}}, true, 3},
		{"fifo skips batch", mixed, false, 2},
		{"lifo skips batch", mixed, true, 3},
		{"only batch fifo", []w{{1, true}, {2, true}}, false, 1},
		{"only batch lifo", []w{{1, true}, {2, true}}, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFairState(8)
			var ws []*waiter
			ids := map[*waiter]int{}
			for _, x := range tc.waiters {
				wt := &waiter{req: Request{Batch: x.batch}, flow: f.join("", 0, time.Time{})}
				ids[wt] = x.id
				ws = append(ws, wt)
			}
			if got := ids[f.pick(ws, tc.lifo, time.Time{})]; got != tc.want {
				t.Errorf("pick = %d, want %d", got, tc.want)
			}
		})
	}
}

// harness runs Acquire calls in goroutines against a fake clock.
type harness struct {
	t     *testing.T
	q     *Queue
	clock *fakeClock
	ctx   context.Context
}

type result struct {
	id      int
	release func()
	err     error
}

func newHarness(t *testing.T, capacity int64, maxWaiters int) *harness {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Capacity, cfg.MaxWaiters = capacity, maxWaiters
	return newHarnessWith(t, cfg)
}

// newHarnessWith is newHarness with a whole config.
func newHarnessWith(t *testing.T, cfg Config) *harness {
	t.Helper()
	clock := newFakeClock()
	q, err := New(cfg, clock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	return &harness{t: t, q: q, clock: clock, ctx: ctx}
}

// acquireNow expects r to be admitted without waiting.
func (h *harness) acquireNow(r Request) func() {
	h.t.Helper()
	release, err := h.q.Acquire(h.ctx, r)
	if err != nil {
		h.t.Fatalf("Acquire(%+v): %v, want admitted at once", r, err)
	}
	return release
}

// wait starts Acquire(r) in a goroutine and returns once it is queued.
func (h *harness) wait(ctx context.Context, id int, r Request, out chan<- result) {
	h.t.Helper()
	before := h.q.Stats().Waiting
	go func() {
		release, err := h.q.Acquire(ctx, r)
		out <- result{id, release, err}
	}()
	h.until(func(s Stats) bool { return s.Waiting == before+1 })
}

// until polls the queue's stats (a synchronisation point, not a timing
// assumption) until cond holds.
func (h *harness) until(cond func(Stats) bool) {
	h.t.Helper()
	for !cond(h.q.Stats()) {
		if h.ctx.Err() != nil {
			h.t.Fatalf("queue never reached the expected state: %+v", h.q.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

func recv(t *testing.T, out <-chan result) result {
	t.Helper()
	select {
	case r := <-out:
		return r
	case <-time.After(defaultTestTimeout):
		t.Fatal("no result")
		return result{}
	}
}

// Tests that waiters are served oldest first while the queue is young,
// and that capacity is never exceeded.
func TestFIFOWhileYoung(t *testing.T) {
	h := newHarness(t, 10, 100)
	hold := h.acquireNow(Request{Cost: 10})
	out := make(chan result, 3)
	for id := 1; id <= 3; id++ {
		h.wait(h.ctx, id, Request{Cost: 10}, out)
	}
	var order []int
	hold()
	for range 3 {
		r := recv(t, out)
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.id, r.err)
		}
		if s := h.q.Stats(); s.InUse != 10 {
			t.Fatalf("in use %d with one 10-item request admitted, capacity 10", s.InUse)
		}
		order = append(order, r.id)
		r.release()
	}
	if !slices.Equal(order, []int{1, 2, 3}) {
		t.Errorf("served %v, want oldest first [1 2 3]", order)
	}
}

// Tests that a waiter in a young queue is shed after N, not before.
func TestShedAfterIntervalWhenYoung(t *testing.T) {
	h := newHarness(t, 10, 100)
	hold := h.acquireNow(Request{Cost: 10})
	defer hold()
	out := make(chan result, 1)
	h.wait(h.ctx, 1, Request{Cost: 5}, out)
	h.clock.Advance(99 * time.Millisecond)
	select {
	case r := <-out:
		t.Fatalf("waiter finished after 99ms: %v; N is 100ms", r.err)
	default:
	}
	h.clock.Advance(time.Millisecond)
	if r := recv(t, out); !errors.Is(r.err, ErrShed) {
		t.Fatalf("after 100ms: %v, want ErrShed", r.err)
	}
	if s := h.q.Stats(); s.Waiting != 0 || s.Shed != 1 {
		t.Errorf("stats %+v, want empty queue and one shed", s)
	}
}

// Tests the standing queue: once it has not emptied for N, waiters older
// than M are shed, newcomers wait at most M, and the newest is served
// first (adaptive LIFO).
func TestStandingQueueCapsWaitAndServesNewestFirst(t *testing.T) {
	h := newHarness(t, 10, 100)
	hold := h.acquireNow(Request{Cost: 10})
	out := make(chan result, 8)
	h.wait(h.ctx, 1, Request{Cost: 10}, out) // at t=0
	h.clock.Advance(98 * time.Millisecond)
	h.wait(h.ctx, 2, Request{Cost: 10}, out) // at t=98ms
	h.clock.Advance(2 * time.Millisecond)    // t=100ms: standing
	if r := recv(t, out); r.id != 1 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want waiter 1 shed when the queue stood for N", r.id, r.err)
	}
	if s := h.q.Stats(); !s.Standing || s.Waiting != 1 {
		t.Fatalf("stats %+v, want a standing queue holding waiter 2", s)
	}
	h.wait(h.ctx, 3, Request{Cost: 10}, out) // at t=100ms, may wait M
	h.wait(h.ctx, 4, Request{Cost: 10}, out)
	hold()
	if r := recv(t, out); r.id != 4 || r.err != nil {
		t.Fatalf("got waiter %d (%v), want the newest, 4, served first", r.id, r.err)
	} else {
		defer r.release()
	}
	h.clock.Advance(3 * time.Millisecond) // t=103ms: waiter 2 reaches M
	if r := recv(t, out); r.id != 2 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want waiter 2 shed at M", r.id, r.err)
	}
	h.clock.Advance(2 * time.Millisecond) // t=105ms: waiter 3 reaches M
	if r := recv(t, out); r.id != 3 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want waiter 3 shed at M", r.id, r.err)
	}
}

// Tests that a waiter whose flow's queue comes to stand may wait on up to
// M in all, but never past its StartBy.
func TestStandingQueueKeepsStartBy(t *testing.T) {
	h := newHarness(t, 10, 100)
	hold := h.acquireNow(Request{Cost: 10})
	defer hold()
	out := make(chan result, 4)
	h.wait(h.ctx, 1, Request{Cost: 10}, out) // at t=0
	h.clock.Advance(98 * time.Millisecond)
	h.wait(h.ctx, 2, Request{Cost: 10, StartBy: h.clock.Now().Add(3 * time.Millisecond)}, out) // at t=98ms, StartBy t=101ms
	h.clock.Advance(2 * time.Millisecond)                                                      // t=100ms: standing; M would let waiter 2 wait to t=103ms
	if r := recv(t, out); r.id != 1 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want waiter 1 shed when the queue stood for N", r.id, r.err)
	}
	h.clock.Advance(time.Millisecond) // t=101ms: waiter 2's StartBy
	if r := recv(t, out); r.id != 2 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want waiter 2 shed at its StartBy", r.id, r.err)
	}
}

// Tests that batch work is shed first: not queued behind others, served
// after interactive waiters, dropped when the queue stands.
func TestBatchShedFirst(t *testing.T) {
	h := newHarness(t, 10, 100)
	hold := h.acquireNow(Request{Cost: 10})
	out := make(chan result, 8)
	h.wait(h.ctx, 1, Request{Cost: 10, Batch: true}, out) // alone: may queue
	if _, err := h.q.Acquire(h.ctx, Request{Cost: 1, Batch: true}); !errors.Is(err, ErrShed) {
		t.Fatalf("batch arrival behind a waiter: %v, want ErrShed at once", err)
	}
	h.wait(h.ctx, 2, Request{Cost: 10}, out)
	hold()
	r := recv(t, out)
	if r.id != 2 || r.err != nil {
		t.Fatalf("got waiter %d (%v), want interactive waiter 2 before batch waiter 1", r.id, r.err)
	}
	h.clock.Advance(100 * time.Millisecond) // standing: batch waiter dropped
	if r := recv(t, out); r.id != 1 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want batch waiter 1 shed", r.id, r.err)
	}
	r.release()
}

// Tests the bound on waiters, the StartBy cap, the cost check and that a
// cancelled waiter leaves the queue.
func TestBoundsAndCancel(t *testing.T) {
	h := newHarness(t, 10, 2)
	if _, err := h.q.Acquire(h.ctx, Request{Cost: 11}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("cost 11 over capacity 10: %v, want ErrTooLarge", err)
	}
	hold := h.acquireNow(Request{Cost: 10})
	defer hold()
	if _, err := h.q.Acquire(h.ctx, Request{Cost: 1, StartBy: h.clock.Now()}); !errors.Is(err, ErrShed) {
		t.Errorf("no time left to wait: %v, want ErrShed at once", err)
	}
	out := make(chan result, 4)
	h.wait(h.ctx, 1, Request{Cost: 1, StartBy: h.clock.Now().Add(20 * time.Millisecond)}, out)
	cctx, cancel := context.WithCancel(h.ctx)
	h.wait(cctx, 2, Request{Cost: 1}, out)
	if _, err := h.q.Acquire(h.ctx, Request{Cost: 1}); !errors.Is(err, ErrShed) {
		t.Errorf("third waiter with MaxWaiters 2: %v, want ErrShed", err)
	}
	cancel()
	if r := recv(t, out); r.id != 2 || !errors.Is(r.err, context.Canceled) {
		t.Errorf("got waiter %d (%v), want waiter 2 cancelled", r.id, r.err)
	}
	h.clock.Advance(20 * time.Millisecond)
	if r := recv(t, out); r.id != 1 || !errors.Is(r.err, ErrShed) {
		t.Errorf("got waiter %d (%v), want waiter 1 shed at its StartBy", r.id, r.err)
	}
	if s := h.q.Stats(); s.Waiting != 0 || s.InUse != 10 {
		t.Errorf("stats %+v, want nothing waiting and 10 in use", s)
	}
}

// Tests that a request whose context has ended is refused with the
// context's error even when capacity is free, and takes none of it.
func TestEndedContextIsNotAdmitted(t *testing.T) {
	h := newHarness(t, 10, 2)
	done, cancel := context.WithCancel(h.ctx)
	cancel()
	if release, err := h.q.Acquire(done, Request{Cost: 1}); !errors.Is(err, context.Canceled) {
		if release != nil {
			release()
		}
		t.Errorf("Acquire with an ended context: %v, want context.Canceled", err)
	}
	if s := h.q.Stats(); s.InUse != 0 || s.Waiting != 0 {
		t.Errorf("stats %+v, want nothing in use or waiting", s)
	}
}

// Tests the real clock end to end: a waiter is granted when capacity
// frees up, and release is idempotent.
func TestSystemClock(t *testing.T) {
	q, err := New(Config{Capacity: 2, MaxWaiters: 4, Target: 5 * time.Millisecond, Interval: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	first, err := q.Acquire(ctx, Request{Cost: 2})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		release, err := q.Acquire(ctx, Request{Cost: 2})
		if err == nil {
			release()
		}
		done <- err
	}()
	for q.Stats().Waiting == 0 {
		time.Sleep(time.Millisecond)
	}
	first()
	first()
	if err := <-done; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if s := q.Stats(); s.InUse != 0 {
		t.Errorf("in use %d after every release, want 0", s.InUse)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{Capacity: 0, MaxWaiters: 1, Target: 1, Interval: 1},
		{Capacity: 1, MaxWaiters: 0, Target: 1, Interval: 1},
		{Capacity: 1, MaxWaiters: 1, Target: 0, Interval: 1},
		{Capacity: 1, MaxWaiters: 1, Target: 2, Interval: 1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
}

// serveAll releases the held capacity, then serves n grants one at a
// time (capacity 1, cost 1), returning the flow of each in grant order.
func (h *harness) serveAll(hold func(), out <-chan result, flows map[int]string, n int) []string {
	h.t.Helper()
	var order []string
	hold()
	for range n {
		r := recv(h.t, out)
		if r.err != nil {
			h.t.Fatalf("waiter %d: %v", r.id, r.err)
		}
		order = append(order, flows[r.id])
		r.release()
	}
	return order
}

// Tests that a light flow's wait does not grow with a heavy flow's
// backlog: whether 5 or 60 heavy requests wait ahead of it, the light
// request is the first one served (neither flow has been granted
// anything, so they start at the same virtual time, and the light one
// has less work waiting).
func TestLightFlowWaitIndependentOfBacklog(t *testing.T) {
	for _, backlog := range []int{5, 60} {
		h := newHarness(t, 10, 100)
		hold := h.acquireNow(Request{Cost: 10})
		out := make(chan result, backlog+1)
		flows := map[int]string{}
		for id := range backlog {
			flows[id] = "heavy"
			h.wait(h.ctx, id, Request{Cost: 10, Flow: "heavy"}, out)
		}
		flows[backlog] = "light"
		h.wait(h.ctx, backlog, Request{Cost: 1, Flow: "light"}, out)
		order := h.serveAll(hold, out, flows, backlog+1)
		if i := slices.Index(order, "light"); i != 0 {
			t.Errorf("backlog %d: light request served %d-th (order %v), want 1st: at the same start tag, the flow with less waiting", backlog, i+1, order[:min(len(order), 5)])
		}
	}
}

// Tests that backlogged flows get items in proportion to their weights.
func TestWeightsGiveProportionalShares(t *testing.T) {
	h := newHarness(t, 1, 200)
	hold := h.acquireNow(Request{Cost: 1})
	out := make(chan result, 160)
	flows := map[int]string{}
	for id := range 80 {
		flows[2*id], flows[2*id+1] = "a", "b"
		h.wait(h.ctx, 2*id, Request{Cost: 1, Flow: "a", Weight: 3}, out)
		h.wait(h.ctx, 2*id+1, Request{Cost: 1, Flow: "b"}, out)
	}
	order := h.serveAll(hold, out, flows, 80) // while both are backlogged
	a := 0
	for _, f := range order {
		if f == "a" {
			a++
		}
	}
	if a < 59 || a > 61 {
		t.Errorf("weight 3 flow got %d of 80 grants against a weight 1 flow, want 60±1", a)
	}
	for range 80 { // drain, so no goroutine outlives the test
		r := recv(t, out)
		if r.err == nil {
			r.release()
		}
	}
}

// Tests that fair-queuing state stays bounded however many flows pass
// through, and is forgotten when the queue empties.
func TestFlowStateBounded(t *testing.T) {
	h := newHarness(t, 1, 8)
	hold := h.acquireNow(Request{Cost: 1, Flow: "a"})
	out := make(chan result, 8)
	for id := range 8 {
		h.wait(h.ctx, id, Request{Cost: 1, Flow: string(rune('a' + id))}, out)
	}
	if s := h.q.Stats(); s.Flows != 8 {
		t.Fatalf("flows %d with 8 waiting flows, want 8", s.Flows)
	}
	hold()
	for range 8 {
		recv(t, out).release()
	}
	if s := h.q.Stats(); s.Flows != 8 || s.Waiting != 0 {
		t.Errorf("stats %+v just after the queue emptied, want the 8 flows' usage kept", s)
	}
	h.clock.Advance(20 * usageHalfLife)
	if s := h.q.Stats(); s.Flows != 0 || s.Waiting != 0 {
		t.Errorf("stats %+v once their usage faded, want no flow state", s)
	}
	f := newFairState(8)
	for i := range 1000 {
		fl := f.join(string(rune(i)), 1, time.Time{})
		f.served(fl, 1, time.Time{})
		f.leave(fl, time.Time{})
	}
	if len(f.flows) > f.maxIdleFlows {
		t.Errorf("%d flows held after 1000 served once each, want at most %d", len(f.flows), f.maxIdleFlows)
	}
}

// Tests SetCapacity: lowering it holds new arrivals back until enough is
// released, raising it admits waiters at once, and it stays within
// [1, configured capacity].
func TestSetCapacity(t *testing.T) {
	h := newHarness(t, 10, 10)
	hold := h.acquireNow(Request{Cost: 4})
	h.q.SetCapacity(5)
	out := make(chan result, 1)
	h.wait(h.ctx, 1, Request{Cost: 2}, out)
	h.q.SetCapacity(6)
	r := recv(t, out)
	if r.err != nil {
		t.Fatalf("waiter after raising capacity to 6 with 4 in use: %v", r.err)
	}
	r.release()
	h.q.SetCapacity(100)
	if s := h.q.Stats(); s.Capacity != 10 {
		t.Errorf("capacity %d after SetCapacity(100), want the configured 10", s.Capacity)
	}
	h.q.SetCapacity(0)
	if s := h.q.Stats(); s.Capacity != 1 {
		t.Errorf("capacity %d after SetCapacity(0), want 1", s.Capacity)
	}
	hold()
	release := h.acquireNow(Request{Cost: 8}) // larger than the capacity, alone
	release()
}

// Tests that a standing queue is judged per flow: once the heavy flow's
// backlog has stood for N, its waiters are held to M and shed, but a
// light flow's waiter that arrives then may still wait up to N, and is
// served at the next grant.
func TestStandingIsPerFlow(t *testing.T) {
	h := newHarness(t, 10, 100)
	hold := h.acquireNow(Request{Cost: 10, Flow: "heavy"})
	out := make(chan result, 8)
	h.wait(h.ctx, 1, Request{Cost: 10, Flow: "heavy"}, out) // at t=0
	h.clock.Advance(98 * time.Millisecond)
	h.wait(h.ctx, 2, Request{Cost: 10, Flow: "heavy"}, out) // at t=98ms
	h.clock.Advance(2 * time.Millisecond)                   // t=100ms: heavy's queue stands
	if r := recv(t, out); r.id != 1 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want heavy waiter 1 shed when its queue stood for N", r.id, r.err)
	}
	h.wait(h.ctx, 3, Request{Cost: 10, Flow: "heavy"}, out) // may wait M
	h.wait(h.ctx, 4, Request{Cost: 1, Flow: "light"}, out)  // may wait N
	h.clock.Advance(3 * time.Millisecond)                   // t=103ms
	if r := recv(t, out); r.id != 2 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want heavy waiter 2 shed at M", r.id, r.err)
	}
	h.clock.Advance(32 * time.Millisecond) // t=135ms: waiter 3 is past M, light is not past N
	if r := recv(t, out); r.id != 3 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want heavy waiter 3 shed at M", r.id, r.err)
	}
	if s := h.q.Stats(); s.Waiting != 1 {
		t.Fatalf("stats %+v, want the light waiter still waiting 35ms after it came", s)
	}
	hold()
	if r := recv(t, out); r.id != 4 || r.err != nil {
		t.Fatalf("got waiter %d (%v), want the light waiter served at the grant", r.id, r.err)
	} else {
		r.release()
	}
}

// Tests that a flow under its fair share is not shed while a flow over
// it has work queued. A heavy flow keeps a full queue (a new request
// every millisecond, for 300ms, on a fake clock, nothing released);
// the light flow's one waiter arrives at the full queue, and a heavy
// waiter is shed to make room; once the light waiter's time is up (the
// queue stands after N, then every M), a heavy waiter is shed in its
// place each time, so at the end it still waits, and it is the first
// served when capacity frees.
func TestUnderShareNotShedWhileOverShareWaits(t *testing.T) {
	const maxWaiters = 8
	h := newHarness(t, 10, maxWaiters)
	hold := h.acquireNow(Request{Cost: 10, Flow: "heavy"})
	out := make(chan result, 400)
	for id := range maxWaiters {
		h.wait(h.ctx, id, Request{Cost: 10, Flow: "heavy"}, out)
	}
	const light = 1000
	go func() { // the queue is full
		release, err := h.q.Acquire(h.ctx, Request{Cost: 1, Flow: "light"})
		out <- result{light, release, err}
	}()
	if r := recv(t, out); r.id == light || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v) when a light request met a full queue, want a heavy waiter shed to make room", r.id, r.err)
	}
	h.until(func(s Stats) bool { return s.Waiting == maxWaiters })
	results := 1
	for step := range 300 {
		h.clock.Advance(time.Millisecond)
		id := maxWaiters + step
		go func() { // refused at once when the queue is full
			release, err := h.q.Acquire(h.ctx, Request{Cost: 10, Flow: "heavy"})
			out <- result{id, release, err}
		}()
		h.until(func(s Stats) bool { return s.Shed+int64(s.Waiting) == int64(id+2) })
	}
	for int64(results) < h.q.Stats().Shed {
		r := recv(t, out)
		results++
		if r.id == light {
			t.Fatalf("light waiter: %v, after %v; want it still waiting while heavy work is queued", r.err, h.clock.Now().Sub(time.Unix(1_700_000_000, 0)))
		}
		if !errors.Is(r.err, ErrShed) {
			t.Fatalf("heavy waiter %d: %v, want shed (nothing was released)", r.id, r.err)
		}
	}
	hold()
	r := recv(t, out)
	if r.id != light || r.err != nil {
		t.Fatalf("first result after the release: waiter %d (%v), want the light waiter granted", r.id, r.err)
	}
	r.release()
	for h.q.Stats().Waiting > 0 { // the heavy ones are granted or give up
		h.clock.Advance(10 * time.Millisecond)
	}
	for h.q.Stats().InUse > 0 {
		r := recv(t, out)
		if r.err == nil {
			r.release()
		}
	}
}

// Tests that sparing a flow under its share never keeps a waiter past
// its StartBy: the light waiter is shed at its StartBy although heavy
// waiters remain.
func TestSparedWaiterStillHonoursStartBy(t *testing.T) {
	h := newHarness(t, 10, 100)
	hold := h.acquireNow(Request{Cost: 10, Flow: "heavy"})
	out := make(chan result, 40)
	for id := range 30 {
		h.wait(h.ctx, id, Request{Cost: 10, Flow: "heavy"}, out)
	}
	startBy := h.clock.Now().Add(120 * time.Millisecond)
	const light = 100
	h.wait(h.ctx, light, Request{Cost: 1, Flow: "light", StartBy: startBy}, out)
	for h.clock.Now().Before(startBy.Add(time.Millisecond)) {
		h.clock.Advance(time.Millisecond)
	}
	deadline := time.After(defaultTestTimeout)
	for {
		select {
		case r := <-out:
			if r.id == light {
				if !errors.Is(r.err, ErrShed) {
					t.Fatalf("light waiter: %v, want shed at its StartBy", r.err)
				}
				hold()
				for h.q.Stats().Waiting > 0 { // the heavy ones give up too
					h.clock.Advance(10 * time.Millisecond)
				}
				return
			}
		case <-deadline:
			t.Fatalf("light waiter still waiting past its StartBy (stats %+v)", h.q.Stats())
		}
	}
}

// Tests that equal-weight flows arriving in lockstep get equal
// admission, counted in items actually admitted, whether admitted at
// once or from the queue. Each tick (a fake clock, 10ms), four flows
// send one request each, always in the same order, into a queue that
// runs two at a time and holds at most four waiters; then the two
// running are released. Without usage carried across the moments the
// queue empties, the flows first in each tick's order win more (24% and
// 26% when this test was written); with it, each flow gets a quarter of
// the grants (±0.5%).
func TestLockstepFlowsGetEqualAdmission(t *testing.T) {
	h := newHarness(t, 2, 4)
	out := make(chan result, 64)
	flows := []string{"a", "b", "c", "d"}
	granted := map[string]int{}
	var running []func()
	id := 0
	owner := map[int]string{}
	const ticks = 300
	for range ticks {
		for _, fl := range flows {
			owner[id] = fl
			before := h.q.Stats()
			go func(id int) {
				release, err := h.q.Acquire(h.ctx, Request{Cost: 1, Flow: fl})
				out <- result{id, release, err}
			}(id)
			id++
			// settled: admitted at once, queued, or refused or shed
			h.until(func(s Stats) bool {
				return s.InUse+int64(s.Waiting)+s.Shed > before.InUse+int64(before.Waiting)+before.Shed || s.Shed > before.Shed
			})
		}
		// collect what was decided: grants run until the next tick
		for len(out) > 0 || int64(len(running)) < h.q.Stats().InUse {
			r := recv(t, out)
			if r.err == nil {
				granted[owner[r.id]]++
				running = append(running, r.release)
			}
		}
		for _, release := range running {
			release()
		}
		running = running[:0]
		h.clock.Advance(10 * time.Millisecond)
	}
	total := 0
	for _, n := range granted {
		total += n
	}
	t.Logf("grants %v", granted)
	for _, fl := range flows {
		if share := float64(granted[fl]) / float64(total); share < 0.245 || share > 0.255 {
			t.Errorf("grants %v of %d: flow %s got %.1f%%, want 25%% ±0.5%%", granted, total, fl, 100*share)
			break
		}
	}
	// Drain: the waiters left are granted as capacity frees.
	for h.q.Stats().Waiting > 0 || h.q.Stats().InUse > 0 {
		r := recv(t, out)
		if r.err == nil {
			r.release()
		}
	}
}

// Tests a later piece of a started request (Continues): in a standing
// queue it is neither held to M nor shed while a new request of its flow
// is, it goes before that flow's new requests, and it still never waits
// past its StartBy.
func TestContinuingPieceKeepsItsWait(t *testing.T) {
	h := newHarness(t, 10, 100)
	hold := h.acquireNow(Request{Cost: 10, Flow: "bulk"})
	out := make(chan result, 4)
	startBy := h.clock.Now().Add(300 * time.Millisecond)
	h.wait(h.ctx, 1, Request{Cost: 10, Flow: "bulk"}, out)
	h.wait(h.ctx, 2, Request{Cost: 10, Flow: "bulk", Continues: true, StartBy: startBy}, out)
	h.clock.Advance(100 * time.Millisecond) // standing: the new request is shed, the piece waits
	if r := recv(t, out); r.id != 1 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want the new request 1 shed when the queue stood", r.id, r.err)
	}
	h.wait(h.ctx, 3, Request{Cost: 10, Flow: "bulk"}, out) // newer, and newest first in a standing queue
	h.clock.Advance(10 * time.Millisecond)                 // past M for both
	if r := recv(t, out); r.id != 3 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want the new request 3 shed at M", r.id, r.err)
	}
	h.wait(h.ctx, 4, Request{Cost: 10, Flow: "bulk"}, out)
	hold()
	r := recv(t, out)
	if r.id != 2 || r.err != nil {
		t.Fatalf("got waiter %d (%v), want the continuing piece 2 served before its flow's new request", r.id, r.err)
	}
	h.clock.Advance(5 * time.Millisecond)
	if r4 := recv(t, out); r4.id != 4 || !errors.Is(r4.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want the new request 4 shed at M", r4.id, r4.err)
	}
	h.wait(h.ctx, 5, Request{Cost: 10, Flow: "bulk", Continues: true, StartBy: startBy}, out)
	h.clock.Advance(200 * time.Millisecond) // past its StartBy
	if r5 := recv(t, out); r5.id != 5 || !errors.Is(r5.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want the continuing piece 5 shed at its StartBy", r5.id, r5.err)
	}
	r.release()
}

// Tests that later pieces waiting do not fill the queue: with as many
// of a heavy flow's continuing pieces waiting as the queue holds new
// requests, a light caller's request still queues (no arrival may shed
// a later piece, so counting them would refuse everyone) and is served
// first in fair order.
func TestContinuingPiecesDoNotFillTheQueue(t *testing.T) {
	h := newHarness(t, 10, 2)
	hold := h.acquireNow(Request{Cost: 10, Flow: "bulk"})
	out := make(chan result, 3)
	h.wait(h.ctx, 1, Request{Cost: 10, Flow: "bulk", Continues: true}, out)
	h.wait(h.ctx, 2, Request{Cost: 10, Flow: "bulk", Continues: true}, out)
	go func() {
		release, err := h.q.Acquire(h.ctx, Request{Cost: 1, Flow: "feed"})
		out <- result{3, release, err}
	}()
	h.until(func(s Stats) bool { return s.Waiting == 3 || s.Shed > 0 })
	if st := h.q.Stats(); st.Shed > 0 {
		t.Fatalf("the light request was refused (%v) with only later pieces waiting, want it queued", recv(t, out).err)
	}
	hold()
	for want := range []int{3, 1, 2} {
		r := recv(t, out)
		if id := []int{3, 1, 2}[want]; r.id != id || r.err != nil {
			t.Fatalf("grant %d went to waiter %d (%v), want %d: the light request first, then the pieces in order", want+1, r.id, r.err, id)
		}
		r.release()
	}
}

// Tests that a flow under its share is never shed for another's sake:
// when a lighter flow's wait is up, a flow with a larger lead but still
// under the mean usage keeps its waiter, and the lighter flow's waiter is
// shed on time.
func TestUnderShareNotShedForALighterFlow(t *testing.T) {
	h := newHarness(t, 10, 100)
	for range 9 {
		h.acquireNow(Request{Cost: 10, Flow: "bulk"})()
	}
	h.acquireNow(Request{Cost: 8, Flow: "feed"})()
	h.acquireNow(Request{Cost: 1, Flow: "thread"})()
	hold := h.acquireNow(Request{Cost: 10, Flow: "bulk"})
	out := make(chan result, 2)
	h.wait(h.ctx, 2, Request{Cost: 1, Flow: "thread"}, out)
	h.clock.Advance(50 * time.Millisecond)
	h.wait(h.ctx, 1, Request{Cost: 5, Flow: "feed"}, out)
	h.clock.Advance(50 * time.Millisecond) // thread's queue has stood for N; feed's has not
	if r := recv(t, out); r.id != 2 || !errors.Is(r.err, ErrShed) {
		t.Fatalf("got waiter %d (%v), want thread's waiter 2 shed on time, not feed's in its place", r.id, r.err)
	}
	select {
	case r := <-out:
		t.Fatalf("feed's waiter ended (%v) though its flow is under its share", r.err)
	default:
	}
	hold()
	if r := recv(t, out); r.id != 1 || r.err != nil {
		t.Fatalf("got waiter %d (%v), want feed's waiter served", r.id, r.err)
	} else {
		r.release()
	}
}

// Tests the light reserve in a run: interactive requests of flows under
// their share, with none of their own waiting, are admitted at once
// while a heavy flow's backlog waits, a new flow and a known one alike,
// up to exactly capacity plus reserve; a flow over its share, a flow
// that already waits and a request past the reserve take the queue; and
// waiters are granted only under the capacity.
func TestLightFlowPassesBacklogWithinReserve(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Capacity, cfg.MaxWaiters, cfg.Reserve = 12, 100, 3
	h := newHarnessWith(t, cfg)
	q, ctx := h.q, h.ctx

	h.acquireNow(Request{Cost: 12, Flow: "d"})() // d has had its share of late
	hold := h.acquireNow(Request{Cost: 12, Flow: "heavy"})
	out := make(chan result, 16)
	for id := range 3 {
		h.wait(ctx, id, Request{Cost: 5, Flow: "heavy"}, out)
	}
	a1 := h.acquireNow(Request{Cost: 2, Flow: "a"}) // a new flow
	a2 := h.acquireNow(Request{Cost: 1, Flow: "a"}) // known now, still under the mean; 15 of 15
	if s := q.Stats(); s.InUse != 15 || s.Light != 2 || s.Waiting != 3 || s.Flows != 3 {
		t.Fatalf("stats %+v after light requests passed the backlog, want 15 in use, 2 light, 3 waiting, 3 flows (a's usage counted)", s)
	}
	h.wait(ctx, 10, Request{Cost: 2, Flow: "b"}, out)     // 17 would exceed 15
	h.wait(ctx, 12, Request{Cost: 1, Flow: "heavy"}, out) // has waiters
	h.wait(ctx, 13, Request{Cost: 1, Flow: "d"}, out)     // over the mean, no waiters
	h.wait(ctx, 14, Request{Cost: 1, Flow: "b"}, out)     // b already waits
	if s := q.Stats(); s.InUse != 15 || s.Light != 2 || s.Waiting != 7 {
		t.Fatalf("stats %+v, want the reserve's limit, flows with waiters and d to queue", s)
	}
	hold()
	granted := []result{recv(t, out), recv(t, out), recv(t, out), recv(t, out)}
	var ids []int
	for _, r := range granted {
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.id, r.err)
		}
		ids = append(ids, r.id)
	}
	if slices.Sort(ids); !slices.Equal(ids, []int{0, 10, 13, 14}) {
		t.Fatalf("grants once the heavy hold ended: %v, want b's (10, 14), d's (13) and the oldest heavy one (0)", ids)
	}
	if s := q.Stats(); s.InUse != 12 || s.Waiting != 3 {
		t.Fatalf("stats %+v, want 12 in use: no grant from the queue over the capacity", s)
	}
	a1()
	a2()
	for _, r := range granted {
		r.release()
	}
	for range 3 {
		if r := recv(t, out); r.err == nil {
			r.release()
		}
	}
	if s := q.Stats(); s.InUse != 0 || s.Light != 2 {
		t.Errorf("stats %+v after all released, want nothing in use and still 2 light admissions", s)
	}
}

// Tests each condition of the light reserve on its own: capacity 12,
// reserve 3, all of it held by a heavy flow with one waiter of 5 items,
// then one more request that either goes past (admitted at once),
// queues, or is shed.
func TestLightReserveRule(t *testing.T) {
	const (
		passes = "admitted at once"
		queues = "queued"
		shed   = "shed"
	)
	for _, tc := range []struct {
		name   string
		before func(h *harness)                                         // before the heavy flow takes the capacity
		after  func(h *harness, ctx context.Context, out chan<- result) // before the request
		req    Request
		want   string
		// heavyBatch makes the heavy flow's waiter a later piece of a
		// batch-criticality request.
		heavyBatch bool
	}{
		{name: "new flow within the reserve", req: Request{Cost: 3, Flow: "x"}, want: passes},
		{name: "new flow past the reserve", req: Request{Cost: 4, Flow: "x"}, want: queues},
		{name: "later piece of a batch", req: Request{Cost: 1, Flow: "x", Continues: true}, want: queues},
		{name: "batch work", req: Request{Cost: 1, Flow: "x", Batch: true}, want: shed},
		{name: "flow at the mean", before: charge("x", 12, 1), req: Request{Cost: 1, Flow: "x"}, want: queues},
		{name: "flow at the mean by count, under it by weight", before: charge("x", 12, 4),
			req: Request{Cost: 1, Flow: "x", Weight: 4}, want: passes},
		{name: "flow whose usage has faded", before: func(h *harness) {
			charge("x", 12, 1)(h)
			h.clock.Advance(10 * usageHalfLife)
		}, req: Request{Cost: 1, Flow: "x"}, want: passes},
		{name: "capacity lowered: the reserve shrinks with it", after: func(h *harness, _ context.Context, _ chan<- result) {
			h.q.SetCapacity(10) // reserve 2, not 3: 13 would exceed 10 + 2
		}, req: Request{Cost: 1, Flow: "x"}, want: queues},
		{name: "only batch work waits: next in line anyway", after: func(h *harness, ctx context.Context, out chan<- result) {
			h.wait(ctx, 2, Request{Cost: 1, Flow: "y", Batch: true, Continues: true}, out)
		}, heavyBatch: true, req: Request{Cost: 1, Flow: "x"}, want: queues},
		{name: "behind the next waiter in fair order", before: charge("x", 4, 1),
			after: func(h *harness, ctx context.Context, out chan<- result) {
				h.wait(ctx, 2, Request{Cost: 4, Flow: "l"}, out) // past the reserve; served before x's request would be
			}, req: Request{Cost: 1, Flow: "x"}, want: queues},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Capacity, cfg.MaxWaiters, cfg.Reserve = 12, 100, 3
			h := newHarnessWith(t, cfg)
			ctx, cancel := context.WithCancel(h.ctx)
			defer cancel()
			if tc.before != nil {
				tc.before(h)
			}
			hold := h.acquireNow(Request{Cost: 12, Flow: "heavy"})
			out := make(chan result, 4)
			h.wait(ctx, 1, Request{Cost: 5, Flow: "heavy", Batch: tc.heavyBatch, Continues: tc.heavyBatch}, out)
			if tc.after != nil {
				tc.after(h, ctx, out)
			}
			waiting, inUse := h.q.Stats().Waiting, h.q.Stats().InUse
			got := make(chan result, 1)
			go func() {
				release, err := h.q.Acquire(ctx, tc.req)
				got <- result{0, release, err}
			}()
			outcome := ""
			for outcome == "" {
				select {
				case r := <-got:
					outcome = shed
					if r.err == nil {
						outcome = passes
						r.release()
					} else if !errors.Is(r.err, ErrShed) {
						t.Fatalf("Acquire: %v", r.err)
					}
				case <-time.After(time.Millisecond):
					if h.q.Stats().Waiting > waiting {
						outcome = queues
					}
				}
			}
			if outcome != tc.want {
				t.Errorf("request %+v with %d items in use and %d waiting: %s, want %s", tc.req, inUse, waiting, outcome, tc.want)
			}
			if outcome == passes && h.q.Stats().Light != 1 {
				t.Errorf("stats %+v, want 1 light admission counted", h.q.Stats())
			}
			cancel()
			hold()
			left := waiting // the waiters' answers, and the request's if it queued
			if outcome == queues {
				left++
			}
			for range left {
				select {
				case r := <-out:
					if r.err == nil {
						r.release()
					}
				case r := <-got:
					if r.err == nil {
						r.release()
					}
				}
			}
		})
	}
}

// charge returns a step that makes flow's recent usage items at weight.
func charge(flow string, items int64, weight float64) func(h *harness) {
	return func(h *harness) { h.acquireNow(Request{Cost: items, Flow: flow, Weight: weight})() }
}

// Tests that the reserve is only for going past waiters: with nobody
// waiting, a light request that does not fit queues (and is first in
// line), so the capacity holds whenever the queue is empty.
func TestLightReserveOnlyPastWaiters(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Capacity, cfg.MaxWaiters, cfg.Reserve = 12, 100, 3
	h := newHarnessWith(t, cfg)
	hold := h.acquireNow(Request{Cost: 12, Flow: "heavy"})
	out := make(chan result, 1)
	h.wait(h.ctx, 1, Request{Cost: 1, Flow: "light"}, out)
	if s := h.q.Stats(); s.InUse != 12 || s.Light != 0 {
		t.Fatalf("stats %+v, want the light request queued, the capacity kept", s)
	}
	hold()
	if r := recv(t, out); r.err != nil {
		t.Fatalf("light waiter once capacity freed: %v", r.err)
	} else {
		r.release()
	}
}

// Tests that a light request which found the reserve full is granted
// from the reserve as soon as the reserve has room again, not only once
// the heavy flow's work drains under the capacity: capacity 12, reserve
// 3, a heavy flow holding all 12 with a waiter, a light request holding
// the reserve. b, under its share, queues; when the light request ends
// b is granted within capacity plus reserve while the heavy flow still
// holds its 12. c, queued behind b, does not fit the reserve's rest and
// waits until b ends; the heavy flow's waiter, then alone in the queue,
// waits for the capacity though its one item would fit the reserve.
func TestUnderShareWaiterTakesTheReserveAsItFrees(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Capacity, cfg.MaxWaiters, cfg.Reserve = 12, 100, 3
	h := newHarnessWith(t, cfg)
	out := make(chan result, 4)
	hold, a := fullReserve(h, out)
	h.wait(h.ctx, 2, Request{Cost: 2, Flow: "b"}, out)
	h.wait(h.ctx, 3, Request{Cost: 2, Flow: "c"}, out)
	if s := h.q.Stats(); s.InUse != 15 || s.Waiting != 3 || s.Light != 1 {
		t.Fatalf("stats %+v, want the reserve full and b, c and heavy waiting", s)
	}
	a()
	b := nextGranted(t, out, 2, "b, from the reserve, after the light request ended")
	if s := h.q.Stats(); s.InUse != 14 || s.Waiting != 2 || s.Light != 2 {
		t.Fatalf("stats %+v, want b's 2 beside the heavy 12, counted as light, and c still waiting (16 would pass 15)", s)
	}
	b.release()
	nextGranted(t, out, 3, "c, from the reserve, after b ended").release()
	if s := h.q.Stats(); s.InUse != 12 || s.Waiting != 1 {
		t.Fatalf("stats %+v, want the heavy waiter, alone in the queue, still waiting for the capacity", s)
	}
	hold()
	nextGranted(t, out, 1, "the heavy waiter, after the heavy hold ended").release()
}

// Tests what the reserve is not for: a waiter alone in the queue (the
// capacity holds with nobody else waiting), a flow with a backlog of its
// own (as past the queue, only a flow's sole waiter may use it), and a
// flow over its share that is next in line with another waiting behind.
func TestReserveIsNotForALoneWaiterABacklogOrAFlowOverItsShare(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Capacity, cfg.MaxWaiters, cfg.Reserve = 12, 100, 3
	t.Run("alone in the queue", func(t *testing.T) {
		h := newHarnessWith(t, cfg)
		one := h.acquireNow(Request{Cost: 1, Flow: "heavy"})
		rest := h.acquireNow(Request{Cost: 11, Flow: "heavy"})
		out := make(chan result, 1)
		h.wait(h.ctx, 1, Request{Cost: 3, Flow: "light"}, out)
		one()
		if s := h.q.Stats(); s.InUse != 11 || s.Waiting != 1 || s.Light != 0 {
			t.Fatalf("stats %+v, want the lone waiter still waiting: 14 would pass the capacity of 12", s)
		}
		rest()
		nextGranted(t, out, 1, "the lone waiter, once capacity freed").release()
	})
	for _, tc := range []struct {
		name    string
		before  func(h *harness)
		waiters []Request // after a's request, then released
	}{
		{name: "a flow with a backlog", waiters: []Request{{Cost: 1, Flow: "b"}, {Cost: 1, Flow: "b"}}},
		// d has used 8 against a mean of 23/3: over its share, so it
		// queues, next in line (lead 9) with heavy's waiter (lead 13)
		// behind.
		{name: "a flow over its share", before: charge("d", 8, 1), waiters: []Request{{Cost: 1, Flow: "d"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWith(t, cfg)
			if tc.before != nil {
				tc.before(h)
			}
			out := make(chan result, 1+len(tc.waiters))
			hold, a := fullReserve(h, out)
			for i, r := range tc.waiters {
				h.wait(h.ctx, 2+i, r, out)
			}
			a()
			if s := h.q.Stats(); s.InUse != 12 || s.Waiting != 1+len(tc.waiters) || s.Light != 1 {
				t.Fatalf("stats %+v, want the waiters %+v still waiting for the capacity", s, tc.waiters)
			}
			hold()
			grantedAll(t, out, 1+len(tc.waiters))
		})
	}
}

// fullReserve fills a queue of capacity 12 and reserve 3: a heavy flow
// holds the 12 and has a waiter of one item (id 1, answered on out), and
// flow a's request of 3 goes past it. It returns the releases of the
// heavy hold and of a's request.
func fullReserve(h *harness, out chan<- result) (hold, light func()) {
	h.t.Helper()
	hold = h.acquireNow(Request{Cost: 12, Flow: "heavy"})
	h.wait(h.ctx, 1, Request{Cost: 1, Flow: "heavy"}, out)
	light = h.acquireNow(Request{Cost: 3, Flow: "a"}) // past the queue: 15 of 15
	return hold, light
}

// nextGranted expects the next result on out to be waiter id's grant
// (what says which, for the failure) and returns it.
func nextGranted(t *testing.T, out <-chan result, id int, what string) result {
	t.Helper()
	r := recv(t, out)
	if r.id != id || r.err != nil {
		t.Fatalf("got waiter %d (%v), want %s granted", r.id, r.err, what)
	}
	return r
}

// grantedAll expects the next n results on out to be grants, and
// releases them.
func grantedAll(t *testing.T, out <-chan result, n int) {
	t.Helper()
	for range n {
		r := recv(t, out)
		if r.err != nil {
			t.Fatalf("waiter %d once capacity freed: %v", r.id, r.err)
		}
		r.release()
	}
}

// Tests Take's grant held as a value: its items are in use until
// Release, which gives back exactly them, and the zero Grant's Release
// changes nothing.
func TestTakeGrantReleases(t *testing.T) {
	q, err := New(Config{Capacity: 3, MaxWaiters: 4, Target: 5 * time.Millisecond, Interval: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := q.Take(context.Background(), Request{Cost: 2})
	if err != nil {
		t.Fatal(err)
	}
	if s := q.Stats(); s.InUse != 2 {
		t.Errorf("in use %d with a grant of 2, want 2", s.InUse)
	}
	g.Release()
	Grant{}.Release()
	if s := q.Stats(); s.InUse != 0 {
		t.Errorf("in use %d after the release, want 0", s.InUse)
	}
}

// Acquire is Take with its grant as a release function, for the tests:
// a release may be called more than once, and only the first call gives
// the items back.
func (q *Queue) Acquire(ctx context.Context, r Request) (release func(), err error) {
	g, err := q.Take(ctx, r)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(g.Release) }, nil
}

// Tests that a flow admitted without waiting takes the weight it is
// admitted at, as a waiting one does: an unlisted flow's weight changes
// with the number of unlisted flows in use, and its usage per weight,
// which decides who is under their share, must follow.
func TestAdmittedFlowTakesTheWeightAskedNow(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	f := newFairState(16)
	f.admitted("y", 1, 12, now)
	f.admitted("y", 4, 4, now)
	f.admitted("x", 1, 8, now)
	mean, _ := f.meanUsage(now)
	if y := f.flows["y"]; y.weight != 4 || !y.underShare(mean, now) {
		t.Errorf("flow y at weight %v, %v items per weight against a mean of %v: want weight 4 and under its share (16 items at weight 4 beside 8 at weight 1)",
			y.weight, y.used(now)/y.weight, mean)
	}
}
