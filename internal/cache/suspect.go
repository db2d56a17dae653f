package cache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Distrust, with WithDistrust, comes in two sizes.
//
// Per key: a tombstone this process owed a server and did not write (the
// call erred, timed out, or its breaker skipped it) leaves that one key
// possibly stale there, and only that key. The server keeps a set of such
// owed keys; GetMulti reads them as misses on it and Fill leaves them
// alone, until RetryTombstones writes the tombstone (it needs memcached,
// never the store), a later write's tombstone lands, or the longest entry
// lifetime has passed since the miss (every entry the tombstone was meant
// to hide has expired by then). Every other key on the server is read as
// usual: a get that fails, a breaker that opens, a server that is frozen
// or restarted make nothing stale by themselves, because every replica
// tombstones every change — its own on the write path, other writers'
// through the journal — and counts each tombstone it could not write.
//
// Whole server: a process that starts cannot know which tombstones the
// one before it wrote (SuspectAll), and a server owing more than
// maxOwedKeys keys stops counting them. Then the whole server is suspect
// from the earliest miss on, and stays so until a follower of the store's
// journal has replayed every change since then onto it (DropOn) and calls
// Trust. That replay needs the store.

// maxOwedKeys bounds the keys one server may owe before it becomes
// suspect as a whole: about 6 MB of keys, far more than the writes a
// server misses in a blip (the default breaker opens after 5 failures and
// retries after 1 s), small enough to hold for every server.
const maxOwedKeys = 50_000

// Suspect is a server that failed and is not yet trusted again.
type Suspect struct {
	// Addr is the server's host:port.
	Addr string
	// Since is when the run of failures began.
	Since time.Time
	// Failures counts the server's whole-server failures since New; Trust
	// refuses if it has changed, so a failure during a replay is never
	// forgotten.
	Failures int64
}

// distrust is one server's suspicion: the keys it owes, and whether it
// is suspect as a whole.
type distrust struct {
	mu       sync.Mutex
	on       bool
	since    time.Time
	failures int64
	owed     map[string]time.Time // key → when its tombstone was last missed
	// untilPaid are the owed keys whose debt does not lapse with age: a
	// refill of unknown outcome may land after it was missed, when the
	// server resumes, so its entry lives from then on (refilled).
	untilPaid map[string]struct{}
	// A get sent while a key was owed (or the server suspect) may be
	// answered after the debt is paid with what memcached read before the
	// tombstone landed (a get and a set on two connections, both queued
	// while the server was frozen): cleared keeps when each debt was paid,
	// for clearedFor, and trusted when the suspicion last ended, so such
	// an answer is hidden too.
	cleared map[string]time.Time
	trusted time.Time
}

// clearedFor is how long a paid debt still hides the answers of gets sent
// before it was paid: far longer than any get waits (the cache's Timeout
// bounds each call).
const clearedFor = time.Minute

func newDistrust() *distrust {
	return &distrust{owed: map[string]time.Time{}, untilPaid: map[string]struct{}{}, cleared: map[string]time.Time{}}
}

// fail makes the server suspect as a whole from at on.
func (d *distrust) fail(at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failLocked(at)
}

func (d *distrust) failLocked(at time.Time) {
	d.failures++
	if !d.on {
		d.on, d.since = true, at
	} else if at.Before(d.since) {
		d.since = at
	}
}

// owe records a tombstone for key not written at now. A key owed
// already keeps the later miss: only a tombstone begun after it pays
// it, and its entries live for the longest entry lifetime from it. Past
// maxOwedKeys the server becomes suspect as a whole since its earliest
// owed key, and the replay covers them all.
func (d *distrust) owe(key string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if at, ok := d.owed[key]; !ok || now.After(at) {
		d.owed[key] = now
	}
	if len(d.owed) <= maxOwedKeys {
		return
	}
	earliest := now
	for _, at := range d.owed {
		earliest = minTime(earliest, at)
	}
	d.failLocked(earliest)
	clear(d.owed)
	clear(d.untilPaid)
}

// oweUntilPaid is owe for a debt that does not lapse with age, only when
// a tombstone begun after now is written (see untilPaid).
func (d *distrust) oweUntilPaid(key string, now time.Time) {
	d.owe(key, now)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.owed[key]; ok { // not cleared by a whole-server suspicion
		d.untilPaid[key] = struct{}{}
	}
}

// paid forgets key's debt if it was last missed before at: a tombstone
// written at or after that time hides whatever the missed ones had to.
func (d *distrust) paid(key string, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if missed, ok := d.owed[key]; ok && !missed.After(at) {
		delete(d.owed, key)
		delete(d.untilPaid, key)
		d.cleared[key] = time.Now()
	}
}

// hide deletes from the items of a get sent at sent the keys it must not
// answer — owed now, or paid (or the server trusted again) after the get
// was sent — and reports how many it deleted.
func (d *distrust) hide(items map[string]*memcache.Item, sent time.Time) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.on || d.trusted.After(sent) {
		n := len(items)
		clear(items)
		return n
	}
	n := 0
	for key := range items {
		_, owed := d.owed[key]
		if paid, ok := d.cleared[key]; owed || ok && paid.After(sent) {
			delete(items, key)
			n++
		}
	}
	return n
}

// trusts reports whether key may be read from and filled on the server.
func (d *distrust) trusts(key string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, owed := d.owed[key]
	return !d.on && !owed
}

// debts lists the owed keys and their miss times, after dropping those
// missed before expired, but for those owed until paid: every entry they
// could hide is gone.
func (d *distrust) debts(expired time.Time) map[string]time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	for key, at := range d.cleared {
		if time.Since(at) > clearedFor {
			delete(d.cleared, key)
		}
	}
	out := make(map[string]time.Time, len(d.owed))
	for key, at := range d.owed {
		if _, pinned := d.untilPaid[key]; at.Before(expired) && !pinned {
			delete(d.owed, key)
			continue
		}
		out[key] = at
	}
	return out
}

func (d *distrust) owedLen() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.owed)
}

// suspect reports the whole-server suspicion.
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
	d.on, d.trusted = false, time.Now()
	return true
}

// suspected reports whether s is suspect as a whole now; false without
// WithDistrust.
func (s *server) suspected() bool {
	if s.distrust == nil {
		return false
	}
	_, on := s.distrust.suspect()
	return on
}

// trusts reports whether key may be read from and filled on s.
func (s *server) trusts(key string) bool { return s.distrust == nil || s.distrust.trusts(key) }

// hide drops from the items of a get sent at sent those s must not
// answer, counting them.
func (s *server) hide(items map[string]*memcache.Item, sent time.Time) {
	if s.distrust == nil || len(items) == 0 {
		return
	}
	s.distrusted.Add(int64(s.distrust.hide(items, sent)))
}

// tombstoned records the outcome of a tombstone for key on s, begun at
// start.
func (s *server) tombstoned(key string, start time.Time, err error) {
	if s.distrust == nil {
		return
	}
	if err == nil {
		s.distrust.paid(key, start)
		return
	}
	s.distrust.owe(key, start)
}

// refilled records the outcome of a refill (an add) of key on s: one
// that failed after its command could have gone out may have been
// stored, or may be yet, with a record read before a write whose
// tombstone expires first, so it leaves key owed, as a missed tombstone
// does, until a tombstone begun after it is written: however long that
// takes, since the add may land only when a frozen server resumes, its
// debt does not lapse with the longest entry lifetime.
func (s *server) refilled(key string, err error) {
	if s.distrust == nil || !refillUnsure(err) {
		return
	}
	s.distrust.oweUntilPaid(key, time.Now())
}

// refillUnsure reports whether a refill that ended with err may have
// been stored or may be yet. One that succeeded, was refused by the
// server or had every add answered, was skipped, or failed to dial or to
// get a connection left nothing that could land later.
func refillUnsure(err error) bool {
	if errors.Is(err, errRefillUnsure) {
		return true
	}
	var connect *memcache.ConnectTimeoutError
	var op *net.OpError
	switch {
	case answered(err), errors.Is(err, memcache.ErrServerError), errors.Is(err, errRefillFault), errors.Is(err, errRefillNotSent),
		errors.Is(err, memcache.ErrMalformedKey), errors.Is(err, ErrUnavailable),
		errors.Is(err, errCallerGone), errors.Is(err, errNotAttempted), errors.Is(err, errOpenedWhileWaiting),
		errors.As(err, &connect), errors.As(err, &op) && op.Op == "dial":
		return false
	}
	return true
}

func (s *server) owedLen() int {
	if s.distrust == nil {
		return 0
	}
	return s.distrust.owedLen()
}

// Suspects lists the servers suspect as a whole now, in Config.Servers
// order. It is empty without WithDistrust.
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

// SuspectAll marks every server suspect as a whole since the given time:
// a process that starts cannot know which tombstones the one before it
// wrote. It does nothing without WithDistrust.
func (c *Cache) SuspectAll(since time.Time) {
	for _, s := range c.servers {
		if s.distrust != nil {
			s.distrust.fail(since)
		}
	}
}

// RetryTombstones writes, on each server, the tombstones it owes (see
// Distrust), each on that server even while its breaker is open — the
// breaker skips the call then, and the key stays owed. It needs no store.
// It returns how many it wrote and an error saying how many it did not.
func (c *Cache) RetryTombstones(ctx context.Context) (int, error) {
	expired := time.Now().Add(-c.cfg.longestEntry())
	var calls []call
	var missed []time.Time
	for _, s := range c.servers {
		if s.distrust == nil {
			continue
		}
		for key, at := range s.distrust.debts(expired) {
			calls = append(calls, call{srv: s, item: c.tombstone(key)})
			missed = append(missed, at)
		}
	}
	errs := c.setTombstones(ctx, calls)
	for i, err := range errs {
		if err == nil {
			// The debt was recorded when its tombstone was missed; this
			// one was begun later, so it is paid.
			calls[i].srv.distrust.paid(calls[i].item.Key, missed[i])
		}
	}
	failed, first := failures(calls, errs)
	if failed > 0 {
		return len(calls) - failed, fmt.Errorf("cache: retry tombstones: %d of %d not written: %w", failed, len(calls), first)
	}
	return len(calls), nil
}

// DropOn deletes, on the server at addr only, the entries of those uris
// whose first or second rendezvous choice it is — on it even while its
// breaker is open, so a replay never lands on a stand-in; others are
// skipped. A server holds a key as its second choice while the first's
// breaker is open, and a copy left there from one outage would be read
// at the next, so a replay drops those too (as Invalidate tombstones
// both). A replay
// deletes rather than tombstones: the server is distrusted meanwhile, so
// this process fills nothing on it, and a tombstone would block refills
// of every replayed key for TombstoneTTL after the server is back. But
// it spares the tombstones it finds (drop.go): each stands between a
// recent write and a read of the record from before it that has yet to
// refill. The deletes go out as tombstones do (writeEach): pipelined, up
// to refillItemsPerWrite a write, when the server has a refill pipeline,
// so that the replay a starting process makes of the last entry
// lifetime's changes ends soon, and with it the reads of every key from
// the store. It returns an error saying how many deletes failed.
func (c *Cache) DropOn(ctx context.Context, addr string, uris []string) error {
	idx := slices.Index(c.cfg.Servers, addr)
	if idx < 0 {
		return fmt.Errorf("cache: drop on %s: not a configured server", addr)
	}
	srv := c.servers[idx]
	var items []*memcache.Item
	for _, u := range uris {
		k := Key(u)
		first := pick(c.seeds, k)
		if first == idx || pickLive(c.seeds, k, func(i int) bool { return i != first }) == idx {
			items = append(items, &memcache.Item{Key: k})
		}
	}
	if failed, first := c.dropOn(ctx, srv, items); failed > 0 {
		return fmt.Errorf("cache: drop on %s: %d of %d deletes failed: %w", addr, failed, len(items), first)
	}
	return nil
}

// dropOn drops the keys of items on srv (each deleted unless it holds a
// tombstone) as writeEach writes, pipelined even when there is only one,
// and reports how many drops failed, with the first failure. A key not
// there is no failure.
func (c *Cache) dropOn(ctx context.Context, srv *server, items []*memcache.Item) (int, error) {
	calls := make([]call, len(items))
	for i, it := range items {
		calls[i] = call{srv: srv, item: it}
	}
	dropPipelined := func(s *server, ctx context.Context, items []*memcache.Item) []error {
		return repeated(s.dropPipelined(ctx, items), len(items))
	}
	return failures(calls, c.writeEach(ctx, calls, writeKind{single: dropOne, pipelined: dropPipelined}))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
