package client_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/synth"
	"go.uber.org/goleak"
)

const defaultTestTimeout = 60 * time.Second

// server is one real sluice, built by internal/app as `sluice serve`
// builds it, shared by the package's tests and examples.
var server struct {
	addr string
	uris []string // seeded posts, in order
	app  *app.App
}

// Budgets the tests' callers get; "example" keeps the default.
var testBudgets = budget.Config{
	Default: budget.Budget{ItemsPerSecond: 100_000, Burst: 5_000, MaxInflightItems: 5_000},
	Clients: map[string]budget.Budget{
		// Bursts below the method's 1,000 make chunks of 250.
		"paced": {ItemsPerSecond: 2_000, Burst: 250, MaxInflightItems: 1_000},
		"pacer": {ItemsPerSecond: 2_000, Burst: 250, MaxInflightItems: 1_000},
		// Slow to refill, so a drained bucket stays drained for seconds.
		"retrier": {ItemsPerSecond: 100, Burst: 250, MaxInflightItems: 1_000},
	},
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	stop, err := startServer(3000)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client tests: start sluice:", err)
		return 1
	}
	code := m.Run()
	stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// startServer serves n seeded posts. The cache is the memcached that
// scripts/test-deps.sh started when there is one; otherwise an address
// where nothing listens, which sluice skips (a missing cache is never
// fatal), so examples run anywhere.
func startServer(n int) (stop func(), err error) {
	dir, err := os.MkdirTemp("", "sluice-client-test")
	if err != nil {
		return nil, err
	}
	cfg := app.DefaultConfig()
	cfg.DataDir = dir
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Cache.Servers = []string{"127.0.0.1:1"}
	if addr := os.Getenv("SLUICE_TEST_MEMCACHED"); addr != "" {
		cfg.Cache.Servers = []string{addr}
	}
	cfg.Guard.Admission = testBudgets
	cfg.DrainTimeout = time.Second
	a, err := app.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	gen := synth.New(7, 100)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	recs := make([]store.Record, n)
	for i := range recs {
		recs[i] = gen.Next()
		server.uris = append(server.uris, recs[i].URI)
	}
	if err := a.Store.Put(ctx, recs); err != nil {
		return nil, err
	}
	grpcLis, httpLis, err := a.Listen()
	if err != nil {
		return nil, err
	}
	serveCtx, stopServe := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(serveCtx, grpcLis, httpLis) }()
	server.addr, server.app = grpcLis.Addr().String(), a
	return func() {
		stopServe()
		<-done
		a.Close()
		os.RemoveAll(filepath.Clean(dir))
	}, nil
}
