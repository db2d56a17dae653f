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
// driver dials only the proxy's address (the node's advertised address
// maps to it), so cutting or slowing the proxy is the network fault sluice
// sees.
func init() {
	newCQLStore = func(t *testing.T, addr string) store.Store {
		cfg := cqltest.ThroughProxy(t, cqltest.Keyspace(t, "sluice_test_faults"), addr)
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
