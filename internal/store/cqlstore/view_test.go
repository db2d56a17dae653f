package cqlstore

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/gocql/gocql"
)

// Tests that a session pair that has been replaced no longer moves the
// host view: a node the old pair reports down while it shuts down stays
// up as the pair that replaced it sees it, and the live pair's own
// reports still count.
func TestRetiredSessionsLeaveTheViewAlone(t *testing.T) {
	var hosts hostTracker
	node := (&gocql.HostInfo{}).SetConnectAddress(net.ParseIP("127.0.0.2"))
	old, fresh := new(atomic.Bool), new(atomic.Bool)
	policies := func(retired *atomic.Bool) []watchedPolicy {
		var out []watchedPolicy
		for _, role := range []Session{ReadSession, WriteSession} {
			out = append(out, watchedPolicy{HostSelectionPolicy: gocql.RoundRobinHostPolicy(), view: viewOf(&hosts, role, retired)})
		}
		return out
	}
	oldPair, freshPair := policies(old), policies(fresh)
	for _, p := range append(oldPair, freshPair...) {
		p.AddHost(node)
	}
	old.Store(true) // sessionPair.close, before the sessions close
	for _, p := range oldPair {
		p.HostDown(node)
		p.RemoveHost(node)
	}
	if got := hosts.snapshot(); len(got) != 1 || !got[0].Up() {
		t.Fatalf("after the retired pair reported the node down: %+v, want one node, up in both sessions", got)
	}
	freshPair[ReadSession].HostDown(node)
	got := hosts.snapshot()
	if len(got) != 1 || got[0].UpIn[ReadSession] || !got[0].UpIn[WriteSession] {
		t.Fatalf("after the live read session reported the node down: %+v, want down in the read session only", got)
	}
}
