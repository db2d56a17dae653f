// Package nearcache keeps the entries read most often in process memory,
// in front of the shared cache, for a short time, so that a hot key is
// answered without a memcached round trip.
//
// It owns one bounded in-memory cache (otter: W-TinyLFU, so a key read
// once passes through a small window and stays only if its read frequency
// beats the entry it would evict), a doorkeeper in front of it (a key is
// stored only on its second shared-cache answer within a while, so a
// uniform load of keys read once costs no insertions), the byte cap, the
// TTL, and the rule
// that a write on this replica is never followed by a read of the old
// value from memory: Invalidate and Forget drop the key, and an answer
// from the shared cache that was fetched before a concurrent Invalidate is
// not kept. It refuses what it cannot keep honest: entries come only from
// the shared cache (after the read path has filled it), never from the
// store directly, and writes on other replicas are seen only when the
// entry expires or when the journal follower forgets it. An entry expires
// TTL after the shared-cache read that fetched it began, however long that
// read took, so Horizon bounds how long any replica may answer a value the
// shared cache no longer holds. It knows nothing of records: keys are
// URIs (held under their 64-bit hash, with the URI beside the entry to
// tell two that share one apart), values cache.Entry.
package nearcache

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/maypok86/otter/v2/stats"
	"github.com/sluice-dev/sluice/internal/cache"
)

// Config configures a Cache.
type Config struct {
	// TTL is how long an entry is served from memory after it was read
	// from the shared cache; it bounds how stale a read can be after a
	// write on another replica. 0 turns the near cache off: every read
	// reaches the shared cache. Default 1s.
	TTL time.Duration `yaml:"ttl"`
	// MaxBytes caps the bytes held: keys, values and a fixed per-entry
	// overhead. Default 64 MiB.
	MaxBytes int64 `yaml:"max_bytes"`
}

// DefaultConfig returns the defaults: a 1 s TTL and a 64 MiB cap.
func DefaultConfig() Config { return Config{TTL: time.Second, MaxBytes: 64 << 20} }

// Limits of Config's fields.
const (
	MaxTTL      = time.Minute
	minMaxBytes = 1 << 20
	maxMaxBytes = 1 << 40
)

// Validate reports every invalid field, naming it, the rule and the value.
func (c Config) Validate() error {
	var errs []error
	if c.TTL < 0 || c.TTL > MaxTTL {
		errs = append(errs, fmt.Errorf("near_cache.ttl: must be between 0 (off) and %v, got %v", MaxTTL, c.TTL))
	}
	if c.TTL > 0 && (c.MaxBytes < minMaxBytes || c.MaxBytes > maxMaxBytes) {
		errs = append(errs, fmt.Errorf("near_cache.max_bytes: must be between %d and %d, got %d", minMaxBytes, int64(maxMaxBytes), c.MaxBytes))
	}
	return errors.Join(errs...)
}

// Enabled reports whether the config turns the near cache on.
func (c Config) Enabled() bool { return c.TTL > 0 }

// entryOverhead is what an entry costs beyond its key and value bytes:
// the map slot, the node with its links and expiry, the slice headers.
const entryOverhead = 128

// Shared is the cache in front of which a near cache sits; *cache.Cache
// is one.
type Shared interface {
	Lookup(ctx context.Context, uris []string, into []cache.Answer) int
	Get(ctx context.Context, uri string) (cache.Entry, bool)
	Fill(ctx context.Context, entries map[string]cache.Entry)
	Invalidate(ctx context.Context, uris []string) error
}

// generations is the number of write counters keys are hashed onto.
const generations = 4096

// doorBits is the size of the doorkeeper's bit set: keys the shared cache
// answered once recently. It is cleared after doorBits/4 new keys, so a
// key must come back within about that many others to be stored.
const doorBits = 1 << 16

// Cache is a near cache in front of a Shared cache; it has the same
// methods, so the read path uses it in place of the shared one. It is
// safe for concurrent use.
type Cache struct {
	shared Shared
	ttl    time.Duration
	check  func(key string, e cache.Entry) bool // nil: keep every entry, unchecked
	mem    *otter.Cache[uint64, held]           // by the key's hash; nil when off
	// counts counts the reads answered from memory (hits) and those that
	// were not (misses). The cache counts them itself, not otter: otter
	// counts a stored entry as a hit even when its URI or read time make
	// it a miss, and counts keep's stores as reads.
	counts *stats.Counter
	// overflows counts entries evicted for the byte cap, expired those
	// removed after their TTL ended.
	overflows, expired atomic.Uint64
	seed               maphash.Seed
	// gens counts invalidations per hash slot of the key: a read from the
	// shared cache keeps its answer only if its key's counter did not
	// move while it was in flight.
	gens [generations]atomic.Uint64
	// door has a bit per hash slot of the keys the shared cache answered
	// since it was last cleared; doorAdds counts the bits set since then.
	door     [doorBits / 64]atomic.Uint64
	doorAdds atomic.Uint64
	// held counts the entries in mem per hash slot of their keys. A key
	// whose slot holds none is a certain miss, answered without a lookup:
	// a load of keys that are not held pays one hash per key. The count
	// goes up before an entry is stored and down when mem deletes one,
	// so it is never below the entries held (only above, briefly).
	held [heldSlots]atomic.Int32
	// bytes is the weight of the entries stored or being stored: reserved
	// before an entry is stored, given back when mem deletes it. otter
	// enforces its own cap only when its maintenance runs, which a writer
	// skips while another holds the lock; so many writers at once could
	// hold several times the cap for a moment. The reservation keeps
	// every moment under it; otter evicts down to all but a
	// 1/storingShare of the cap, which leaves that share for entries
	// being stored between its maintenance runs.
	bytes    atomic.Int64
	maxBytes int64
	// hooks let tests act between keep's steps; they do nothing otherwise.
	hooks keepHooks
}

// keepHooks are called by keep just before and just after it stores an
// entry; tests set them to run an invalidation or a read between the
// steps.
type keepHooks struct {
	before, after func()
}

func (k keepHooks) beforeStore() {
	if k.before != nil {
		k.before()
	}
}

func (k keepHooks) afterStore() {
	if k.after != nil {
		k.after()
	}
}

// storingShare: a 1/storingShare of the byte cap is kept for entries
// being stored, the rest for entries held after maintenance.
const storingShare = 8

// heldSlots is the number of hash slots Cache.held counts entries in.
const heldSlots = 1 << 16

// Option configures a Cache.
type Option func(*Cache)

// WithCheck has the cache keep only the entries check accepts for their
// key, and answer them from memory with Checked set: a reader that
// checks every entry it is given (package posts) then checks a hot key
// once, when it is kept, not on every read. An entry check refuses is
// still answered, unchecked, as the shared cache gave it.
func WithCheck(check func(key string, e cache.Entry) bool) Option {
	return func(c *Cache) { c.check = check }
}

// New returns a near cache in front of shared. cfg must be valid.
func New(cfg Config, shared Shared, opts ...Option) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cache{shared: shared, ttl: cfg.TTL, seed: maphash.MakeSeed(), maxBytes: cfg.MaxBytes}
	for _, opt := range opts {
		opt(c)
	}
	if !cfg.Enabled() {
		return c, nil
	}
	c.counts = stats.NewCounter()
	mem, err := otter.New(&otter.Options[uint64, held]{
		MaximumWeight:    uint64(cfg.MaxBytes - cfg.MaxBytes/storingShare),
		Weigher:          weigh,
		ExpiryCalculator: otter.ExpiryWriting[uint64, held](cfg.TTL),
		OnAtomicDeletion: func(e otter.DeletionEvent[uint64, held]) {
			c.held[e.Key%heldSlots].Add(-1)
			c.bytes.Add(-int64(weigh(e.Key, e.Value)))
			switch e.Cause {
			case otter.CauseOverflow:
				c.overflows.Add(1)
			case otter.CauseExpiration:
				c.expired.Add(1)
			}
		},
		// Maintenance runs on the goroutine that reads or writes, under
		// the cache's try-lock: no goroutine per operation, and the cap
		// is enforced before a write returns.
		Executor: func(fn func()) { fn() },
	})
	if err != nil {
		return nil, fmt.Errorf("nearcache: %w", err)
	}
	c.mem = mem
	return c, nil
}

// held is an entry, the URI it is for and the time the shared-cache read
// that returned it began: it is answered only until TTL after that. It is
// kept under the URI's hash, which makes a lookup hash the URI once and
// compare it once; a held entry whose URI is not the one asked for (two
// URIs with one 64-bit hash) is a miss, and the later of the two replaces
// the other.
type held struct {
	uri    string
	entry  cache.Entry
	readAt time.Time
}

func weigh(_ uint64, h held) uint32 {
	return uint32(min(len(h.uri)+len(h.entry.Value)+entryOverhead, 1<<31))
}

// Horizon is how long after a key's shared-cache entry was invalidated a
// near cache with this one's config may still answer the old value — on a
// replica that did not see the invalidation: its TTL (0 when off). A
// writer that waits Horizon after invalidating knows no replica sharing
// the config answers the old value any more.
func (c *Cache) Horizon() time.Duration { return c.ttl }

// Lookup answers by position (as cache.Cache.Lookup) what it holds from
// memory, and asks the shared cache for the rest, keeping those answers
// for the TTL. An entry it keeps is answered as kept (Checked when the
// cache's check accepted it).
func (c *Cache) Lookup(ctx context.Context, uris []string, into []cache.Answer) int {
	if c.mem == nil {
		return c.shared.Lookup(ctx, uris, into)
	}
	var misses []string
	var missAt []int // misses[k] is uris[missAt[k]]
	var missed []miss
	now := time.Now()
	hits := 0
	for i, uri := range uris {
		e, ok, m := c.lookup(uri, now)
		if ok {
			into[i] = cache.Answer{Entry: e, Hit: true}
			hits++
			continue
		}
		misses = append(misses, uri)
		missAt = append(missAt, i)
		missed = append(missed, m)
	}
	if len(misses) == 0 {
		return hits
	}
	// The shared cache answers the misses by their own positions; when
	// nothing came from memory those are uris' own, so into takes them.
	got := into
	if hits > 0 {
		got = make([]cache.Answer, len(misses))
	}
	c.shared.Lookup(ctx, misses, got)
	for k, a := range got {
		if a.Hit {
			into[missAt[k]] = cache.Answer{Entry: c.consider(misses[k], a.Entry, now, missed[k]), Hit: true}
			hits++
		}
	}
	return hits
}

// Get is Lookup of one URI: the entry and true, or false for a miss. An
// entry it keeps is answered as kept (Checked when the cache's check
// accepted it).
func (c *Cache) Get(ctx context.Context, uri string) (cache.Entry, bool) {
	if c.mem == nil {
		return c.shared.Get(ctx, uri)
	}
	now := time.Now()
	e, ok, m := c.lookup(uri, now)
	if ok {
		return e, true
	}
	if e, ok = c.shared.Get(ctx, uri); !ok {
		return e, false
	}
	return c.consider(uri, e, now, m), true
}

// lookup answers uri from memory if it holds an entry read less than the
// TTL before now; otherwise it returns what the shared-cache read that
// follows needs (miss).
func (c *Cache) lookup(uri string, now time.Time) (cache.Entry, bool, miss) {
	return c.lookupHashed(uri, c.hash(uri), now)
}

// lookupHashed is lookup of uri, whose hash is hash; it counts the hit
// or miss.
func (c *Cache) lookupHashed(uri string, hash uint64, now time.Time) (cache.Entry, bool, miss) {
	if c.held[hash%heldSlots].Load() == 0 {
		c.counts.RecordMisses(1)
		return cache.Entry{}, false, miss{hash: hash, before: c.gen(hash).Load()}
	}
	if h, ok := c.mem.GetIfPresent(hash); ok && h.uri == uri && now.Sub(h.readAt) < c.ttl {
		c.counts.RecordHits(1)
		return h.entry, true, miss{}
	}
	c.counts.RecordMisses(1)
	return cache.Entry{}, false, miss{hash: hash, before: c.gen(hash).Load()}
}

// consider keeps e, the shared cache's answer for uri to a read that
// began at now, if the doorkeeper admits it and the check accepts it, and
// returns it as kept.
func (c *Cache) consider(uri string, e cache.Entry, now time.Time, m miss) cache.Entry {
	if c.admit(m.hash) && c.accepts(uri, &e) {
		c.keep(held{uri: uri, entry: e, readAt: now}, m)
	}
	return e
}

// accepts reports whether e may be kept for uri, and marks it Checked
// when the cache's check accepted it.
func (c *Cache) accepts(uri string, e *cache.Entry) bool {
	if c.check == nil {
		return true
	}
	if !c.check(uri, *e) {
		return false
	}
	e.Checked = true
	return true
}

// miss is a key the shared cache is asked for: its hash and its write
// counter when the read began.
type miss struct {
	hash, before uint64
}

// keep stores h unless an invalidation of its URI began after the read
// that returned it did. The counter is checked again as the entry is
// stored, under the lock of the key's bucket, which Forget's delete takes
// too: either the store comes first and the delete removes the entry, or
// the store sees the counter moved and stores nothing. So no reader finds
// the entry once Forget has returned; checking after the store instead
// would leave it readable for a moment after.
func (c *Cache) keep(h held, m miss) {
	g := c.gen(m.hash)
	w := int64(weigh(m.hash, h))
	if g.Load() != m.before || !c.reserve(w) {
		return
	}
	slot := &c.held[m.hash%heldSlots]
	slot.Add(1) // before the store, so a reader never skips a held entry
	c.hooks.beforeStore()
	stored := false
	c.mem.Compute(m.hash, func(old held, found bool) (held, otter.ComputeOp) {
		if g.Load() != m.before {
			return old, otter.CancelOp
		}
		stored = true
		return h, otter.WriteOp
	})
	c.hooks.afterStore()
	if !stored {
		slot.Add(-1)
		c.bytes.Add(-w)
	}
}

// reserve takes w bytes of the cap for an entry about to be stored, and
// reports whether they were there. When they were not, it runs the
// maintenance other writers left pending (the evictions that make room)
// and tries once more; an entry that still does not fit is not kept,
// which costs only a later shared-cache read. An entry heavier than the
// share of the cap kept for storing is never kept: eviction leaves no
// more room than that.
func (c *Cache) reserve(w int64) bool {
	if w > c.maxBytes/storingShare {
		return false
	}
	if c.tryReserve(w) {
		return true
	}
	c.mem.CleanUp()
	return c.tryReserve(w)
}

// tryReserve takes w bytes if the cap has them; the count never passes
// the cap, even for a moment.
func (c *Cache) tryReserve(w int64) bool {
	for {
		held := c.bytes.Load()
		if held+w > c.maxBytes {
			return false
		}
		if c.bytes.CompareAndSwap(held, held+w) {
			return true
		}
	}
}

// Fill refills the shared cache; the near cache keeps only what it reads
// back from the shared cache, and only on the second such answer (the
// doorkeeper), so a key first read from the store enters memory on its
// third read.
func (c *Cache) Fill(ctx context.Context, entries map[string]cache.Entry) {
	c.shared.Fill(ctx, entries)
}

// Invalidate invalidates uris in the shared cache, then forgets them here
// whether or not the shared cache answered: a write on this replica is
// never followed by a read of the old value from memory.
func (c *Cache) Invalidate(ctx context.Context, uris []string) error {
	err := c.shared.Invalidate(ctx, uris)
	c.Forget(uris)
	return err
}

// Forget drops uris from memory (and makes reads already in flight for
// them not keep their answers), leaving the shared cache alone: for
// invalidations that reached the shared cache some other way.
func (c *Cache) Forget(uris []string) {
	if c.mem == nil {
		return
	}
	for _, uri := range uris {
		hash := c.hash(uri)
		c.gen(hash).Add(1)
		c.mem.Invalidate(hash)
	}
}

// admit reports whether the shared cache answered the key of hash before,
// since the doorkeeper was last cleared, and notes that it has now.
func (c *Cache) admit(hash uint64) bool {
	slot := hash % doorBits
	word, bit := &c.door[slot/64], uint64(1)<<(slot%64)
	if word.Load()&bit != 0 {
		return true
	}
	if word.Or(bit)&bit != 0 {
		return true // another reader noted it first
	}
	if c.doorAdds.Add(1)%(doorBits/4) == 0 {
		for i := range c.door {
			c.door[i].Store(0)
		}
	}
	return false
}

func (c *Cache) gen(hash uint64) *atomic.Uint64 { return &c.gens[hash%generations] }

func (c *Cache) hash(uri string) uint64 { return maphash.String(c.seed, uri) }

// Stats are the near cache's figures since New.
type Stats struct {
	Enabled   bool
	Hits      uint64
	Misses    uint64
	Evictions uint64 // entries dropped to stay under the byte cap
	Expired   uint64 // entries removed (by maintenance, a delete or a store) after their TTL ended
	Bytes     uint64 // weighed bytes held now, with those being stored
	MaxBytes  uint64
}

// Stats returns the current figures.
func (c *Cache) Stats() Stats {
	if c.mem == nil {
		return Stats{}
	}
	s := c.counts.Snapshot()
	return Stats{
		Enabled:   true,
		Hits:      s.Hits,
		Misses:    s.Misses,
		Evictions: c.overflows.Load(),
		Expired:   c.expired.Load(),
		Bytes:     uint64(c.bytes.Load()),
		MaxBytes:  uint64(c.maxBytes),
	}
}

// Close stops the cache's periodic clean-up goroutine. The Cache still
// answers afterwards, from the shared cache and from memory.
func (c *Cache) Close() error {
	if c.mem != nil {
		c.mem.StopAllGoroutines()
	}
	return nil
}
