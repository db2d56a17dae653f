// Package queue bounds the items sluice works on at once and decides who
// waits, who goes first and who is shed when they do not all fit.
//
// A Queue holds a capacity of items (a batch of n URIs costs n). A request
// that fits while nobody waits is admitted at once. Otherwise it joins a
// bounded queue, under the controlled-delay rule Facebook published in
// "Fail at Scale" (Maurer, ACM Queue 13(8), 2015):
//
//   - if the queue has not been empty at any time in the last Interval
//     (N, 100 ms by default), it is a standing queue, and a request may
//     wait at most Target (M, 5 ms by default);
//   - otherwise a request may wait up to Interval;
//   - either way never past the request's own StartBy (the latest start
//     that still leaves time to do the work before its deadline).
//
// While the queue stands, freed capacity goes to the newest waiter first
// (adaptive LIFO): its caller is the one most likely still waiting, while
// the oldest are about to time out anyway. Otherwise waiters are served
// in arrival order.
//
// Waiters are served fairly across flows (Request.Flow, one per client):
// start-time fair queuing over item cost, weighted by Request.Weight (see
// fair.go). A flow that asks for less than its share is served before
// flows with a backlog, so its wait does not grow with theirs; within a
// flow the order above applies. Whether a queue stands is judged per
// flow (as in FQ-CoDel): the heavy flows' standing backlog holds their
// own waiters to Target, not a light flow's.
//
// A flow under its share may also go past the queue, within a small
// reserve of items over the capacity: an interactive request whose flow
// has no waiters, has used less than the mean of the flows of late and
// comes before the next waiter, an interactive one, in fair order is
// admitted at once while others wait (with only batch work waiting, the
// next grant is its own anyway), as long as the items in use stay within the capacity
// plus the reserve (Config.Reserve, at most a quarter of the capacity in
// force). So a caller that asks for little does not wait for a release
// behind the heavy flows' backlog while the reserve has room; it only
// shares the CPU with the work in flight. A request that would have gone
// past but found the reserve full waits; when it is next in fair order,
// still its flow's only waiter, with others waiting behind it and its
// flow still under the mean, it is granted from the reserve as soon as
// the reserve has room again, before later arrivals go past it:
// otherwise it would wait for the capacity itself, that is for the heavy
// flows' work in flight to drain, while light requests that came after
// it went by. Other waiters are granted only under the capacity, so, but
// for a lowered capacity or a request running alone, the reserve bounds
// how far over it the items in use go, and with nobody else waiting the
// capacity holds.
//
// Batch requests (Request.Batch) are shed first: one that cannot start at
// once while others already wait is refused without queueing, freed
// capacity goes to interactive waiters before batch ones, and batch
// waiters are shed as soon as the queue becomes a standing queue.
//
// The capacity can be changed while serving (SetCapacity), by an
// adaptive controller for instance, between 1 and the configured
// Capacity, which stays the upper bound.
//
// The package knows nothing of gRPC, clients or deadlines beyond StartBy;
// the guard maps its errors to status codes. Time comes from a Clock so
// the rule can be tested step by step.
package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Errors returned by Take, wrapped with detail; match with errors.Is.
var (
	// ErrShed reports a request refused or dropped to keep latency flat.
	ErrShed = errors.New("queue: shed")
	// ErrTooLarge reports a cost over the whole capacity.
	ErrTooLarge = errors.New("queue: cost exceeds capacity")
)

// Config sizes a Queue. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Capacity is how many items may be admitted at once.
	Capacity int64
	// MaxWaiters bounds the queue's new requests; an arrival that finds
	// it full is shed. Continues requests do not count (their callers
	// bound them, see Request.Continues).
	MaxWaiters int
	// Target is M: the longest wait in a standing queue.
	Target time.Duration
	// Interval is N: how long the queue must have been non-empty to count
	// as standing, and the longest wait otherwise.
	Interval time.Duration
	// Reserve is how many items beyond the capacity in force may be in
	// use at once for requests of flows under their share that go past
	// the queue, or that wait next in line with others behind them (see
	// the package doc), at most a quarter of that capacity; 0 means none.
	Reserve int64
}

// DefaultConfig returns Facebook's published values (M 5 ms, N 100 ms)
// for a capacity of 20,000 items and at most 1,024 waiters.
func DefaultConfig() Config {
	return Config{Capacity: 20_000, MaxWaiters: 1_024, Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond}
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.Capacity < 1:
		return fmt.Errorf("queue: capacity must be at least 1, got %d", c.Capacity)
	case c.MaxWaiters < 1:
		return fmt.Errorf("queue: max waiters must be at least 1, got %d", c.MaxWaiters)
	case c.Target <= 0 || c.Interval <= 0:
		return fmt.Errorf("queue: target %v and interval %v must be positive", c.Target, c.Interval)
	case c.Target > c.Interval:
		return fmt.Errorf("queue: target %v must not exceed interval %v", c.Target, c.Interval)
	case c.Reserve < 0 || c.Reserve > c.Capacity:
		return fmt.Errorf("queue: reserve must be between 0 and the capacity %d, got %d", c.Capacity, c.Reserve)
	}
	return nil
}

// Clock tells time and runs a function later. Real time is SystemClock.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f after d, from another goroutine; stop cancels it.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc implements Clock with time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// Request is one request asking for capacity.
type Request struct {
	// Cost is the items it needs; at least 1.
	Cost int64
	// Batch marks work that is shed before interactive work.
	Batch bool
	// StartBy, when not zero, is the latest time the request is still
	// worth starting; it never waits past it.
	StartBy time.Time
	// Flow names whose share the request counts against (a client);
	// waiters of different flows are served fairly.
	Flow string
	// Weight is the flow's share relative to other flows; 0 means 1.
	Weight float64
	// Continues marks a later piece of a request whose first piece was
	// admitted: shedding it would waste the work already done, so it
	// may wait up to its StartBy (Interval without one), is never held
	// to Target nor shed for another's sake, and goes before the new
	// requests of its flow. Shedding happens at a request's first piece.
	// The caller bounds how many wait (the guard: two per request holding
	// a request slot), so they neither count against MaxWaiters nor are
	// refused for a full queue: a queue full of later pieces, which no
	// arrival may shed, would otherwise refuse every caller, light ones
	// too.
	Continues bool
}

// Stats is a snapshot of a Queue.
type Stats struct {
	InUse    int64 // items admitted and not yet released
	Capacity int64 // items that may be admitted now
	Flows    int   // flows with fair-queuing state (waiters, lead or usage)
	Waiting  int   // requests in the queue
	Standing bool  // whether the queue counts as standing now
	Shed     int64 // requests shed since start
	Light    int64 // requests admitted within the reserve (past waiters, or next in line before them) since start
}

// Queue admits requests against a capacity of items. It is safe for
// concurrent use; the zero value is not usable, call New.
type Queue struct {
	cfg   Config
	clock Clock

	mu        sync.Mutex
	capacity  int64 // current capacity, at most cfg.Capacity
	inUse     int64
	fair      fairState
	waiters   []*waiter // in arrival order
	continues int       // how many of waiters are Continues ones
	lastEmpty time.Time // the last time waiters was empty
	stopCheck func() bool
	shed      int64
	passed    int64 // admitted within the reserve: past waiters, or next in line before them
}

type waiter struct {
	req      Request
	enqueued time.Time
	done     chan struct{} // closed once err is set or the grant made
	err      error         // nil when granted
	stop     func() bool
	flow     *flow
}

// New returns a Queue; clock nil means SystemClock.
func New(cfg Config, clock Clock) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		clock = SystemClock{}
	}
	return &Queue{cfg: cfg, clock: clock, lastEmpty: clock.Now(), capacity: cfg.Capacity, fair: newFairState(cfg.MaxWaiters)}, nil
}

// MaxWait is the controlled-delay rule: how long a request that arrives
// at now may wait, given when the queue was last empty. startBy, when
// not zero, caps it further; the result is never negative.
func (c Config) MaxWait(now, lastEmpty, startBy time.Time) time.Duration {
	wait := c.Interval
	if c.standing(now, lastEmpty) {
		wait = c.Target
	}
	if !startBy.IsZero() {
		wait = min(wait, startBy.Sub(now))
	}
	return max(wait, 0)
}

// continuingWait is how long a Continues request arriving at now may
// wait: until its StartBy, or Interval without one.
func (c Config) continuingWait(now, startBy time.Time) time.Duration {
	if startBy.IsZero() {
		return c.Interval
	}
	return max(startBy.Sub(now), 0)
}

// flowSince is since when fl's queue has been non-empty, as the queue's
// own standing rule sees it: the later of the whole queue's last empty
// time and the flow's (see fair.go).
func (q *Queue) flowSince(fl *flow) time.Time {
	if fl.since.After(q.lastEmpty) {
		return fl.since
	}
	return q.lastEmpty
}

// standing reports whether a queue that has been non-empty since
// lastEmpty is a standing queue at now.
func (c Config) standing(now, lastEmpty time.Time) bool { return now.Sub(lastEmpty) >= c.Interval }

// Take admits r, waiting as the rule allows. On success the caller must
// call the grant's Release exactly once when the work is done.
// Errors wrap ErrShed or ErrTooLarge, or are ctx's error; a request whose
// ctx has already ended is never admitted, even with capacity free.
func (q *Queue) Take(ctx context.Context, r Request) (Grant, error) {
	if err := ctx.Err(); err != nil {
		return Grant{}, err
	}
	if r.Cost > q.cfg.Capacity {
		return Grant{}, fmt.Errorf("%w: %d items needed, capacity %d", ErrTooLarge, r.Cost, q.cfg.Capacity)
	}
	r.Cost = max(r.Cost, 1)
	w, err := q.enter(r)
	switch {
	case err != nil:
		return Grant{}, err
	case w == nil:
		return Grant{q: q, cost: r.Cost}, nil
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		q.mu.Lock()
		if q.remove(w) {
			w.stop()
			q.grant()
			q.mu.Unlock()
			return Grant{}, ctx.Err()
		}
		q.mu.Unlock() // granted or shed meanwhile; w.err says which
	}
	if w.err != nil {
		return Grant{}, w.err
	}
	return Grant{q: q, cost: r.Cost}, nil
}

// Grant is capacity Take admitted: Cost items, held until Release. It is
// a value, so that admitting a request allocates nothing for its release.
type Grant struct {
	q    *Queue
	cost int64
}

// Release gives the grant's items back. It must be called exactly once;
// the zero Grant's Release does nothing.
func (g Grant) Release() {
	if g.q != nil {
		g.q.release(g.cost)
	}
}

// enter admits r at once (nil waiter, nil error), refuses it (nil waiter,
// error), or queues it (the waiter).
func (q *Queue) enter(r Request) (*waiter, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	if len(q.waiters) == 0 {
		q.lastEmpty = now
		if q.fits(r.Cost) {
			q.inUse += r.Cost
			q.fair.admitted(r.Flow, r.Weight, r.Cost, now)
			return nil, nil
		}
	}
	if q.light(r, now) {
		q.inUse += r.Cost
		q.passed++
		q.fair.admitted(r.Flow, r.Weight, r.Cost, now)
		return nil, nil
	}
	if r.Batch && !r.Continues && len(q.waiters) > 0 {
		return nil, q.refuse(fmt.Errorf("%w: batch work is not queued while %d requests wait", ErrShed, len(q.waiters)))
	}
	if q.arrivalWait(r, now) <= 0 {
		// Refused before anyone is shed in its place: a waiter dropped
		// to make room for a request that cannot wait either is lost.
		return nil, q.refuse(fmt.Errorf("%w: no capacity for %d items and no time left to wait", ErrShed, r.Cost))
	}
	shed := false
	if !r.Continues && len(q.waiters)-q.continues >= q.cfg.MaxWaiters {
		v := q.batchVictim(r)
		if v == nil {
			v = q.victim(q.fair.flows[r.Flow], q.fair.lead(q.fair.flows[r.Flow], r.Cost, r.Weight, now), now)
		}
		if v == nil {
			return nil, q.refuse(fmt.Errorf("%w: %d requests already wait for capacity, the most the queue holds", ErrShed, len(q.waiters)-q.continues))
		}
		why := "a caller under its fair share arrived"
		if v.req.Batch && !r.Batch {
			why = "interactive work arrived, which goes before batch work"
		}
		q.drop(v, fmt.Errorf("%w: the queue was full and %s; this request waited %v", ErrShed, why, now.Sub(v.enqueued)))
		shed = true
	}
	fl := q.fair.join(r.Flow, r.Weight, now)
	wait := q.cfg.MaxWait(now, q.flowSince(fl), r.StartBy)
	if r.Continues {
		wait = q.cfg.continuingWait(now, r.StartBy)
	}
	if wait <= 0 {
		q.fair.leave(fl, now)
		return nil, q.refuse(fmt.Errorf("%w: no capacity for %d items and no time left to wait", ErrShed, r.Cost))
	}
	fl.queued += r.Cost
	w := &waiter{req: r, enqueued: now, done: make(chan struct{}), flow: fl}
	if len(q.waiters) == 0 {
		q.stopCheck = q.clock.AfterFunc(q.cfg.Interval, q.onStanding)
	}
	q.waiters = append(q.waiters, w)
	if r.Continues {
		q.continues++
	}
	w.stop = q.clock.AfterFunc(wait, func() { q.expire(w) })
	if shed {
		// The waiter shed may have been the one at the head that did
		// not fit, holding back those behind it (this arrival too).
		q.grant()
	}
	return w, nil
}

// arrivalWait is how long r, arriving at now, may wait as the queue
// stands before it joins: the wait enter gives it, or less (shedding a
// waiter to make room can only make its flow's queue younger).
func (q *Queue) arrivalWait(r Request, now time.Time) time.Duration {
	if r.Continues {
		return q.cfg.continuingWait(now, r.StartBy)
	}
	since := now
	if fl := q.fair.flows[r.Flow]; fl != nil && fl.waiting > 0 {
		since = fl.since
	}
	if since.Before(q.lastEmpty) {
		since = q.lastEmpty
	}
	return q.cfg.MaxWait(now, since, r.StartBy)
}

// light reports whether r may go past the waiters (with none, it is
// first in line anyway): an interactive new request of a flow with none
// of its own waiting, which has used less than the mean of the flows of
// late at its weight (so with no other flow it never is) and would be
// served before the waiter served next, fitting within the capacity
// plus the reserve in force.
func (q *Queue) light(r Request, now time.Time) bool {
	if len(q.waiters) == 0 || r.Batch || r.Continues || q.inUse+r.Cost > q.capacity+q.reserve() {
		return false
	}
	fl := q.fair.flows[r.Flow]
	share := 0.0 // its recent usage at its weight; none for a new flow
	if fl != nil {
		if fl.waiting > 0 {
			return false
		}
		share = fl.used(now) / fl.weight
	}
	mean, _ := q.fair.meanUsage(now)
	return share < mean && q.fair.ahead(fl, r.Cost, r.Weight, q.next(now), now)
}

// reserve is how far over the capacity light requests may take the
// items in use now: Config.Reserve, at most a quarter of the capacity in
// force, so that it shrinks as an adaptive controller lowers it.
func (q *Queue) reserve() int64 { return min(q.cfg.Reserve, q.capacity/4) }

func (q *Queue) refuse(err error) error {
	q.shed++
	return err
}

// expire sheds w if it still waits after its allowed wait, or, if a
// flow further over its share has waiters, one of theirs instead.
func (q *Queue) expire(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !slices.Contains(q.waiters, w) || q.spare(w, q.clock.Now()) {
		return
	}
	q.drop(w, fmt.Errorf("%w: waited %v for %d items without capacity freeing up", ErrShed, q.clock.Now().Sub(w.enqueued), w.req.Cost))
	q.grant()
}

// spare sheds, in place of w whose wait is up, the oldest waiter of the
// flow furthest over its fair share, if that flow is further over it
// than w's, and lets w wait up to Target more, never past its StartBy.
// It reports whether it did. A waiter under its share with nobody to
// shed in its place is shed on time all the same: letting it wait on to
// its StartBy made sheds slow whenever many equal callers overload the
// queue, since about half of them are below the mean at any moment.
func (q *Queue) spare(w *waiter, now time.Time) bool {
	left := q.cfg.Target
	if !w.req.StartBy.IsZero() {
		left = min(left, w.req.StartBy.Sub(now))
	}
	if left <= 0 || w.req.Batch {
		return false
	}
	v := q.victim(w.flow, q.fair.lead(w.flow, 0, 0, now), now)
	if v == nil {
		return false
	}
	q.drop(v, fmt.Errorf("%w: shed in favour of a caller under its fair share after waiting %v", ErrShed, now.Sub(v.enqueued)))
	w.stop()
	w.stop = q.clock.AfterFunc(left, func() { q.expire(w) })
	q.grant()
	return true
}

// victim returns the oldest waiter, not a Continues one, of the flow
// with the largest lead, if that lead is larger than lead, the flow is
// not fl and it has used at least its share of late (a flow under its
// share is never shed for another's sake); nil otherwise. It is asked
// for an interactive waiter's sake only: a batch request is refused
// rather than queued while others wait, and a later piece is never
// refused for a full queue.
func (q *Queue) victim(fl *flow, lead float64, now time.Time) *waiter {
	mean, shares := q.fair.meanUsage(now) // once: victim runs per waiter in onStanding
	var worst *flow
	for _, w := range q.waiters {
		if w.flow == fl || w.flow == worst || w.req.Continues || shares && w.flow.underShare(mean, now) {
			continue
		}
		if l := q.fair.lead(w.flow, 0, 0, now); l > lead {
			worst, lead = w.flow, l
		}
	}
	for _, w := range q.waiters {
		if w.flow == worst && !w.req.Continues {
			return w
		}
	}
	return nil
}

// batchVictim returns, for an interactive r arriving at a full queue,
// the oldest batch waiter that is not a Continues one: batch work is
// shed before interactive work, whatever the flows' shares. nil for a
// batch r or when there is none.
func (q *Queue) batchVictim(r Request) *waiter {
	if r.Batch {
		return nil
	}
	for _, w := range q.waiters {
		if w.req.Batch && !w.req.Continues {
			return w
		}
	}
	return nil
}

// drop sheds w, which waits, with err.
func (q *Queue) drop(w *waiter, err error) {
	q.remove(w)
	w.stop()
	q.shed++
	w.err = err
	close(w.done)
}

// onStanding runs Interval after the queue became non-empty: if it never
// emptied since, it is now a standing queue, so batch waiters and waiters
// older than Target are shed, and the rest may wait only until they
// reach Target.
func (q *Queue) onStanding() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	if len(q.waiters) == 0 || !q.cfg.standing(now, q.lastEmpty) {
		return
	}
	q.stopCheck = nil
	// Flows furthest under their share first, so that theirs are spared
	// at the expense of the others' while those still wait.
	order := slices.Clone(q.waiters)
	slices.SortStableFunc(order, func(a, b *waiter) int {
		return cmp.Compare(q.fair.lead(a.flow, 0, 0, now), q.fair.lead(b.flow, 0, 0, now))
	})
	for _, w := range order {
		if !slices.Contains(q.waiters, w) {
			continue // shed in place of an earlier one
		}
		waited := now.Sub(w.enqueued)
		if w.req.Continues {
			continue // it keeps its wait: shedding it would waste its request's work
		}
		if !w.req.Batch && !q.cfg.standing(now, q.flowSince(w.flow)) {
			continue // its flow's own queue does not stand: it keeps its wait
		}
		if left := q.standingWait(w, now, waited); left > 0 {
			w.stop()
			w.stop = q.clock.AfterFunc(left, func() { q.expire(w) })
			continue
		}
		if q.spare(w, now) {
			continue
		}
		q.drop(w, fmt.Errorf("%w: the queue has not emptied for %v and this request waited %v", ErrShed, now.Sub(q.lastEmpty), waited))
	}
	q.grant()
}

// standingWait is how much longer w, which has waited waited, may wait
// now that its flow's queue stands: up to Target in all, never past its
// StartBy; 0 for batch work, which is shed at once.
func (q *Queue) standingWait(w *waiter, now time.Time, waited time.Duration) time.Duration {
	if w.req.Batch || waited >= q.cfg.Target {
		return 0
	}
	left := q.cfg.Target - waited
	if !w.req.StartBy.IsZero() {
		left = min(left, w.req.StartBy.Sub(now))
	}
	return left
}

func (q *Queue) release(cost int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.inUse -= cost
	q.grant()
}

// grant hands free capacity to waiters in the order the rule picks,
// stopping at the first that does not fit, so a large request is not
// starved by smaller ones behind it.
func (q *Queue) grant() {
	now := q.clock.Now()
	for len(q.waiters) > 0 {
		w := q.next(now)
		if !q.fits(w.req.Cost) {
			if !q.fitsReserve(w, now) {
				return
			}
			q.passed++
		}
		q.fair.served(w.flow, w.req.Cost, now)
		q.remove(w)
		w.stop()
		q.inUse += w.req.Cost
		close(w.done)
	}
}

// fits reports whether cost more items may be admitted now. A request
// larger than a lowered capacity (but within the configured one) runs
// alone rather than never.
func (q *Queue) fits(cost int64) bool {
	return q.inUse+cost <= q.capacity || q.inUse == 0
}

// fitsReserve reports whether w, next in fair order, may be granted from
// the light reserve as a request going past the queue would be (see
// light): an interactive new request, its flow's only waiter, with
// others waiting behind it, of a flow that has used less than the mean
// of the flows of late at its weight, within the capacity plus the
// reserve. So the reserve stays what light requests use while heavier
// flows wait: not extra capacity for flows that keep a backlog of their
// own, and not for a request alone in the queue, where the limit holds.
func (q *Queue) fitsReserve(w *waiter, now time.Time) bool {
	if w.req.Batch || w.req.Continues || w.flow.waiting != 1 || len(q.waiters) < 2 ||
		q.inUse+w.req.Cost > q.capacity+q.reserve() {
		return false
	}
	mean, ok := q.fair.meanUsage(now)
	return ok && w.flow.underShare(mean, now)
}

// next picks the waiter to serve: interactive before batch; among those,
// the flow first in fair order; within it, newest first in a standing
// queue, oldest first otherwise.
func (q *Queue) next(now time.Time) *waiter {
	return q.fair.pick(q.waiters, q.cfg.standing(now, q.lastEmpty), now)
}

// remove takes w out of the queue, reporting whether it was there.
// Emptying the queue records the time and cancels the standing check.
func (q *Queue) remove(w *waiter) bool {
	i := slices.Index(q.waiters, w)
	if i < 0 {
		return false
	}
	q.waiters = slices.Delete(q.waiters, i, i+1)
	if w.req.Continues {
		q.continues--
	}
	now := q.clock.Now()
	w.flow.queued -= w.req.Cost
	q.fair.leave(w.flow, now)
	if len(q.waiters) == 0 {
		q.fair.reset(now)
		q.lastEmpty = now
		if q.stopCheck != nil {
			q.stopCheck()
			q.stopCheck = nil
		}
	}
	return true
}

// Stats reports the queue's state now.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	return Stats{
		InUse:    q.inUse,
		Capacity: q.capacity,
		Flows:    q.fair.held(now),
		Waiting:  len(q.waiters),
		Standing: len(q.waiters) > 0 && q.cfg.standing(now, q.lastEmpty),
		Shed:     q.shed,
		Light:    q.passed,
	}
}

// Capacity is the configured capacity in items: the upper bound of
// SetCapacity.
func (q *Queue) Capacity() int64 { return q.cfg.Capacity }

// SetCapacity changes how many items may be admitted at once, clamped to
// [1, the configured Capacity]. Lowering it admits nobody new until
// enough is released; raising it admits waiters at once.
func (q *Queue) SetCapacity(n int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.capacity = min(max(n, 1), q.cfg.Capacity)
	q.grant()
}
