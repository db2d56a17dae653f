// Package cqlstore is the store.Store on Scylla or Apache Cassandra, for
// sluice replicas that share one replicated cluster.
//
// It is written against the v1 API of github.com/gocql/gocql, so Scylla's
// shard-aware fork drops in with one line in go.mod:
//
//	replace github.com/gocql/gocql => github.com/scylladb/gocql v1.19.0
//
// Records live in one table keyed by URI, one partition per record. Get
// is a token-routed single-partition SELECT. GetMany (store.BatchReader)
// reads a batch in groups of Config.ReadGroup partitions, one
// SELECT ... WHERE uri IN ? per group, as many groups at once as the
// caller's fan-out limit allows (the posts read path runs them under the
// guard's). A node answers one such query for far less CPU than the
// same partitions asked one query each: on one Cassandra 5.0 node, groups
// of 20 read about 2.5 times as many records a second as single-partition
// SELECTs at the same concurrency (docs/benchmarks.md).
// A group holds only URIs whose primary replica in the local datacenter
// is the same node, and is sent to that node first, so every partition
// of it is on its coordinator (groups.go); a group fails or succeeds as
// one query (with the same retries and speculative attempt).
// ReadGroup 1 restores one token-routed SELECT per URI. On top of that,
// every query in the process (a group is one) takes one of
// Config.MaxInflight slots first, waiting no longer than its context, so
// many requests at once cannot multiply the load on the cluster: at most
// MaxInflight queries of at most ReadGroup partitions.
//
// Reads and writes use separate long-lived sessions at their own
// consistency (LOCAL_ONE and LOCAL_QUORUM by default), both routed by
// TokenAwareHostPolicy(DCAwareRoundRobinPolicy(dc)) with the replicas
// shuffled, except group reads, which try the primary replica first
// (groups.go). Statements are
// constants, prepared by the driver once per host. Every statement is
// idempotent — writes carry one client timestamp chosen before the first
// attempt — so each gets a bounded exponential-backoff retry policy.
// Transport and server failures wrap store.ErrUnavailable; a context that
// ends returns its own error.
//
// The package does not create its schema on Open: Migrate (sluice migrate)
// does, and Open refuses a keyspace whose schema version it does not
// read. Put is not atomic across records: it validates the whole batch
// first (an invalid record stores nothing), then writes each record as its
// own single-partition INSERT, so a failure part-way leaves the earlier
// records written; retrying the batch is safe.
package cqlstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gocql/gocql"
	"golang.org/x/sync/semaphore"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/store"
)

// Limits on what Put accepts.
const (
	MaxURILength   = 512
	MaxRecordBytes = 64 << 10
)

// The statements, constant so the driver prepares each once per host. In
// each the partition key is bound, so the token-aware policy can route,
// but in selectRecords, whose group the store routes by its first URI
// (Query.RoutingKey).
const (
	selectRecord  = `SELECT cid, json, created_at_us, indexed_at_us, takedown_ref, tags, gate_flags FROM records WHERE uri = ?`
	selectRecords = `SELECT uri, cid, json, created_at_us, indexed_at_us, takedown_ref, tags, gate_flags FROM records WHERE uri IN ?`
	selectExists  = `SELECT uri FROM records WHERE uri = ?`
	insertRecord  = `INSERT INTO records (uri, cid, json, created_at_us, indexed_at_us, takedown_ref, tags, gate_flags) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	deleteRecord  = `DELETE FROM records WHERE uri = ?`
	insertChange  = `INSERT INTO journal (bucket, at_us, uri, origin) VALUES (?, ?, ?, ?) USING TTL ?`
	selectChange  = `SELECT at_us, uri, origin FROM journal WHERE bucket = ? AND at_us >= ? AND at_us < ?`
)

// Store is a store.Store on a CQL cluster. It is safe for concurrent use.
type Store struct {
	cfg      Config
	sessions atomic.Pointer[sessionPair]
	healer   healer
	slots    *semaphore.Weighted
	inflight atomic.Int64
	waits    atomic.Int64
	retry    gocql.RetryPolicy
	hosts    hostTracker
	lastTS   atomic.Int64 // the last write timestamp given (timestamp)
}

var (
	_ store.Store       = (*Store)(nil)
	_ store.Journal     = (*Store)(nil)
	_ store.BatchReader = (*Store)(nil)
)

// Open connects the read and write sessions and checks the schema. It
// fails if no host answers, or if the keyspace lacks the schema this build
// reads (run Migrate first).
func Open(ctx context.Context, cfg Config) (*Store, error) {
	s, err := open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cqlstore: open keyspace %s on %v: %w", cfg.Keyspace, cfg.Hosts, err)
	}
	return s, nil
}

func open(ctx context.Context, cfg Config) (*Store, error) {
	if !cfg.Enabled() {
		return nil, errors.New("no hosts configured")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rc, _ := parseConsistency(cfg.ReadConsistency)
	wc, _ := parseConsistency(cfg.WriteConsistency)
	s := &Store{
		cfg:   cfg,
		slots: semaphore.NewWeighted(int64(cfg.MaxInflight)),
		retry: &gocql.ExponentialBackoffRetryPolicy{NumRetries: cfg.Retries, Min: 10 * time.Millisecond, Max: 200 * time.Millisecond},
	}
	s.healer.open = func() (*sessionPair, error) { return openSessions(cfg, rc, wc, &s.hosts) }
	pair, err := s.healer.open()
	if err != nil {
		return nil, err
	}
	s.sessions.Store(pair)
	if err := checkSchema(ctx, pair.read, cfg.Keyspace); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// sessionPair is the read and the write session, replaced together,
// with their own view of which nodes are up.
type sessionPair struct {
	read, write *gocql.Session
	hosts       *hostStates
	order       gocql.HostSelectionPolicy // the read session's primary-first policy (groups.go)
}

// sessionOf is what one session reports to: the store's query counts
// and its pair's host view (both nil for a session nobody reads the
// figures of, such as a schema change's), under its role.
type sessionOf struct {
	counts *hostTracker
	view   *hostStates
	role   Session
	order  gocql.HostSelectionPolicy // picks a batch read's group's nodes; nil for none
}

// openSessions connects a read session at rc and a write session at wc.
func openSessions(cfg Config, rc, wc gocql.Consistency, counts *hostTracker) (*sessionPair, error) {
	view, order := &hostStates{}, newPrimaryFirst(cfg.DC)
	read, err := openSession(cfg, rc, sessionOf{counts, view, ReadSession, order})
	if err != nil {
		return nil, err
	}
	write, err := openSession(cfg, wc, sessionOf{counts, view, WriteSession, nil})
	if err != nil {
		read.Close()
		return nil, err
	}
	return &sessionPair{read: read, write: write, hosts: view, order: order}, nil
}

func (p *sessionPair) close() {
	p.read.Close()
	p.write.Close()
}

func (s *Store) read() *gocql.Session { return s.sessions.Load().read }

// readFor is the session a read under ctx goes to: the write session,
// at the write consistency, for the reads of a write (store.ForWrite),
// so that a read-modify-write never writes back a replica's older copy;
// the read session otherwise.
func (s *Store) readFor(ctx context.Context) *gocql.Session {
	if store.IsForWrite(ctx) {
		return s.write()
	}
	return s.read()
}
func (s *Store) write() *gocql.Session { return s.sessions.Load().write }

// openSession connects one session at consistency cl, reporting to of.
func openSession(cfg Config, cl gocql.Consistency, of sessionOf) (*gocql.Session, error) {
	s, err := cfg.cluster(cl, of).CreateSession()
	if err != nil {
		hint := ""
		if cfg.Keyspace != "" {
			hint = fmt.Sprintf(" (does keyspace %s exist? sluice migrate creates it)", cfg.Keyspace)
		}
		return nil, fmt.Errorf("%w: connect at %s%s: %w", store.ErrUnavailable, cl, hint, err)
	}
	return s, nil
}

// Get reads one record with a single-partition SELECT at the read
// consistency (the write consistency under store.ForWrite), or returns
// an error wrapping store.ErrNotFound.
func (s *Store) Get(ctx context.Context, uri string) (store.Record, error) {
	r, err := s.get(ctx, uri)
	if err != nil {
		return store.Record{}, fmt.Errorf("cqlstore: get %s: %w", short(uri), err)
	}
	return r, nil
}

func (s *Store) get(ctx context.Context, uri string) (store.Record, error) {
	release, err := s.acquire(ctx)
	if err != nil {
		return store.Record{}, err
	}
	defer release()
	row := recordRow{r: store.Record{URI: uri}}
	err = s.run(func() error {
		return s.idempotent(s.readFor(ctx).Query(selectRecord, uri), ctx).Scan(row.columns()[1:]...)
	})
	switch {
	case errors.Is(err, gocql.ErrNotFound):
		return store.Record{}, store.ErrNotFound
	case err != nil:
		return store.Record{}, queryError(ctx, "select", err)
	}
	return row.record(), nil
}

// GetMany implements store.BatchReader: it reads uris (each once) in
// groups of at most Config.ReadGroup that share a primary replica, one
// SELECT ... WHERE uri IN ? per group sent to that replica first, as
// many groups at once as ctx's fan-out limit allows, each in one query
// slot. A group of one URI is a Get. A group that fails fails the whole
// read.
func (s *Store) GetMany(ctx context.Context, uris []string) (map[string]store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cqlstore: get %d records: %w", len(uris), err)
	}
	uris = uniq(uris)
	groups := s.readGroups(uris)
	found := make([][]store.Record, len(groups))
	err := fanout.Each(ctx, len(groups), func(ctx context.Context, g int) (err error) {
		found[g], err = s.getGroup(ctx, groups[g])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cqlstore: get %d records: %w", len(uris), err)
	}
	out := make(map[string]store.Record, len(uris))
	for _, recs := range found {
		for _, r := range recs {
			out[r.URI] = r
		}
	}
	return out, nil
}

// getGroup reads the records of uris that exist, with one SELECT (or a
// Get, for one URI).
func (s *Store) getGroup(ctx context.Context, uris []string) ([]store.Record, error) {
	if len(uris) == 1 {
		r, err := s.get(ctx, uris[0])
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("get %s: %w", short(uris[0]), err)
		}
		return []store.Record{r}, nil
	}
	release, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	var recs []store.Record
	err = s.run(func() error {
		recs = recs[:0]
		q := s.idempotent(s.readFor(ctx).Query(selectRecords, uris), ctx).RoutingKey([]byte(uris[0]))
		it := q.Iter()
		for row := (recordRow{}); it.Scan(row.columns()...); row = (recordRow{}) {
			recs = append(recs, row.record())
		}
		return it.Close()
	})
	if err != nil {
		return nil, queryError(ctx, fmt.Sprintf("select %d records", len(uris)), err)
	}
	return recs, nil
}

// recordRow is one row of the records table as the driver scans it.
type recordRow struct {
	r                store.Record
	created, indexed int64
	flags            int
}

// columns are the scan destinations of the columns selectRecords names,
// in order (selectRecord names all but the first, uri).
func (w *recordRow) columns() []any {
	return []any{&w.r.URI, &w.r.CID, &w.r.JSON, &w.created, &w.indexed, &w.r.TakedownRef, &w.r.Tags, &w.flags}
}

// record is the scanned row as a store.Record.
func (w *recordRow) record() store.Record {
	r := w.r
	if r.JSON == nil {
		r.JSON = []byte{}
	}
	r.CreatedAt, r.IndexedAt = time.UnixMicro(w.created).UTC(), time.UnixMicro(w.indexed).UTC()
	r.Gates = gatesOf(w.flags)
	if len(r.Tags) == 0 {
		r.Tags = nil
	}
	return r
}

// Put validates every record, then upserts each with a single-partition
// INSERT at the write consistency, running as many at once as ctx's
// fan-out limit allows. All INSERTs of one Put carry the same client
// timestamp; within recs, the last record for a URI wins. If any record
// is invalid, Put returns an error wrapping store.ErrInvalid and writes
// nothing; if a write fails, records already written stay written.
func (s *Store) Put(ctx context.Context, recs []store.Record) error {
	if err := s.put(ctx, recs); err != nil {
		return fmt.Errorf("cqlstore: put %d records: %w", len(recs), err)
	}
	return nil
}

func (s *Store) put(ctx context.Context, recs []store.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, r := range recs {
		if err := validate(r); err != nil {
			return fmt.Errorf("record %d %s: %w", i, short(r.URI), err)
		}
	}
	recs = lastPerURI(recs)
	ts := s.timestamp()
	return fanout.Each(ctx, len(recs), func(ctx context.Context, i int) error {
		r := recs[i]
		c := withChange(ts, r.URI, insertRecord, r.URI, r.CID, r.JSON, r.CreatedAt.UnixMicro(), r.IndexedAt.UnixMicro(), r.TakedownRef, r.Tags, gateFlags(r.Gates))
		return s.writeChange(ctx, c, "insert "+short(r.URI))
	})
}

// timestamp is the client timestamp of a write: the wall clock in
// microseconds, but always later than the last one this store gave. Cassandra
// keeps the cell with the highest timestamp, so a write acknowledged
// after another through this process wins over it even if the clock
// steps back (an NTP step, a resumed VM), and two writes of one record
// never tie (a tie is settled cell by cell, which could mix two writes'
// fields). Writes through other processes are ordered by their clocks.
func (s *Store) timestamp() int64 {
	for {
		last := s.lastTS.Load()
		ts := max(time.Now().UnixMicro(), last+1)
		if s.lastTS.CompareAndSwap(last, ts) {
			return ts
		}
	}
}

// lastPerURI drops all but the last record of each URI, so that INSERTs
// sharing one timestamp cannot race.
func lastPerURI(recs []store.Record) []store.Record {
	last := make(map[string]int, len(recs))
	for i, r := range recs {
		last[r.URI] = i
	}
	if len(last) == len(recs) {
		return recs
	}
	out := make([]store.Record, 0, len(last))
	for i, r := range recs {
		if last[r.URI] == i {
			out = append(out, r)
		}
	}
	return out
}

// validate reports why r cannot be stored, wrapping store.ErrInvalid.
func validate(r store.Record) error { return store.Check(r, MaxURILength, MaxRecordBytes) }

// gateFlags packs a post's gate state into the gate_flags column: bit 0
// HasThreadGate, 1 HasPostGate, 2 ViolatesThreadGate, 3
// ViolatesEmbeddingRules. A row written before the column existed reads
// as zero.
func gateFlags(g store.Gates) int {
	f := 0
	for i, set := range []bool{g.HasThreadGate, g.HasPostGate, g.ViolatesThreadGate, g.ViolatesEmbeddingRules} {
		if set {
			f |= 1 << i
		}
	}
	return f
}

func gatesOf(f int) store.Gates {
	return store.Gates{HasThreadGate: f&1 != 0, HasPostGate: f&2 != 0, ViolatesThreadGate: f&4 != 0, ViolatesEmbeddingRules: f&8 != 0}
}

// Delete removes the records stored under uris and returns how many
// existed. Each URI is checked with a SELECT and deleted with a DELETE,
// both at the write consistency, as many at once as ctx's fan-out limit
// allows. Under concurrent writes to the same URIs the count is a close
// estimate, not a transaction's answer: lightweight transactions would
// make it exact at several times the cost.
func (s *Store) Delete(ctx context.Context, uris []string) (int, error) {
	n, err := s.delete(ctx, uris)
	if err != nil {
		return 0, fmt.Errorf("cqlstore: delete %d records: %w", len(uris), err)
	}
	return n, nil
}

func (s *Store) delete(ctx context.Context, uris []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	uris = uniq(uris)
	ts := s.timestamp()
	var n atomic.Int64
	err := fanout.Each(ctx, len(uris), func(ctx context.Context, i int) error {
		existed, err := s.exists(ctx, uris[i])
		if err != nil || !existed {
			return err
		}
		n.Add(1)
		return s.writeChange(ctx, withChange(ts, uris[i], deleteRecord, uris[i]), "delete "+short(uris[i]))
	})
	return int(n.Load()), err
}

func (s *Store) exists(ctx context.Context, uri string) (bool, error) {
	release, err := s.acquire(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	var got string
	err = s.run(func() error { return s.idempotent(s.write().Query(selectExists, uri), ctx).Scan(&got) })
	switch {
	case errors.Is(err, gocql.ErrNotFound):
		return false, nil
	case err != nil:
		return false, queryError(ctx, "check "+short(uri), err)
	}
	return true, nil
}

func uniq(uris []string) []string {
	seen := make(map[string]bool, len(uris))
	out := make([]string, 0, len(uris))
	for _, u := range uris {
		if !seen[u] {
			seen[u] = true
			out = append(out, u)
		}
	}
	return out
}

// idempotent marks q idempotent, gives it the bounded retry policy and
// the speculative attempt, and binds it to ctx.
func (s *Store) idempotent(q *gocql.Query, ctx context.Context) *gocql.Query {
	q = q.WithContext(ctx).Idempotent(true).RetryPolicy(s.retry)
	if s.cfg.SpeculativeDelay > 0 {
		q = q.SetSpeculativeExecutionPolicy(&gocql.SimpleSpeculativeExecution{NumAttempts: 1, TimeoutDelay: s.cfg.SpeculativeDelay})
	}
	return q
}

// acquire takes one of the process-wide query slots, waiting until ctx
// ends at most. The caller must call release.
func (s *Store) acquire(ctx context.Context) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !s.slots.TryAcquire(1) {
		s.waits.Add(1)
		if err := s.slots.Acquire(ctx, 1); err != nil {
			return nil, fmt.Errorf("waiting for one of %d in-flight CQL query slots: %w", s.cfg.MaxInflight, err)
		}
	}
	s.inflight.Add(1)
	return func() {
		s.inflight.Add(-1)
		s.slots.Release(1)
	}, nil
}

// Stats is a snapshot of the store's query slots and sessions.
type Stats struct {
	InFlight    int64       // queries holding a slot now
	MaxInflight int         // the slot limit
	Waits       int64       // queries that had to wait for a slot, ever
	Reopened    int64       // times the sessions were replaced for want of a connection
	Hosts       []HostStats // every node the driver knows, by address
}

// Stats reports the query slots and session replacements now.
func (s *Store) Stats() Stats {
	return Stats{InFlight: s.inflight.Load(), MaxInflight: s.cfg.MaxInflight, Waits: s.waits.Load(), Reopened: s.healer.reopened.Load(), Hosts: s.hosts.snapshot(s.sessions.Load().hosts)}
}

// Close closes both sessions. It waits for a reopen under way, so the
// sessions that reopen swaps in are the ones closed, and none opens after.
func (s *Store) Close() error {
	s.healer.mu.Lock()
	defer s.healer.mu.Unlock()
	if s.healer.closed {
		return nil
	}
	s.healer.closed = true
	s.sessions.Load().close()
	return nil
}

// queryError keeps a context's error as it is (the caller ran out of time
// or gave up) and wraps anything else — no host, a timeout, an error from
// the server — with store.ErrUnavailable.
func queryError(ctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w (driver: %v)", what, ctxErr, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return unavailable(what, err)
}

// errDriverPanic reports a panic inside the driver during a query.
var errDriverPanic = errors.New("the CQL driver panicked")

// run makes one driver call; every query goes through it. A panic inside
// the driver becomes an error: gocql v1.7.0's token-aware policy can
// dereference a host that went away while its connection pool is being
// rebuilt (seen when the node is unreachable and comes back), and a
// driver fault must fail one query, not the process. The outcome is
// reported to the healer.
func (s *Store) run(call func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errDriverPanic, r)
		}
		s.heal(err)
	}()
	return call()
}

// unavailable wraps err with store.ErrUnavailable.
func unavailable(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", store.ErrUnavailable, what, err)
}

// maxURIInError is how much of a URI error messages quote.
const maxURIInError = 128

// short quotes uri for an error message, cut to maxURIInError bytes.
func short(uri string) string {
	if len(uri) <= maxURIInError {
		return fmt.Sprintf("%q", uri)
	}
	return fmt.Sprintf("%q…(%d bytes)", uri[:maxURIInError], len(uri))
}

// Empty reports whether the records table holds no record. It reads at
// most one row.
func (s *Store) Empty(ctx context.Context) (bool, error) {
	release, err := s.acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("cqlstore: empty: %w", err)
	}
	defer release()
	var uri string
	err = s.run(func() error { return s.idempotent(s.read().Query(`SELECT uri FROM records LIMIT 1`), ctx).Scan(&uri) })
	switch {
	case errors.Is(err, gocql.ErrNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("cqlstore: empty: %w", queryError(ctx, "select", err))
	}
	return false, nil
}
