// Package apptest builds real sluice servers for tests outside package
// app: the embedded store (or one the test supplies) seeded with synthetic
// posts, the memcached the test names (or a private memcached process it
// starts), gRPC and admin HTTP on loopback,
// and a client connected to it — assembled through app.New, as `sluice
// serve` assembles it.
//
// It also counts what the server logs (LineCounter) and reads what tests
// assert on: /metrics families and the process's OS threads. It starts
// one goroutine per server (Serve) and stops it when the test ends. It is
// for tests only; nothing in the serving path imports it.
package apptest

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/promtext"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// DefaultTimeout bounds every context this package hands out.
const DefaultTimeout = 60 * time.Second

// Options describe the server to start. The zero value serves 1,000
// posts from the embedded store through a private memcached.
type Options struct {
	// Memcached is the memcached address sluice uses (a real server or a
	// proxy in front of one). Empty: a private memcached is started
	// (Server.Memcached).
	Memcached string
	// Posts is how many synthetic posts to seed. Default 1,000.
	Posts int
	// Store, when set, replaces the embedded store; the server closes it.
	Store store.Store
	// Configure may change the config after the defaults are set.
	Configure func(*app.Config)
	// DialOptions replace the client's default (plaintext) dial options.
	DialOptions []grpc.DialOption
}

// Server is a running sluice and a client of it.
type Server struct {
	App      *app.App
	Config   app.Config
	Conn     *grpc.ClientConn
	Client   sluicev1.PostRecordsClient
	GRPCAddr string
	AdminURL string
	// MetricsURL is AdminURL's /metrics.
	MetricsURL string
	// Memcached is the private memcached, when Options.Memcached was
	// empty; tests may stop, pause and restart it.
	Memcached *testenv.Memcached
	// Posts are the seeded records; Missing are URIs never stored.
	Posts   []store.Record
	Missing []string
	// URIs are the seeded posts' URIs; URIFile holds them one per line,
	// as `sluice seed --uris-out` writes them.
	URIs    []string
	URIFile string
	// Log counts the lines the server logged.
	Log *LineCounter
	t   testing.TB
}

// Start builds, seeds and serves a sluice, and stops it when the test
// ends, failing the test if serving or closing failed.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	s := &Server{Log: &LineCounter{}, t: t}
	if opts.Memcached == "" {
		s.Memcached = testenv.StartMemcached(t)
		opts.Memcached = s.Memcached.Addr()
	}
	cfg.Cache.Servers = []string{opts.Memcached}
	cfg.DrainTimeout = 2 * time.Second
	// Per-client budgets are tested where they are the subject (package
	// app); elsewhere a test's callers must not be refused by one.
	cfg.Guard.Admission.Default = budget.Budget{ItemsPerSecond: 1e9, Burst: 1e9, MaxInflightItems: 1e9}
	// The adaptive item limit is tested where it is the subject (package
	// guard); here it holds at max_inflight_items, so results do not
	// depend on how busy the machine is.
	cfg.Guard.AdaptiveTolerance = 1e9
	if opts.Configure != nil {
		opts.Configure(&cfg)
	}
	s.Config = cfg
	var appOpts []app.Option
	if opts.Store != nil {
		appOpts = append(appOpts, app.WithStore(opts.Store))
	}
	// The server logs through the same rate-limited, non-blocking handler
	// `sluice serve` uses, so tests count what production would write.
	logs := telemetry.NewLogHandler(s.Log, telemetry.LogConfig{})
	t.Cleanup(func() { _ = logs.CloseWithTimeout() })
	a, err := app.New(cfg, slog.New(logs), appOpts...)
	if err != nil {
		t.Fatalf("apptest: app.New: %v", err)
	}
	s.App = a
	s.seed(cmp.Or(opts.Posts, 1000))
	s.writeURIFile()
	s.serve(opts.DialOptions)
	s.MetricsURL = s.AdminURL + "/metrics"
	return s
}

func (s *Server) seed(n int) {
	s.t.Helper()
	gen := synth.New(42, 200)
	for range n {
		p := gen.Next()
		s.Posts = append(s.Posts, p)
		s.URIs = append(s.URIs, p.URI)
	}
	for range 100 {
		s.Missing = append(s.Missing, gen.MissingURI())
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	for i := 0; i < len(s.Posts); i += 1000 {
		if err := s.App.Store.Put(ctx, s.Posts[i:min(i+1000, len(s.Posts))]); err != nil {
			s.t.Fatalf("apptest: seed: %v", err)
		}
	}
}

// writeURIFile writes the seeded URIs to URIFile, one per line.
func (s *Server) writeURIFile() {
	s.t.Helper()
	s.URIFile = filepath.Join(s.t.TempDir(), "uris.txt")
	if err := os.WriteFile(s.URIFile, []byte(strings.Join(s.URIs, "\n")+"\n"), 0o644); err != nil {
		s.t.Fatalf("apptest: write URIs: %v", err)
	}
}

func (s *Server) serve(dialOpts []grpc.DialOption) {
	s.t.Helper()
	grpcLis, httpLis, err := s.App.Listen()
	if err != nil {
		s.t.Fatalf("apptest: listen: %v", err)
	}
	s.GRPCAddr, s.AdminURL = grpcLis.Addr().String(), "http://"+httpLis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.App.Serve(ctx, grpcLis, httpLis) }()
	if dialOpts == nil {
		dialOpts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	if s.Conn, err = grpc.NewClient(s.GRPCAddr, dialOpts...); err != nil {
		s.t.Fatalf("apptest: dial: %v", err)
	}
	s.Client = sluicev1.NewPostRecordsClient(s.Conn)
	s.t.Cleanup(func() {
		s.Conn.Close()
		cancel()
		if err := <-served; err != nil {
			s.t.Errorf("apptest: Serve: %v", err)
		}
		if err := s.App.Close(); err != nil {
			s.t.Errorf("apptest: Close: %v", err)
		}
	})
}

// Ctx returns a context bounded by DefaultTimeout that names the caller
// client in its metadata.
func (s *Server) Ctx(client string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	s.t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "x-client-id", client)
}

// URIRange returns the URIs of Posts[from:to].
func (s *Server) URIRange(from, to int) []string {
	out := make([]string, 0, to-from)
	for _, p := range s.Posts[from:to] {
		out = append(out, p.URI)
	}
	return out
}

// Warm reads every seeded post once, in batches of batch, so the cache
// holds them all.
func (s *Server) Warm(batch int) {
	s.t.Helper()
	for from := 0; from < len(s.Posts); from += batch {
		to := min(from+batch, len(s.Posts))
		if _, err := s.Client.GetPostRecords(s.Ctx("warmup"), &sluicev1.GetPostRecordsRequest{Uris: s.URIRange(from, to)}); err != nil {
			s.t.Fatalf("apptest: warm up: %v", err)
		}
	}
}

// Metrics scrapes /metrics and returns the families by name.
func (s *Server) Metrics() promtext.Families {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	fams, err := promtext.Scrape(ctx, nil, s.AdminURL+"/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	return fams
}

// LineCounter is an io.Writer that counts the lines written to it and
// keeps the last few, for a test to assert that logging stays bounded.
// It is safe for concurrent use.
type LineCounter struct {
	lines atomic.Int64
	mu    sync.Mutex
	tail  []string
}

var _ io.Writer = (*LineCounter)(nil)

const keptLines = 20

func (c *LineCounter) Write(p []byte) (int, error) {
	n := bytes.Count(p, []byte{'\n'})
	c.lines.Add(int64(n))
	c.mu.Lock()
	for _, line := range strings.SplitAfter(string(p), "\n") {
		if line != "" {
			c.tail = append(c.tail, strings.TrimSuffix(line, "\n"))
		}
	}
	if len(c.tail) > keptLines {
		c.tail = c.tail[len(c.tail)-keptLines:]
	}
	c.mu.Unlock()
	return len(p), nil
}

// Lines reports how many lines were written.
func (c *LineCounter) Lines() int64 { return c.lines.Load() }

// Tail returns the last lines written (at most 20).
func (c *LineCounter) Tail() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.tail...)
}
