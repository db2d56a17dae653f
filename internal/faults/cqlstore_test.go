package faults

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
)

// The store scenarios run against the CQL store through toxiproxy: the
// driver knows only the proxy's address (host discovery off), so cutting
// or slowing the proxy is the network fault sluice sees.
func init() {
	newCQLStore = func(t *testing.T, addr string) store.Store {
		cfg := cqltest.Keyspace(t, "sluice_test_faults")
		cfg.Hosts, cfg.DisableHostLookup, cfg.ReconnectInterval = []string{addr}, true, 300*time.Millisecond
		cfg.ConnectTimeout = time.Second
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		st, err := cqlstore.Open(ctx, cfg)
		if err != nil {
			t.Fatalf("open the CQL store behind the proxy: %v", err)
		}
		return st
	}
}
