package cqlstore

import (
	"github.com/gocql/gocql"
)

// Groups of a batch read, by replica. A group is one SELECT ... WHERE uri
// IN ?, and its coordinator reads locally only the partitions it holds
// and forwards the rest. So GetMany first sorts the URIs by their
// primary replica in the local datacenter (the first replica the ring
// gives for the URI's token, as a token-aware policy without shuffling
// sees it), then cuts each primary's URIs into groups of ReadGroup, and
// the read session sends a group read to that primary first (Pick), the
// other replicas of its first URI after it. Every partition of a group
// is then on its coordinator while the primary is up, on a cluster of
// any size. On a cluster where every node holds every partition (as many
// nodes as replicas) the split costs little: a batch makes at most one
// group more per node.
//
// primaryFirst is that unshuffled policy. Each session keeps its own
// instance (gocql refuses to share one), kept up to date with the same
// host, keyspace and partitioner events as the session's own policy
// (watchedPolicy forwards them).

// newPrimaryFirst returns the policy that offers a statement's replicas
// in the local datacenter in ring order, the primary first.
func newPrimaryFirst(dc string) gocql.HostSelectionPolicy {
	return gocql.TokenAwareHostPolicy(gocql.DCAwareRoundRobinPolicy(dc))
}

// isGroupRead reports whether q is a batch read's group: those go to
// their primary replica first.
func isGroupRead(q gocql.ExecutableQuery) bool {
	gq, ok := q.(*gocql.Query)
	return ok && gq.Statement() == selectRecords
}

// primaries returns a function that gives the ID of the node order
// would send a read of a URI to first: its primary replica in the local
// datacenter while that node is up, else its first live replica there.
// Without the ring or the keyspace's replicas (right after the session
// opened) order falls back to round robin, and the URIs land in groups
// by whichever node it offers: smaller groups, each read where the
// coordinator finds its partitions. "" means no node is up. The
// function reuses one query for every URI, so it must not be called
// after release, nor concurrently.
func primaries(session *gocql.Session, order gocql.HostSelectionPolicy) (primary func(uri string) string, release func()) {
	q := session.Query(selectRecord)
	return func(uri string) string {
		q.RoutingKey([]byte(uri))
		if h := order.Pick(q)(); h != nil && h.Info() != nil {
			return h.Info().HostID()
		}
		return ""
	}, q.Release
}

// readGroups cuts uris into the groups GetMany reads. Groups of one, or
// fewer than two URIs, need no replica found, so no lookup is made for
// them.
func (s *Store) readGroups(uris []string) [][]string {
	if s.cfg.ReadGroup == 1 || len(uris) < 2 {
		return groupsOf(uris, s.cfg.ReadGroup, func(string) string { return "" })
	}
	pair := s.sessions.Load()
	primary, release := primaries(pair.read, pair.order)
	defer release()
	return groupsOf(uris, s.cfg.ReadGroup, primary)
}

// groupsOf cuts uris into groups of at most size that share a primary
// (primary maps a URI to it), keeping the order of uris within a group
// and the order of first appearance between primaries.
func groupsOf(uris []string, size int, primary func(string) string) [][]string {
	var byPrimary [][]string
	at := map[string]int{} // primary → its index in byPrimary
	for _, uri := range uris {
		p := primary(uri)
		i, ok := at[p]
		if !ok {
			i = len(byPrimary)
			at[p] = i
			byPrimary = append(byPrimary, nil)
		}
		byPrimary[i] = append(byPrimary[i], uri)
	}
	var groups [][]string
	for _, same := range byPrimary {
		for lo := 0; lo < len(same); lo += size {
			groups = append(groups, same[lo:min(len(same), lo+size)])
		}
	}
	return groups
}
