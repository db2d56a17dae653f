package cqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/gocql/gocql"

	"github.com/sluice-dev/sluice/internal/store"
)

// journalBucketWidth is the span of one journal partition. A minute keeps
// a follower's poll to one or two partitions and a replay of the default
// half-hour retention to 31 single-partition reads, while a partition
// holds at most a minute of writes. It is part of the schema: changing it
// needs a new table.
const journalBucketWidth = time.Minute

// maxJournalRetention bounds Config.JournalRetention: a replay reads one
// partition per minute kept.
const maxJournalRetention = 24 * time.Hour

func journalBucket(us int64) int64 { return us / journalBucketWidth.Microseconds() }

// withChange returns a logged batch of one record statement and the
// journal row for uri, both at client timestamp ts (microseconds), which
// is also the change's time.
func (s *Store) withChange(ts int64, uri, stmt string, args ...any) *gocql.Batch {
	b := s.write().NewBatch(gocql.LoggedBatch)
	b.Entries = append(b.Entries,
		gocql.BatchEntry{Stmt: stmt, Args: args, Idempotent: true},
		gocql.BatchEntry{Stmt: insertChange, Args: []any{journalBucket(ts), ts, uri, s.cfg.JournalOrigin, int(s.cfg.JournalRetention.Seconds())}, Idempotent: true})
	return b.WithTimestamp(ts)
}

// execBatch runs one logged batch in a slot, with the bounded retry
// policy: it is idempotent, since every statement carries the same client
// timestamp.
func (s *Store) execBatch(ctx context.Context, b *gocql.Batch, what string) error {
	release, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	if err := s.run(func() error { return s.write().ExecuteBatch(b.WithContext(ctx).RetryPolicy(s.retry)) }); err != nil {
		return queryError(ctx, what, err)
	}
	return nil
}

// Changes reads the journal partitions from from's minute to to's, each
// with one single-partition SELECT at the write consistency (so it sees
// every acknowledged write), and calls fn for each row in time order.
func (s *Store) Changes(ctx context.Context, from, to time.Time, fn func(store.Change) error) error {
	if from.Before(time.Now().Add(-s.cfg.JournalRetention)) {
		return fmt.Errorf("cqlstore: journal from %s: %w (retention %s)", from.UTC().Format(time.RFC3339), store.ErrJournalGap, s.cfg.JournalRetention)
	}
	fromUS, toUS := from.UnixMicro(), to.UnixMicro()
	for b := journalBucket(fromUS); b <= journalBucket(toUS); b++ {
		if err := s.changesIn(ctx, b, fromUS, toUS, fn); err != nil {
			return fmt.Errorf("cqlstore: journal: %w", err)
		}
	}
	return nil
}

// changesIn reads one journal partition.
func (s *Store) changesIn(ctx context.Context, bucket, fromUS, toUS int64, fn func(store.Change) error) error {
	release, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	var (
		at     int64
		ch     store.Change
		fnErr  error
		rowErr error
	)
	rowErr = s.run(func() error {
		iter := s.idempotent(s.write().Query(selectChange, bucket, fromUS, toUS), ctx).Iter()
		for fnErr == nil && iter.Scan(&at, &ch.URI, &ch.Origin) {
			ch.At = time.UnixMicro(at).UTC()
			fnErr = fn(ch)
		}
		return iter.Close()
	})
	if fnErr != nil {
		return fnErr
	}
	if rowErr != nil {
		return queryError(ctx, fmt.Sprintf("select journal bucket %d", bucket), rowErr)
	}
	return nil
}

// Retention is how long journal rows live.
func (s *Store) Retention() time.Duration { return s.cfg.JournalRetention }
