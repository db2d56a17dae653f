package cqlstore

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
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

// hostTracker counts query attempts per node. It sits in every
// session's query observer, so its counts outlive session replacement;
// which nodes are up is each session pair's own view (hostStates).
type hostTracker struct {
	mu    sync.Mutex
	hosts map[string]*hostCounters
}

type hostCounters struct {
	queries, errors atomic.Int64
}

func hostAddr(h *gocql.HostInfo) string {
	return net.JoinHostPort(h.ConnectAddress().String(), strconv.Itoa(h.Port()))
}

// host returns the counters of the node at addr, adding them if there is
// room.
func (t *hostTracker) host(addr string) *hostCounters {
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

// snapshot returns every node counted or held by view (the live session
// pair's), sorted by address, each with view's up/down state.
func (t *hostTracker) snapshot(view *hostStates) []HostStats {
	byAddr := map[string]*HostStats{}
	stats := func(addr string) *HostStats {
		h, ok := byAddr[addr]
		if !ok {
			h = &HostStats{Addr: addr}
			byAddr[addr] = h
		}
		return h
	}
	t.mu.Lock()
	for addr, c := range t.hosts {
		h := stats(addr)
		h.Queries, h.Errors = c.queries.Load(), c.errors.Load()
	}
	t.mu.Unlock()
	for addr, up := range view.all() {
		stats(addr).UpIn = up
	}
	out := make([]HostStats, 0, len(byAddr))
	for _, h := range byAddr {
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b HostStats) int { return strings.Compare(a.Addr, b.Addr) })
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
		if c := o.t.host(hostAddr(q.Host)); c != nil {
			c.queries.Add(1)
			// The losing one of a statement's attempt and its
			// speculative attempt ends cancelled: not the node's fault.
			if q.Err != nil && !errors.Is(q.Err, context.Canceled) {
				c.errors.Add(1)
			}
		}
	}
	if o.next != nil {
		o.next.ObserveQuery(ctx, q)
	}
}

// hostStates is one session pair's view of which nodes are up, by
// session, from the host-state events of the pair's own sessions. The
// store reports the view of the pair in use, so a pair that is being
// replaced, or that never went into use (a reopen that failed), cannot
// change what is reported, however late its events arrive.
type hostStates struct {
	mu sync.Mutex
	up map[string][sessions]bool
}

func (v *hostStates) set(addr string, in Session, up bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.up == nil {
		v.up = map[string][sessions]bool{}
	}
	state, ok := v.up[addr]
	if !ok && len(v.up) >= maxTrackedHosts {
		return
	}
	state[in] = up
	v.up[addr] = state
}

// all returns a copy of the view; nil for no view.
func (v *hostStates) all() map[string][sessions]bool {
	if v == nil {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return maps.Clone(v.up)
}

// watchedPolicy is one session's host-selection policy; it records in
// its pair's view every host the session adds, removes, marks up or
// marks down. A session with no view (a schema change's) records
// nothing.
type watchedPolicy struct {
	gocql.HostSelectionPolicy
	// order, when set, picks the nodes of a batch read's group (groups.go)
	// and gets every event the session's policy gets.
	order   gocql.HostSelectionPolicy
	view    *hostStates
	session Session
	rounds  int // passes over the nodes an idempotent statement may make (speculation.go)
}

// each calls f with the session's policy and, when there is one, order.
func (p watchedPolicy) each(f func(gocql.HostSelectionPolicy)) {
	f(p.HostSelectionPolicy)
	if p.order != nil {
		f(p.order)
	}
}

func (p watchedPolicy) Init(s *gocql.Session) {
	p.each(func(h gocql.HostSelectionPolicy) { h.Init(s) })
}

func (p watchedPolicy) SetPartitioner(partitioner string) {
	p.each(func(h gocql.HostSelectionPolicy) { h.SetPartitioner(partitioner) })
}

func (p watchedPolicy) KeyspaceChanged(e gocql.KeyspaceUpdateEvent) {
	p.each(func(h gocql.HostSelectionPolicy) { h.KeyspaceChanged(e) })
}

func (p watchedPolicy) setUp(h *gocql.HostInfo, up bool) {
	if p.view != nil {
		p.view.set(hostAddr(h), p.session, up)
	}
}

func (p watchedPolicy) AddHost(h *gocql.HostInfo) {
	p.setUp(h, true)
	p.each(func(s gocql.HostSelectionPolicy) { s.AddHost(h) })
}

// bulkAdder is a policy that adds many hosts at once, updating its
// replica map once rather than per host; gocql calls it at start when
// the session's policy is one.
type bulkAdder interface{ AddHosts([]*gocql.HostInfo) }

// AddHosts adds hosts at once to each policy that can, one by one to the
// others.
func (p watchedPolicy) AddHosts(hosts []*gocql.HostInfo) {
	for _, h := range hosts {
		p.setUp(h, true)
	}
	p.each(func(s gocql.HostSelectionPolicy) {
		if bulk, ok := s.(bulkAdder); ok {
			bulk.AddHosts(hosts)
			return
		}
		for _, h := range hosts {
			s.AddHost(h)
		}
	})
}

func (p watchedPolicy) RemoveHost(h *gocql.HostInfo) {
	p.setUp(h, false)
	p.each(func(s gocql.HostSelectionPolicy) { s.RemoveHost(h) })
}

func (p watchedPolicy) HostUp(h *gocql.HostInfo) {
	p.setUp(h, true)
	p.each(func(s gocql.HostSelectionPolicy) { s.HostUp(h) })
}

func (p watchedPolicy) HostDown(h *gocql.HostInfo) {
	p.setUp(h, false)
	p.each(func(s gocql.HostSelectionPolicy) { s.HostDown(h) })
}
