package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// Tests that `sluice migrate` creates the schema on its first run and is a
// no-op, saying so, on its second.
func TestMigrateCommandTwice(t *testing.T) {
	addr := testenv.Cassandra(t)
	ks := "sluice_test_cmd_migrate" + os.Getenv("SLUICE_TEST_KEYSPACE_SUFFIX")
	cqltest.Exec(t, addr, "DROP KEYSPACE IF EXISTS "+ks)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	args := []string{"--cql-hosts", addr, "--cql-keyspace", ks, "--replication", "datacenter1:1"}
	var first, second bytes.Buffer
	if err := migrate(ctx, args, &first); err != nil {
		t.Fatalf("first migrate: %v\n%s", err, &first)
	}
	if err := migrate(ctx, args, &second); err != nil {
		t.Fatalf("second migrate: %v\n%s", err, &second)
	}
	t.Logf("first run:\n%ssecond run:\n%s", &first, &second)
	applied := make([]int, cqlstore.SchemaVersion)
	for i := range applied {
		applied[i] = i + 1
	}
	for _, want := range []string{"creating keyspace " + ks, "applying migration 1",
		fmt.Sprintf("schema is at version %d (applied %v)", cqlstore.SchemaVersion, applied)} {
		if !strings.Contains(first.String(), want) {
			t.Errorf("first run lacks %q", want)
		}
	}
	if !strings.Contains(second.String(), fmt.Sprintf("up to date at version %d; nothing to do", cqlstore.SchemaVersion)) ||
		strings.Contains(second.String(), "creating") || strings.Contains(second.String(), "applying") {
		t.Errorf("second run was not a no-op:\n%s", &second)
	}
}

// Tests that migrate without hosts, or with a malformed replication, says
// which flag is wrong.
func TestMigrateCommandBadFlags(t *testing.T) {
	var out bytes.Buffer
	err := migrate(t.Context(), nil, &out)
	if err == nil || !strings.Contains(err.Error(), "--cql-hosts is required") {
		t.Errorf("migrate without hosts: %v", err)
	}
	err = migrate(t.Context(), []string{"--cql-hosts", "127.0.0.1", "--replication", "dc1=3"}, &out)
	if err == nil || !strings.Contains(err.Error(), "--replication") || !strings.Contains(err.Error(), "dc:factor") {
		t.Errorf("migrate with a bad replication: %v", err)
	}
}
