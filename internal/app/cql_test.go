package app

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// withCQL returns a config change that serves from cfg's keyspace.
func withCQL(cfg cqlstore.Config) func(*Config) {
	return func(c *Config) { c.CQL = cfg }
}

// withPatientBatches wraps mutate so GetPostRecords may take up to timeout:
// for tests that assert what a batch reads, not how fast, against a
// Cassandra node that may have just started and is shared with other test
// packages on two cores.
func withPatientBatches(timeout time.Duration, mutate func(*Config)) func(*Config) {
	return func(c *Config) {
		mutate(c)
		name := sluicev1.PostRecords_ServiceDesc.ServiceName + "/GetPostRecords"
		p := c.Guard.Methods[name]
		p.Timeout = timeout
		c.Guard.Methods[name] = p
		c.Cache.TombstoneTTL = max(c.Cache.TombstoneTTL, 2*timeout)
	}
}

// Tests that two concurrent 1,000-URI batches served from Cassandra never
// have more CQL queries in flight than the process-wide cap (one piece's
// five groups alone would go past it), that the misses are read in
// groups of read_group partitions (one SELECT ... IN per group), and that
// the answers equal the embedded backend's for the same seeded posts.
func TestCQLBatchBoundedAndMatchesEmbedded(t *testing.T) {
	const maxInflight = 4
	cfg := cqltest.Keyspace(t, "sluice_test_app_batch")
	obs := &cqltest.Observer{}
	cfg.MaxInflight, cfg.QueryObserver = maxInflight, obs
	// The cap is on queries; a speculative attempt, sent within its
	// query's slot, would count as a second one in the observer.
	cfg.SpeculativeDelay = 0
	// The assertions are about bounds and answers; the method's 2 s
	// deadline is tested elsewhere and would only make this test depend on
	// how warm the node is.
	// The journal follower's polls would add statements and slots in use
	// that are not the batches'; they have their own tests.
	cql := startServer(t, 1900, withPatientBatches(defaultTestTimeout/2, func(c *Config) {
		withCQL(cfg)(c)
		c.Journal.Disabled = true
	}))
	embedded := startServer(t, 1900, nil)
	batches := [2][]string{
		append(cql.uris(0, 950), cql.missing[:50]...),
		append(cql.uris(950, 1900), cql.missing[50:100]...),
	}
	obs.Reset()
	waitsBefore := cql.metrics().Sum("sluice_cql_slot_waits_total", nil)
	var got [2]*sluicev1.GetPostRecordsResponse
	var errs [2]error
	var wg sync.WaitGroup
	for i, uris := range batches {
		wg.Go(func() {
			got[i], errs[i] = cql.client.GetPostRecords(cql.ctx("batch"), &sluicev1.GetPostRecordsRequest{Uris: uris})
		})
	}
	wg.Wait()
	peak, n := obs.Peak()
	t.Logf("2 × 1,000-URI batches on Cassandra: %d CQL queries, peak %d in flight (cap %d); statements %v", n, peak, maxInflight, obs.Statements())
	for i, uris := range batches {
		if errs[i] != nil {
			t.Fatalf("batch %d: %v", i, errs[i])
		}
		want, err := embedded.client.GetPostRecords(embedded.ctx("batch"), &sluicev1.GetPostRecordsRequest{Uris: uris})
		if err != nil {
			t.Fatalf("embedded batch %d: %v", i, err)
		}
		compareResponses(t, uris, want, got[i])
	}
	if peak > maxInflight || peak < 2 {
		t.Errorf("peak CQL queries in flight = %d, want 2..%d", peak, maxInflight)
	}
	// Each batch is served in pieces of 100 (piece_items), each piece's
	// misses in groups of read_group.
	if want := 2000 / cfg.ReadGroup; n != want {
		t.Errorf("%d CQL queries for 2,000 uncached URIs, want one per %d (%d)", n, cfg.ReadGroup, want)
	}
	for stmt := range obs.Statements() {
		if !strings.HasSuffix(stmt, "WHERE uri IN ? / 1 values") {
			t.Errorf("statement %q is not a SELECT of a group of URIs", stmt)
		}
	}
	// The slots show on /metrics: more queries wanted at once than the
	// 4 allowed.
	fams := cql.metrics()
	limit, inFlight := fams.Sum("sluice_cql_queries_max_in_flight", nil), fams.Sum("sluice_cql_queries_in_flight", nil)
	waits, reopened := fams.Sum("sluice_cql_slot_waits_total", nil), fams.Sum("sluice_cql_sessions_reopened_total", nil)
	waits -= waitsBefore // the seeding's writes waited too
	t.Logf("/metrics: cap %v, in flight %v, slot waits during the batches %v, sessions reopened %v", limit, inFlight, waits, reopened)
	if limit != maxInflight || inFlight != 0 || waits == 0 || reopened != 0 {
		t.Errorf("CQL slot metrics: cap %v, in flight %v, waits during the batches %v, reopened %v; want cap %d, 0 in flight after the batches, some waits, no reopen",
			limit, inFlight, waits, reopened, maxInflight)
	}
}

// Tests that the write RPCs work on Cassandra: reads after a put or a
// delete never return the old version, with the cache warm.
func TestCQLReadAfterWriteAndDelete(t *testing.T) {
	readAfterWriteAndDelete(t, withCQL(cqltest.Keyspace(t, "sluice_test_app_writes")))
}

// compareResponses fails unless got answers every URI exactly as want.
func compareResponses(t *testing.T, uris []string, want, got *sluicev1.GetPostRecordsResponse) {
	t.Helper()
	if len(got.Records) != len(uris) || len(want.Records) != len(uris) {
		t.Fatalf("%d and %d records for %d URIs", len(got.Records), len(want.Records), len(uris))
	}
	found := 0
	for i := range uris {
		if !proto.Equal(want.Records[i], got.Records[i]) {
			t.Fatalf("uris[%d] %s: CQL answered %v, embedded %v", i, uris[i], got.Records[i], want.Records[i])
		}
		if got.Records[i].GetFound() {
			found++
		}
	}
	if found != len(uris)-50 {
		t.Errorf("%d of %d found, want %d", found, len(uris), len(uris)-50)
	}
}

// outcome is one request of the outage load.
type outcome struct {
	hit     bool // asked only for cached URIs
	code    codes.Code
	msg     string
	elapsed time.Duration
}

// Tests that when Cassandra becomes unreachable mid-load (its proxy is cut:
// connections closed, new ones refused), requests the cache can answer keep
// being served, requests that need the store fail with Unavailable and a
// message saying so within their deadline, and once Cassandra is reachable
// again the same server answers them without a restart. The shared
// Cassandra node keeps running; only this server's path to it is cut.
func TestCQLOutageMidLoad(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_app_outage")
	proxy := testenv.StartProxy(t, cfg.Hosts[0])
	cfg = cqltest.ThroughProxy(t, cfg, proxy.Addr())
	ts := startServer(t, 1000, withCQL(cfg))
	hits := ts.uris(0, 500)
	warmThroughProxy(t, func() error {
		_, err := ts.client.GetPostRecords(ts.ctx("warm"), &sluicev1.GetPostRecordsRequest{Uris: hits})
		return err
	})
	misses := ts.uris(500, 1000)
	timeout := getPolicy(t).Timeout
	waitSteady(t, ts, hits[0], 60*time.Second)

	before := runLoad(t, ts, hits, misses[:50], time.Second)
	checkAllOK(t, "before the outage", before)

	proxy.Cut()
	during := runLoad(t, ts, hits, misses[50:100], 3*time.Second)
	var hitOK, missUnavailable int
	for _, o := range during {
		switch {
		case o.hit && o.code == codes.OK:
			hitOK++
		case o.hit:
			t.Errorf("during the outage a cached batch failed: %s %s", o.code, o.msg)
		case o.code != codes.Unavailable || !strings.Contains(o.msg, "record store is unavailable"):
			t.Errorf("during the outage an uncached batch got %s %q, want Unavailable naming the record store", o.code, o.msg)
		default:
			missUnavailable++
		}
		if o.elapsed > timeout+time.Second {
			t.Errorf("a request took %v, over its %v deadline", o.elapsed, timeout)
		}
	}
	t.Logf("during the outage: %d cached batches served, %d uncached batches Unavailable; e.g. %q", hitOK, missUnavailable, firstMsg(during))
	if hitOK == 0 || missUnavailable == 0 {
		t.Fatalf("outage load ran %d cached and %d uncached batches, want both", hitOK, missUnavailable)
	}

	probe := []string{hits[0][:strings.LastIndex(hits[0], "/")+1] + "outage-probe"}
	if _, err := ts.client.GetPostRecords(ts.ctx("recovery"), &sluicev1.GetPostRecordsRequest{Uris: probe}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a URI never read before, during the outage: %v; want Unavailable, or waitSteady's probes do not reach the store", err)
	}
	proxy.Restore()
	recovered := waitSteady(t, ts, hits[0], 60*time.Second)
	t.Logf("recovered steadily %v after Cassandra was reachable again, without a restart", recovered.Round(time.Millisecond))
	after := runLoad(t, ts, hits, misses[150:], time.Second)
	checkAllOK(t, "after recovery", after)
}

// runLoad sends batches from 4 workers for d, as client "load", whose
// budget is unlimited: odd requests ask for 50 cached URIs, even ones for
// the uncached misses. It returns every outcome.
func runLoad(t *testing.T, ts *testServer, hits, misses []string, d time.Duration) []outcome {
	t.Helper()
	var mu sync.Mutex
	var out []outcome
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for w := range 4 {
		wg.Go(func() {
			for i := w; time.Now().Before(end); i++ {
				hit := i%2 == 1
				uris := misses
				if hit {
					uris = hits[(i*50)%len(hits):][:50]
				}
				start := time.Now()
				_, err := ts.client.GetPostRecords(ts.ctx("load"), &sluicev1.GetPostRecordsRequest{Uris: uris})
				st := status.Convert(err)
				mu.Lock()
				out = append(out, outcome{hit: hit, code: st.Code(), msg: st.Message(), elapsed: time.Since(start)})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

func checkAllOK(t *testing.T, phase string, outs []outcome) {
	t.Helper()
	for _, o := range outs {
		if o.code != codes.OK {
			t.Fatalf("%s: %s %s", phase, o.code, o.msg)
		}
	}
	if len(outs) == 0 {
		t.Fatalf("%s: no request ran", phase)
	}
}

func firstMsg(outs []outcome) string {
	for _, o := range outs {
		if !o.hit && o.code != codes.OK {
			return o.msg
		}
	}
	return ""
}

// waitSteady reads a URI no earlier read asked for (so the answer comes
// from Cassandra, never the cache) until such reads have succeeded without
// a failure for two reconnect intervals, and returns how long after it
// started that run of successes began. Through toxiproxy the driver's pool
// is refilled one connection at a time, both a second or so after the
// session opens and after the proxy is restored, and gocql v1.7.0 marks
// a host down when a pool fill fails while the pool has no connection,
// dropping its pool until the next reconnect round, one interval on; the
// strict loads of the test start once that is over.
func waitSteady(t *testing.T, ts *testServer, like string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var firstOK time.Time // of the current run of successes
	prefix := like[:strings.LastIndex(like, "/")+1]
	for i := 0; ; i++ {
		probe := []string{fmt.Sprintf("%ssteady%d", prefix, i)}
		_, err := ts.client.GetPostRecords(ts.ctx("recovery"), &sluicev1.GetPostRecordsRequest{Uris: probe})
		switch {
		case err != nil:
			firstOK = time.Time{}
		case firstOK.IsZero():
			firstOK = time.Now()
		case time.Since(firstOK) >= 2*cqlstore.DefaultReconnectInterval:
			return firstOK.Sub(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("no steady store reads %v after Cassandra was reachable: %v", limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// getPolicy returns the default policy of GetPostRecords.
func getPolicy(t testing.TB) guard.Policy {
	t.Helper()
	p, ok := DefaultConfig().Guard.Methods[sluicev1.PostRecords_ServiceDesc.ServiceName+"/GetPostRecords"]
	if !ok || p.Timeout <= 0 || p.Concurrency < 1 {
		t.Fatalf("no usable default policy for GetPostRecords: %+v", p)
	}
	return p
}

// warmThroughProxy runs warm until it succeeds. Through toxiproxy the
// driver's connection pool can be empty for a moment a second or so after
// the session opened ("no hosts available in the pool"; gocql refills it
// within its reconnect interval): a server whose start-up journal replay
// takes that long meets it on its first reads. The warm-up is not what
// these tests are about, so it waits that out, up to defaultTestTimeout.
func warmThroughProxy(t *testing.T, warm func() error) {
	t.Helper()
	deadline := time.Now().Add(defaultTestTimeout)
	for tries := 1; ; tries++ {
		err := warm()
		if err == nil {
			if tries > 1 {
				t.Logf("warm-up succeeded at try %d", tries)
			}
			return
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("warming the cache (try %d): %v", tries, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
