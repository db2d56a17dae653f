package queue

import (
	"errors"
	"testing"
	"time"
)

// Tests that an arrival at a full queue with no time left to wait is
// refused without shedding a waiter in its place: the waiter would be
// dropped for a request that is not queued either.
func TestFullQueueArrivalWithoutTimeShedsNobody(t *testing.T) {
	h := newHarness(t, 10, 2)
	hold := h.acquireNow(Request{Cost: 10, Flow: "heavy"})
	out := make(chan result, 4)
	h.wait(h.ctx, 1, Request{Cost: 10, Flow: "heavy"}, out)
	h.wait(h.ctx, 2, Request{Cost: 10, Flow: "heavy"}, out)
	if _, err := h.q.Acquire(h.ctx, Request{Cost: 1, Flow: "light", StartBy: h.clock.Now()}); !errors.Is(err, ErrShed) {
		t.Fatalf("light arrival with no time left: %v, want ErrShed", err)
	}
	if s := h.q.Stats(); s.Waiting != 2 || s.Shed != 1 {
		t.Errorf("stats %+v, want both heavy waiters still waiting and one shed (the arrival)", s)
	}
	hold()
	r := recv(t, out)
	if r.err != nil {
		t.Fatalf("waiter %d after the release: %v, want granted", r.id, r.err)
	}
	r.release()
	for h.q.Stats().Waiting > 0 || h.q.Stats().InUse > 0 {
		h.clock.Advance(10 * time.Millisecond)
		select {
		case r := <-out:
			if r.err == nil {
				r.release()
			}
		default:
		}
	}
}

// Tests that an interactive arrival at a full queue sheds a batch waiter
// in its place rather than being shed while the batch work waits, even
// when the batch waiter's flow is under its share.
func TestFullQueueShedsBatchBeforeInteractive(t *testing.T) {
	h := newHarness(t, 10, 1)
	hold := h.acquireNow(Request{Cost: 10, Flow: "heavy"})
	out := make(chan result, 2)
	h.wait(h.ctx, 1, Request{Cost: 5, Flow: "bulk", Batch: true}, out)
	go func() {
		release, err := h.q.Acquire(h.ctx, Request{Cost: 1, Flow: "light"})
		out <- result{2, release, err}
	}()
	if r := recv(t, out); r.id != 1 || !errors.Is(r.err, ErrShed) {
		if r.release != nil {
			r.release()
		}
		t.Fatalf("got request %d (%v) when an interactive request met a queue full of batch work, want the batch waiter shed", r.id, r.err)
	}
	h.until(func(s Stats) bool { return s.Waiting == 1 })
	hold()
	r := recv(t, out)
	if r.id != 2 || r.err != nil {
		t.Fatalf("after the release: request %d (%v), want the interactive one granted", r.id, r.err)
	}
	r.release()
}

// Tests that shedding a waiter to make room grants what then fits: the
// waiter shed was the head that did not fit, and the arrival that took
// its place fits, so it is admitted at once instead of waiting for the
// next release.
func TestShedHeadLetsWhatFitsThrough(t *testing.T) {
	h := newHarness(t, 10, 1)
	hold := h.acquireNow(Request{Cost: 8, Flow: "x"})
	defer hold()
	out := make(chan result, 2)
	h.wait(h.ctx, 1, Request{Cost: 5, Flow: "bulk", Batch: true}, out) // does not fit
	go func() {
		release, err := h.q.Acquire(h.ctx, Request{Cost: 1, Flow: "x"}) // fits; x is over its share, so it does not pass
		out <- result{2, release, err}
	}()
	got := map[int]result{}
	for len(got) < 2 {
		select {
		case r := <-out:
			got[r.id] = r
		case <-time.After(10 * time.Second):
			t.Fatalf("results %v: the arrival that fits still waits after the head that did not fit was shed", got)
		}
	}
	if !errors.Is(got[1].err, ErrShed) {
		t.Errorf("batch waiter: %v, want shed", got[1].err)
	}
	if got[2].err != nil {
		t.Fatalf("the arrival that fits: %v, want admitted", got[2].err)
	}
	got[2].release()
}

// Tests that a batch piece arriving at a full queue never takes an
// interactive waiter's place, even one of a flow further over its share:
// a later piece of a batch read does not count against the queue's
// bound, so it waits beside the interactive waiter, which is still
// granted first.
func TestFullQueueBatchArrivalShedsNoInteractiveWaiter(t *testing.T) {
	h := newHarness(t, 10, 1)
	holds := []func(){h.acquireNow(Request{Cost: 5, Flow: "heavy"}), h.acquireNow(Request{Cost: 5, Flow: "heavy"})}
	out := make(chan result, 2)
	h.wait(h.ctx, 1, Request{Cost: 5, Flow: "heavy"}, out)
	h.wait(h.ctx, 2, Request{Cost: 5, Flow: "bulk", Batch: true, Continues: true}, out)
	select {
	case r := <-out:
		t.Fatalf("waiter %d ended (%v) when a batch piece arrived, want both waiting", r.id, r.err)
	default:
	}
	for i, want := range []int{1, 2} {
		holds[i]() // room for one
		r := recv(t, out)
		if r.id != want || r.err != nil {
			t.Fatalf("release %d: waiter %d (%v), want %d granted: the interactive waiter first", i+1, r.id, r.err, want)
		}
		defer r.release()
	}
}
