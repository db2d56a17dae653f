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
