// Package posts is the read-through path for records: it validates
// AT-URIs, de-duplicates a batch, answers what it can from the cache,
// reads the rest from the store (in one batch read when the store has
// them, otherwise one read per URI; either way coalesced across
// concurrent requests), refills the cache, and returns the records aligned
// with the request. Writes go to the store first and then invalidate the
// cache, so a read after a successful write never sees the old version.
//
// A cache that fails is skipped, never fatal: its errors are misses. A
// store that fails fails the request, whole (one error for the batch, not
// a per-item status), because a partial answer would look like "not
// found". All parallel work runs through package fanout, so it is bounded
// by the method's policy; a batch read is one call. Posts does not know
// about gRPC; the rpc package maps its errors to status codes.
package posts

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/identity"
	"github.com/sluice-dev/sluice/internal/store"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Cache is what the read path needs of a cache; *cache.Cache has it.
type Cache interface {
	Lookup(ctx context.Context, uris []string, into []cache.Answer) int
	Get(ctx context.Context, uri string) (cache.Entry, bool) // Lookup of one URI
	Fill(ctx context.Context, entries map[string]cache.Entry)
	Invalidate(ctx context.Context, uris []string) error
}

// Result is the answer for one requested URI.
type Result struct {
	Record    store.Record // URI is always set; the rest only when Found and Wire is nil
	Found     bool
	FromCache bool
	// Wire is the record's sluice.v1.PostRecord encoding as the cache
	// holds it: checked well-formed and naming this URI (checkWire) for a
	// record found in the cache, in which case Record holds only the URI;
	// the encoding the cache was refilled with for a record read from the
	// store. Only GetEncoded sets it. Callers must not modify it.
	Wire []byte
}

// Counts summarises where a batch's answers came from. Invalid counts
// items answered as missing because their URI cannot name a stored record
// (set by services that answer such URIs instead of refusing them).
type Counts struct {
	FromCache, FromStore, NotFound, Invalid int
}

// Service reads and writes records of one collection through the cache.
type Service struct {
	collection string
	cache      Cache
	store      store.Store
	loads      singleflight.Group
	flights    flights
	limits     WriteLimits
	opts       options

	invalidationFailures atomic.Int64
	coalesced            atomic.Int64
	// slots orders this Service's writes of a URI, by hash slot
	// (writeSlot).
	slots [writeSlots]writeSlot
	seed  maphash.Seed
}

// writeSlots is the number of slots URIs are hashed onto for writes.
const writeSlots = 4096

// writeSlot is the write state of the URIs of one hash slot.
//   - A read-modify-write (Update, Upsert) takes lock alone and other
//     writes share it (whole-record Put and Delete need no order among
//     themselves), so a read-modify-write never writes back a record
//     another write changed after it was read.
//   - writes counts the writes that let the slot go: a read that began
//     after a write was acknowledged never takes the answer of a shared
//     store read that began before it (load).
type writeSlot struct {
	lock   sync.RWMutex
	writes atomic.Uint64
}

// WriteLimits bounds what the write path accepts.
type WriteLimits struct {
	// MaxRecordBytes is the largest record JSON accepted.
	MaxRecordBytes int
}

// DefaultWriteLimits returns the limits used when none are given.
func DefaultWriteLimits() WriteLimits { return WriteLimits{MaxRecordBytes: 64 << 10} }

// New returns a Service for records of collection (an NSID such as
// app.bsky.feed.post). It panics if collection is not a valid NSID: the
// read path checks URIs against it with aturi.ParseIn, which takes it as
// valid.
func New(collection string, c Cache, s store.Store, limits WriteLimits, opts ...Option) *Service {
	if err := aturi.CheckCollection(collection); err != nil {
		panic(fmt.Sprintf("posts: collection %q: %v", collection, err))
	}
	if limits.MaxRecordBytes <= 0 {
		limits = DefaultWriteLimits()
	}
	svc := &Service{collection: collection, cache: c, store: s, limits: limits, opts: defaultOptions(), seed: maphash.MakeSeed(), flights: flights{m: make(map[string]*flight)}}
	for _, opt := range opts {
		opt(&svc.opts)
	}
	// The count starts at zero, so its series exists before the first
	// refusal and an alert on its increase sees that one.
	svc.opts.refused(collection, 0)
	return svc
}

// Collection is the NSID of the records this Service serves.
func (s *Service) Collection() string { return s.collection }

// InvalidationFailures counts writes whose cache invalidation failed.
func (s *Service) InvalidationFailures() int64 { return s.invalidationFailures.Load() }

// Coalesced counts store reads saved because a concurrent request was
// already reading the same URI.
func (s *Service) Coalesced() int64 { return s.coalesced.Load() }

// Get returns one Result per URI, in order; duplicates are answered at
// each position. It fails with an *InvalidURIError before any I/O if a URI
// is not a record AT-URI of the collection, and with an error wrapping
// store.ErrUnavailable if the store fails for any URI the cache lacks.
func (s *Service) Get(ctx context.Context, uris []string) ([]Result, Counts, error) {
	answers, counts, err := s.get(ctx, uris, false)
	if err != nil {
		return nil, Counts{}, err
	}
	out := answers.inOrder()
	for i := range out {
		if out[i].Wire == nil {
			continue
		}
		var pr sluicev1.PostRecord
		if err := proto.Unmarshal(out[i].Wire, &pr); err != nil {
			// checkWire accepted these bytes, so this cannot happen.
			return nil, Counts{}, fmt.Errorf("posts: decode cached %s: %w", out[i].Record.URI, err)
		}
		out[i].Record, out[i].Wire = FromProto(&pr), nil
	}
	return out, counts, nil
}

// GetEncoded is Get, except that a record found in the cache is returned
// in the encoding the cache holds (Result.Wire), not decoded, and a record
// read from the store with the encoding it was refilled with: a server
// can copy those bytes into its response as they are. A URI asked more
// than once has one Result, shared by its positions (Answers.At).
func (s *Service) GetEncoded(ctx context.Context, uris []string) (Answers, Counts, error) {
	return s.get(ctx, uris, true)
}

// get is Get, with store reads' encodings kept (Result.Wire) when encoded
// is set.
func (s *Service) get(ctx context.Context, uris []string, encoded bool) (Answers, Counts, error) {
	if err := s.validate(uris); err != nil {
		return Answers{}, Counts{}, err
	}
	unique, at := positions(uris)
	found, counts, err := s.read(ctx, unique, encoded)
	if err != nil {
		return Answers{}, Counts{}, err
	}
	return Answers{unique: found, at: at}, counts, nil
}

// Answers are a read's Results in request order: one per distinct URI,
// shared by every position that asks for it.
type Answers struct {
	unique []Result
	at     []int // request position → index in unique; nil when no URI repeats
}

// Len is the number of URIs asked.
func (a Answers) Len() int {
	if a.at == nil {
		return len(a.unique)
	}
	return len(a.at)
}

// At is the Result for the i-th URI asked. Callers must not modify it.
func (a Answers) At(i int) *Result {
	if a.at == nil {
		return &a.unique[i]
	}
	return &a.unique[a.at[i]]
}

// inOrder is one Result per URI asked, each position its own copy.
func (a Answers) inOrder() []Result {
	if a.at == nil {
		return a.unique
	}
	out := make([]Result, len(a.at))
	for i, j := range a.at {
		out[i] = a.unique[j]
	}
	return out
}

func (s *Service) validate(uris []string) error {
	for i, uri := range uris {
		if _, err := aturi.ParseIn(uri, s.collection); err != nil {
			return &InvalidURIError{Index: i, URI: uri, Err: err}
		}
	}
	return nil
}

// read answers each unique URI from the cache or the store, in a span;
// the answers are aligned with uris. With encoded, a record read from the
// store keeps the encoding the cache is refilled with (Result.Wire).
func (s *Service) read(ctx context.Context, uris []string, encoded bool) ([]Result, Counts, error) {
	ctx, span := s.opts.tracer.Start(ctx, "posts.Get", trace.SpanKindInternal, func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("sluice.client", identity.Client(ctx)), attribute.Int("sluice.batch.size", len(uris))}
	})
	defer span.End()
	results := make([]Result, len(uris))
	var misses, refused []string
	var missAt []int // misses[k] is uris[missAt[k]]
	cached := s.cached(ctx, uris)
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("sluice.cache.hits", cached.hits))
	}
	for i, uri := range uris {
		if e, ok := cached.entry(i); ok {
			if r, ok := decodeEntry(uri, e); ok {
				results[i] = r
				continue
			}
			refused = append(refused, uri)
		}
		misses = append(misses, uri)
		missAt = append(missAt, i)
	}
	// Refused values are tombstoned first, so that a store read that
	// fails still leaves them counted and on their way out.
	s.discard(ctx, refused)
	loaded, err := s.loadAll(ctx, misses)
	if err != nil {
		span.SetStatus(otelcodes.Error, err.Error())
		return nil, Counts{}, err
	}
	if len(misses) == 0 {
		return results, count(results), nil
	}
	fills := make(map[string]cache.Entry, len(loaded))
	for k, uri := range misses {
		e := encodeEntry(loaded[k])
		if encoded && loaded[k].Found {
			loaded[k].Wire = e.Value
		}
		results[missAt[k]] = loaded[k]
		fills[uri] = e
	}
	s.cache.Fill(ctx, fills)
	return results, count(results), nil
}

// loadAll reads misses from the store, in a span: in one batch read when
// the store has them (store.BatchReader), otherwise one read per URI
// under the request's fan-out limit; either way coalesced with the reads
// of concurrent requests (load, loadShared). A failure other than the caller
// leaving is logged. Store reads end a little before the request does
// (storeContext): a store that hangs is then reported as unavailable while
// the caller is still waiting for an answer, instead of the caller's
// deadline passing with no word of why.
func (s *Service) loadAll(ctx context.Context, uris []string) ([]Result, error) {
	if len(uris) == 0 {
		return nil, nil
	}
	ctx, span := s.opts.tracer.Start(ctx, "store.read", trace.SpanKindInternal, func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.Int("sluice.batch.size", len(uris))}
	})
	defer span.End()
	reqCtx := ctx
	ctx, cancel := storeContext(ctx)
	defer cancel()
	read := s.loadEach
	if br, ok := s.store.(store.BatchReader); ok {
		read = func(ctx context.Context, uris []string) ([]Result, int, error) { return s.loadShared(ctx, br, uris) }
	}
	out, failed, err := read(ctx, uris)
	if err != nil {
		span.SetAttributes(attribute.Int("sluice.store.failed", failed))
		span.SetStatus(otelcodes.Error, err.Error())
		if errors.Is(err, context.DeadlineExceeded) && reqCtx.Err() == nil {
			err = fmt.Errorf("%w: no answer before the request's deadline (%v)", store.ErrUnavailable, err)
		}
		if !isContextErr(err) || errors.Is(err, store.ErrUnavailable) {
			s.opts.log.Error("store read failed", "component", "store", "kind", "read", "uris", len(uris), "failed", failed, "err", err)
		}
		return nil, fmt.Errorf("posts: read %d uris from the store: %w", len(uris), err)
	}
	found := 0
	for _, r := range out {
		if r.Found {
			found++
		}
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("sluice.store.found", found))
	}
	return out, nil
}

// loadEach reads each URI on its own, under the request's fan-out limit,
// and reports how many reads failed and the first failure.
func (s *Service) loadEach(ctx context.Context, uris []string) ([]Result, int, error) {
	out := make([]Result, len(uris))
	var failed atomic.Int64
	var firstErr atomic.Pointer[error]
	err := fanout.Each(ctx, len(uris), func(ctx context.Context, i int) error {
		r, err := s.load(ctx, uris[i])
		if err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, &err)
			return err
		}
		out[i] = r
		return nil
	})
	if err != nil {
		if p := firstErr.Load(); p != nil {
			err = *p
		}
		return nil, int(failed.Load()), err
	}
	return out, 0, nil
}

// loadBatch reads every URI in one batch read.
func loadBatch(ctx context.Context, br store.BatchReader, uris []string) ([]Result, int, error) {
	recs, err := br.GetMany(ctx, uris)
	if err != nil {
		return nil, len(uris), err
	}
	out := make([]Result, len(uris))
	for i, uri := range uris {
		if r, ok := recs[uri]; ok {
			out[i] = Result{Record: r, Found: true}
		} else {
			out[i] = Result{Record: store.Record{URI: uri}}
		}
	}
	return out, 0, nil
}

// storeContext ends a fifth of the time left before ctx's deadline, and
// at most 500ms before it: time enough to turn the store's silence into
// an answer and send it, even on a busy machine, before the caller (whose
// deadline started earlier) gives up. Under the race detector with a
// CPU hog on the other core, that took up to 75 ms after the store read
// gave up; with 250 ms, such an answer had 175 ms to spare.
func storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	margin := min(time.Until(deadline)/5, 500*time.Millisecond)
	return context.WithDeadline(ctx, deadline.Add(-margin))
}

// load reads one URI from the store, sharing the read with concurrent
// requests for the same URI. It reads again on its own if the shared
// read began before a write of the URI that was acknowledged before this
// read began (a read after a write never sees the old record), or if the
// request that led the shared read gave up (its context ended) while
// this one still has time.
func (s *Service) load(ctx context.Context, uri string) (Result, error) {
	before := s.slotOf(uri).writes.Load()
	v, err, shared := s.loads.Do(uri, func() (any, error) {
		r, err := s.storeGet(ctx, uri)
		return sharedRead{r, before}, err
	})
	if shared {
		s.coalesced.Add(1)
		if v.(sharedRead).writes != before || (err != nil && isContextErr(err) && ctx.Err() == nil) {
			return s.storeGet(ctx, uri)
		}
	}
	if err != nil {
		return Result{}, err
	}
	return v.(sharedRead).Result, nil
}

// sharedRead is a store read's answer and the URI's write count when
// the read began.
type sharedRead struct {
	Result
	writes uint64
}

func (s *Service) slotOf(uri string) *writeSlot { return &s.slots[s.slotIndex(uri)] }

func (s *Service) slotIndex(uri string) uint64 { return maphash.String(s.seed, uri) % writeSlots }

// shareSlots takes the slots of uris, shared and in slot order, for a
// write of whole records; the function it returns counts the write and
// lets them go, once the store has answered and before the write is.
func (s *Service) shareSlots(uris []string) (wrote func()) {
	return s.takeSlots(uris, (*sync.RWMutex).RLock, (*sync.RWMutex).RUnlock)
}

// ownSlots takes the slots of uris alone, in slot order (as shareSlots
// takes them, so the two never wait for each other in a cycle), for a
// read-modify-write of many records; the function it returns counts the
// write and lets them go.
func (s *Service) ownSlots(uris []string) (wrote func()) {
	return s.takeSlots(uris, (*sync.RWMutex).Lock, (*sync.RWMutex).Unlock)
}

// takeSlots locks the distinct slots of uris in slot order with lock; the
// function it returns counts a write on each and unlocks it.
func (s *Service) takeSlots(uris []string, lock, unlock func(*sync.RWMutex)) (wrote func()) {
	at := make([]uint64, len(uris))
	for i, u := range uris {
		at[i] = s.slotIndex(u)
	}
	slices.Sort(at)
	at = slices.Compact(at)
	for _, i := range at {
		lock(&s.slots[i].lock)
	}
	return func() {
		for _, i := range at {
			s.slots[i].writes.Add(1)
			unlock(&s.slots[i].lock)
		}
	}
}

// ownSlot takes uri's slot alone, for a read-modify-write; the function
// it returns counts the write and lets the slot go.
func (s *Service) ownSlot(uri string) (wrote func()) {
	w := s.slotOf(uri)
	w.lock.Lock()
	return func() {
		w.writes.Add(1)
		w.lock.Unlock()
	}
}

func (s *Service) storeGet(ctx context.Context, uri string) (Result, error) {
	rec, err := s.store.Get(ctx, uri)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return Result{Record: store.Record{URI: uri}}, nil
	case err != nil:
		return Result{}, err
	}
	return Result{Record: rec, Found: true}, nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// positions returns the distinct URIs of uris in first-seen order and,
// when some URI repeats, where each of uris is in that list (nil when
// none does, so the list is uris itself).
func positions(uris []string) (unique []string, at []int) {
	if len(uris) < 2 {
		return uris, nil
	}
	first := make(map[string]int, len(uris))
	for i, uri := range uris {
		if _, ok := first[uri]; ok {
			return positionsWithRepeats(uris, first, i)
		}
		first[uri] = i
	}
	return uris, nil
}

// positionsWithRepeats finishes positions for uris whose URIs up to
// repeat (the first repeated one) are in first, by their index.
func positionsWithRepeats(uris []string, first map[string]int, repeat int) ([]string, []int) {
	unique := append(make([]string, 0, len(uris)), uris[:repeat]...)
	at := make([]int, len(uris))
	for i := range repeat {
		at[i] = i
	}
	for i := repeat; i < len(uris); i++ {
		j, ok := first[uris[i]]
		if !ok {
			j = len(unique)
			first[uris[i]] = j
			unique = append(unique, uris[i])
		}
		at[i] = j
	}
	return unique, at
}

func count(results []Result) Counts {
	var c Counts
	for _, r := range results {
		switch {
		case !r.Found:
			c.NotFound++
		case r.FromCache:
			c.FromCache++
		default:
			c.FromStore++
		}
	}
	return c
}

// cacheAnswer is the cache's answer to a read, by position: a Lookup's
// for a batch, or the one entry of a single URI (Cache.Get).
type cacheAnswer struct {
	batch []cache.Answer
	one   cache.Answer
	hits  int
}

// cached asks the cache for uris.
func (s *Service) cached(ctx context.Context, uris []string) cacheAnswer {
	if len(uris) == 1 {
		e, ok := s.cache.Get(ctx, uris[0])
		if !ok {
			return cacheAnswer{}
		}
		return cacheAnswer{one: cache.Answer{Entry: e, Hit: true}, hits: 1}
	}
	batch := make([]cache.Answer, len(uris))
	return cacheAnswer{batch: batch, hits: s.cache.Lookup(ctx, uris, batch)}
}

// entry is the cache's entry for the i-th URI asked.
func (a cacheAnswer) entry(i int) (cache.Entry, bool) {
	if a.batch == nil {
		return a.one.Entry, a.one.Hit
	}
	return a.batch[i].Entry, a.batch[i].Hit
}

// discard replaces cached values the read refused with tombstones, as a
// write does, so that the refill after the tombstone's TTL stores the
// record read from the store: a refill is an ADD, which a value already
// there refuses, so a refused value would otherwise send every read of
// its URI to the store until it expired (the cache's TTL). A tombstone
// only ever turns a hit into a miss, so writing one cannot put a stale
// record back. It counts and logs them: a refused value is a value this
// build cannot serve, written by something else or damaged.
func (s *Service) discard(ctx context.Context, uris []string) {
	if len(uris) == 0 {
		return
	}
	s.opts.refused(s.collection, len(uris))
	err := s.cache.Invalidate(ctx, uris)
	s.opts.log.WarnContext(ctx, "cached values refused: malformed or naming another URI; read from the store and tombstoned",
		"component", "cache", "kind", "refused", "collection", s.collection, "count", len(uris), "first", uris[0], "tombstone_error", err)
}

// decodeEntry turns a cache hit into a Result carrying the cached
// encoding; a value checkWire refuses is treated as a miss.
func decodeEntry(uri string, e cache.Entry) (Result, bool) {
	if e.Negative {
		return Result{Record: store.Record{URI: uri}, FromCache: true}, true
	}
	if !e.Checked && !checkWire(uri, e.Value) {
		return Result{}, false
	}
	return Result{Record: store.Record{URI: uri}, Found: true, FromCache: true, Wire: e.Value}, true
}

// CheckEntry reports whether e is an entry the read path answers uri
// with as it is: a negative entry, or a record encoding checkWire
// accepts. A near cache given it (nearcache.WithCheck) keeps only such
// entries, and the read path does not check them again.
func CheckEntry(uri string, e cache.Entry) bool {
	return e.Negative || checkWire(uri, e.Value)
}

// encodeEntry is the cache's form of a store answer: the protobuf-encoded
// record, or a negative entry.
func encodeEntry(r Result) cache.Entry {
	if !r.Found {
		return cache.Entry{Negative: true}
	}
	b, _ := proto.Marshal(ToProto(r.Record, true))
	return cache.Entry{Value: b}
}

// ToProto converts a stored record to its wire form.
func ToProto(r store.Record, found bool) *sluicev1.PostRecord {
	pr := &sluicev1.PostRecord{Uri: r.URI, Found: found}
	if !found {
		return pr
	}
	pr.Cid = r.CID
	pr.Record = r.JSON
	pr.CreatedAt = timestamp(r.CreatedAt)
	pr.IndexedAt = timestamp(r.IndexedAt)
	pr.TakedownRef = r.TakedownRef
	pr.Tags = r.Tags
	if r.Gates != (store.Gates{}) {
		pr.Gates = &sluicev1.PostGates{
			HasThreadGate:          r.Gates.HasThreadGate,
			HasPostGate:            r.Gates.HasPostGate,
			ViolatesThreadGate:     r.Gates.ViolatesThreadGate,
			ViolatesEmbeddingRules: r.Gates.ViolatesEmbeddingRules,
		}
	}
	return pr
}

// FromProto converts a wire record to its stored form.
func FromProto(pr *sluicev1.PostRecord) store.Record {
	return store.Record{
		URI:       pr.GetUri(),
		CID:       pr.GetCid(),
		JSON:      pr.GetRecord(),
		CreatedAt: asTime(pr.GetCreatedAt()),
		IndexedAt: asTime(pr.GetIndexedAt()),

		TakedownRef: pr.GetTakedownRef(),
		Tags:        pr.GetTags(),
		Gates: store.Gates{
			HasThreadGate:          pr.GetGates().GetHasThreadGate(),
			HasPostGate:            pr.GetGates().GetHasPostGate(),
			ViolatesThreadGate:     pr.GetGates().GetViolatesThreadGate(),
			ViolatesEmbeddingRules: pr.GetGates().GetViolatesEmbeddingRules(),
		},
	}
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func asTime(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}
