package guard

import (
	"sync"
	"time"
)

// Silent streams. A stream reserves its slot and its worst-case request
// bytes at its headers (tapHandle), and gives them back once its request
// has arrived, or when it ends. A stream that sends its headers and then
// nothing would keep them until its caller left. So every admitted stream
// waits in a list, oldest first, until its request arrives or it ends;
// a sweep of the list, every quarter of receive_timeout while the server
// serves, cancels the streams that have waited receive_timeout. A list
// and one sweep cost a stream two short critical sections, where a timer
// per stream cost several microseconds.

// pendingStreams is the list of admitted streams whose request has not
// arrived, in the order they were admitted.
type pendingStreams struct {
	mu         sync.Mutex
	head, tail *receiving
}

// pendingLink is a stream's place in pendingStreams.
type pendingLink struct {
	prev, next *receiving
	listed     bool
	since      time.Time
}

// add appends r, admitted at now.
func (p *pendingStreams) add(r *receiving, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r.link = pendingLink{prev: p.tail, listed: true, since: now}
	if p.tail != nil {
		p.tail.link.next = r
	} else {
		p.head = r
	}
	p.tail = r
}

// remove takes r out of the list, if it is in it.
func (p *pendingStreams) remove(r *receiving) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unlink(r)
}

func (p *pendingStreams) unlink(r *receiving) {
	if !r.link.listed {
		return
	}
	if r.link.prev != nil {
		r.link.prev.link.next = r.link.next
	} else {
		p.head = r.link.next
	}
	if r.link.next != nil {
		r.link.next.link.prev = r.link.prev
	} else {
		p.tail = r.link.prev
	}
	r.link = pendingLink{}
}

// takeOlder removes and returns the streams admitted before cutoff.
func (p *pendingStreams) takeOlder(cutoff time.Time) []*receiving {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*receiving
	for p.head != nil && p.head.link.since.Before(cutoff) {
		r := p.head
		p.unlink(r)
		out = append(out, r)
	}
	return out
}

// sweepEvery is how often the silent streams are swept: a stream is
// cancelled between receive_timeout and 1.25 × receive_timeout after
// its headers.
func sweepEvery(receiveTimeout time.Duration) time.Duration {
	return max(receiveTimeout/4, time.Millisecond)
}

// sweepSilent cancels, every sweepEvery until stop is closed, the
// streams that have waited receive_timeout for their request.
func (mem *memory) sweepSilent(stop <-chan struct{}) {
	t := time.NewTicker(sweepEvery(mem.plan.ReceiveTimeout))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			for _, r := range mem.pending.takeOlder(now.Add(-mem.plan.ReceiveTimeout)) {
				r.notReceived()
			}
		}
	}
}
