// Package journal follows the store's invalidation journal
// (store.Journal) and keeps memcached honest with it.
//
// A Follower polls the journal every Config.MaxLag/4 and writes a
// tombstone for every change another process made (its own changes the
// write path already invalidated), so a replica whose memcached view
// never saw a write — the writer was another replica, or died between the
// store write and its tombstone — is corrected within the lag. It writes
// the tombstones the cache owes (cache.RetryTombstones: keys whose
// tombstones a memcached failure made this process miss, each read as a
// miss meanwhile), which needs memcached only. And it replays the
// journal onto memcached servers the cache distrusts as a whole
// (cache.Suspects: at start-up, or after too many missed tombstones):
// such a server is read as misses until every change since its
// failure began (less Config.Overlap) has been deleted from it, and only
// then trusted again. That replay needs the store.
//
// The follower owns no memcached connections and no store writes; it
// refuses nothing and never fails a request. Its one goroutine is the
// caller's (Run), started by the server's lifecycle.
package journal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/store"
)

// Cache is what the follower needs of the cache; *cache.Cache has it.
type Cache interface {
	Invalidate(ctx context.Context, uris []string) error
	DropOn(ctx context.Context, addr string, uris []string) error
	Suspects() []cache.Suspect
	SuspectAll(since time.Time)
	Trust(cache.Suspect) bool
	RetryTombstones(ctx context.Context) (int, error)
}

// Config tunes a Follower. The zero value of a field takes its default.
type Config struct {
	// Disabled turns the journal follower off, and with it the distrust
	// of keys and servers that missed tombstones: the behaviour before
	// the journal, kept for measuring it. Default false (the follower
	// runs). The store writes the journal either way.
	Disabled bool `yaml:"disabled"`
	// MaxLag bounds how long after a change is written this replica
	// tombstones it, while the journal is readable: the follower polls
	// every MaxLag/4. Default 1s; at least 40ms.
	MaxLag time.Duration `yaml:"max_lag"`
	// Overlap is how far back each poll reads again, for changes stamped
	// by their writer's clock that land later (a slow or retried CQL
	// write, clock skew between replicas); a replay onto a failed server
	// also starts this long before the failure. Default 10s.
	Overlap time.Duration `yaml:"overlap"`
	// StartReplay is how much journal a starting process replays onto
	// every server before trusting it, for writes whose tombstones the
	// process before it never wrote. Default: set by the server to the
	// cache's longest entry lifetime; at most the journal's retention.
	StartReplay time.Duration `yaml:"start_replay"`
	// Parallelism bounds the tombstones written at once. Default 16.
	Parallelism int `yaml:"parallelism"`
	// Retention is how long the store keeps journal entries (the server
	// passes it to the backend). Default store.DefaultJournalRetention;
	// the server refuses one shorter than the cache's longest entry
	// lifetime plus its tombstone lifetime.
	Retention time.Duration `yaml:"retention"`
}

// MaxRetention bounds Config.Retention: the longest any store keeps
// journal entries (the CQL store's row TTL bound).
const MaxRetention = 24 * time.Hour

// ReplayMargin is how much of the retention a start-up replay leaves
// unread: the entries at its very edge may expire while it reads them.
const ReplayMargin = time.Minute

// Defaults of Config.
const (
	DefaultMaxLag      = time.Second
	DefaultOverlap     = 10 * time.Second
	DefaultParallelism = 16
	minMaxLag          = 40 * time.Millisecond
	// maxMaxLag bounds how long another writer's change may stay
	// stale here: past a minute a shorter cache ttl is the better knob.
	maxMaxLag = time.Minute
)

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.MaxLag == 0 {
		c.MaxLag = DefaultMaxLag
	}
	if c.Overlap == 0 {
		c.Overlap = DefaultOverlap
	}
	if c.Parallelism == 0 {
		c.Parallelism = DefaultParallelism
	}
	if c.Retention == 0 {
		c.Retention = store.DefaultJournalRetention
	}
	return c
}

// Validate reports every field out of range, after defaults.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.MaxLag < minMaxLag || c.MaxLag > maxMaxLag {
		errs = append(errs, fmt.Errorf("journal: max_lag must be between %v and %v, got %v", minMaxLag, maxMaxLag, c.MaxLag))
	}
	if c.Overlap < 0 {
		errs = append(errs, fmt.Errorf("journal: overlap %v is negative", c.Overlap))
	}
	if c.Retention < time.Minute || c.Retention > MaxRetention {
		errs = append(errs, fmt.Errorf("journal: retention must be between 1m0s and %v, got %v", MaxRetention, c.Retention))
	}
	if c.StartReplay < 0 || c.StartReplay > c.Retention-ReplayMargin {
		errs = append(errs, fmt.Errorf("journal: start_replay must be between 0 (the default: the cache's longest entry lifetime plus its tombstone lifetime) and the retention less %v (%v), got %v", ReplayMargin, c.Retention-ReplayMargin, c.StartReplay))
	}
	if c.Parallelism < 1 || c.Parallelism > 1024 {
		errs = append(errs, fmt.Errorf("journal: parallelism %d is outside [1, 1024]", c.Parallelism))
	}
	return errors.Join(errs...)
}

// Stats are the follower's counters since New.
type Stats struct {
	// Lag is how far behind now the last successful poll read.
	Lag time.Duration
	// Applied counts tombstones written for other writers' changes (a
	// batch of them not all written counts none); Own
	// counts own changes skipped.
	Applied, Own int64
	// ReadErrors counts journal reads that failed.
	ReadErrors int64
	// Replays counts replays that ended with a server trusted again,
	// ReplayedURIs the tombstones they wrote, ReplayFailures replays that
	// did not (the server failed again, or the journal was unreadable).
	Replays, ReplayedURIs, ReplayFailures int64
	// Truncated counts replays whose start lay beyond the journal's
	// retention and began at the retention instead (see Follower).
	Truncated int64
	// Retried counts owed tombstones written again (cache.RetryTombstones).
	Retried int64
	// Suspects is how many memcached servers are distrusted as a whole now.
	Suspects int
}

// Follower follows one store's journal for one cache.
//
// A replay whose start is older than the journal's retention begins at
// the retention: the changes before it are gone, but every cache entry
// they made stale has expired, as long as the retention is at least the
// cache's longest entry lifetime, which the server checks at start-up.
// So no wholesale invalidation (a key generation, flush_all) is needed.
type Follower struct {
	cfg     Config
	j       store.Journal
	c       Cache
	origin  string
	log     *slog.Logger
	applied func([]string)

	cursor atomic.Int64 // unix microseconds: changes before it were read
	start  time.Time    // New's or CatchUp's time: CatchUp covers changes before it
	seen   map[seenKey]time.Time

	own, appliedN, readErrors, retried        atomic.Int64
	replays, replayedURIs, replayFail, truncd atomic.Int64
}

type seenKey struct {
	uri, origin string
	at          int64
}

// Option adjusts a Follower.
type Option func(*Follower)

// WithLogger logs failed journal reads and replays; they repeat while the
// store is down, so the logger must rate-limit.
func WithLogger(l *slog.Logger) Option {
	return func(f *Follower) { f.log = l.With("component", "journal") }
}

// OnApplied calls fn with the URIs of every batch of changes the follower
// tombstoned, after the tombstones were written: the hook for any cache
// in front of memcached (a near cache in the process) that must drop them
// too. fn runs on the follower's goroutine and must not block.
func OnApplied(fn func(uris []string)) Option {
	return func(f *Follower) { f.applied = fn }
}

// New returns a Follower of j for c that skips changes written under
// origin. cfg must be valid.
func New(cfg Config, j store.Journal, c Cache, origin string, opts ...Option) *Follower {
	f := &Follower{cfg: cfg.WithDefaults(), j: j, c: c, origin: origin,
		log: slog.New(slog.DiscardHandler), applied: func([]string) {}, seen: map[seenKey]time.Time{}}
	for _, opt := range opts {
		opt(f)
	}
	f.start = time.Now()
	f.cursor.Store(f.start.UnixMicro())
	return f
}

// CatchUp distrusts every server since StartReplay ago and replays that
// much journal onto each, before the process serves; servers it cannot
// reach stay distrusted until Run replays onto them. Polls then begin at
// CatchUp's start: what changed before is the replay's, deleted rather
// than tombstoned, so records written just before the process serves
// (a seed, a predecessor's last writes) are not kept out of the cache for
// TombstoneTTL.
func (f *Follower) CatchUp(ctx context.Context) {
	f.start = time.Now()
	f.cursor.Store(f.start.UnixMicro())
	f.c.SuspectAll(f.start.Add(-f.cfg.StartReplay))
	f.replaySuspects(ctx, true)
}

// Run polls the journal until ctx ends. RetryOwed runs beside it.
func (f *Follower) Run(ctx context.Context) { f.every(ctx, f.step) }

// RetryOwed writes the tombstones memcached is owed every MaxLag/4 until
// ctx ends. It needs memcached only, so keys whose tombstones a blip made
// this process miss are trusted again as soon as memcached answers; it
// runs on its own, beside Run, so that a journal read hung on an
// unreachable store (up to stepTimeout) cannot hold it up.
func (f *Follower) RetryOwed(ctx context.Context) { f.every(ctx, f.retryOwed) }

// every calls round at once and then every MaxLag/4 until ctx ends.
func (f *Follower) every(ctx context.Context, round func(context.Context)) {
	tick := time.NewTicker(f.cfg.MaxLag / 4)
	defer tick.Stop()
	for {
		round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// retryOwed makes one round of RetryOwed.
func (f *Follower) retryOwed(ctx context.Context) {
	ctx, cancel := context.WithTimeout(fanout.WithLimit(ctx, f.cfg.Parallelism), f.stepTimeout())
	defer cancel()
	n, err := f.c.RetryTombstones(ctx)
	f.retried.Add(int64(n))
	if err != nil {
		f.log.Warn("owed tombstones not written; their keys stay read as misses", "kind", "tombstone_retry", "err", err)
	}
}

// step makes one poll and one replay round.
func (f *Follower) step(ctx context.Context) {
	ctx, cancel := context.WithTimeout(fanout.WithLimit(ctx, f.cfg.Parallelism), f.stepTimeout())
	defer cancel()
	f.poll(ctx)
	f.replaySuspects(ctx, false)
}

// stepTimeout bounds one poll and replay: long enough for a replay of
// the whole retention on a busy machine, short enough that a hung store
// shows in the lag.
func (f *Follower) stepTimeout() time.Duration { return max(10*f.cfg.MaxLag, 10*time.Second) }

// poll reads the changes since the cursor (less Overlap) and tombstones
// those of other writers not seen before.
func (f *Follower) poll(ctx context.Context) {
	to := time.Now()
	// Changes from before the start are CatchUp's: re-reading them would
	// tombstone, and so keep out of the cache for TombstoneTTL, every
	// record written just before the process started.
	from := f.clamp(maxTime(time.UnixMicro(f.cursor.Load()).Add(-f.cfg.Overlap), f.start), to)
	var uris []string
	// Changes are marked seen only once the whole read succeeded: a read
	// that fails part-way is made again, and what it had already passed
	// on must then still be tombstoned.
	fresh := map[seenKey]time.Time{}
	var own int64
	err := f.j.Changes(ctx, from, to, func(ch store.Change) error {
		k := seenKey{ch.URI, ch.Origin, ch.At.UnixMicro()}
		if _, ok := f.seen[k]; ok {
			return nil
		}
		if _, ok := fresh[k]; ok {
			return nil
		}
		fresh[k] = ch.At
		if ch.Origin == f.origin {
			own++
		} else {
			uris = append(uris, ch.URI)
		}
		return nil
	})
	if err != nil {
		f.readErrors.Add(1)
		f.log.Error("journal read failed; other writers' changes wait", "kind", "journal_read", "err", err)
		return
	}
	maps.Copy(f.seen, fresh)
	f.own.Add(own)
	if len(uris) > 0 {
		uris = uniq(uris)
		// A tombstone not written makes its server suspect, and the
		// replay covers it: the error needs no handling here but that
		// the batch is not counted as written.
		if f.c.Invalidate(ctx, uris) == nil {
			f.appliedN.Add(int64(len(uris)))
		}
		f.applied(uris)
	}
	f.cursor.Store(to.UnixMicro())
	for k, at := range f.seen {
		if at.Before(to.Add(-f.cfg.Overlap)) {
			delete(f.seen, k)
		}
	}
}

// clamp keeps from inside the journal's retention, with a second's
// margin for the time the read takes.
func (f *Follower) clamp(from, now time.Time) time.Time {
	oldest := now.Add(-f.j.Retention() + time.Second)
	if from.Before(oldest) {
		return oldest
	}
	return from
}

// replaySuspects replays the journal onto every distrusted server. At
// start-up (startup true) it skips this process's own changes: whatever
// it wrote before serving went through its write path, whose tombstones
// were written or are owed key by key.
func (f *Follower) replaySuspects(ctx context.Context, startup bool) {
	for _, s := range f.c.Suspects() {
		if err := f.replay(ctx, s, startup); err != nil {
			f.replayFail.Add(1)
			f.log.Warn("journal replay onto a failed memcached server did not finish; it stays distrusted", "kind", "journal_replay", "server", s.Addr, "err", err)
		}
	}
}

// replay deletes, on s, the entry of every URI changed since s's failure began
// (less Overlap) by any writer, then trusts s unless it failed again.
func (f *Follower) replay(ctx context.Context, s cache.Suspect, skipOwn bool) error {
	now := time.Now()
	from := s.Since.Add(-f.cfg.Overlap)
	if c := f.clamp(from, now); !c.Equal(from) {
		f.truncd.Add(1)
		from = c
	}
	var uris []string
	err := f.j.Changes(ctx, from, now, func(ch store.Change) error {
		if !skipOwn || ch.Origin != f.origin {
			uris = append(uris, ch.URI)
		}
		return nil
	})
	if err != nil {
		return err
	}
	uris = uniq(uris)
	if err := f.c.DropOn(ctx, s.Addr, uris); err != nil {
		return err
	}
	if !f.c.Trust(s) {
		return errors.New("the server failed again during the replay")
	}
	f.replays.Add(1)
	f.replayedURIs.Add(int64(len(uris)))
	f.applied(uris)
	return nil
}

// Stats reports the counters now.
func (f *Follower) Stats() Stats {
	return Stats{
		Lag:     time.Since(time.UnixMicro(f.cursor.Load())),
		Applied: f.appliedN.Load(), Own: f.own.Load(), ReadErrors: f.readErrors.Load(),
		Replays: f.replays.Load(), ReplayedURIs: f.replayedURIs.Load(), ReplayFailures: f.replayFail.Load(),
		Truncated: f.truncd.Load(), Retried: f.retried.Load(), Suspects: len(f.c.Suspects()),
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func uniq(uris []string) []string {
	slices.Sort(uris)
	return slices.Compact(uris)
}
