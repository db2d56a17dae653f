package queue

// Fair order across flows: start-time fair queuing (Goyal, Vin and Cheng,
// SIGCOMM 1996) over item cost. Each flow has a virtual finish time, the
// virtual time at which the work it has been granted ends at its weight;
// a waiter's start tag is the later of the queue's virtual time and its
// flow's finish. The waiter with the smallest start tag is served next,
// and serving it moves the virtual time to its start and its flow's
// finish on by cost/weight. A flow that was idle starts at the current
// virtual time, ahead of every flow with a backlog, so a light flow waits
// for at most one grant whatever the others have queued; flows that stay
// backlogged are served items in proportion to their weights.
//
// State is bounded: a flow is kept only while it has waiters or has been
// served ahead of the virtual time, at most maxIdleFlows of the latter,
// and everything is forgotten when the queue empties (nobody is behind).
// The queue does not decide what a flow is; the guard maps clients onto
// a bounded set of flow names.
//
// Controlled delay is judged per flow, as FQ-CoDel does (RFC 8290): a
// flow whose own waiters have not run out for Interval has a standing
// queue, and only its waiters are held to Target and shed when the queue
// stands. A flow that asks for less than its share has at most a waiter
// or two at a time, served at the next grant, so its queue never stands
// and its waiters may wait up to Interval for that grant however long the
// heavy flows' backlog has stood.
//
// Whoever is shed, the flow furthest over its share pays first: when a
// waiter's time runs out, or the queue is full when a request arrives,
// and another flow has a larger lead (work granted beyond the virtual
// time plus work waiting, at its weight), that flow's oldest waiter is
// shed instead, and the waiter whose time ran out may wait another
// Target, never past its StartBy. So a flow under its share is not shed
// while a flow over it has work queued.

import (
	"math"
	"time"
)

type fairState struct {
	vtime        float64
	flows        map[string]*flow
	maxIdleFlows int
}

type flow struct {
	key     string
	weight  float64
	finish  float64   // virtual time at which its granted work ends
	waiting int       // its waiters in the queue
	queued  int64     // their items
	usage   float64   // items admitted, decayed by usageHalfLife
	usedAt  time.Time // when usage was last brought up to date
	since   time.Time // when its waiters last went from none to one
}

func newFairState(maxWaiters int) fairState {
	return fairState{flows: map[string]*flow{}, maxIdleFlows: max(maxWaiters, 64)}
}

// setWeight takes the weight a request asks for now (an unlisted flow's
// changes with the number of unlisted flows in use); 0 or less means 1.
func (fl *flow) setWeight(w float64) {
	fl.weight = w
	if w <= 0 {
		fl.weight = 1
	}
}

// join returns key's flow, counting one more waiter on it at now.
func (f *fairState) join(key string, weight float64, now time.Time) *flow {
	fl, ok := f.flows[key]
	if !ok {
		fl = &flow{key: key}
		f.flows[key] = fl
	}
	fl.setWeight(weight)
	if fl.waiting == 0 {
		fl.since = now
	}
	fl.waiting++
	return fl
}

// usageHalfLife is how fast a flow's record of the items it was
// admitted fades: long enough to outlast the moments the queue empties,
// short enough that callers arriving with a heavy load are over their
// share within a few hundred milliseconds, before a steady light caller
// is shed in their place.
const usageHalfLife = 250 * time.Millisecond

// used is fl's usage decayed to now.
func (fl *flow) used(now time.Time) float64 {
	if dt := now.Sub(fl.usedAt); dt > 0 {
		return fl.usage * math.Exp2(-dt.Seconds()/usageHalfLife.Seconds())
	}
	return fl.usage
}

// charge adds cost items admitted at now to fl's usage.
func (fl *flow) charge(cost int64, now time.Time) {
	fl.usage, fl.usedAt = fl.used(now)+float64(cost), now
}

// idle reports whether nothing distinguishes fl from a new flow at now:
// no waiters, no lead on the virtual time, less than an item of usage.
func (f *fairState) idle(fl *flow, now time.Time) bool {
	return fl.waiting == 0 && fl.finish <= f.vtime && fl.used(now) < 1
}

// meanUsage is the mean, over the flows the queue knows, of their recent
// usage at their weights; ok is false with fewer than two flows, when no
// flow can be under the others' share.
func (f *fairState) meanUsage(now time.Time) (mean float64, ok bool) {
	total := 0.0
	for _, fl := range f.flows {
		total += fl.used(now) / fl.weight
	}
	return total / float64(max(len(f.flows), 1)), len(f.flows) > 1
}

// underShare reports whether fl has used, of late, less than mean (from
// meanUsage) at its weight: a caller asking for less than its share.
func (fl *flow) underShare(mean float64, now time.Time) bool {
	return fl.used(now)/fl.weight < mean
}

// leave counts one waiter fewer on fl, forgetting the flow once nothing
// distinguishes it from a new one.
func (f *fairState) leave(fl *flow, now time.Time) {
	fl.waiting--
	if f.idle(fl, now) {
		delete(f.flows, fl.key)
	}
}

// served records that fl was granted cost items from the queue at now.
func (f *fairState) served(fl *flow, cost int64, now time.Time) {
	start := max(f.vtime, fl.finish)
	fl.finish = start + float64(cost)/fl.weight
	f.vtime = start
	fl.charge(cost, now)
	if len(f.flows) > f.maxIdleFlows {
		f.prune(now)
	}
}

// admitted records that key's flow was admitted cost items at now
// without waiting, so its usage counts when it next competes.
func (f *fairState) admitted(key string, weight float64, cost int64, now time.Time) {
	fl, ok := f.flows[key]
	if !ok {
		fl = &flow{key: key}
		f.flows[key] = fl
	}
	fl.setWeight(weight)
	fl.charge(cost, now)
	if len(f.flows) > f.maxIdleFlows {
		f.prune(now)
	}
}

// prune forgets idle flows: first those with nothing to tell them from
// a new one, then, if too many remain, the rest without waiters (they
// lose the lead and usage they had).
func (f *fairState) prune(now time.Time) {
	for key, fl := range f.flows {
		if f.idle(fl, now) {
			delete(f.flows, key)
		}
	}
	for key, fl := range f.flows {
		if len(f.flows) <= f.maxIdleFlows {
			return
		}
		if fl.waiting == 0 {
			delete(f.flows, key)
		}
	}
}

// held counts the flows not idle at now.
func (f *fairState) held(now time.Time) int {
	n := 0
	for _, fl := range f.flows {
		if !f.idle(fl, now) {
			n++
		}
	}
	return n
}

// reset restarts virtual time when the queue empties (nobody is behind
// anyone): every flow's lead on it goes, and flows with no usage left
// are forgotten; the others keep their usage.
func (f *fairState) reset(now time.Time) {
	f.vtime = 0
	for key, fl := range f.flows {
		if fl.finish = 0; f.idle(fl, now) {
			delete(f.flows, key)
		}
	}
}

// lead is how far fl is ahead of its fair share at now with extra more
// items waiting: the work it was granted beyond the virtual time, plus
// its recent usage (admitted at once or from the queue, fading with a
// half-life of usageHalfLife, so that it counts across the times the
// queue empties), plus the work it has waiting, at its weight. fl nil
// is a flow with nothing granted or waiting.
func (f *fairState) lead(fl *flow, extra int64, weight float64, now time.Time) float64 {
	if fl == nil {
		if weight <= 0 {
			weight = 1
		}
		return float64(extra) / weight
	}
	return f.startTag(fl) - f.vtime + (fl.used(now)+float64(fl.queued+extra))/fl.weight
}

// ahead reports whether a new interactive request of fl (nil: a flow
// with nothing granted or waiting) costing cost would be served before
// w, an interactive waiter, in pick's order. Before a batch waiter, the
// next grant goes to it anyway: false, so that it waits for that grant
// instead of adding to the items in flight.
func (f *fairState) ahead(fl *flow, cost int64, weight float64, w *waiter, now time.Time) bool {
	if w.req.Batch {
		return false
	}
	tag := f.vtime
	if fl != nil {
		tag = f.startTag(fl)
	}
	if wTag := f.startTag(w.flow); tag != wTag {
		return tag < wTag
	}
	return f.lead(fl, cost, weight, now) < f.lead(w.flow, 0, 0, now)
}

// startTag is when fl's next waiter starts in virtual time.
func (f *fairState) startTag(fl *flow) float64 { return max(f.vtime, fl.finish) }

// pick returns the waiter to serve: interactive before batch; among
// those, the smallest start tag; among equal tags (as every tag is just
// after the queue empties), the flow with the smaller lead (less recent
// usage and work waiting); within a flow, a later piece of a started
// request (Continues) before new requests; then the oldest, or the
// newest when lifo. waiters is in arrival order and not empty.
func (f *fairState) pick(waiters []*waiter, lifo bool, now time.Time) *waiter {
	for _, wantBatch := range []bool{false, true} {
		var best *waiter
		var bestTag, bestLead float64
		for i := range waiters {
			j := i
			if lifo {
				j = len(waiters) - 1 - i
			}
			w := waiters[j]
			if w.req.Batch != wantBatch {
				continue
			}
			tag, lead := f.startTag(w.flow), f.lead(w.flow, 0, 0, now)
			tied := tag == bestTag && lead == bestLead
			if best == nil || tag < bestTag || tag == bestTag && lead < bestLead ||
				tied && w.flow == best.flow && w.req.Continues && !best.req.Continues {
				best, bestTag, bestLead = w, tag, lead
			}
		}
		if best != nil {
			return best
		}
	}
	return waiters[0]
}
