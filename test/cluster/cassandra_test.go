//go:build cluster

package cluster

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocql/gocql"
	"google.golang.org/grpc/codes"

	"github.com/sluice-dev/sluice/internal/promtext"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// figure logs one measured figure in a form the README's Reliability
// table is built from: `figure: name = value`.
func figure(t *testing.T, name string, format string, args ...any) {
	t.Helper()
	t.Logf("figure: %s = %s", name, fmt.Sprintf(format, args...))
}

// TestCassandraCluster runs steady load from named callers through one
// sluice on a keyspace at replication factor 3 (writes LOCAL_QUORUM, reads
// LOCAL_ONE: sluice's defaults) and takes nodes away: one by SIGTERM, one
// by SIGKILL, then two at once. The subtests share the cluster and the
// load, in order.
func TestCassandraCluster(t *testing.T) {
	ks := newKeyspace(t, "sluice_cluster_rf3", 3, 2000)
	mc := testenv.StartMemcached(t)
	r := startReplica(t, ks, []string{mc.Addr()})
	l := startLoad(t, ks.uris, r.client())
	time.Sleep(3 * time.Second) // the load reaches every node before the first window

	t.Run("token-aware routing spreads reads over the replicas", func(t *testing.T) {
		before := hostQueries(t, r, ks.hosts)
		coordBefore := coordinatorReads(t, ks)
		time.Sleep(5 * time.Second)
		after := hostQueries(t, r, ks.hosts)
		coordAfter := coordinatorReads(t, ks)
		var total, coordTotal float64
		for i := range ks.hosts {
			total += after[i] - before[i]
			coordTotal += coordAfter[i] - coordBefore[i]
		}
		if total < 100 {
			t.Fatalf("only %.0f CQL queries in 5s of load; the load is not reaching the store", total)
		}
		for i, h := range ks.hosts {
			share := (after[i] - before[i]) / total
			coordShare := (coordAfter[i] - coordBefore[i]) / coordTotal
			figure(t, "reads coordinated by "+h, "%.0f%% (driver), %.0f%% (the node's own count)", 100*share, 100*coordShare)
			// At RF 3 every node holds every partition: token-aware
			// routing with shuffled replicas gives each about a third.
			if share < 0.2 || share > 0.47 {
				t.Errorf("node %s coordinated %.2f of the queries, want about 1/3 (all nodes own every range at RF 3)", h, share)
			}
			if math.Abs(share-coordShare) > 0.12 {
				t.Errorf("node %s: the driver sent it %.2f of the queries but it counted %.2f of the coordinated reads", h, share, coordShare)
			}
		}
	})

	for _, fault := range []struct{ name, verb string }{
		{"one node stopped by SIGTERM", "stop-node"},
		{"one node killed by SIGKILL", "kill-node"},
	} {
		t.Run(fault.name, func(t *testing.T) {
			const victim = 2
			host := ks.hosts[victim-1]
			from := time.Now()
			clusterScript(t, fault.verb, fmt.Sprint(victim))
			time.Sleep(8 * time.Second) // load runs on two nodes
			rejoin := clusterScript(t, "start-node", fmt.Sprint(victim))
			figure(t, fault.verb+": node restart until UN in every view", "%.1fs", rejoin.Seconds())
			back := waitUsedAgain(t, r, ks.hosts, victim-1)
			figure(t, fault.verb+": node UN until sluice sends it queries", "%.1fs", back.Seconds())
			time.Sleep(time.Second)
			got := l.between(from, time.Now())
			figure(t, fault.verb+": calls from stop to use again", "%v", got)
			if got.reads == 0 || got.writes == 0 {
				t.Fatalf("no load ran during the fault: %v", got)
			}
			if got.readErrs != 0 || got.writeErrs != 0 {
				t.Errorf("with %s down: %v; first failed read: %s; first failed write: %s; want 0 failed reads and writes at LOCAL_ONE / LOCAL_QUORUM", host, got, got.firstReadErr, got.firstWriteErr)
			}
		})
	}

	t.Run("two nodes stopped", func(t *testing.T) {
		clusterScript(t, "stop-node", "2")
		clusterScript(t, "stop-node", "3")
		waitDown(t, r, ks.hosts, 1, 2)
		from := time.Now()
		time.Sleep(5 * time.Second)
		got := l.between(from, time.Now())
		figure(t, "two nodes down: calls", "%v", got)
		if got.readErrs != 0 {
			t.Errorf("reads at LOCAL_ONE with one node of three: %v; first failed read: %s; want 0 failed", got, got.firstReadErr)
		}
		if got.writes == 0 || got.writeErrs != got.writes || got.codes[codes.Unavailable] != got.writeErrs {
			t.Errorf("writes at LOCAL_QUORUM with one node of three: %v; want every one refused with Unavailable", got)
		}
		if !strings.Contains(got.firstWriteErr, "store") {
			t.Errorf("first refused write %q does not name the store", got.firstWriteErr)
		}
		// Fail fast: Cassandra knows the replicas are down and says so at
		// once; a refusal that took most of the call's deadline would be
		// the deadline, not the store's answer.
		figure(t, "two nodes down: slowest refused write", "%v of a %v deadline", got.slowestWriteErr.Round(time.Millisecond), callLimit)
		if got.slowestWriteErr > callLimit/2 {
			t.Errorf("slowest refused write took %v, more than half its %v deadline: not failing fast", got.slowestWriteErr, callLimit)
		}
		clusterScript(t, "start-node", "2", "3")
		waitUsedAgain(t, r, ks.hosts, 1)
		waitUsedAgain(t, r, ks.hosts, 2)
	})

	t.Run("every acknowledged write is there after recovery", func(t *testing.T) {
		l.halt()
		acked := l.ackedWrites()
		if len(acked) == 0 {
			t.Fatal("no write was acknowledged")
		}
		s := session(t, ks.hosts, gocql.Quorum)
		defer s.Close()
		lost := readBack(t, s, ks.name, acked)
		figure(t, "acknowledged writes read back at QUORUM", "%d, %d lost", len(acked), lost)
	})
}

// readBack reads every acknowledged write at the session's consistency,
// 16 at a time, and returns how many are missing or hold another version.
func readBack(t *testing.T, s *gocql.Session, keyspace string, acked map[string]string) int {
	t.Helper()
	type write struct{ uri, cid string }
	work := make(chan write)
	var (
		mu   sync.Mutex
		lost int
		wg   sync.WaitGroup
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w := range work {
				var got string
				err := s.Query("SELECT cid FROM "+keyspace+".records WHERE uri = ?", w.uri).Scan(&got)
				if err != nil || got != w.cid {
					mu.Lock()
					lost++
					if lost <= 3 {
						t.Errorf("acknowledged write %s: read back %q, %v; want cid %s", w.uri, got, err, w.cid)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for uri, cid := range acked {
		work <- write{uri, cid}
	}
	close(work)
	wg.Wait()
	return lost
}

// hostQueries returns sluice's count of CQL queries sent to each host.
func hostQueries(t *testing.T, r *replica, hosts []string) []float64 {
	t.Helper()
	m := r.metrics(t)
	out := make([]float64, len(hosts))
	for i, h := range hosts {
		out[i] = m.Sum("sluice_cql_host_queries_total", map[string]string{"host": h})
	}
	return out
}

// coordinatorReads asks each node how many reads of the records table it
// has coordinated (its own metric, system_views.coordinator_read_latency).
func coordinatorReads(t *testing.T, ks *keyspace) []float64 {
	t.Helper()
	out := make([]float64, len(ks.hosts))
	for i, h := range ks.hosts {
		s := session(t, []string{h}, gocql.One)
		var n int64
		err := s.Query(`SELECT count FROM system_views.coordinator_read_latency WHERE keyspace_name = ? AND table_name = 'records'`, ks.name).Scan(&n)
		s.Close()
		if err != nil {
			t.Fatalf("coordinator reads on %s: %v", h, err)
		}
		out[i] = float64(n)
	}
	return out
}

// waitUsedAgain waits until sluice's driver holds host i up and sends it
// queries again, and returns how long that took.
func waitUsedAgain(t *testing.T, r *replica, hosts []string, i int) time.Duration {
	t.Helper()
	start := time.Now()
	base := hostQueries(t, r, hosts)[i]
	for time.Since(start) < 90*time.Second {
		m := r.metrics(t)
		if heldUpBy(m, hosts[i]) == len(driverSessions) && m.Sum("sluice_cql_host_queries_total", map[string]string{"host": hosts[i]}) > base+10 {
			return time.Since(start)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("sluice did not use %s again within 90s of it rejoining", hosts[i])
	return 0
}

// driverSessions are the CQL store's sessions, as sluice_cql_host_up
// labels them: each follows the cluster's host events on its own.
var driverSessions = []string{"read", "write"}

// heldUpBy returns how many of the driver's sessions hold host up.
func heldUpBy(m promtext.Families, host string) int {
	n := 0
	for _, s := range driverSessions {
		if m.Sum("sluice_cql_host_up", map[string]string{"host": host, "session": s}) == 1 {
			n++
		}
	}
	return n
}

// heldDownBy returns how many of the driver's sessions report host and
// hold it down: a session whose series is missing does not count.
func heldDownBy(m promtext.Families, host string) int {
	n := 0
	for _, s := range driverSessions {
		want := map[string]string{"host": host, "session": s}
		if m.Count("sluice_cql_host_up", want) == 1 && m.Sum("sluice_cql_host_up", want) == 0 {
			n++
		}
	}
	return n
}

// waitDown waits until every session of sluice's driver holds every host
// of idx down: until then the read session may still send a read to a
// node that has gone.
func waitDown(t *testing.T, r *replica, hosts []string, idx ...int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		m, down := r.metrics(t), 0
		for _, i := range idx {
			if heldDownBy(m, hosts[i]) == len(driverSessions) {
				down++
			}
		}
		if down == len(idx) {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("sluice's driver did not mark %v down within 60s", idx)
}
