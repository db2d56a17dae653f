// Package boltstore is the embedded default store.Store, kept in one file on
// local disk with go.etcd.io/bbolt.
//
// bbolt rather than Pebble: bbolt is pure Go and keeps everything in one
// file, and its copy-on-write B+tree serves read transactions as lock-free
// reads of a memory map. That fits sluice's read-heavy point lookups. Pebble's
// LSM tree favours write-heavy ingest and brings compactions to tune, which
// this workload does not need.
//
// Every Put and Delete is one bbolt write transaction, fsynced on commit (the
// bbolt default), so acknowledged writes survive a crash or restart and a
// batch is stored entirely or not at all. Only one process may open a file at
// a time; a second Open waits Options.Timeout for the file lock and fails.
//
// The file holds three buckets: "records", URI → value in a small versioned
// binary encoding; "meta", holding the schema version that Open checks; and
// "journal", the invalidation journal (store.Journal): one entry per
// changed URI, keyed by the change's time and a sequence number, written
// in the same transaction as the record change. Each write transaction
// also drops a bounded number of entries older than the retention, so the
// journal stays bounded without a background task. The journal bucket is
// created on Open when missing, so files from before it open unchanged.
// The package does not cache, replicate or migrate; it refuses files written
// by a newer schema.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/sluice-dev/sluice/internal/store"
)

// schemaVersion is the layout of buckets and values this build writes and
// reads.
const schemaVersion = 1

var (
	recordsBucket = []byte("records")
	metaBucket    = []byte("meta")
	journalBucket = []byte("journal")
	schemaKey     = []byte("schema_version")
)

// Defaults for the zero fields of Options, and the ceilings Open accepts.
const (
	defaultTimeout        = time.Second
	defaultMaxURILength   = 512
	defaultMaxRecordBytes = 64 << 10
	maxRecordBytesCeiling = 1 << 30
)

// Options configures Open. The zero value is valid: each zero field takes
// its default. Negative values are refused.
type Options struct {
	// Timeout is how long Open waits for another process to release the
	// file lock. Default 1s.
	Timeout time.Duration
	// MaxURILength is the longest URI, in bytes, that Put accepts. Default
	// 512; at most 32768, bbolt's key limit.
	MaxURILength int
	// MaxRecordBytes is the largest record JSON, in bytes, that Put
	// accepts. Default 64 KiB; at most 1 GiB.
	MaxRecordBytes int
	// JournalRetention is how long invalidation journal entries are kept.
	// Default store.DefaultJournalRetention.
	JournalRetention time.Duration
	// JournalOrigin names this writer in the journal entries it writes
	// (store.Change.Origin).
	JournalOrigin string
}

func (o Options) timeout() time.Duration { return orDefault(o.Timeout, defaultTimeout) }
func (o Options) maxURILength() int      { return orDefault(o.MaxURILength, defaultMaxURILength) }
func (o Options) maxRecordBytes() int    { return orDefault(o.MaxRecordBytes, defaultMaxRecordBytes) }
func (o Options) retention() time.Duration {
	return orDefault(o.JournalRetention, store.DefaultJournalRetention)
}

// orDefault returns v, or def when v is zero.
func orDefault[T time.Duration | int](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// validate reports the first option out of range.
func (o Options) validate() error {
	switch {
	case o.Timeout < 0:
		return fmt.Errorf("boltstore: timeout %s is negative", o.Timeout)
	case o.JournalRetention < 0:
		return fmt.Errorf("boltstore: journal retention %s is negative", o.JournalRetention)
	case o.MaxURILength < 0 || o.MaxURILength > bolt.MaxKeySize:
		return fmt.Errorf("boltstore: max URI length %d is outside [0, %d]", o.MaxURILength, bolt.MaxKeySize)
	case o.MaxRecordBytes < 0 || o.MaxRecordBytes > maxRecordBytesCeiling:
		return fmt.Errorf("MaxRecordBytes %d is outside [0, %d]", o.MaxRecordBytes, maxRecordBytesCeiling)
	}
	return nil
}

// Store is a store.Store in one bbolt file. It is safe for concurrent use:
// reads run in parallel and do not block on writes; writes are serialised.
type Store struct {
	db   *bolt.DB
	path string
	opts Options
	// writer is the one write transaction's turn: a write waits for it
	// here, where it can give up at its context's end, rather than in
	// bbolt, which waits for its writer lock however long that takes.
	writer chan struct{}
}

var (
	_ store.Store       = (*Store)(nil)
	_ store.Journal     = (*Store)(nil)
	_ store.BatchReader = (*Store)(nil)
)

// Open opens the store in the file at path, creating the file and its parent
// directory if needed. It fails if the file was written by a newer schema,
// or if another process holds it open for longer than opts.Timeout.
func Open(path string, opts Options) (*Store, error) {
	s, err := open(path, opts)
	if err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	return s, nil
}

func open(path string, opts Options) (*Store, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("empty path")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create parent directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.timeout()})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("database is locked by another process (timeout %s)", opts.timeout())
	}
	if err != nil {
		return nil, err
	}
	if err := db.Update(initSchema); err != nil {
		_ = db.Close()
		return nil, err
	}
	return &Store{db: db, path: path, opts: opts, writer: make(chan struct{}, 1)}, nil
}

// initSchema creates the buckets of a new file, or checks that an existing
// file has them and a schema version this build reads.
func initSchema(tx *bolt.Tx) error {
	meta := tx.Bucket(metaBucket)
	if meta == nil {
		return createSchema(tx)
	}
	if err := checkSchemaVersion(meta.Get(schemaKey)); err != nil {
		return err
	}
	if tx.Bucket(recordsBucket) == nil {
		return errors.New("meta bucket present but records bucket missing; the file is damaged")
	}
	_, err := tx.CreateBucketIfNotExists(journalBucket)
	return err
}

// createSchema sets up an empty file. A records bucket without a meta
// bucket means the file was not written by this package.
func createSchema(tx *bolt.Tx) error {
	if tx.Bucket(recordsBucket) != nil {
		return errors.New("records bucket has no schema version; the file was not written by boltstore")
	}
	meta, err := tx.CreateBucket(metaBucket)
	if err != nil {
		return err
	}
	if _, err := tx.CreateBucket(recordsBucket); err != nil {
		return err
	}
	if _, err := tx.CreateBucket(journalBucket); err != nil {
		return err
	}
	return meta.Put(schemaKey, binary.AppendUvarint(nil, schemaVersion))
}

// checkSchemaVersion accepts only the version this build writes.
func checkSchemaVersion(v []byte) error {
	ver, n := binary.Uvarint(v)
	switch {
	case n <= 0 || n != len(v):
		return fmt.Errorf("unreadable schema version %q", v)
	case ver > schemaVersion:
		return fmt.Errorf("schema version %d is newer than this build reads (%d); run a newer sluice", ver, schemaVersion)
	case ver < schemaVersion:
		return fmt.Errorf("schema version %d is older than %d and has no migration", ver, schemaVersion)
	}
	return nil
}

// Get returns the record stored under uri, or an error wrapping
// store.ErrNotFound. The record's JSON is a copy the caller owns.
func (s *Store) Get(ctx context.Context, uri string) (store.Record, error) {
	r, err := s.get(ctx, uri)
	if err != nil {
		return store.Record{}, fmt.Errorf("boltstore: get %s: %w", short(uri), err)
	}
	return r, nil
}

func (s *Store) get(ctx context.Context, uri string) (store.Record, error) {
	if err := ctx.Err(); err != nil {
		return store.Record{}, err
	}
	var v []byte
	err := s.view(func(tx *bolt.Tx) error {
		v = bytes.Clone(tx.Bucket(recordsBucket).Get([]byte(uri)))
		return nil
	})
	if err != nil {
		return store.Record{}, err
	}
	if v == nil {
		return store.Record{}, store.ErrNotFound
	}
	r, err := decodeValue(v)
	if err != nil {
		return store.Record{}, err
	}
	r.URI = uri
	return r, nil
}

// GetMany implements store.BatchReader: it reads every URI in one read
// transaction. Each record's JSON is a copy the caller owns.
func (s *Store) GetMany(ctx context.Context, uris []string) (map[string]store.Record, error) {
	out, err := s.getMany(ctx, uris)
	if err != nil {
		return nil, fmt.Errorf("boltstore: get %d records: %w", len(uris), err)
	}
	return out, nil
}

func (s *Store) getMany(ctx context.Context, uris []string) (map[string]store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	values := make(map[string][]byte, len(uris))
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(recordsBucket)
		for _, uri := range uris {
			if v := b.Get([]byte(uri)); v != nil {
				values[uri] = bytes.Clone(v)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Decoded after the transaction, which then holds bbolt's mmap lock
	// (that a write growing the file waits for) only while copying.
	out := make(map[string]store.Record, len(values))
	for uri, v := range values {
		r, err := decodeValue(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", short(uri), err)
		}
		r.URI = uri
		out[uri] = r
	}
	return out, nil
}

// Put validates every record, then writes all of them in one transaction,
// replacing records with the same URI; within recs, the last record for a
// URI wins. If any record is invalid, Put returns an error wrapping
// store.ErrInvalid and changes nothing.
func (s *Store) Put(ctx context.Context, recs []store.Record) error {
	if err := s.put(ctx, recs); err != nil {
		return fmt.Errorf("boltstore: put %d records: %w", len(recs), err)
	}
	return nil
}

func (s *Store) put(ctx context.Context, recs []store.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(recs) == 0 {
		return nil
	}
	vals := make([][]byte, len(recs))
	for i, r := range recs {
		if err := s.validate(r); err != nil {
			return fmt.Errorf("record %d %s: %w", i, short(r.URI), err)
		}
		vals[i] = encodeValue(r)
	}
	return s.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(recordsBucket)
		j := s.journal(tx)
		for i, r := range recs {
			if err := b.Put([]byte(r.URI), vals[i]); err != nil {
				return err
			}
			if err := j.add(r.URI); err != nil {
				return err
			}
		}
		return j.prune()
	})
}

// validate reports why r cannot be stored, wrapping store.ErrInvalid.
func (s *Store) validate(r store.Record) error {
	return store.Check(r, s.opts.maxURILength(), s.opts.maxRecordBytes())
}

// Delete removes the records stored under uris in one transaction and
// returns how many existed. Missing URIs, and repeats, are skipped.
func (s *Store) Delete(ctx context.Context, uris []string) (int, error) {
	n, err := s.delete(ctx, uris)
	if err != nil {
		return 0, fmt.Errorf("boltstore: delete %d records: %w", len(uris), err)
	}
	return n, nil
}

func (s *Store) delete(ctx context.Context, uris []string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if len(uris) == 0 {
		return 0, nil
	}
	n := 0
	err := s.update(ctx, func(tx *bolt.Tx) error {
		n = 0
		b := tx.Bucket(recordsBucket)
		j := s.journal(tx)
		for _, uri := range uris {
			k := []byte(uri)
			if b.Get(k) == nil {
				continue
			}
			if err := b.Delete(k); err != nil {
				return err
			}
			if err := j.add(uri); err != nil {
				return err
			}
			n++
		}
		return j.prune()
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Count returns the number of records stored.
func (s *Store) Count() (int, error) {
	var n int
	err := s.view(func(tx *bolt.Tx) error {
		n = tx.Bucket(recordsBucket).Stats().KeyN
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("boltstore: count: %w", err)
	}
	return n, nil
}

// Scan calls fn for every record in URI byte order, stopping at the first
// error from fn, a corrupt value or ctx. fn sees one consistent snapshot
// and owns each record it is given. fn runs inside a read transaction and
// must not call Put or Delete on s, which may wait for the scan to end.
func (s *Store) Scan(ctx context.Context, fn func(store.Record) error) error {
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(recordsBucket).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if err := scanOne(ctx, k, v, fn); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("boltstore: scan: %w", err)
	}
	return nil
}

// scanOne decodes one key and value, still owned by bbolt, and passes the
// record to fn.
func scanOne(ctx context.Context, k, v []byte, fn func(store.Record) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r, err := decodeValue(bytes.Clone(v))
	if err != nil {
		return fmt.Errorf("%s: %w", short(string(k)), err)
	}
	r.URI = string(k)
	return fn(r)
}

// Close closes the file and releases its lock.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("boltstore: close %s: %w", s.path, err)
	}
	return nil
}

// view runs fn in a read transaction. Failing to begin one wraps
// store.ErrUnavailable; fn's own error is returned unchanged.
func (s *Store) view(fn func(*bolt.Tx) error) error {
	tx, err := s.db.Begin(false)
	if err != nil {
		return unavailable(err)
	}
	defer func() { _ = tx.Rollback() }()
	return fn(tx)
}

// update runs fn in a write transaction and commits it, once the write
// before it has committed; it returns ctx's error, having written
// nothing, if ctx ends first. Callers validate first, so any other
// failure is bbolt's or the disk's and wraps store.ErrUnavailable.
func (s *Store) update(ctx context.Context, fn func(*bolt.Tx) error) error {
	select {
	case s.writer <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.writer }()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.db.Update(fn); err != nil {
		return unavailable(err)
	}
	return nil
}

// unavailable wraps err with store.ErrUnavailable.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
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
