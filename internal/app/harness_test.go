package app

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/promtext"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"github.com/sluice-dev/sluice/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

const defaultTestTimeout = 60 * time.Second

// unlimited is a budget no test client reaches.
var unlimited = budget.Budget{ItemsPerSecond: 1e9, Burst: 1e9, MaxInflightItems: 1e9}

// testServer is a real sluice — embedded store, real memcached, gRPC and
// admin HTTP on loopback — built through New, as `sluice serve` builds it.
type testServer struct {
	t         *testing.T
	app       *App
	memcached *testenv.Memcached
	conn      *grpc.ClientConn
	client    sluicev1.PostRecordsClient
	adminURL  string
	posts     []store.Record
	missing   []string
}

// serverSetup is what a serverOption may change before New.
type serverSetup struct {
	log  *slog.Logger
	opts []Option
}

// serverOption adjusts how startServer builds the App.
type serverOption func(*serverSetup)

// withLogger gives the App log instead of a discarding logger.
func withLogger(log *slog.Logger) serverOption {
	return func(s *serverSetup) { s.log = log }
}

// withAppOptions passes opts to New.
func withAppOptions(opts ...Option) serverOption {
	return func(s *serverSetup) { s.opts = append(s.opts, opts...) }
}

// startServer seeds nPosts synthetic posts and serves them; mutate may
// change the config first.
func startServer(t *testing.T, nPosts int, mutate func(*Config), options ...serverOption) *testServer {
	t.Helper()
	setup := serverSetup{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range options {
		o(&setup)
	}
	mc := testenv.StartMemcached(t)
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Cache.Servers = []string{mc.Addr()}
	cfg.DrainTimeout = 2 * time.Second
	// The load generators and the warm-up are one caller each driving the
	// whole server; budgets are tested on their own.
	cfg.Guard.Admission.Clients = map[string]budget.Budget{"load": unlimited, "warmup": unlimited}
	// The adaptive item limit is tested where it is the subject (package
	// guard); here it holds at max_inflight_items, so results do not
	// depend on how busy the machine is.
	cfg.Guard.AdaptiveTolerance = 1e9
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := New(cfg, setup.log, setup.opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := &testServer{t: t, app: a, memcached: mc}
	ts.seed(nPosts)
	grpcLis, httpLis, err := a.Listen()
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, grpcLis, httpLis) }()
	ts.adminURL = "http://" + httpLis.Addr().String()
	ts.conn, err = grpc.NewClient(grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	ts.client = sluicev1.NewPostRecordsClient(ts.conn)
	t.Cleanup(func() {
		ts.conn.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	ts.waitCaughtUp()
	return ts
}

// waitCaughtUp waits until Serve's start-up journal replay has trusted
// memcached, so that tests see a server as it serves.
func (ts *testServer) waitCaughtUp() {
	ts.t.Helper()
	f := ts.app.Follower
	for deadline := time.Now().Add(defaultTestTimeout); f != nil; time.Sleep(5 * time.Millisecond) {
		if f.Stats().Replays > 0 && len(ts.app.Cache.Suspects()) == 0 {
			return
		}
		if time.Now().After(deadline) {
			ts.t.Fatalf("the start-up journal replay did not trust memcached within %v: %+v", defaultTestTimeout, f.Stats())
		}
	}
}

func (ts *testServer) seed(n int) {
	ts.t.Helper()
	gen := synth.New(42, 200)
	for range n {
		ts.posts = append(ts.posts, gen.Next())
	}
	for range 100 {
		ts.missing = append(ts.missing, gen.MissingURI())
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	ctx = fanout.WithLimit(ctx, 32) // the CQL store writes one statement per record
	for i := 0; i < len(ts.posts); i += 1000 {
		if err := ts.app.Store.Put(ctx, ts.posts[i:min(i+1000, len(ts.posts))]); err != nil {
			ts.t.Fatalf("seed: %v", err)
		}
	}
}

// ctx returns a context with the test timeout, naming the caller.
func (ts *testServer) ctx(client string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	ts.t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "x-client-id", client)
}

// metrics scrapes /metrics and returns the families by name.
func (ts *testServer) metrics() promtext.Families {
	ts.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	fams, err := promtext.Scrape(ctx, nil, ts.adminURL+"/metrics")
	if err != nil {
		ts.t.Fatal(err)
	}
	return fams
}

// uris returns the URIs of posts[from:to].
func (ts *testServer) uris(from, to int) []string {
	out := make([]string, 0, to-from)
	for _, p := range ts.posts[from:to] {
		out = append(out, p.URI)
	}
	return out
}

// osThreads reads this process's thread count as the kernel counts it.
func osThreads(t *testing.T) int {
	t.Helper()
	n, err := telemetry.OSThreads()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// skipUnderRace skips a test whose assertions are latency figures when
// the race detector is on; `make test` runs it again without -race.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("latency figures are measured in the non-race pass of make test (make test-timing)")
	}
}
