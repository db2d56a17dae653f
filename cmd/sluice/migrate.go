package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/sluice-dev/sluice/internal/store/cqlstore"
)

// migrate creates or upgrades the CQL schema: the keyspace with the
// requested replication, then every migration not yet applied. Running it
// again is a no-op.
func migrate(ctx context.Context, args []string, out io.Writer) error {
	cfg := cqlstore.DefaultConfig()
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	replication := fs.String("replication", "1",
		"keyspace replication: a factor for SimpleStrategy (development, one datacenter), or dc:factor pairs for NetworkTopologyStrategy (production), e.g. dc1:3,dc2:3")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if !cfg.Enabled() {
		return fmt.Errorf("migrate: --cql-hosts is required; the embedded store creates its own schema when it opens")
	}
	r, err := cqlstore.ParseReplication(*replication)
	if err != nil {
		return fmt.Errorf("migrate: --replication: %w", err)
	}
	logf := func(format string, a ...any) { fmt.Fprintf(out, "migrate: "+format+"\n", a...) }
	logf("keyspace %s on %v, replication %s", cfg.Keyspace, cfg.Hosts, r)
	res, err := cqlstore.Migrate(ctx, cfg, r, logf)
	if err != nil {
		return err
	}
	if !res.KeyspaceCreated && len(res.Applied) == 0 {
		logf("schema is up to date at version %d; nothing to do", res.Version)
		return nil
	}
	logf("schema is at version %d (applied %v)", res.Version, res.Applied)
	return nil
}
