package cqlstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/gocql/gocql"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
)

// Tests the healer that replaces the sessions when the driver stays
// without a usable connection: the first "no connections" only starts the
// clock, and any answer (a not-found too) stops it; once queries have
// failed that way for longer than StuckAfter,
// fresh sessions replace the old ones (closed, or TestMain's leak check
// fails) and reads work on them; a second replacement waits StuckAfter;
// another kind of error never triggers one; and while the cluster is
// unreachable the old sessions are kept.
func TestHealerReplacesStuckSessions(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_heal")
	s := mustOpen(t, cfg)
	defer s.Close()
	rec := store.Record{URI: "at://did:plc:heal/app.bsky.feed.post/3kheal", CID: "bafyreiheal",
		JSON: []byte(`{"text":"still here"}`), CreatedAt: time.Unix(1700000000, 0).UTC(), IndexedAt: time.Unix(1700000001, 0).UTC()}
	if err := s.Put(testContext(t), []store.Record{rec}); err != nil {
		t.Fatal(err)
	}
	stuck := cfg.StuckAfter() + time.Second
	reopened := func() int64 { return s.Stats().Reopened }
	readable := func(when string) {
		t.Helper()
		got, err := s.Get(testContext(t), rec.URI)
		if err != nil || string(got.JSON) != string(rec.JSON) {
			t.Fatalf("%s: Get = %q, %v; want the stored record", when, got.JSON, err)
		}
	}

	s.Heal(gocql.ErrNoConnections)
	if n := reopened(); n != 0 {
		t.Fatalf("reopened %d times after one failed query, want 0: the first only starts the clock", n)
	}

	s.StuckFor(stuck)
	s.Heal(errors.New("gocql: no response received from cassandra within timeout period"))
	if n := reopened(); n != 0 {
		t.Fatalf("reopened %d times after a timeout, want 0: only a missing connection is healed", n)
	}

	s.Heal(gocql.ErrNotFound)
	s.Heal(gocql.ErrNoConnections)
	if n := reopened(); n != 0 {
		t.Fatalf("reopened %d times right after a not-found answer, want 0: an answer resets the clock", n)
	}

	s.StuckFor(stuck)
	s.Heal(gocql.ErrNoConnections)
	s.WaitReopen()
	if n := reopened(); n != 1 {
		t.Fatalf("reopened %d times after %v without a connection, want 1", n, stuck)
	}
	readable("on the fresh sessions")

	s.StuckFor(stuck)
	s.Heal(gocql.ErrNoConnections)
	s.WaitReopen()
	if n := reopened(); n != 1 {
		t.Fatalf("reopened %d times, want still 1: a second replacement waits %v after the first", n, cfg.StuckAfter())
	}

	s.ForgetLastReopen()
	s.FailReopens()
	s.StuckFor(stuck)
	s.Heal(gocql.ErrNoConnections)
	s.WaitReopen()
	if n := reopened(); n != 1 {
		t.Fatalf("reopened %d times while the cluster was unreachable, want still 1", n)
	}
	readable("after a failed reopen kept the sessions")
}

// Tests that the query which finds the driver stuck does not wait for
// fresh sessions to open (a connect to a cluster still away can take
// longer than the query's deadline): they open in the background, and
// are swapped in when they have.
func TestStuckQueryDoesNotWaitForTheReopen(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_heal_bg")
	s := mustOpen(t, cfg)
	defer s.Close()
	release := make(chan struct{})
	s.HoldReopens(release)
	s.StuckFor(cfg.StuckAfter() + time.Second)
	returned := make(chan struct{})
	go func() {
		s.Heal(gocql.ErrNoConnections)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the stuck query waited for the fresh sessions to open")
	}
	if n := s.Stats().Reopened; n != 0 {
		t.Fatalf("reopened %d times before the sessions could open, want 0", n)
	}
	close(release)
	s.WaitReopen()
	if n := s.Stats().Reopened; n != 1 {
		t.Fatalf("reopened %d times once the sessions could open, want 1", n)
	}
}
