package app

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
)

// OpenStore opens the backend the config selects: the CQL store when
// CQL.Hosts is set, else the embedded store in DataDir. `sluice seed`
// uses it too, so it writes where `sluice serve` reads.
func OpenStore(ctx context.Context, cfg Config) (store.Store, error) {
	retention := cfg.Journal.WithDefaults().Retention
	if cfg.CQL.Enabled() {
		cql := cfg.CQL
		cql.JournalRetention, cql.JournalOrigin = retention, cfg.journalOrigin
		return cqlstore.Open(ctx, cql)
	}
	return boltstore.Open(filepath.Join(cfg.DataDir, StoreFile), boltstore.Options{JournalRetention: retention, JournalOrigin: cfg.journalOrigin})
}

// storeName describes the backend for the start-up log line.
func (c Config) storeName() string {
	if c.CQL.Enabled() {
		return "cql keyspace " + c.CQL.Keyspace + " on " + strings.Join(c.CQL.Hosts, ",") + " (dc " + c.CQL.DC + ")"
	}
	return "embedded in " + c.DataDir
}
