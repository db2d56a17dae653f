package cqlstore

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/gocql/gocql"
)

// maxTrackedHosts bounds the per-node figures: a cluster larger than this
// is counted in full only for its first maxTrackedHosts nodes.
const maxTrackedHosts = 256

// HostStats is one node as the driver sees it: query attempts it
// coordinated, how many failed, and whether the driver holds it up.
type HostStats struct {
	Addr    string // the node's address and native port, as dialed
	Queries int64  // query attempts sent to it, ever
	Errors  int64  // of those, attempts that failed
	Up      bool   // the driver's view: up (true) or down
}

// hostTracker counts query attempts per node and follows the driver's
// host-state events. It sits in every session's host-selection policy and
// query observer, so it outlives session replacement.
type hostTracker struct {
	mu    sync.Mutex
	hosts map[string]*hostCounters
}

type hostCounters struct {
	queries, errors atomic.Int64
	up              atomic.Bool
}

func hostAddr(h *gocql.HostInfo) string {
	return net.JoinHostPort(h.ConnectAddress().String(), strconv.Itoa(h.Port()))
}

// host returns h's counters, adding them if there is room.
func (t *hostTracker) host(h *gocql.HostInfo) *hostCounters {
	addr := hostAddr(h)
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.hosts[addr]; ok {
		return c
	}
	if t.hosts == nil {
		t.hosts = map[string]*hostCounters{}
	}
	if len(t.hosts) >= maxTrackedHosts {
		return nil
	}
	c := &hostCounters{}
	t.hosts[addr] = c
	return c
}

func (t *hostTracker) setUp(h *gocql.HostInfo, up bool) {
	if c := t.host(h); c != nil {
		c.up.Store(up)
	}
}

// snapshot returns every tracked node, sorted by address.
func (t *hostTracker) snapshot() []HostStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]HostStats, 0, len(t.hosts))
	for addr, c := range t.hosts {
		out = append(out, HostStats{Addr: addr, Queries: c.queries.Load(), Errors: c.errors.Load(), Up: c.up.Load()})
	}
	slices.SortFunc(out, func(a, b HostStats) int {
		if a.Addr < b.Addr {
			return -1
		}
		if a.Addr > b.Addr {
			return 1
		}
		return 0
	})
	return out
}

// observer counts each query attempt against the node that coordinated
// it, then passes the attempt on to next (the config's own observer).
type observer struct {
	t    *hostTracker
	next gocql.QueryObserver
}

func (o observer) ObserveQuery(ctx context.Context, q gocql.ObservedQuery) {
	if q.Host != nil {
		if c := o.t.host(q.Host); c != nil {
			c.queries.Add(1)
			if q.Err != nil {
				c.errors.Add(1)
			}
		}
	}
	if o.next != nil {
		o.next.ObserveQuery(ctx, q)
	}
}

// watchedPolicy is a host-selection policy that tells the tracker of
// every host the driver adds, removes, marks up or marks down.
type watchedPolicy struct {
	gocql.HostSelectionPolicy
	t *hostTracker
}

func (p watchedPolicy) AddHost(h *gocql.HostInfo) {
	p.t.setUp(h, true)
	p.HostSelectionPolicy.AddHost(h)
}

func (p watchedPolicy) RemoveHost(h *gocql.HostInfo) {
	p.t.setUp(h, false)
	p.HostSelectionPolicy.RemoveHost(h)
}

func (p watchedPolicy) HostUp(h *gocql.HostInfo) {
	p.t.setUp(h, true)
	p.HostSelectionPolicy.HostUp(h)
}

func (p watchedPolicy) HostDown(h *gocql.HostInfo) {
	p.t.setUp(h, false)
	p.HostSelectionPolicy.HostDown(h)
}
