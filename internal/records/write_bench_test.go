package records

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/socialgraph"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
)

// BenchmarkWriteBatch measures one PutRecords batch of 1,000 records and
// its DeleteRecords, through the writer over the embedded store and a
// real memcached: follows (each changes a social-graph edge) and replies
// (each reads the gates of its post and of its root). It reports the
// milliseconds each batch took.
func BenchmarkWriteBatch(b *testing.B) {
	benchmarkWriteBatch(b, func(b *testing.B) *fixture { return newFixture(b) })
}

// BenchmarkWriteBatchCQL is BenchmarkWriteBatch over the CQL store, on
// the Cassandra the tests use (CASSANDRA_ADDR), with the fan-out limit
// of the method's default policy.
func BenchmarkWriteBatchCQL(b *testing.B) {
	benchmarkWriteBatch(b, func(b *testing.B) *fixture {
		cfg := cqltest.Keyspace(b, "sluice_bench_records")
		st, err := cqlstore.Open(testCtx(b), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		return newFixtureOn(b, st)
	})
}

func benchmarkWriteBatch(b *testing.B, newFixture func(*testing.B) *fixture) {
	for _, kind := range []string{"follows", "replies"} {
		b.Run(kind, func(b *testing.B) {
			f := newFixture(b)
			ctx := fanout.WithLimit(testCtx(b), guard.DefaultPolicy().Concurrency)
			var put, del time.Duration
			for i := range b.N {
				recs := writeBatch(kind, i)
				uris := make([]string, len(recs))
				for j, r := range recs {
					uris[j] = r.URI
				}
				start := time.Now()
				if _, err := f.w.Put(ctx, recs); err != nil {
					b.Fatal(err)
				}
				put += time.Since(start)
				start = time.Now()
				if _, err := f.w.Delete(ctx, uris); err != nil {
					b.Fatal(err)
				}
				del += time.Since(start)
			}
			b.ReportMetric(float64(put.Milliseconds())/float64(b.N), "put-ms/batch")
			b.ReportMetric(float64(del.Milliseconds())/float64(b.N), "delete-ms/batch")
		})
	}
}

// writeBatch is the i-th batch of 1,000 records of kind: follows of
// distinct subjects, or replies to distinct roots of another account.
func writeBatch(kind string, i int) []store.Record {
	recs := make([]store.Record, 1000)
	for j := range recs {
		n := i*len(recs) + j
		if kind == "follows" {
			uri := "at://" + alice + "/" + socialgraph.FollowCollection + fmt.Sprintf("/3kf%08d", n)
			subject := "did:plc:zzzzzzzzzzzzzzzz" + letters(n)
			recs[j] = rec(uri, fmt.Sprintf(`{"$type":"app.bsky.graph.follow","subject":%q,"createdAt":"2024-01-01T00:00:00Z"}`, subject))
			continue
		}
		root := postURI(bob, fmt.Sprintf("3kr%08d", n))
		recs[j] = rec(postURI(alice, fmt.Sprintf("3kp%08d", n)), fmt.Sprintf(`{"$type":"app.bsky.feed.post","text":"re","createdAt":"2024-01-01T00:00:00Z","reply":{"root":{"uri":%q,"cid":"b"},"parent":{"uri":%q,"cid":"b"}}}`, root, root))
	}
	return recs
}

// letters spells n in eight letters a–j, as a did:plc identifier's
// characters must be.
func letters(n int) string {
	return strings.Map(func(r rune) rune { return 'a' + r - '0' }, fmt.Sprintf("%08d", n))
}
