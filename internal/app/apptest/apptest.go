// Package apptest starts a real sluice for tests outside package app:
// the embedded store seeded with synthetic posts, a private memcached
// process, and gRPC and admin HTTP on loopback ports — built through
// app.New, as `sluice serve` builds it. It refuses to fake anything:
// without a memcached binary the test is skipped or failed by the rule of
// package testenv.
package apptest

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/testenv"
	"golang.org/x/sync/errgroup"
)

// Options shape the server.
type Options struct {
	// Posts is how many synthetic posts to seed. Default 2000.
	Posts int
	// Configure may change the config before the server is built.
	Configure func(*app.Config)
}

// Server is a running sluice.
type Server struct {
	App       *app.App
	Config    app.Config
	Memcached *testenv.Memcached
	// GRPCAddr and AdminURL are where it serves; MetricsURL is its
	// /metrics.
	GRPCAddr, AdminURL, MetricsURL string
	// URIs are the seeded posts' URIs; URIFile holds them one per line,
	// as `sluice seed --uris-out` writes them.
	URIs    []string
	URIFile string
}

// Start seeds, builds and serves a sluice until the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Posts == 0 {
		opts.Posts = 2000
	}
	mc := testenv.StartMemcached(t)
	cfg := app.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Cache.Servers = []string{mc.Addr()}
	cfg.DrainTimeout = 2 * time.Second
	if opts.Configure != nil {
		opts.Configure(&cfg)
	}
	a, err := app.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("apptest: app.New: %v", err)
	}
	s := &Server{App: a, Config: cfg, Memcached: mc}
	s.seed(t, opts.Posts)
	grpcLis, httpLis, err := a.Listen()
	if err != nil {
		a.Close()
		t.Fatalf("apptest: %v", err)
	}
	s.GRPCAddr = grpcLis.Addr().String()
	s.AdminURL = "http://" + httpLis.Addr().String()
	s.MetricsURL = s.AdminURL + "/metrics"
	ctx, cancel := context.WithCancel(context.Background())
	g := new(errgroup.Group)
	g.SetLimit(1)
	g.Go(func() error { return a.Serve(ctx, grpcLis, httpLis) })
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("apptest: Serve: %v", err)
		}
		if err := a.Close(); err != nil {
			t.Errorf("apptest: Close: %v", err)
		}
	})
	return s
}

// seed writes n synthetic posts to the store and their URIs to URIFile.
func (s *Server) seed(t testing.TB, n int) {
	t.Helper()
	gen := synth.New(42, 200)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for done := 0; done < n; {
		recs := make([]store.Record, 0, 1000)
		for range min(1000, n-done) {
			recs = append(recs, gen.Next())
		}
		if err := s.App.Store.Put(ctx, recs); err != nil {
			t.Fatalf("apptest: seed: %v", err)
		}
		for _, r := range recs {
			s.URIs = append(s.URIs, r.URI)
		}
		done += len(recs)
	}
	s.URIFile = filepath.Join(t.TempDir(), "uris.txt")
	f, err := os.Create(s.URIFile)
	if err != nil {
		t.Fatalf("apptest: %v", err)
	}
	w := bufio.NewWriter(f)
	for _, u := range s.URIs {
		w.WriteString(u + "\n")
	}
	if err := w.Flush(); err != nil {
		t.Fatalf("apptest: write URIs: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("apptest: write URIs: %v", err)
	}
}
