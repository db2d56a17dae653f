package boltstore

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/sluice-dev/sluice/internal/store"
)

// BenchmarkPutJournal measures what the invalidation journal costs a
// write: Put of a 50-record batch, whose transaction also writes each
// change's journal entry ("journal"), against the same transaction with
// the records only ("records-only"). Both rewrite the same 50 records of
// about 500 bytes, so the difference is the journal's entries and their
// pruning. `make bench` (part journalrow) reports the ratio.
func BenchmarkPutJournal(b *testing.B) {
	recs := make([]store.Record, 50)
	for i := range recs {
		recs[i] = store.Record{
			URI:  fmt.Sprintf("at://did:plc:bench%019d/app.bsky.feed.post/3k%d", i, i),
			CID:  "bafyreibench",
			JSON: fmt.Appendf(nil, `{"text":%q}`, strings.Repeat("x", 480)),
		}
	}
	for _, variant := range []struct {
		name string
		put  func(*Store, []store.Record) error
	}{
		{"journal", func(s *Store, recs []store.Record) error { return s.Put(context.Background(), recs) }},
		{"records-only", putRecordsOnly},
	} {
		b.Run(variant.name, func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "sluice.db"), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			for b.Loop() {
				if err := variant.put(s, recs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(recs))/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// putRecordsOnly is Put without the journal: what a write would cost if
// nothing recorded the change.
func putRecordsOnly(s *Store, recs []store.Record) error {
	vals := make([][]byte, len(recs))
	for i, r := range recs {
		if err := s.validate(r); err != nil {
			return err
		}
		vals[i] = encodeValue(r)
	}
	return s.update(context.Background(), func(tx *bolt.Tx) error {
		b := tx.Bucket(recordsBucket)
		for i, r := range recs {
			if err := b.Put([]byte(r.URI), vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
}
