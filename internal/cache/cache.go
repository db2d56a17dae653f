// Package cache bounds and protects sluice's access to memcached.
//
// It owns the connections to the memcached servers (a hard cap per
// server, counted dials), the choice of server for a key (rendezvous
// hashing), the key format (Key), a circuit breaker per server, and how
// concurrent single-key reads share gets (gather.go). It
// refuses to fail a read: a server that errs, times out, is skipped by its
// breaker or has no free connection before the caller's deadline yields
// misses, and the error is counted in Stats and handed to the logger
// given with WithLogger, which must rate-limit. It knows
// nothing of records: keys are strings (URIs) and values are bytes; what
// they mean, and what to do on a miss, is the caller's business.
//
// Writes follow one protocol: Fill refills with ADD after a store read,
// and Invalidate, after a write or delete, SETs a short-lived tombstone
// that makes the key a miss and turns any Fill racing with the write into
// a no-op.
package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/spans"
)

// ErrUnavailable reports a call that was not made: the server's breaker
// was open, or the Cache was closed.
var ErrUnavailable = errors.New("cache: server unavailable")

// errNotAttempted marks a call fanout.Each never started because the
// request's context ended first.
var errNotAttempted = errors.New("cache: not attempted: request context ended")

// Item flags mark what a stored item means.
const (
	flagValue     uint32 = 0 // Value holds the bytes
	flagNegative  uint32 = 1 // a cached "does not exist"
	flagTombstone uint32 = 2 // written or deleted recently: a miss that blocks Fill
)

// Entry is what the cache holds for a key.
type Entry struct {
	// Value is the cached bytes; empty when Negative.
	Value []byte
	// Negative marks a cached "does not exist".
	Negative bool
	// Checked is set on an entry answered by a layer that kept it only
	// after the reader's check accepted it for its key (a near cache
	// given a check): the reader need not check it again.
	Checked bool
}

// Cache is a bounded, breaker-protected memcached client. It is safe for
// concurrent use.
//
// Each server has one gomemcache client and a weighted semaphore of
// MaxConnsPerServer slots, less the refill pipeline's share
// (refillConnsFor), and every call to the client holds one slot.
// gomemcache reuses an idle connection before it dials and keeps up to
// MaxIdleConns idle ones, which is set to the same number. So a dial
// happens only when no idle connection exists, at most as many
// connections exist as calls hold slots, and a released connection always
// fits in the idle list. The refill pipeline keeps the same rule with its
// own semaphore and idle list, so in use plus idle never exceeds the cap
// on the two together, a burst of callers waits for a slot (no longer
// than its context allows) instead of dialing, and no connection is
// closed just because the idle list was full, so no TIME_WAIT sockets
// pile up on the client.
//
// Parallel work runs only through fanout.Each, under the limit the
// request's guard policy put in its context.
type Cache struct {
	cfg     Config
	servers []*server
	seeds   []uint64
	opts    options
	once    sync.Once
	err     error
}

// ServerStats are the counters of one server since New.
type ServerStats struct {
	// Addr is the server's host:port.
	Addr string
	// Dials counts connections made; OpenConns those made and not yet
	// closed; InUse the connection slots held right now.
	Dials, OpenConns, InUse int64
	// Hits and Misses count keys in gets the server answered. Errors
	// counts calls that failed, Skipped calls not made because the
	// breaker was open or half-open with its probe in flight, refills not
	// made because it was not closed, or calls made after the Cache was
	// closed.
	Hits, Misses, Errors, Skipped int64
	// Waits counts calls that found no free connection and had to wait;
	// WaitExpired those of them, and the single-key reads waiting to be
	// gathered, whose context ended first. Gathered counts single-key
	// reads answered by a get gathered with others (gather).
	Waits, WaitExpired, Gathered int64
	// BreakerState is "closed", "half-open" or "open"; BreakerOpens counts
	// the times it opened (each also closed the idle connections).
	BreakerState string
	BreakerOpens int64
	// RefillWrites counts pipelined refill exchanges: each carried up to
	// refillItemsPerWrite adds in one round trip.
	RefillWrites int64
	// TombstoneWrites counts pipelined tombstone exchanges: each carried
	// up to refillItemsPerWrite of one invalidation's sets on the server,
	// when it had more than one, in one round trip.
	TombstoneWrites int64
	// Suspect reports a server not trusted as a whole since it failed
	// (WithDistrust); OwedTombstones counts the keys whose tombstones it
	// missed and is owed (each read as a miss there); Distrusted counts
	// the hits it answered that were read as misses.
	Suspect        bool
	OwedTombstones int64
	Distrusted     int64
}

// New validates cfg and returns a Cache. It does not dial; connections are
// made on first use.
func New(cfg Config, opts ...Option) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cache{cfg: cfg, seeds: seedsFor(cfg.Servers), opts: defaultOptions()}
	for _, opt := range opts {
		opt(&c.opts)
	}
	for _, addr := range cfg.Servers {
		s := newServer(addr, cfg, c.opts.log)
		if c.opts.distrust {
			s.distrust = newDistrust()
		}
		s.singles = newGather(s, cfg, c.opts.tracer)
		c.servers = append(c.servers, s)
	}
	return c, nil
}

// Answer is the cache's answer for one URI of a Lookup: the entry
// cached for it when Hit.
type Answer struct {
	Entry
	Hit bool
}

// Lookup is GetMulti answered by position, without maps: it sets into[i]
// for each uris[i] the cache holds and leaves the others as they are
// (into must be as long as uris), and returns the number of hits. uris
// should be distinct: a repeated URI is asked for once per position.
func (c *Cache) Lookup(ctx context.Context, uris []string, into []Answer) int {
	if len(uris) == 1 {
		e, ok := c.Get(ctx, uris[0])
		if !ok {
			return 0
		}
		into[0] = Answer{Entry: e, Hit: true}
		return 1
	}
	keys := make([]string, len(uris))
	for i, u := range uris {
		keys[i] = Key(u)
	}
	chunks := c.chunks(keys)
	found := make([]map[string]*memcache.Item, len(chunks))
	sent := time.Now()
	_ = fanout.Each(ctx, len(chunks), func(ctx context.Context, i int) error {
		found[i] = chunks[i].get(ctx, c.opts.tracer)
		return nil
	})
	hits := 0
	for i, items := range found {
		chunks[i].srv.hide(items, sent)
		hits += chunks[i].answer(items, into)
	}
	return hits
}

// GetMulti returns the entries cached for uris, keyed by URI. It returns
// hits only: misses, tombstones, and keys on servers that erred, were
// skipped or had no free connection before ctx ended are absent. It
// never fails.
func (c *Cache) GetMulti(ctx context.Context, uris []string) map[string]Entry {
	into := make([]Answer, len(uris))
	c.Lookup(ctx, uris, into)
	return ByURI(uris, into)
}

// ByURI keys a Lookup's hits by URI.
func ByURI(uris []string, answers []Answer) map[string]Entry {
	out := make(map[string]Entry)
	for i, a := range answers {
		if a.Hit {
			out[uris[i]] = a.Entry
		}
	}
	return out
}

// Get is GetMulti of a single URI, answered without a map: the entry
// cached for uri, and false for a miss (as GetMulti leaves a key out). It
// is one get on the key's server, gathered with other single-key reads
// when the server is busy (gather).
func (c *Cache) Get(ctx context.Context, uri string) (Entry, bool) {
	if ctx.Err() != nil {
		return Entry{}, false // as GetMulti: no call once the caller has gone
	}
	key := Key(uri)
	it := c.owner(key).singles.get(ctx, key)
	if it == nil {
		return Entry{}, false
	}
	return decode(it)
}

// Fill stores entries, keyed by URI, after a store read. It uses ADD, so
// it never replaces an item already there, including a tombstone left by
// a recent write; a refused ADD is normal. A server with a refill
// pipeline (refills) takes its adds in one round trip per
// refillItemsPerWrite items; otherwise each is a call of its own. Values live for TTL, negative
// entries for NegativeTTL. Failures are counted, not returned.
//
// A refill is best effort, so Fill gives up after one Timeout: calls
// still waiting for a connection then are dropped. Without that bound a
// slow or flapping memcached held reads that had their answer already
// (the fault tests saw 2s deadlines pass queued behind refills).
func (c *Cache) Fill(ctx context.Context, entries map[string]Entry) {
	if len(entries) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var oneByOne []*memcache.Item
	pipelined := map[*server][]*memcache.Item{}
	for uri, e := range entries {
		it := c.encode(uri, e)
		srv := c.owner(it.Key)
		switch {
		case !srv.trusts(it.Key):
		case srv.refills != nil:
			pipelined[srv] = append(pipelined[srv], it)
		default:
			oneByOne = append(oneByOne, it)
		}
	}
	c.addEach(ctx, oneByOne)
	c.addPipelined(ctx, pipelined)
}

// addPipelined adds each server's items in pipelined writes of up to
// refillItemsPerWrite items, under the request's fan-out limit.
func (c *Cache) addPipelined(ctx context.Context, byServer map[*server][]*memcache.Item) {
	type write struct {
		srv   *server
		items []*memcache.Item
	}
	var writes []write
	for srv, items := range byServer {
		for _, part := range inWrites(items) {
			writes = append(writes, write{srv: srv, items: part})
		}
	}
	_ = fanout.Each(ctx, len(writes), func(ctx context.Context, i int) error {
		_ = writes[i].srv.addPipelined(ctx, writes[i].items)
		return nil
	})
}

// Invalidate SETs a tombstone for each URI after a write or delete. For
// TombstoneTTL the URI reads as a miss and Fill cannot store it, so a read
// that fetched the old record before the write cannot put it back. It
// returns an error saying how many tombstones were not written, counting
// those skipped by an open breaker; the caller decides whether that
// matters.
func (c *Cache) Invalidate(ctx context.Context, uris []string) error {
	calls := make([]call, 0, len(uris))
	for _, u := range uris {
		calls = append(calls, c.tombstoneCalls(Key(u))...)
	}
	failed, first := failures(calls, c.setTombstones(ctx, calls))
	if failed > 0 {
		return fmt.Errorf("cache: invalidate: %d of %d tombstones not written: %w", failed, len(calls), first)
	}
	return nil
}

// setTombstones writes the tombstones of calls (writeEach) and returns
// each one's error, recording its outcome on its server: one not written
// is owed (see Distrust), one written pays what the key owed before it
// began.
func (c *Cache) setTombstones(ctx context.Context, calls []call) []error {
	start := time.Now()
	errs := c.writeEach(ctx, calls, writeKind{single: setTombstone, pipelined: (*server).setPipelined, alone: true})
	for i, err := range errs {
		calls[i].srv.tombstoned(calls[i].item.Key, start, err)
	}
	return errs
}

// setTombstone sets one tombstone with the gomemcache client. A set
// answered NOT_STORED did not store it, whatever an add so answered
// means (isSuccessful), so it is a refusal, as on the pipeline.
func setTombstone(mc *memcache.Client, it *memcache.Item) error {
	err := mc.Set(it)
	if errors.Is(err, memcache.ErrNotStored) {
		return fmt.Errorf("%w: the set was answered NOT_STORED", errItemRefused)
	}
	return err
}

// writeKind is how writeEach sends one kind of write: single is one
// call of the gomemcache client, pipelined one pipelined write (an error
// per item). With alone, a server given a single call takes it through
// single even when it has a refill pipeline: the client has the most
// connections.
type writeKind struct {
	single    func(*memcache.Client, *memcache.Item) error
	pipelined func(*server, context.Context, []*memcache.Item) []error
	alone     bool
}

// oneByOne reports whether n calls to srv go one gomemcache call each.
func (k writeKind) oneByOne(srv *server, n int) bool {
	return srv.refills == nil || (n == 1 && k.alone)
}

// writeEach makes calls under the request's fan-out limit and returns
// each one's error, nil for success. A server with a refill pipeline
// takes them in pipelined writes of up to refillItemsPerWrite (one round
// trip each), but for a single call when kind.alone; a server without
// one takes them one call each.
func (c *Cache) writeEach(ctx context.Context, calls []call, kind writeKind) []error {
	byServer := map[*server][]int{}
	for i, cl := range calls {
		byServer[cl.srv] = append(byServer[cl.srv], i)
	}
	var writes [][]int // indexes into calls, each a pipelined write or a single call
	for srv, idx := range byServer {
		if kind.oneByOne(srv, len(idx)) {
			for _, i := range idx {
				writes = append(writes, []int{i})
			}
			continue
		}
		writes = append(writes, inWrites(idx)...)
	}
	errs := make([]error, len(calls))
	for i := range errs {
		errs[i] = errNotAttempted
	}
	_ = fanout.Each(ctx, len(writes), func(ctx context.Context, w int) error {
		idx := writes[w]
		srv := calls[idx[0]].srv
		if kind.oneByOne(srv, len(idx)) {
			it := calls[idx[0]].item
			errs[idx[0]] = srv.do(ctx, func(mc *memcache.Client) error { return kind.single(mc, it) })
			return nil
		}
		items := make([]*memcache.Item, len(idx))
		for k, i := range idx {
			items[k] = calls[i].item
		}
		for k, err := range kind.pipelined(srv, ctx, items) {
			errs[idx[k]] = err
		}
		return nil
	})
	for i, err := range errs {
		if isSuccessful(err) {
			errs[i] = nil
		}
	}
	return errs
}

// inWrites splits items into the parts pipelined writes carry, of up to
// refillItemsPerWrite each, in order.
func inWrites[T any](items []T) [][]T {
	var parts [][]T
	for len(items) > 0 {
		n := min(len(items), refillItemsPerWrite)
		parts = append(parts, items[:n])
		items = items[n:]
	}
	return parts
}

// tombstoneCalls are the tombstone writes for key: on its current owner
// and, with WithDistrust, also on its rendezvous first and second choices.
// The second choice holds the key while the first's breaker is open; a
// copy it filled during one outage must not outlive a write made after,
// or the next outage would serve it.
func (c *Cache) tombstoneCalls(key string) []call {
	it := c.tombstone(key)
	owner := c.ownerIndex(key)
	calls := []call{{srv: c.servers[owner], item: it}}
	if !c.opts.distrust || len(c.servers) == 1 {
		return calls
	}
	first := pick(c.seeds, key)
	second := pickLive(c.seeds, key, func(i int) bool { return i != first })
	for _, i := range []int{first, second} {
		if i != owner {
			calls = append(calls, call{srv: c.servers[i], item: it})
			owner = i // a first choice that owns the key is not written twice
		}
	}
	return calls
}

// tombstone is the item Invalidate sets for key.
func (c *Cache) tombstone(key string) *memcache.Item {
	return &memcache.Item{Key: key, Value: []byte{}, Flags: flagTombstone, Expiration: seconds(c.cfg.TombstoneTTL)}
}

// Stats returns the counters of each server, in Config.Servers order.
func (c *Cache) Stats() []ServerStats {
	out := make([]ServerStats, len(c.servers))
	for i, s := range c.servers {
		out[i] = s.stats()
	}
	return out
}

// Close stops new calls, waits for running ones (each bounded by Timeout)
// and closes all connections. Later calls are skipped. Close is
// idempotent.
func (c *Cache) Close() error {
	c.once.Do(func() {
		errs := make([]error, len(c.servers))
		for i, s := range c.servers {
			errs[i] = s.close()
		}
		c.err = errors.Join(errs...)
	})
	return c.err
}

// addEach adds every item with one call per item on the item's current
// owner (refillEach). A key whose add may yet land is owed there
// (refilled).
func (c *Cache) addEach(ctx context.Context, items []*memcache.Item) {
	calls := make([]call, len(items))
	for i, it := range items {
		calls[i] = call{srv: c.owner(it.Key), item: it}
	}
	for i, err := range c.refillEach(ctx, calls) {
		calls[i].srv.refilled(calls[i].item.Key, err)
	}
}

// call is one item's operation on one server.
type call struct {
	srv  *server
	item *memcache.Item
}

// failures counts the calls whose error in errs is not nil, and names
// the first.
func failures(calls []call, errs []error) (int, error) {
	failed, first := 0, error(nil)
	for i, err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = fmt.Errorf("key %s on %s: %w", calls[i].item.Key, calls[i].srv.addr, err)
			}
		}
	}
	return failed, first
}

// refillEach adds each of calls' items under the request's fan-out
// limit, one gomemcache call each, skipping a server whose breaker is not
// closed (server.refill), and returns each one's error, nil for a refused
// ADD.
func (c *Cache) refillEach(ctx context.Context, calls []call) []error {
	errs := make([]error, len(calls))
	for i := range errs {
		errs[i] = errNotAttempted
	}
	_ = fanout.Each(ctx, len(calls), func(ctx context.Context, i int) error {
		srv := calls[i].srv
		errs[i] = srv.refill(ctx, srv.sem, nil, func() error { return refusedItem(srv.client.Add(calls[i].item)) })
		return nil
	})
	for i, err := range errs {
		if isSuccessful(err) {
			errs[i] = nil
		}
	}
	return errs
}

// ownerIndex is the index of the server that holds key now: its
// rendezvous owner, or while that server's breaker is open the next
// server in the key's rendezvous order whose breaker is not. Keys of a
// server that is out thus refill on the others (about 1/n of all keys move),
// and go back to it once its breaker lets a probe through.
func (c *Cache) ownerIndex(key string) int {
	return pickLive(c.seeds, key, func(i int) bool { return !c.servers[i].isOpen() })
}

func (c *Cache) owner(key string) *server { return c.servers[c.ownerIndex(key)] }

// encode builds the item Fill adds for one entry.
func (c *Cache) encode(uri string, e Entry) *memcache.Item {
	if e.Negative {
		return &memcache.Item{Key: Key(uri), Value: []byte{}, Flags: flagNegative, Expiration: seconds(c.cfg.NegativeTTL)}
	}
	return &memcache.Item{Key: Key(uri), Value: e.Value, Flags: flagValue, Expiration: seconds(c.cfg.TTL)}
}

// decode reads an item back; tombstones and unknown flags are misses.
func decode(it *memcache.Item) (Entry, bool) {
	switch it.Flags {
	case flagValue:
		return Entry{Value: it.Value}, true
	case flagNegative:
		return Entry{Negative: true}, true
	}
	return Entry{}, false
}

// chunk is one memcached get: up to MaxKeysPerGet keys on one server,
// and where each key stands in the Lookup that asked for it.
type chunk struct {
	srv  *server
	keys []string
	at   []int // keys[j] answers position at[j]
}

// chunks groups keys (a Lookup's, by position) by server and splits each
// group into gets.
func (c *Cache) chunks(keys []string) []chunk {
	groups := make([]chunk, len(c.servers))
	for pos, key := range keys {
		g := &groups[c.ownerIndex(key)]
		g.keys = append(g.keys, key)
		g.at = append(g.at, pos)
	}
	var out []chunk
	for i, g := range groups {
		for len(g.keys) > 0 {
			n := min(len(g.keys), c.cfg.MaxKeysPerGet)
			out = append(out, chunk{srv: c.servers[i], keys: g.keys[:n], at: g.at[:n]})
			g.keys, g.at = g.keys[n:], g.at[n:]
		}
	}
	return out
}

// answer sets into's positions of the chunk's keys that items holds as
// entries (tombstones and unknown flags are misses), and returns how many.
func (ch chunk) answer(items map[string]*memcache.Item, into []Answer) int {
	if len(items) == 0 {
		return 0
	}
	hits := 0
	for j, key := range ch.keys {
		it, ok := items[key]
		if !ok {
			continue
		}
		if e, ok := decode(it); ok {
			into[ch.at[j]] = Answer{Entry: e, Hit: true}
			hits++
		}
	}
	return hits
}

// getKeys is one memcached get of keys. A single key goes through
// gomemcache's Get, which runs on the caller's goroutine; GetMulti starts
// a goroutine per server and gathers their answers over a channel.
func getKeys(mc *memcache.Client, keys []string) (map[string]*memcache.Item, error) {
	if len(keys) != 1 {
		return mc.GetMulti(keys)
	}
	it, err := mc.Get(keys[0])
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return map[string]*memcache.Item{it.Key: it}, nil
}

// get runs the chunk's get in a span and counts hits and misses. It
// returns nil when the call failed or was not made.
func (ch chunk) get(ctx context.Context, tracer spans.Tracer) map[string]*memcache.Item {
	ctx, span := tracer.Start(ctx, "memcached.GetMulti", trace.SpanKindClient, func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("sluice.memcached.server", ch.srv.addr), attribute.Int("sluice.batch.size", len(ch.keys))}
	})
	defer span.End()
	var items map[string]*memcache.Item
	err := ch.srv.do(ctx, func(mc *memcache.Client) error {
		var err error
		items, err = getKeys(mc, ch.keys)
		return err
	})
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return nil
	}
	hits := 0
	for _, it := range items {
		if it.Flags == flagValue || it.Flags == flagNegative {
			hits++
		}
	}
	ch.srv.hits.Add(int64(hits))
	ch.srv.misses.Add(int64(len(ch.keys) - hits))
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("sluice.cache.hits", hits))
	}
	return items
}
