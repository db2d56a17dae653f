package cqlstore

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocql/gocql"
)

// healer replaces the sessions when the driver stays without a usable
// connection after the cluster is back. gocql v1.7.0 sometimes keeps a
// host's pool empty after an outage (its pool never refills and the host
// is not marked down, so its reconnect loop skips it): every query then
// fails with "no hosts available in the pool" until the process restarts.
// A store that has seen only that error for longer than the time a
// reconnect takes opens fresh sessions in the background — one opening
// at a time, and no more often than that same interval — and keeps the
// old ones if the cluster is still unreachable.
type healer struct {
	open func() (*sessionPair, error)

	stuckSince atomic.Int64 // unix nanoseconds; 0 while queries get answers
	mu         sync.Mutex   // held while reopening, and by Close
	lastTry    time.Time
	closed     bool         // set by Close: no more reopening
	reopened   atomic.Int64 // sessions replaced, ever
}

// stuckAfter is how long queries may fail for lack of connections before
// the sessions are replaced: a connect timeout and two reconnect rounds.
func (c Config) stuckAfter() time.Duration {
	return max(c.ConnectTimeout+2*c.ReconnectInterval, 2*time.Second)
}

// heal notes a query's outcome and replaces the sessions when the driver
// has had no connection for longer than stuckAfter.
func (s *Store) heal(err error) {
	switch {
	case err == nil || errors.Is(err, gocql.ErrNotFound): // the cluster answered
		s.healer.stuckSince.Store(0)
		return
	case !errors.Is(err, gocql.ErrNoConnections):
		return
	}
	now := time.Now()
	since := s.healer.stuckSince.Load()
	if since == 0 {
		s.healer.stuckSince.CompareAndSwap(0, now.UnixNano())
		return
	}
	if now.Sub(time.Unix(0, since)) < s.cfg.stuckAfter() {
		return
	}
	s.reopen(now)
}

// reopen starts opening fresh sessions, unless another caller is
// already doing so or one tried within stuckAfter. The sessions open in
// the background: a connect can take ConnectTimeout or longer against a
// cluster still away, and the query that noticed the driver stuck must
// not wait for it past its own deadline, holding its query slot.
func (s *Store) reopen(now time.Time) {
	h := &s.healer
	if !h.mu.TryLock() {
		return
	}
	if h.closed || now.Sub(h.lastTry) < s.cfg.stuckAfter() {
		h.mu.Unlock()
		return
	}
	h.lastTry = now
	go s.swapSessions() // at most one: it holds h.mu until done
}

// swapSessions opens fresh sessions and swaps them in, keeping the old
// ones if the cluster is still unreachable; it releases the healer's
// lock, which reopen took for it.
func (s *Store) swapSessions() {
	h := &s.healer
	defer h.mu.Unlock()
	fresh, err := h.open()
	if err != nil {
		return // still unreachable; the next stuck query tries again later
	}
	old := s.sessions.Swap(fresh)
	h.stuckSince.Store(0)
	h.reopened.Add(1)
	old.close()
}
