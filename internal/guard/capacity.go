package guard

import (
	"time"

	"github.com/sluice-dev/sluice/internal/guard/queue"
)

// observeCapacity feeds one successful request's service time, and the
// items in flight as it finished, to the adaptive item limit and applies
// a changed limit to the item queue.
func (s *Server) observeCapacity(cost int64, took time.Duration) {
	limit := s.limiter.Observe(cost, took, s.inflightItems.Load(), time.Now())
	if s.itemLimit.Swap(limit) == limit {
		return
	}
	// Two requests finishing together can apply their limits to the
	// queue in the opposite order from the one they stored them in: after
	// applying its own, each applies again whatever is in force now, so
	// the queue ends with the last limit stored.
	for applied := limit; ; {
		s.items.SetCapacity(applied)
		now := s.itemLimit.Load()
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
}

// Admission reports the item queue's state and the adaptive limit's
// bounds.
func (s *Server) Admission() AdmissionStats {
	a := s.cfg.adaptiveConfig()
	return AdmissionStats{Stats: s.items.Stats(), MinItems: a.Min, MaxItems: a.Max}
}
