package testenv

import (
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is a TCP proxy (toxiproxy, embedded) between a test's client and a
// shared server, so one test can cut its own path to the server without
// disturbing other tests that use the server directly.
type Proxy struct {
	t     testing.TB
	proxy *toxiproxy.Proxy
}

// StartProxy listens on a free loopback port and forwards to upstream
// until the test ends.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "test", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("start proxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{t: t, proxy: p}
}

// Addr is where clients connect.
func (p *Proxy) Addr() string { return p.proxy.Listen }

// Cut closes every proxied connection and refuses new ones, as if the
// server had died.
func (p *Proxy) Cut() { p.proxy.Stop() }

// Restore accepts connections on the same address again.
func (p *Proxy) Restore() {
	p.t.Helper()
	if err := p.proxy.Start(); err != nil {
		p.t.Fatalf("restore proxy on %s: %v", p.proxy.Listen, err)
	}
}
