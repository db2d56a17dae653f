package cqlstore

import (
	"fmt"
	"slices"
	"testing"

	"github.com/gocql/gocql"
)

// Tests that a batch read's URIs are cut into groups that each share a
// primary replica and hold at most the group size, in the order asked.
func TestGroupsShareAPrimary(t *testing.T) {
	var uris []string
	primaries := map[string]string{}
	for i := range 23 {
		uri := fmt.Sprintf("u%02d", i)
		uris = append(uris, uri)
		primaries[uri] = []string{"a", "b", "c"}[i%3] // a b c a b c …
	}
	groups := groupsOf(uris, 4, func(u string) string { return primaries[u] })
	var got []string
	for _, g := range groups {
		if len(g) == 0 || len(g) > 4 {
			t.Errorf("group %v: %d URIs, want 1..4", g, len(g))
		}
		for _, u := range g {
			if primaries[u] != primaries[g[0]] {
				t.Errorf("group %v mixes primaries %s and %s", g, primaries[g[0]], primaries[u])
			}
		}
		if !slices.IsSorted(g) {
			t.Errorf("group %v is not in the order asked", g)
		}
		got = append(got, g...)
	}
	slices.Sort(got)
	if !slices.Equal(got, uris) {
		t.Errorf("the groups hold %v, want each of %v once", got, uris)
	}
	// 8 URIs on a, 8 on b, 7 on c: 2 + 2 + 2 groups.
	if len(groups) != 6 {
		t.Errorf("%d groups, want 6: %v", len(groups), groups)
	}
}

// namedPolicy offers one named node.
type namedPolicy struct {
	gocql.HostSelectionPolicy
	name string
}

func (p namedPolicy) Pick(gocql.ExecutableQuery) gocql.NextHost { return listOf(p.name) }

// Tests that a batch read's group is offered the primary-first policy's
// nodes and every other statement the session's own.
func TestGroupReadsGoToTheirPrimary(t *testing.T) {
	p := watchedPolicy{HostSelectionPolicy: namedPolicy{name: "shuffled"}, order: namedPolicy{name: "primary"}, rounds: 1}
	for _, c := range []struct {
		stmt, want string
	}{
		{selectRecords, "primary"},
		{selectRecord, "shuffled"},
		{insertRecord, "shuffled"},
	} {
		q := (&gocql.Session{}).Query(c.stmt)
		if got := drain(p.Pick(q), 1); got != c.want {
			t.Errorf("%q offered %s, want %s", c.stmt, got, c.want)
		}
	}
}

// recordingPolicy records the events it gets, by name.
type recordingPolicy struct {
	gocql.HostSelectionPolicy
	got *[]string
}

func (r recordingPolicy) Init(*gocql.Session)   { *r.got = append(*r.got, "Init") }
func (r recordingPolicy) SetPartitioner(string) { *r.got = append(*r.got, "SetPartitioner") }
func (r recordingPolicy) KeyspaceChanged(gocql.KeyspaceUpdateEvent) {
	*r.got = append(*r.got, "KeyspaceChanged")
}
func (r recordingPolicy) AddHost(*gocql.HostInfo)    { *r.got = append(*r.got, "AddHost") }
func (r recordingPolicy) AddHosts([]*gocql.HostInfo) { *r.got = append(*r.got, "AddHosts") }
func (r recordingPolicy) RemoveHost(*gocql.HostInfo) { *r.got = append(*r.got, "RemoveHost") }
func (r recordingPolicy) HostUp(*gocql.HostInfo)     { *r.got = append(*r.got, "HostUp") }
func (r recordingPolicy) HostDown(*gocql.HostInfo)   { *r.got = append(*r.got, "HostDown") }

// Tests that the primary-first policy gets every event the session's
// policy gets, so it knows the same ring, keyspaces and live nodes.
func TestOrderPolicyGetsTheSessionsEvents(t *testing.T) {
	var session, order []string
	p := watchedPolicy{HostSelectionPolicy: recordingPolicy{got: &session}, order: recordingPolicy{got: &order}}
	var gp gocql.HostSelectionPolicy = p
	gp.Init(nil)
	gp.SetPartitioner("org.apache.cassandra.dht.Murmur3Partitioner")
	gp.KeyspaceChanged(gocql.KeyspaceUpdateEvent{})
	h := &gocql.HostInfo{}
	gp.AddHost(h)
	gp.(bulkAdder).AddHosts([]*gocql.HostInfo{h})
	gp.HostDown(h)
	gp.HostUp(h)
	gp.RemoveHost(h)
	want := []string{"Init", "SetPartitioner", "KeyspaceChanged", "AddHost", "AddHosts", "HostDown", "HostUp", "RemoveHost"}
	if !slices.Equal(session, want) || !slices.Equal(order, want) {
		t.Errorf("events: session's policy %v, primary-first %v; want both %v", session, order, want)
	}
}
