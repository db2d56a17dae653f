package cqlstore

import (
	"net"
	"testing"

	"github.com/gocql/gocql"
)

// policiesOf are the host-selection policies of a session pair whose
// host view is view: one per session, as openSessions builds them.
func policiesOf(view *hostStates) [sessions]watchedPolicy {
	var out [sessions]watchedPolicy
	for role := range out {
		out[role] = watchedPolicy{HostSelectionPolicy: gocql.RoundRobinHostPolicy(), view: view, session: Session(role)}
	}
	return out
}

// Tests that the reported host view is the live session pair's: a pair
// that was replaced, or one whose opening failed after its sessions had
// seen the nodes, cannot mark a node down in it however late its events
// come, while the live pair's own events still count, per session.
func TestHostViewIsTheLivePairs(t *testing.T) {
	var counts hostTracker
	node := (&gocql.HostInfo{}).SetConnectAddress(net.ParseIP("127.0.0.2"))
	addr := hostAddr(node)
	counts.host(addr).queries.Add(3) // queries counted across pairs
	live, replaced, failed := &hostStates{}, &hostStates{}, &hostStates{}
	for _, view := range []*hostStates{replaced, live, failed} {
		for _, p := range policiesOf(view) {
			p.AddHost(node)
		}
	}
	for _, view := range []*hostStates{replaced, failed} {
		for _, p := range policiesOf(view) {
			p.HostDown(node)
			p.RemoveHost(node)
		}
	}
	got := counts.snapshot(live)
	if len(got) != 1 || got[0].Addr != addr || !got[0].Up() || got[0].Queries != 3 {
		t.Fatalf("after other pairs reported the node down: %+v, want %s up in both sessions with 3 queries", got, addr)
	}
	policiesOf(live)[ReadSession].HostDown(node)
	got = counts.snapshot(live)
	if len(got) != 1 || got[0].UpIn[ReadSession] || !got[0].UpIn[WriteSession] {
		t.Fatalf("after the live read session reported the node down: %+v, want it down in the read session only", got)
	}
	if got := counts.snapshot(replaced); len(got) != 1 || got[0].UpIn != [sessions]bool{} {
		t.Errorf("the replaced pair's own view: %+v, want the node down in both sessions", got)
	}
}
