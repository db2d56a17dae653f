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

// Session names one of the store's two driver sessions. Each follows the
// cluster's host-state events on its own, so for a moment after a node
// goes down or comes back the two may disagree.
type Session int

const (
	ReadSession  Session = iota // reads, at the read consistency
	WriteSession                // writes and the journal, at the write consistency
	sessions                    // how many there are
)

func (s Session) String() string {
	if s == WriteSession {
		return "write"
	}
	return "read"
}

// HostStats is one node as the driver sees it: query attempts it
// coordinated, how many failed, and whether each session holds it up.
type HostStats struct {
	Addr    string         // the node's address and native port, as dialed
	Queries int64          // query attempts sent to it, ever
	Errors  int64          // of those, attempts that failed
	UpIn    [sessions]bool // each session's view, by Session: up (true) or down
}

// Up reports whether every session holds the node up.
func (h HostStats) Up() bool {
	for _, up := range h.UpIn {
		if !up {
			return false
		}
	}
	return true
}

// hostTracker counts query attempts per node and follows the driver's
// host-state events of each session. It sits in every session's
// host-selection policy and query observer, so it outlives session
// replacement.
type hostTracker struct {
	mu    sync.Mutex
	hosts map[string]*hostCounters
}

type hostCounters struct {
	queries, errors atomic.Int64
	upIn            [sessions]atomic.Bool
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

func (t *hostTracker) setUp(h *gocql.HostInfo, in Session, up bool) {
	if c := t.host(h); c != nil {
		c.upIn[in].Store(up)
	}
}

// snapshot returns every tracked node, sorted by address.
func (t *hostTracker) snapshot() []HostStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]HostStats, 0, len(t.hosts))
	for addr, c := range t.hosts {
		h := HostStats{Addr: addr, Queries: c.queries.Load(), Errors: c.errors.Load()}
		for i := range c.upIn {
			h.UpIn[i] = c.upIn[i].Load()
		}
		out = append(out, h)
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
	if q.Host != nil && o.t != nil {
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

// hostView is where one session reports what it sees: the tracker
// (nil for a session nobody reads the figures of, such as a schema
// change's), the session's role, and whether its pair has been retired.
// A session pair that has been replaced is retired before it is closed,
// so nothing it reports while closing overwrites the view of the pair
// that replaced it.
type hostView struct {
	t       *hostTracker
	session Session
	retired *atomic.Bool
}

// viewOf is the view of role in t while retired is false.
func viewOf(t *hostTracker, role Session, retired *atomic.Bool) hostView {
	return hostView{t: t, session: role, retired: retired}
}

func (v hostView) setUp(h *gocql.HostInfo, up bool) {
	if v.t == nil || (v.retired != nil && v.retired.Load()) {
		return
	}
	v.t.setUp(h, v.session, up)
}

// watchedPolicy is one session's host-selection policy; it tells the
// session's view of every host the session adds, removes, marks up or
// marks down.
type watchedPolicy struct {
	gocql.HostSelectionPolicy
	view hostView
}

func (p watchedPolicy) AddHost(h *gocql.HostInfo) {
	p.view.setUp(h, true)
	p.HostSelectionPolicy.AddHost(h)
}

func (p watchedPolicy) RemoveHost(h *gocql.HostInfo) {
	p.view.setUp(h, false)
	p.HostSelectionPolicy.RemoveHost(h)
}

func (p watchedPolicy) HostUp(h *gocql.HostInfo) {
	p.view.setUp(h, true)
	p.HostSelectionPolicy.HostUp(h)
}

func (p watchedPolicy) HostDown(h *gocql.HostInfo) {
	p.view.setUp(h, false)
	p.HostSelectionPolicy.HostDown(h)
}
