// Package cqltest prepares keyspaces on the test Cassandra for tests of
// the CQL store and of servers built on it.
//
// Every package's tests share one Cassandra node (scripts/test-deps.sh
// starts it) and run in parallel with other packages, so each test gets a
// keyspace of its own name, dropped and migrated afresh. The package does
// not start Cassandra; testenv.Cassandra finds it or skips the test.
package cqltest

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gocql/gocql"

	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// timeout bounds schema changes, which wait for schema agreement.
const timeout = 60 * time.Second

// Keyspace drops keyspace name if it exists, creates it with sluice's
// schema (SimpleStrategy, RF 1) and returns a config for it on the test
// Cassandra. The keyspace is left in place after the test, for
// inspection; the next run drops it. SLUICE_TEST_KEYSPACE_SUFFIX, when
// set, is appended to name, so two checkouts can share one Cassandra
// without dropping each other's keyspaces.
func Keyspace(t testing.TB, name string) cqlstore.Config {
	t.Helper()
	addr := testenv.Cassandra(t)
	name += os.Getenv("SLUICE_TEST_KEYSPACE_SUFFIX")
	cfg := cqlstore.DefaultConfig()
	cfg.Hosts, cfg.Keyspace = []string{addr}, name
	cfg.MaxInflight = 64
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	Exec(t, addr, "DROP KEYSPACE IF EXISTS "+name)
	rf, _ := cqlstore.ParseReplication("1")
	if _, err := cqlstore.Migrate(ctx, cfg, rf, func(string, ...any) {}); err != nil {
		t.Fatalf("migrate %s: %v", name, err)
	}
	return cfg
}

// Exec runs one statement on the Cassandra at addr, outside any keyspace.
func Exec(t testing.TB, addr, stmt string, values ...any) {
	t.Helper()
	s := session(t, addr)
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := s.Query(stmt, values...).WithContext(ctx).Exec(); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// ThroughProxy returns cfg changed to reach the test Cassandra only
// through proxy (a host:port that forwards to it), as a deployment behind
// a proxy or NAT would: the proxy is the contact point, and the node's
// advertised address maps to it, so the driver keeps discovering the node
// and routing by token but never dials around the proxy. Reconnects are
// quick, for tests that cut the proxy.
func ThroughProxy(t testing.TB, cfg cqlstore.Config, proxy string) cqlstore.Config {
	t.Helper()
	advertised := Advertised(t, cfg.Hosts[0])
	cfg.Hosts = []string{proxy}
	cfg.AddressMap = map[string]string{advertised: proxy}
	cfg.ReconnectInterval = 300 * time.Millisecond
	return cfg
}

// Advertised returns the "ip:port" the node at addr advertises to
// drivers: its rpc_address and native port. Like the driver, it takes
// 9042 when the node does not say (Cassandra 5 names only rpc_port, which
// the driver does not read).
func Advertised(t testing.TB, addr string) string {
	t.Helper()
	s := session(t, addr)
	defer s.Close()
	row := map[string]any{}
	if err := s.Query("SELECT * FROM system.local").MapScan(row); err != nil {
		t.Fatalf("read system.local on %s: %v", addr, err)
	}
	ip := net.ParseIP(fmt.Sprint(row["rpc_address"]))
	if ip == nil {
		t.Fatalf("system.local on %s has no rpc_address: %v", addr, row)
	}
	port := 9042
	if p, ok := row["native_port"].(int); ok && p > 0 {
		port = p
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(port))
}

// session connects to the node at addr alone.
func session(t testing.TB, addr string) *gocql.Session {
	t.Helper()
	c := gocql.NewCluster(addr)
	c.Timeout, c.ConnectTimeout = 30*time.Second, 10*time.Second
	c.DisableInitialHostLookup = true
	c.NumConns = 1
	s, err := c.CreateSession()
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	return s
}

// Truncate empties the records and journal tables of cfg's keyspace.
func Truncate(t testing.TB, cfg cqlstore.Config) {
	t.Helper()
	Exec(t, cfg.Hosts[0], fmt.Sprintf("TRUNCATE %s.records", cfg.Keyspace))
	Exec(t, cfg.Hosts[0], fmt.Sprintf("TRUNCATE %s.journal", cfg.Keyspace))
}

// Observer is a gocql.QueryObserver that records when every query attempt
// started and ended, to count how many were in flight at once. It is safe
// for concurrent use.
type Observer struct {
	mu    sync.Mutex
	spans []span
}

type span struct {
	start, end time.Time
	statement  string
	values     int
}

// ObserveQuery implements gocql.QueryObserver.
func (o *Observer) ObserveQuery(_ context.Context, q gocql.ObservedQuery) {
	o.mu.Lock()
	o.spans = append(o.spans, span{q.Start, q.End, q.Statement, len(q.Values)})
	o.mu.Unlock()
}

// Reset forgets every attempt seen so far.
func (o *Observer) Reset() {
	o.mu.Lock()
	o.spans = nil
	o.mu.Unlock()
}

// Peak returns the most attempts that were in flight at one instant, and
// how many attempts were observed in all. An attempt that ended at the
// instant another started does not overlap it.
func (o *Observer) Peak() (peak, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	type edge struct {
		at    time.Time
		delta int
	}
	edges := make([]edge, 0, 2*len(o.spans))
	for _, s := range o.spans {
		edges = append(edges, edge{s.start, +1}, edge{s.end, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // ends before starts at the same instant
	})
	cur := 0
	for _, e := range edges {
		cur += e.delta
		peak = max(peak, cur)
	}
	return peak, len(o.spans)
}

// Statements counts the attempts of each statement text, by the number of
// values bound to it: "SELECT … WHERE uri = ? / 1 values".
func (o *Observer) Statements() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	for _, s := range o.spans {
		out[fmt.Sprintf("%s / %d values", s.statement, s.values)]++
	}
	return out
}
