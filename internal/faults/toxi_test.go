package faults

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/rs/zerolog"
	"github.com/sluice-dev/sluice/internal/testenv"
	"go.uber.org/goleak"
)

// toxi is the client of the toxiproxy server TestMain runs in-process.
var toxi *toxiclient.Client

func TestMain(m *testing.M) {
	addr, err := startToxiproxy()
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
	toxi = toxiclient.NewClient(addr)
	code := m.Run()
	http.DefaultClient.CloseIdleConnections()
	// toxiproxy's API server has no shutdown, and v2.5.0 leaves the pipes
	// of a link whose peer stopped reading blocked after its proxy is
	// deleted. gocql answers another client's schema change (other suites
	// create keyspaces on the shared Cassandra) with a goroutine that
	// polls for schema agreement until MaxWaitSchemaAgreement even after
	// its session is closed. Those are the only goroutines allowed to stay.
	if err := goleak.Find(
		goleak.IgnoreAnyFunction("github.com/gocql/gocql.(*Session).handleSchemaEvent"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ApiServer).Listen"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).write"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "faults: goroutines leaked:", err)
		code = 1
	}
	os.Exit(code)
}

// startToxiproxy serves toxiproxy's HTTP API on a free loopback port and
// returns its address once it answers.
func startToxiproxy() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	go srv.Listen("127.0.0.1", port)
	addr := net.JoinHostPort("127.0.0.1", port)
	if err := testenv.WaitTCP(addr, 10*time.Second); err != nil {
		return "", fmt.Errorf("toxiproxy API: %w", err)
	}
	return addr, nil
}

// proxyTo creates a toxiproxy proxy on a free loopback port in front of
// upstream and deletes it when the test ends.
func proxyTo(t *testing.T, upstream string) *toxiclient.Proxy {
	t.Helper()
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	p, err := toxi.CreateProxy(name, "127.0.0.1:0", upstream)
	if err != nil {
		t.Fatalf("toxiproxy: create proxy to %s: %v", upstream, err)
	}
	t.Cleanup(func() {
		if err := p.Delete(); err != nil {
			t.Errorf("toxiproxy: delete proxy: %v", err)
		}
	})
	return p
}

// toxic is a toxic to put on a proxy.
type toxic struct {
	name, typ, stream string
	toxicity          float32
	attrs             toxiclient.Attributes
}

// rewire replaces p by a proxy on the same address and upstream that
// carries toxics from its first connection: the old proxy and its
// connections are closed, the new one is created disabled, given its
// toxics, then enabled. sluice sees its connections drop and redials
// into the fault (or, with no toxics, into a healthy link).
//
// Toxics are never added to live connections: toxiproxy v2.5.0 (the
// newest the module proxy serves here) deadlocks adding a toxic to a link
// whose client closed while data was in flight — its pipe stays blocked
// and the API call hangs until its 25s timeout.
func rewire(t *testing.T, p *toxiclient.Proxy, toxics ...toxic) *toxiclient.Proxy {
	t.Helper()
	if err := p.Delete(); err != nil {
		t.Fatalf("toxiproxy: delete %s: %v", p.Name, err)
	}
	np := toxi.NewProxy()
	np.Name, np.Listen, np.Upstream, np.Enabled = p.Name, p.Listen, p.Upstream, false
	if err := np.Save(); err != nil {
		t.Fatalf("toxiproxy: recreate %s on %s: %v", p.Name, p.Listen, err)
	}
	for _, tx := range toxics {
		if _, err := np.AddToxic(tx.name, tx.typ, tx.stream, tx.toxicity, tx.attrs); err != nil {
			t.Fatalf("toxiproxy: add %s toxic: %v", tx.typ, err)
		}
	}
	if err := np.Enable(); err != nil {
		t.Fatalf("toxiproxy: enable %s: %v", p.Name, err)
	}
	*p = *np
	return p
}

// soak reports whether the long phases of `make test-faults` were asked
// for.
func soak() bool { return os.Getenv("SLUICE_FAULTS_SOAK") != "" }

// phase scales a scenario phase: as given under `make test`, ten times
// longer under `make test-faults`.
func phase(d time.Duration) time.Duration {
	if soak() {
		return 10 * d
	}
	return d
}
