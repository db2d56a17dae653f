package cqlstore

import (
	"context"
	"fmt"
	"time"

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

// change is one record statement and the journal row for its URI, both
// written at client timestamp ts (microseconds), which is also the
// change's time.
type change struct {
	ts   int64
	uri  string
	stmt string
	args []any
}

// withChange describes the record statement stmt(args) on uri and its
// journal row at client timestamp ts.
func withChange(ts int64, uri, stmt string, args ...any) change {
	return change{ts: ts, uri: uri, stmt: stmt, args: args}
}

// writeChange writes c's record statement, then its journal row, in one
// query slot, each a single-partition write at the write consistency
// with the bounded retry policy (both are idempotent: they carry the same
// client timestamp). The record goes first, so a follower that reads the
// journal row invalidates after the record changed; the change is
// acknowledged only after both. A failure between the two leaves the
// record changed without its journal row, which the caller sees as an
// error and retries. They are not one logged batch: a batch's batchlog
// write goes to replicas the coordinator still believes up, so a node
// killed without warning times batches out until it is marked down,
// where two plain LOCAL_QUORUM writes succeed on the live replicas.
func (s *Store) writeChange(ctx context.Context, c change, what string) error {
	release, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	if err := s.exec(ctx, c.ts, c.stmt, c.args); err != nil {
		return queryError(ctx, what, err)
	}
	// The record has changed: its journal row is written even if ctx is
	// cancelled now (the caller gave up, or another write of the same
	// batch failed), within ctx's deadline, or one query timeout without
	// one.
	jctx, cancel := journalContext(ctx, s.cfg.Timeout)
	defer cancel()
	journalRow := []any{journalBucket(c.ts), c.ts, c.uri, s.cfg.JournalOrigin, int(s.cfg.JournalRetention.Seconds())}
	if err := s.exec(jctx, c.ts, insertChange, journalRow); err != nil {
		return queryError(jctx, "journal "+what, err)
	}
	return nil
}

// journalContext is ctx without its cancellation, ending at ctx's
// deadline, or after timeout when ctx has none.
func journalContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), timeout)
}

// exec runs one idempotent write at client timestamp ts.
func (s *Store) exec(ctx context.Context, ts int64, stmt string, args []any) error {
	return s.run(func() error {
		return s.write().Query(stmt, args...).WithContext(ctx).WithTimestamp(ts).Idempotent(true).RetryPolicy(s.retry).Exec()
	})
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
