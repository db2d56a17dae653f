package cache

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Distrust: with WithDistrust, a server that fails — a call that errs, a
// call its open breaker skips, a tombstone not written for any reason —
// becomes suspect from the first failure on. Its hits may be stale: a
// tombstone it missed would have hidden them. Until a follower of the
// store's journal has replayed every change since the failure's start onto
// it (DropOn) and calls Trust, GetMulti treats its keys as misses
// and Fill leaves it alone; tombstones are still written to it.

// Suspect is a server that failed and is not yet trusted again.
type Suspect struct {
	// Addr is the server's host:port.
	Addr string
	// Since is when the run of failures began.
	Since time.Time
	// Failures counts the server's failures since New; Trust refuses if
	// it has changed, so a failure during a replay is never forgotten.
	Failures int64
}

// distrust is one server's suspicion.
type distrust struct {
	mu       sync.Mutex
	on       bool
	since    time.Time
	failures int64
}

// fail records a failure at now.
func (d *distrust) fail(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failures++
	if !d.on {
		d.on, d.since = true, now
	}
}

// suspect reports the current suspicion.
func (d *distrust) suspect() (Suspect, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Suspect{Since: d.since, Failures: d.failures}, d.on
}

// trust ends the suspicion if no failure happened since s was taken.
func (d *distrust) trust(s Suspect) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.on || d.failures != s.Failures || !d.since.Equal(s.Since) {
		return false
	}
	d.on = false
	return true
}

// suspected reports whether s is suspect now; false without WithDistrust.
func (s *server) suspected() bool {
	if s.distrust == nil {
		return false
	}
	_, on := s.distrust.suspect()
	return on
}

// failed records one failure of s, if it tracks them.
func (s *server) failed() {
	if s.distrust != nil {
		s.distrust.fail(time.Now())
	}
}

// Suspects lists the servers not trusted now, in Config.Servers order.
// It is empty without WithDistrust.
func (c *Cache) Suspects() []Suspect {
	var out []Suspect
	for _, s := range c.servers {
		if s.distrust == nil {
			continue
		}
		if sus, on := s.distrust.suspect(); on {
			sus.Addr = s.addr
			out = append(out, sus)
		}
	}
	return out
}

// Trust trusts sus.Addr again, unless it failed since sus was listed by
// Suspects; it reports whether it did.
func (c *Cache) Trust(sus Suspect) bool {
	for _, s := range c.servers {
		if s.addr == sus.Addr && s.distrust != nil {
			if s.distrust.trust(sus) {
				s.log.Info("memcached server trusted again after a journal replay", "kind", "distrust", "failed_at", sus.Since)
				return true
			}
			return false
		}
	}
	return false
}

// SuspectAll marks every server suspect since the given time, as if each
// had failed then: a process that starts cannot know which tombstones
// the one before it wrote. It does nothing without WithDistrust.
func (c *Cache) SuspectAll(since time.Time) {
	for _, s := range c.servers {
		if s.distrust != nil {
			s.distrust.fail(since)
		}
	}
}

// DropOn deletes, on the server at addr only, the entries of those uris
// whose first rendezvous choice it is — on it even while its breaker is
// open, so a replay never lands on a stand-in; others are skipped. A replay
// deletes rather than tombstones: the server is distrusted meanwhile, so
// this process fills nothing on it, and a tombstone would block refills
// of every replayed key for TombstoneTTL after the server is back. It
// returns an error saying how many deletes failed.
func (c *Cache) DropOn(ctx context.Context, addr string, uris []string) error {
	idx := slices.Index(c.cfg.Servers, addr)
	if idx < 0 {
		return fmt.Errorf("cache: drop on %s: not a configured server", addr)
	}
	var calls []call
	for _, u := range uris {
		if k := Key(u); pick(c.seeds, k) == idx {
			calls = append(calls, call{srv: c.servers[idx], item: &memcache.Item{Key: k}})
		}
	}
	del := func(mc *memcache.Client, it *memcache.Item) error { return mc.Delete(it.Key) }
	if failed, first := c.run(ctx, calls, del); failed > 0 {
		return fmt.Errorf("cache: drop on %s: %d of %d deletes failed: %w", addr, failed, len(calls), first)
	}
	return nil
}
