package cqlstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gocql/gocql"
)

// SchemaVersion is the newest schema this build writes and reads.
const SchemaVersion = 3

// migration is one step of the schema; its statements are idempotent on
// their own (IF NOT EXISTS), and its added columns are added only when
// system_schema does not list them yet, so a step interrupted half-way is
// re-run whole.
type migration struct {
	version     int
	description string
	statements  []string
	addColumns  []column // ALTER TABLE … ADD, each only if missing
}

// column is one column a migration adds to a table.
type column struct{ table, name, cqlType string }

// migrations are applied in order. A released step is never edited: a
// change is a new step. Table names are unqualified; the session's
// keyspace holds them.
var migrations = []migration{{
	version:     1,
	description: "records table keyed by uri",
	statements: []string{`CREATE TABLE IF NOT EXISTS records (
		uri text PRIMARY KEY,
		cid text,
		json blob,
		created_at_us bigint,
		indexed_at_us bigint
	) WITH comment = 'sluice records: one partition per AT-URI; times in microseconds since the Unix epoch'`},
}, {
	version:     2,
	description: "moderation state (takedown_ref, tags) and post gate flags beside each record",
	addColumns: []column{
		{"records", "takedown_ref", "text"},
		{"records", "tags", "list<text>"},
		{"records", "gate_flags", "int"},
	},
}, {
	version:     3,
	description: "invalidation journal partitioned by minute",
	// Rows expire by TTL (set per insert from JournalRetention) and are
	// never deleted, so TimeWindowCompactionStrategy drops whole expired
	// SSTables instead of compacting tombstones; gc_grace_seconds is short
	// because no row is ever deleted explicitly.
	statements: []string{`CREATE TABLE IF NOT EXISTS journal (
		bucket bigint,
		at_us bigint,
		uri text,
		origin text,
		PRIMARY KEY ((bucket), at_us, uri, origin)
	) WITH comment = 'sluice invalidation journal: one row per changed record; bucket is at_us divided by 60 000 000 (one partition per minute)'
	AND compaction = {'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'MINUTES', 'compaction_window_size': 10}
	AND default_time_to_live = 1800
	AND gc_grace_seconds = 3600`},
}}

// createMigrationsTable holds one row per applied migration.
const createMigrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version int PRIMARY KEY,
	description text,
	applied_at timestamp
)`

// Replication is a keyspace's replication: SimpleStrategy with one factor
// (development, one datacenter) or NetworkTopologyStrategy with a factor
// per datacenter (production).
type Replication struct {
	// SimpleFactor is SimpleStrategy's replication factor; used when
	// PerDC is empty.
	SimpleFactor int
	// PerDC maps datacenter names to NetworkTopologyStrategy factors.
	PerDC map[string]int
}

// ParseReplication reads "3" (SimpleStrategy, RF 3) or "dc1:3,dc2:3"
// (NetworkTopologyStrategy).
func ParseReplication(s string) (Replication, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil {
		r := Replication{SimpleFactor: n}
		return r, r.validate()
	}
	r := Replication{PerDC: map[string]int{}}
	for _, part := range splitList(s) {
		dc, rf, ok := strings.Cut(part, ":")
		n, err := strconv.Atoi(strings.TrimSpace(rf))
		if !ok || err != nil || strings.TrimSpace(dc) == "" {
			return Replication{}, fmt.Errorf("replication %q: %q is not dc:factor; write a factor (3) or dc:factor pairs (dc1:3,dc2:3)", s, part)
		}
		r.PerDC[strings.TrimSpace(dc)] = n
	}
	return r, r.validate()
}

// maxReplicationFactor is a sanity bound, far above any real cluster's.
const maxReplicationFactor = 15

func (r Replication) validate() error {
	if len(r.PerDC) == 0 {
		if r.SimpleFactor < 1 || r.SimpleFactor > maxReplicationFactor {
			return fmt.Errorf("replication factor %d is outside [1, %d]", r.SimpleFactor, maxReplicationFactor)
		}
		return nil
	}
	for dc, n := range r.PerDC {
		if n < 1 || n > maxReplicationFactor {
			return fmt.Errorf("replication factor %d for datacenter %q is outside [1, %d]", n, dc, maxReplicationFactor)
		}
		if strings.ContainsAny(dc, `'"{}`) {
			return fmt.Errorf("datacenter name %q holds a quote or brace", dc)
		}
	}
	return nil
}

// options returns the replication map as Cassandra reports it in
// system_schema.keyspaces.
func (r Replication) options() map[string]string {
	if len(r.PerDC) == 0 {
		return map[string]string{"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": strconv.Itoa(r.SimpleFactor)}
	}
	m := map[string]string{"class": "org.apache.cassandra.locator.NetworkTopologyStrategy"}
	for dc, n := range r.PerDC {
		m[dc] = strconv.Itoa(n)
	}
	return m
}

// cql renders the replication map for CREATE KEYSPACE.
func (r Replication) cql() string {
	if len(r.PerDC) == 0 {
		return fmt.Sprintf("{'class': 'SimpleStrategy', 'replication_factor': %d}", r.SimpleFactor)
	}
	parts := []string{"'class': 'NetworkTopologyStrategy'"}
	for _, dc := range slices.Sorted(maps.Keys(r.PerDC)) {
		parts = append(parts, fmt.Sprintf("'%s': %d", dc, r.PerDC[dc]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// String shows the replication as a flag would take it.
func (r Replication) String() string {
	if len(r.PerDC) == 0 {
		return fmt.Sprintf("SimpleStrategy RF %d", r.SimpleFactor)
	}
	var parts []string
	for _, dc := range slices.Sorted(maps.Keys(r.PerDC)) {
		parts = append(parts, fmt.Sprintf("%s:%d", dc, r.PerDC[dc]))
	}
	return "NetworkTopologyStrategy " + strings.Join(parts, ",")
}

// MigrateResult says what Migrate did. A run that changed nothing has
// KeyspaceCreated false and no Applied versions.
type MigrateResult struct {
	KeyspaceCreated bool
	Applied         []int // versions applied by this run, in order
	Version         int   // schema version after the run
}

// Migrate creates the keyspace with replication r if it is missing, then
// applies every migration not yet recorded in schema_migrations. Running
// it again changes nothing. It refuses a keyspace whose replication
// differs from r (changing replication needs ALTER KEYSPACE and a repair,
// which an operator should do on purpose) and a schema newer than this
// build. Progress lines go to logf.
func Migrate(ctx context.Context, cfg Config, r Replication, logf func(format string, args ...any)) (MigrateResult, error) {
	res, err := migrate(ctx, cfg, r, logf)
	if err != nil {
		return res, fmt.Errorf("cqlstore: migrate keyspace %s: %w", cfg.Keyspace, err)
	}
	return res, nil
}

// ddlTimeout is the least per-statement timeout of a migration: a schema
// change returns only once the nodes agree on the new schema, which takes
// tens of seconds on a busy multi-node cluster (seen on three nodes
// sharing two cores), far above a point query's timeout.
const ddlTimeout = 60 * time.Second

func migrate(ctx context.Context, cfg Config, r Replication, logf func(string, ...any)) (MigrateResult, error) {
	var res MigrateResult
	if err := errors.Join(cfg.Validate(), r.validate()); err != nil {
		return res, err
	}
	cfg.Timeout = max(cfg.Timeout, ddlTimeout)
	created, err := ensureKeyspace(ctx, cfg, r, logf)
	if err != nil {
		return res, err
	}
	res.KeyspaceCreated = created
	s, err := openSession(cfg, gocql.Quorum, sessionOf{})
	if err != nil {
		return res, err
	}
	defer s.Close()
	if err := s.Query(createMigrationsTable).WithContext(ctx).Exec(); err != nil {
		return res, unavailable("create schema_migrations", err)
	}
	applied, err := appliedVersions(ctx, s)
	if err != nil {
		return res, err
	}
	if latest := lastVersion(applied); latest > SchemaVersion {
		return res, fmt.Errorf("schema version %d is newer than this build knows (%d); run a newer sluice", latest, SchemaVersion)
	}
	for _, m := range migrations {
		if applied[m.version] {
			continue
		}
		if err := apply(ctx, s, cfg.Keyspace, m, logf); err != nil {
			return res, err
		}
		res.Applied = append(res.Applied, m.version)
	}
	res.Version = SchemaVersion
	return res, nil
}

// ensureKeyspace creates the keyspace if it is missing and checks the
// replication of one that exists.
func ensureKeyspace(ctx context.Context, cfg Config, r Replication, logf func(string, ...any)) (bool, error) {
	sysCfg := cfg
	sysCfg.Keyspace = ""
	s, err := openSession(sysCfg, gocql.Quorum, sessionOf{})
	if err != nil {
		return false, err
	}
	defer s.Close()
	var have map[string]string
	err = s.Query(`SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?`, cfg.Keyspace).WithContext(ctx).Scan(&have)
	switch {
	case err == nil:
		if !maps.Equal(have, r.options()) {
			return false, fmt.Errorf("keyspace exists with replication %v, not the requested %s; change it with ALTER KEYSPACE and run a repair, or pass the replication it has", have, r)
		}
		return false, nil
	case !errors.Is(err, gocql.ErrNotFound):
		return false, unavailable("read keyspace replication", err)
	}
	logf("creating keyspace %s with %s", cfg.Keyspace, r)
	stmt := fmt.Sprintf("CREATE KEYSPACE IF NOT EXISTS %s WITH replication = %s", cfg.Keyspace, r.cql())
	if err := s.Query(stmt).WithContext(ctx).Exec(); err != nil {
		return false, unavailable("create keyspace", err)
	}
	return true, nil
}

func appliedVersions(ctx context.Context, s *gocql.Session) (map[int]bool, error) {
	iter := s.Query(`SELECT version FROM schema_migrations`).WithContext(ctx).Iter()
	applied := map[int]bool{}
	var v int
	for iter.Scan(&v) {
		applied[v] = true
	}
	if err := iter.Close(); err != nil {
		return nil, unavailable("read schema_migrations", err)
	}
	return applied, nil
}

func lastVersion(applied map[int]bool) int {
	latest := 0
	for v := range applied {
		latest = max(latest, v)
	}
	return latest
}

// apply runs one migration's statements, then records it.
func apply(ctx context.Context, s *gocql.Session, keyspace string, m migration, logf func(string, ...any)) error {
	logf("applying migration %d: %s", m.version, m.description)
	for _, stmt := range m.statements {
		if err := s.Query(stmt).WithContext(ctx).Exec(); err != nil {
			return unavailable(fmt.Sprintf("migration %d", m.version), err)
		}
	}
	for _, c := range m.addColumns {
		if err := addColumn(ctx, s, keyspace, c); err != nil {
			return fmt.Errorf("migration %d: %w", m.version, err)
		}
	}
	err := s.Query(`INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)`,
		m.version, m.description, time.Now()).WithContext(ctx).Exec()
	if err != nil {
		return unavailable(fmt.Sprintf("record migration %d", m.version), err)
	}
	return nil
}

// addColumn adds c unless the session keyspace's table already has it.
func addColumn(ctx context.Context, s *gocql.Session, keyspace string, c column) error {
	var have string
	err := s.Query(`SELECT column_name FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ? AND column_name = ?`,
		keyspace, c.table, c.name).WithContext(ctx).Scan(&have)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, gocql.ErrNotFound):
		return unavailable("read columns of "+c.table, err)
	}
	stmt := fmt.Sprintf("ALTER TABLE %s ADD %s %s", c.table, c.name, c.cqlType)
	if err := s.Query(stmt).WithContext(ctx).Exec(); err != nil {
		return unavailable(fmt.Sprintf("add column %s.%s", c.table, c.name), err)
	}
	return nil
}

// checkSchema fails unless the keyspace holds exactly SchemaVersion.
func checkSchema(ctx context.Context, s *gocql.Session, keyspace string) error {
	applied, err := appliedVersions(ctx, s)
	if err != nil {
		var reqErr gocql.RequestError
		if errors.As(err, &reqErr) && reqErr.Code() == gocql.ErrCodeInvalid {
			return fmt.Errorf("keyspace %s has no schema_migrations table; run sluice migrate first", keyspace)
		}
		return err
	}
	switch latest := lastVersion(applied); {
	case latest == 0:
		return fmt.Errorf("keyspace %s has no schema applied; run sluice migrate first", keyspace)
	case latest > SchemaVersion:
		return fmt.Errorf("schema version %d is newer than this build reads (%d); run a newer sluice", latest, SchemaVersion)
	case latest < SchemaVersion:
		return fmt.Errorf("schema version %d is older than %d; run sluice migrate", latest, SchemaVersion)
	}
	return nil
}
