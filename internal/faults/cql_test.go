package faults

import (
	"os"
	"testing"
	"time"

	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// newCQLStore opens the CQL store whose only contact point is addr (a
// toxiproxy listener). It is nil until internal/store/cqlstore exists;
// wiring it is one assignment, e.g.
//
//	func init() { newCQLStore = func(t *testing.T, addr string) store.Store { … cqlstore.Open(ctx, cfg) … } }
//
// where cfg must keep every connection on addr — gocql's
// DisableInitialHostLookup, or an AddressTranslator mapping the node's
// broadcast address to addr — or the driver would discover the node's
// real address and go around the proxy.
var newCQLStore func(t *testing.T, addr string) store.Store

// openCQLBehindProxy puts toxiproxy between sluice and the Cassandra at
// CASSANDRA_ADDR.
func openCQLBehindProxy(t *testing.T) breakableStore {
	t.Helper()
	if newCQLStore == nil {
		t.Skip("skipping: the CQL store backend (internal/store/cqlstore) is not built yet; these scenarios run against it through toxiproxy once newCQLStore is set")
	}
	addr := os.Getenv("CASSANDRA_ADDR")
	if addr == "" {
		testenv.Missing(t, "Cassandra", "CASSANDRA_ADDR is not set")
	}
	p := proxyTo(t, addr)
	return &proxiedStore{st: newCQLStore(t, p.Listen), proxy: p}
}

// proxiedStore breaks a network store at its proxy.
type proxiedStore struct {
	st    store.Store
	proxy *toxiclient.Proxy
}

func (p *proxiedStore) Backend() store.Store { return p.st }

// Down refuses connections and closes the open ones.
func (p *proxiedStore) Down(t *testing.T) { must(t, p.proxy.Disable()) }

// Slow delays every answer by longer than any method timeout.
func (p *proxiedStore) Slow(t *testing.T) {
	rewire(t, p.proxy, toxic{"store-slow", "latency", "downstream", 1, toxiclient.Attributes{"latency": int((5 * time.Second).Milliseconds())}})
}

// Heal puts back a plain, enabled link.
func (p *proxiedStore) Heal(t *testing.T) { rewire(t, p.proxy) }
