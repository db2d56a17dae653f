package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sluice-dev/sluice/internal/store"
)

// maxPrunePerWrite bounds how many expired journal entries one write
// transaction drops, so a write after a long idle spell stays cheap; each
// write drops more than it adds, so the backlog shrinks.
const maxPrunePerWrite = 256

// Journal keys are the change's time in microseconds since the epoch,
// then the bucket's sequence number, both big-endian, so a cursor walks
// them in time order. Values are the origin's length (uvarint), the
// origin, then the URI.

// journalTx adds entries to, and prunes, the journal in one write
// transaction.
type journalTx struct {
	b      *bolt.Bucket
	at     int64
	origin string
	oldest int64
}

func (s *Store) journal(tx *bolt.Tx) journalTx {
	now := time.Now()
	return journalTx{b: tx.Bucket(journalBucket), at: now.UnixMicro(), origin: s.opts.JournalOrigin,
		oldest: now.Add(-s.opts.retention()).UnixMicro()}
}

// add records a change of uri.
func (j journalTx) add(uri string) error {
	seq, err := j.b.NextSequence()
	if err != nil {
		return err
	}
	key := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(make([]byte, 0, 16), uint64(j.at)), seq)
	val := binary.AppendUvarint(nil, uint64(len(j.origin)))
	val = append(append(val, j.origin...), uri...)
	return j.b.Put(key, val)
}

// prune drops up to maxPrunePerWrite entries older than the retention.
func (j journalTx) prune() error {
	limit := binary.BigEndian.AppendUint64(nil, uint64(j.oldest))
	c := j.b.Cursor()
	for range maxPrunePerWrite {
		k, _ := c.First()
		if k == nil || bytes.Compare(k, limit) >= 0 {
			return nil
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// Changes calls fn for each journal entry with from <= At < to, in time
// order. fn runs inside a read transaction and must not write to s.
func (s *Store) Changes(ctx context.Context, from, to time.Time, fn func(store.Change) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("boltstore: journal: %w", err)
	}
	if from.Before(time.Now().Add(-s.opts.retention())) {
		return fmt.Errorf("boltstore: journal from %s: %w (retention %s)", from.UTC().Format(time.RFC3339), store.ErrJournalGap, s.opts.retention())
	}
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(journalBucket).Cursor()
		end := binary.BigEndian.AppendUint64(nil, uint64(to.UnixMicro()))
		for k, v := c.Seek(binary.BigEndian.AppendUint64(nil, uint64(from.UnixMicro()))); k != nil && bytes.Compare(k, end) < 0; k, v = c.Next() {
			ch, err := decodeChange(k, v)
			if err != nil {
				return err
			}
			if err := fn(ch); err != nil {
				return err
			}
		}
		return ctx.Err()
	})
	if err != nil {
		return fmt.Errorf("boltstore: journal: %w", err)
	}
	return nil
}

// Retention is how long journal entries are kept.
func (s *Store) Retention() time.Duration { return s.opts.retention() }

// JournalLen counts the journal's entries, expired ones not yet pruned
// included.
func (s *Store) JournalLen() (int, error) {
	var n int
	err := s.view(func(tx *bolt.Tx) error {
		n = tx.Bucket(journalBucket).Stats().KeyN
		return nil
	})
	return n, err
}

var errBadJournalEntry = errors.New("corrupt journal entry")

func decodeChange(k, v []byte) (store.Change, error) {
	if len(k) != 16 {
		return store.Change{}, fmt.Errorf("%w: key of %d bytes", errBadJournalEntry, len(k))
	}
	n, w := binary.Uvarint(v)
	if w <= 0 || uint64(len(v)-w) < n {
		return store.Change{}, fmt.Errorf("%w: origin length", errBadJournalEntry)
	}
	origin := string(v[w : w+int(n)])
	return store.Change{
		URI:    string(v[w+int(n):]),
		At:     time.UnixMicro(int64(binary.BigEndian.Uint64(k))).UTC(),
		Origin: origin,
	}, nil
}
