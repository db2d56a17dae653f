package cqlstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
)

// Tests that every query attempt is counted against the node that
// coordinated it, that the config's own observer still sees each one, and
// that the node is reported up.
func TestHostStatsCountEveryAttempt(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_hosts")
	obs := &cqltest.Observer{}
	cfg.QueryObserver = obs
	cfg.SpeculativeDelay = 0 // one attempt per read, however slow the node
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := cqlstore.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := total(s.Stats().Hosts)
	const reads = 7
	for range reads {
		if _, err := s.Get(ctx, "at://did:plc:x/app.bsky.feed.post/3k"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get: %v, want not found", err)
		}
	}
	hosts := s.Stats().Hosts
	if len(hosts) != 1 || hosts[0].Addr != cfg.Hosts[0] || !hosts[0].Up() {
		t.Fatalf("hosts = %+v, want one node, %s, up", hosts, cfg.Hosts[0])
	}
	if got := total(hosts) - before; got != reads {
		t.Errorf("%d attempts counted for %d reads, want %d", got, reads, reads)
	}
	if _, n := obs.Peak(); n < reads {
		t.Errorf("the config's observer saw %d attempts, want at least %d", n, reads)
	}
}

func total(hosts []cqlstore.HostStats) int64 {
	var n int64
	for _, h := range hosts {
		n += h.Queries
	}
	return n
}
