package cqlstore_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gocql/gocql"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
	"github.com/sluice-dev/sluice/internal/store/storetest"
	"github.com/sluice-dev/sluice/internal/testenv"
)

const defaultTestTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), defaultTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

func mustOpen(t *testing.T, cfg cqlstore.Config) *cqlstore.Store {
	t.Helper()
	s, err := cqlstore.Open(testContext(t), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// Tests that the CQL store passes the contract suite every backend passes.
func TestContract(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_contract")
	storetest.Run(t, func(t *testing.T) store.Store {
		cqltest.Truncate(t, cfg)
		return mustOpen(t, cfg)
	})
}

// Tests that the CQL store passes the journal contract every backend
// passes.
func TestJournalContract(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_journal")
	cfg.JournalOrigin = storetest.JournalOrigin
	storetest.RunJournal(t, func(t *testing.T) store.Store {
		cqltest.Truncate(t, cfg)
		return mustOpen(t, cfg)
	})
}

// Tests that migrate creates the keyspace and applies every migration the
// first time, and changes nothing the second time: no keyspace created, no
// migration applied, the recorded migration rows untouched.
func TestMigrateTwiceIsNoOp(t *testing.T) {
	addr := testenv.Cassandra(t)
	const ks = "sluice_test_migrate"
	cqltest.Exec(t, addr, "DROP KEYSPACE IF EXISTS "+ks)
	cfg := cqlstore.DefaultConfig()
	cfg.Hosts, cfg.Keyspace = []string{addr}, ks
	rf, err := cqlstore.ParseReplication("datacenter1:1")
	if err != nil {
		t.Fatal(err)
	}
	var logged []string
	logf := func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }

	first, err := cqlstore.Migrate(testContext(t), cfg, rf, logf)
	if err != nil {
		t.Fatalf("first Migrate: %v", err)
	}
	if !first.KeyspaceCreated || len(first.Applied) != cqlstore.SchemaVersion || first.Version != cqlstore.SchemaVersion {
		t.Fatalf("first Migrate = %+v, want keyspace created and versions 1..%d applied", first, cqlstore.SchemaVersion)
	}
	before := migrationRows(t, cfg)
	firstLog := len(logged)

	second, err := cqlstore.Migrate(testContext(t), cfg, rf, logf)
	if err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if second.KeyspaceCreated || len(second.Applied) != 0 || second.Version != cqlstore.SchemaVersion {
		t.Errorf("second Migrate = %+v, want nothing created or applied", second)
	}
	if len(logged) != firstLog {
		t.Errorf("second Migrate logged %q, want nothing", logged[firstLog:])
	}
	if after := migrationRows(t, cfg); after != before {
		t.Errorf("schema_migrations changed: %q, then %q", before, after)
	}
	s := mustOpen(t, cfg)
	defer s.Close()
	if _, err := s.Get(testContext(t), "at://did:plc:x/app.bsky.feed.post/3k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get on the migrated keyspace: %v, want ErrNotFound", err)
	}
}

// Tests the upgrade from schema 1: a keyspace holding a record written
// before moderation state existed, and a column of migration 2 already
// added by an interrupted run, migrates to the current schema; the old
// record reads with no moderation state and new records keep theirs.
func TestMigrateFromVersion1(t *testing.T) {
	addr := testenv.Cassandra(t)
	ks := "sluice_test_migrate_v1" + os.Getenv("SLUICE_TEST_KEYSPACE_SUFFIX")
	cqltest.Exec(t, addr, "DROP KEYSPACE IF EXISTS "+ks)
	cqltest.Exec(t, addr, "CREATE KEYSPACE "+ks+" WITH replication = {'class': 'NetworkTopologyStrategy', 'datacenter1': 1}")
	cqltest.Exec(t, addr, "CREATE TABLE "+ks+".records (uri text PRIMARY KEY, cid text, json blob, created_at_us bigint, indexed_at_us bigint)")
	cqltest.Exec(t, addr, "CREATE TABLE "+ks+".schema_migrations (version int PRIMARY KEY, description text, applied_at timestamp)")
	cqltest.Exec(t, addr, "INSERT INTO "+ks+".schema_migrations (version, description, applied_at) VALUES (1, 'records table keyed by uri', toTimestamp(now()))")
	const old = "at://did:plc:old/app.bsky.feed.post/3kold"
	cqltest.Exec(t, addr, "INSERT INTO "+ks+".records (uri, cid, json, created_at_us, indexed_at_us) VALUES (?, 'bafyold', textAsBlob('{}'), 1, 2)", old)
	cqltest.Exec(t, addr, "ALTER TABLE "+ks+".records ADD takedown_ref text")

	cfg := cqlstore.DefaultConfig()
	cfg.Hosts, cfg.Keyspace = []string{addr}, ks
	rf, err := cqlstore.ParseReplication("datacenter1:1")
	if err != nil {
		t.Fatal(err)
	}
	res, err := cqlstore.Migrate(testContext(t), cfg, rf, func(string, ...any) {})
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if len(res.Applied) != cqlstore.SchemaVersion-1 || res.Applied[0] != 2 || res.Version != cqlstore.SchemaVersion {
		t.Fatalf("Migrate = %+v, want migrations 2..%d applied", res, cqlstore.SchemaVersion)
	}
	s := mustOpen(t, cfg)
	defer s.Close()
	got, err := s.Get(testContext(t), old)
	if err != nil || got.CID != "bafyold" || got.TakedownRef != "" || got.Tags != nil || got.Gates != (store.Gates{}) {
		t.Fatalf("old record = %+v, %v", got, err)
	}
	fresh := store.Record{URI: "at://did:plc:new/app.bsky.feed.post/3knew", CID: "bafynew", JSON: []byte(`{}`),
		TakedownRef: "t", Tags: []string{"x"}, Gates: store.Gates{HasPostGate: true}}
	if err := s.Put(testContext(t), []store.Record{fresh}); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Get(testContext(t), fresh.URI); err != nil || got.TakedownRef != "t" || len(got.Tags) != 1 || !got.Gates.HasPostGate {
		t.Fatalf("new record = %+v, %v", got, err)
	}
}

// migrationRows renders the schema_migrations table, applied_at included.
func migrationRows(t *testing.T, cfg cqlstore.Config) string {
	t.Helper()
	c := gocql.NewCluster(cfg.Hosts...)
	c.Keyspace, c.DisableInitialHostLookup = cfg.Keyspace, true
	s, err := c.CreateSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	iter := s.Query(`SELECT version, description, applied_at FROM schema_migrations`).WithContext(testContext(t)).Iter()
	var rows []string
	var v int
	var d string
	var at time.Time
	for iter.Scan(&v, &d, &at) {
		rows = append(rows, fmt.Sprintf("%d %s %s", v, d, at.Format(time.RFC3339Nano)))
	}
	if err := iter.Close(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(rows, "; ")
}

// Tests that migrate refuses to silently keep a keyspace whose
// replication differs from the one asked for.
func TestMigrateRefusesOtherReplication(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_migrate_rf")
	rf, _ := cqlstore.ParseReplication("dc9:3")
	_, err := cqlstore.Migrate(testContext(t), cfg, rf, func(string, ...any) {})
	if err == nil || !strings.Contains(err.Error(), "ALTER KEYSPACE") {
		t.Fatalf("Migrate with other replication: %v, want a refusal naming ALTER KEYSPACE", err)
	}
}

// Tests that Open refuses a keyspace that migrate never prepared, saying
// what to run.
func TestOpenUnmigrated(t *testing.T) {
	addr := testenv.Cassandra(t)
	const ks = "sluice_test_unmigrated"
	cqltest.Exec(t, addr, "DROP KEYSPACE IF EXISTS "+ks)
	cfg := cqlstore.DefaultConfig()
	cfg.Hosts, cfg.Keyspace = []string{addr}, ks
	_, err := cqlstore.Open(testContext(t), cfg)
	if err == nil || !strings.Contains(err.Error(), "sluice migrate") {
		t.Fatalf("Open(missing keyspace) = %v, want an error naming sluice migrate", err)
	}
	cqltest.Exec(t, addr, "CREATE KEYSPACE "+ks+" WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
	_, err = cqlstore.Open(testContext(t), cfg)
	if err == nil || !strings.Contains(err.Error(), "sluice migrate") {
		t.Fatalf("Open(empty keyspace) = %v, want an error naming sluice migrate", err)
	}
}

// Tests that the process-wide slot limit holds while far more Gets than
// slots run at once, counted by a QueryObserver on every attempt, and that
// the excess waited rather than failed.
func TestInflightBound(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_inflight")
	obs := &cqltest.Observer{}
	cfg.QueryObserver = obs
	cfg.MaxInflight = 4
	// The bound is on queries; a speculative attempt, sent within its
	// query's slot, would count as a second one in the observer.
	cfg.SpeculativeDelay = 0
	s := mustOpen(t, cfg)
	defer s.Close()
	ctx := fanout.WithLimit(testContext(t), 64)
	err := fanout.Each(ctx, 400, func(ctx context.Context, i int) error {
		_, err := s.Get(ctx, fmt.Sprintf("at://did:plc:x/app.bsky.feed.post/3k%d", i))
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	peak, n := obs.Peak()
	t.Logf("400 Gets, 64 callers, 4 slots: %d queries observed, peak %d in flight, %d waited", n, peak, s.Stats().Waits)
	if n < 400 {
		t.Errorf("observed %d queries, want at least 400", n)
	}
	if peak > 4 || peak < 2 {
		t.Errorf("peak in flight = %d, want 2..4", peak)
	}
	if s.Stats().Waits == 0 || s.Stats().InFlight != 0 {
		t.Errorf("stats = %+v, want waits > 0 and none in flight", s.Stats())
	}
}

// Tests the flag values migrate and serve accept and the clear refusals
// of bad ones.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(*cqlstore.Config)
		wantErr string
	}{
		{"defaults", func(*cqlstore.Config) {}, ""},
		{"no hosts is off, not an error", func(c *cqlstore.Config) { c.Hosts = nil; c.Keyspace = "" }, ""},
		{"bad keyspace", func(c *cqlstore.Config) { c.Keyspace = "posts; DROP" }, "must start with a letter"},
		{"long keyspace", func(c *cqlstore.Config) { c.Keyspace = strings.Repeat("k", 49) }, "1 to 48 characters"},
		{"bad consistency", func(c *cqlstore.Config) { c.ReadConsistency = "SOME" }, `unknown level "SOME"`},
		{"zero inflight", func(c *cqlstore.Config) { c.MaxInflight = 0 }, "max inflight 0 is outside [1, 65536]"},
		{"too many retries", func(c *cqlstore.Config) { c.Retries = 50 }, "retries 50 is outside [0, 10]"},
		{"negative speculative delay", func(c *cqlstore.Config) { c.SpeculativeDelay = -time.Millisecond }, "speculative delay -1ms is outside [0, the query timeout 6s)"},
		{"speculative delay past the timeout", func(c *cqlstore.Config) { c.SpeculativeDelay = 6 * time.Second }, "speculative delay 6s is outside"},
		{"empty dc", func(c *cqlstore.Config) { c.DC = "" }, "dc is empty"},
		{"zero timeout", func(c *cqlstore.Config) { c.Timeout = 0 }, "timeout 0s must be positive"},
		{"address map of ip:port", func(c *cqlstore.Config) { c.AddressMap = map[string]string{"10.0.0.5:9042": "127.0.0.1:19042"} }, ""},
		{"address map with a name", func(c *cqlstore.Config) { c.AddressMap = map[string]string{"10.0.0.5:9042": "proxy:19042"} }, "address map 10.0.0.5:9042=proxy:19042: both sides must be ip:port"},
		{"address map without port", func(c *cqlstore.Config) { c.AddressMap = map[string]string{"10.0.0.5": "127.0.0.1:19042"} }, "both sides must be ip:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cqlstore.DefaultConfig()
			c.Hosts = []string{"127.0.0.1"}
			tc.mutate(&c)
			err := c.Validate()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// Tests that --cql-address-map is read as advertised=reachable pairs, that
// the driver is handed the reachable address of a mapped node (in either
// IP form) and the advertised one of any other, and that a malformed pair
// is refused with an example.
func TestAddressMap(t *testing.T) {
	c := cqlstore.DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"--cql-hosts", "127.0.0.1:19042", "--cql-address-map", "10.0.0.5:9042=127.0.0.1:19042, 10.0.0.6:9042=127.0.0.1:19043"}); err != nil {
		t.Fatalf("parse: %v", err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	for advertised, want := range map[string]string{
		"10.0.0.5:9042":          "127.0.0.1:19042",
		"[::ffff:10.0.0.6]:9042": "127.0.0.1:19043",
		"10.0.0.7:9042":          "10.0.0.7:9042",
		"10.0.0.5:9043":          "10.0.0.5:9043",
	} {
		if got, err := c.Translate(advertised); err != nil || got != want {
			t.Errorf("node advertising %s is dialed at %s (%v), want %s", advertised, got, err, want)
		}
	}
	err := fs.Parse([]string{"--cql-address-map", "10.0.0.5:9042"})
	if err == nil || !strings.Contains(err.Error(), "is not advertised=reachable (for example") {
		t.Errorf("a pair without = parsed: %v", err)
	}
}

// Tests the replication flag's two forms and its refusals.
func TestParseReplication(t *testing.T) {
	for _, tc := range []struct {
		in, want, wantErr string
	}{
		{in: "1", want: "SimpleStrategy RF 1"},
		{in: "dc2:3, dc1:3", want: "NetworkTopologyStrategy dc1:3,dc2:3"},
		{in: "0", wantErr: "factor 0 is outside [1, 15]"},
		{in: "dc1", wantErr: `"dc1" is not dc:factor`},
		{in: "dc1:x", wantErr: "is not dc:factor"},
		{in: "dc'1:3", wantErr: "quote"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			r, err := cqlstore.ParseReplication(tc.in)
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("ParseReplication(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			case tc.wantErr == "" && (err != nil || r.String() != tc.want):
				t.Errorf("ParseReplication(%q) = %v, %v; want %s", tc.in, r, err, tc.want)
			}
		})
	}
}

// Tests that ANY is refused for reads and for writes: Cassandra accepts
// it only for writes, and the write session also reads (Delete's
// existence check, the journal), so a store opened with it could never
// delete a record or read its journal.
func TestConfigRefusesConsistencyAny(t *testing.T) {
	for _, set := range []func(*cqlstore.Config){
		func(c *cqlstore.Config) { c.ReadConsistency = "ANY" },
		func(c *cqlstore.Config) { c.WriteConsistency = "any" },
	} {
		c := cqlstore.DefaultConfig()
		c.Hosts = []string{"127.0.0.1"}
		set(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "unknown level") {
			t.Errorf("Validate() with read %s, write %s = %v, want the level refused", c.ReadConsistency, c.WriteConsistency, err)
		}
	}
}

// Tests that the reads of a write (store.ForWrite) go at the write
// consistency and other reads at the read consistency. The keyspace has
// one replica and the write consistency asks for two, so a read that
// goes at it fails, while one at the read consistency is answered.
func TestReadsOfAWriteAtTheWriteConsistency(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_for_write")
	cqltest.Truncate(t, cfg)
	cfg.WriteConsistency = "TWO"
	s := mustOpen(t, cfg)
	t.Cleanup(func() { s.Close() })
	ctx := testContext(t)
	uri := "at://did:plc:abcdefghijklmnopqrstuvwx/app.bsky.feed.post/3kforwrite"
	cqltest.Exec(t, cfg.Hosts[0], "INSERT INTO "+cfg.Keyspace+".records (uri, cid, json) VALUES (?, 'c1', ?)", uri, []byte(`{"$type":"app.bsky.feed.post"}`))
	other := "at://did:plc:abcdefghijklmnopqrstuvwx/app.bsky.feed.post/3kforwrit2"

	if _, err := s.Get(ctx, uri); err != nil {
		t.Fatalf("Get at the read consistency: %v", err)
	}
	if got, err := s.GetMany(ctx, []string{uri, other}); err != nil || len(got) != 1 {
		t.Fatalf("GetMany at the read consistency = %d records, %v", len(got), err)
	}
	if _, err := s.Get(store.ForWrite(ctx), uri); err == nil || !strings.Contains(err.Error(), "TWO") {
		t.Errorf("Get for a write = %v, want it refused at consistency TWO", err)
	}
	if _, err := s.GetMany(store.ForWrite(ctx), []string{uri, other}); err == nil || !strings.Contains(err.Error(), "TWO") {
		t.Errorf("GetMany for a write = %v, want it refused at consistency TWO", err)
	}
}
