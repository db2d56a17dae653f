// Package appview_test proves that sluice is a drop-in data plane for the
// AT Protocol AppView's record reads: it starts a seeded sluice (built by
// internal/app, as `sluice serve` builds it, with a private memcached) and
// runs appview.test.mjs under Node's test runner, which calls bsky.Service
// with the AppView's own client stack. The npm packages come from
// package-lock.json, installed by scripts/appview-deps.sh (make test runs
// it through scripts/test-deps.sh up).
package appview_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/testenv"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

const defaultTestTimeout = 2 * time.Minute

// summary matches the end of the Node test report when all ten tests
// ran and passed, so a test deleted or skipped in the .mjs file shows.
var summary = regexp.MustCompile(`(?m)\btests 10\n.*\n.*\bpass 10\n.*\bfail 0\n`)

// fixture is what the Node test reads: where sluice listens and what was
// seeded.
type fixture struct {
	GRPCURL    string   `json:"grpcUrl"`
	MetricsURL string   `json:"metricsUrl"`
	Posts      []seeded `json:"posts"`
	Missing    []string `json:"missing"`
	Likes      []seeded `json:"likes"`
	Profile    seeded   `json:"profile"`
}

type seeded struct {
	URI       string    `json:"uri"`
	CID       string    `json:"cid"`
	JSON      string    `json:"json"`
	CreatedAt time.Time `json:"createdAt"`
}

// Tests sluice's bsky.Service through the AppView's client stack:
// connect-es over an HTTP/2 gRPC transport, named by x-atlantis-caller.
func TestAppViewClient(t *testing.T) {
	node := nodeBinary(t)
	requirePackages(t)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	fx := serve(t, ctx)
	path := filepath.Join(t.TempDir(), "fixture.json")
	raw, err := json.Marshal(fx)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "appview.test.mjs")
	cmd.Env = append(os.Environ(), "SLUICE_APPVIEW_FIXTURE="+path, "NO_COLOR=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("node --test appview.test.mjs:\n%s", out.String())
	if err != nil {
		t.Fatalf("the AppView client tests failed: %v", err)
	}
	if !summary.MatchString(out.String()) {
		t.Errorf("want 10 passing Node tests and none failing; see the output above")
	}
}

// nodeBinary finds node, failing under make test and in CI when absent.
func nodeBinary(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node", "install Node.js 18 or later; scripts/appview-deps.sh installs it with apt")
	}
	return node
}

// requirePackages checks that npm installed the locked packages.
func requirePackages(t *testing.T) {
	t.Helper()
	for _, pkg := range []string{"@connectrpc/connect", "@connectrpc/connect-node", "@bufbuild/protobuf", "@atproto/api"} {
		if _, err := os.Stat(filepath.Join("node_modules", pkg, "package.json")); err != nil {
			testenv.Missing(t, "npm package "+pkg, "run scripts/appview-deps.sh (npm ci in test/appview)")
		}
	}
}

// serve seeds and starts a sluice that lists the AppView's caller name,
// "appview", as a metrics client, and stops it when the test ends.
func serve(t *testing.T, ctx context.Context) fixture {
	t.Helper()
	mc := testenv.StartMemcached(t)
	cfg := app.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Cache.Servers = []string{mc.Addr()}
	cfg.Telemetry.Clients = []string{"appview"}
	cfg.DrainTimeout = 2 * time.Second
	a, err := app.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	fx := seed(t, ctx, a.Store)
	grpcLis, httpLis, err := a.Listen()
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	serveCtx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.Serve(serveCtx, grpcLis, httpLis) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	fx.GRPCURL = "http://" + grpcLis.Addr().String()
	fx.MetricsURL = "http://" + httpLis.Addr().String() + "/metrics"
	return fx
}

// seed stores 60 posts (replies, images and videos among them), three
// likes and a profile.
func seed(t *testing.T, ctx context.Context, st store.Store) fixture {
	t.Helper()
	gen := synth.New(7, 40)
	var fx fixture
	var recs []store.Record
	add := func(r store.Record) seeded {
		recs = append(recs, r)
		return seeded{URI: r.URI, CID: r.CID, JSON: string(r.JSON), CreatedAt: r.CreatedAt}
	}
	for range 60 {
		fx.Posts = append(fx.Posts, add(gen.Next()))
	}
	for range 3 {
		fx.Likes = append(fx.Likes, add(gen.NextIn(synth.LikeCollection)))
	}
	fx.Profile = add(gen.NextIn(synth.ProfileCollection))
	fx.Missing = []string{gen.MissingURI()}
	if err := st.Put(ctx, recs); err != nil {
		t.Fatalf("seed: %v", err)
	}
	return fx
}

// Tests that the committed JavaScript in gen/ is what the pinned
// generators make from proto/bsky now, so the Node test never calls a
// stale contract (`make generate` rebuilds it).
func TestGeneratedClientIsFresh(t *testing.T) {
	nodeBinary(t)
	buf := filepath.Join("node_modules", ".bin", "buf")
	if _, err := os.Stat(buf); err != nil {
		testenv.Missing(t, "npm package @bufbuild/buf", "run scripts/appview-deps.sh (npm ci in test/appview)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	tmp := t.TempDir()
	if out, err := exec.CommandContext(ctx, buf, "generate", "--output", tmp).CombinedOutput(); err != nil {
		t.Fatalf("buf generate: %v\n%s", err, out)
	}
	for _, dir := range []string{filepath.Join("gen", "bsky"), filepath.Join("gen", "sluice", "v1")} {
		fresh, err := filepath.Glob(filepath.Join(tmp, dir, "*"))
		if err != nil || len(fresh) == 0 {
			t.Fatalf("buf generate wrote nothing under %s (%v)", filepath.Join(tmp, dir), err)
		}
		for _, f := range fresh {
			compareGenerated(t, f, filepath.Join(dir, filepath.Base(f)))
		}
	}
}

// compareGenerated fails the test when the committed file differs from
// the freshly generated one.
func compareGenerated(t *testing.T, fresh, committed string) {
	t.Helper()
	want, err := os.ReadFile(fresh)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(committed); err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s is stale or missing (%v); run make generate", committed, err)
	}
}
