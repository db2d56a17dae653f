package guard

import (
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/queue"
)

// observeCapacity feeds one successful request's service time, and the
// items in flight as it finished, to the adaptive item limit and applies
// a changed limit to the item queue.
func (s *Server) observeCapacity(cost int64, took time.Duration) {
	limit := s.limiter.Observe(cost, took, s.inflightItems.Load(), time.Now())
	applyLast(&s.itemLimit, limit, s.items.SetCapacity)
}

// applyLast stores limit in stored and, unless it was there already,
// applies it. Two callers finishing together can apply their limits in
// the opposite order from the one they stored them in: after applying
// its own, each applies again whatever is stored now, so what was applied
// last is the last limit stored.
func applyLast(stored *atomic.Int64, limit int64, apply func(int64)) {
	if stored.Swap(limit) == limit {
		return
	}
	for applied := limit; ; {
		apply(applied)
		now := stored.Load()
		if now == applied {
			return
		}
		applied = now
	}
}

// ItemLimit reports the process-wide in-flight item limit in force now:
// the adaptive limit, between min_inflight_items and max_inflight_items.
func (s *Server) ItemLimit() int64 { return s.itemLimit.Load() }

// AdmissionStats is the state of process-wide admission, for metrics and
// the /clients page.
type AdmissionStats struct {
	queue.Stats
	// MinItems and MaxItems bound the adaptive item limit (Stats.Capacity).
	MinItems, MaxItems int64
	// Slots is the request slots' queue: InUse of Capacity
	// (max_inflight_requests) taken, Waiting for one, Shed since start.
	Slots queue.Stats
}

// Admission reports the item queue's state, the adaptive limit's bounds
// and the request slots' queue.
func (s *Server) Admission() AdmissionStats {
	a := s.cfg.adaptiveConfig()
	return AdmissionStats{Stats: s.items.Stats(), MinItems: a.Min, MaxItems: a.Max, Slots: s.requests.Stats()}
}

// Saturation returns a reading of whether the guard is saturated: a
// request waits for items or for a request slot now, or one was shed
// since the previous reading. Its state is its own, so each caller
// (one goroutine) takes its own.
func (s *Server) Saturation() func() bool {
	var shedBefore int64
	return func() bool {
		a := s.Admission()
		shed := a.Shed + a.Slots.Shed
		grew := shed > shedBefore
		shedBefore = shed
		return a.Waiting > 0 || a.Slots.Waiting > 0 || grew
	}
}
