//go:build cluster

package cluster

import (
	"cmp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gocql/gocql"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// TestTokenAwareRouting reads every post of a keyspace at replication
// factor 1 once through sluice (a cold cache, so every read reaches the
// store) and asks the nodes what happened. With one replica per partition,
// a token-aware driver sends each read to the node that owns it, which
// answers from its own data: the nodes exchange no messages for them. A
// driver that spread reads round robin would have each coordinator forward
// about two thirds of its reads to the owner (a request and a response
// each), about 1.3 internode messages per read. The nodes' own message
// counts (system_views.internode_outbound) are compared over the read
// window and an idle window of the same length just before it (gossip
// only). The nodes' shares of the reads follow the token ranges they own
// (a third each: the tokens are spread evenly).
func TestTokenAwareRouting(t *testing.T) {
	ks := newKeyspace(t, "sluice_cluster_rf1", 1, 1200)
	mc := testenv.StartMemcached(t)
	r := startReplica(t, ks, []string{mc.Addr()})
	coordBefore := coordinatorReads(t, ks)
	msgs0 := internodeMessages(t, ks.hosts)
	start := time.Now()
	readSeeded(t.Fatalf, r, ks.uris, 50)
	window := time.Since(start)
	msgs1 := internodeMessages(t, ks.hosts)
	time.Sleep(window)
	msgs2 := internodeMessages(t, ks.hosts)
	coordAfter := coordinatorReads(t, ks)

	reads := float64(len(ks.uris))
	extra := (msgs1 - msgs0) - (msgs2 - msgs1)
	figure(t, "RF 1: internode messages per read beyond gossip", "%.2f (%.0f in the read window, %.0f in an idle window of the same %v)", extra/reads, msgs1-msgs0, msgs2-msgs1, window.Round(time.Millisecond))
	if extra > 0.2*reads {
		t.Errorf("%.0f internode messages beyond gossip for %.0f reads: reads were forwarded between nodes, not sent to the replica that owns them", extra, reads)
	}
	var total float64
	for i := range ks.hosts {
		total += coordAfter[i] - coordBefore[i]
	}
	if total < reads {
		t.Fatalf("the nodes coordinated %.0f reads for %.0f posts read from a cold cache", total, reads)
	}
	for i, h := range ks.hosts {
		share := (coordAfter[i] - coordBefore[i]) / total
		figure(t, "RF 1: reads coordinated by "+h, "%.0f%%", 100*share)
		if share < 0.2 || share > 0.47 {
			t.Errorf("node %s coordinated %.2f of the reads, want about a third (the share of the ring it owns)", h, share)
		}
	}
}

// internodeMessages is the sum over the nodes of the messages each has
// sent to its peers (system_views.internode_outbound), ever.
func internodeMessages(t *testing.T, hosts []string) float64 {
	t.Helper()
	var n float64
	for _, h := range hosts {
		s := session(t, []string{h}, gocql.One)
		it := s.Query(`SELECT sent_count FROM system_views.internode_outbound`).Iter()
		var c int64
		for it.Scan(&c) {
			n += float64(c)
		}
		if err := it.Close(); err != nil {
			t.Fatalf("internode messages of %s: %v", h, err)
		}
		s.Close()
	}
	return n
}

// TestGroupReadsGoToTheirPrimary reads, through sluice from a cold cache,
// only the posts whose primary replica (the first node the ring gives for
// their token) is one node, on a keyspace at replication factor 3. Every
// node holds every partition, so any node could answer; sluice groups a
// batch's misses by primary replica and sends each group to that primary
// first (cqlstore's groups.go), so that one node coordinates the reads.
// A driver that shuffled the replicas, as sluice's point reads do, would
// spread the groups over the three nodes (the primary coordinated 47 of
// 307 reads when group reads were sent that way). The primary is worked out here
// from the nodes' own tokens and Cassandra's token() of each key, not by
// sluice's code; the counts are the nodes' own.
func TestGroupReadsGoToTheirPrimary(t *testing.T) {
	ks := newKeyspace(t, "sluice_cluster_rf3_primary", 3, 900)
	owner := primaryOf(t, ks)
	p, mine := mostOwned(owner, ks)
	figure(t, "RF 3: posts whose primary is "+ks.hosts[p], "%d of %d", len(mine), len(ks.uris))
	if len(mine) < len(ks.uris)/5 {
		t.Fatalf("node %s is the primary of %d of %d posts; the ring's tokens are not spread evenly", ks.hosts[p], len(mine), len(ks.uris))
	}

	mc := testenv.StartMemcached(t)
	// No speculative attempt: on a busy machine one would send a group's
	// reads to a second node, and this test counts who coordinated them.
	r := startReplica(t, ks, []string{mc.Addr()}, "--cql-speculative-delay", "0")
	coordBefore := coordinatorReads(t, ks)
	readSeeded(t.Fatalf, r, mine, 50)
	coordAfter := coordinatorReads(t, ks)

	var total float64
	for i := range ks.hosts {
		total += coordAfter[i] - coordBefore[i]
	}
	if total < 1 {
		t.Fatalf("the nodes coordinated no reads of %d posts read from a cold cache", len(mine))
	}
	for i, h := range ks.hosts {
		figure(t, "RF 3, one primary's posts: reads coordinated by "+h, "%.0f of %.0f", coordAfter[i]-coordBefore[i], total)
	}
	if share := (coordAfter[p] - coordBefore[p]) / total; share < 0.9 {
		t.Errorf("the posts' primary %s coordinated %.2f of their reads; group reads must go to the primary first (shuffled replicas gave 0.15)", ks.hosts[p], share)
	}
}

// primaryOf maps each post of ks to the index in ks.hosts of its primary
// replica: the node with the lowest token at or after the post's token,
// wrapping past the ring's last token to its first (each node has one
// token, scripts/cassandra-cluster.sh).
func primaryOf(t *testing.T, ks *keyspace) map[string]int {
	t.Helper()
	type node struct {
		token int64
		index int
	}
	var ring []node
	for i, h := range ks.hosts {
		s := session(t, []string{h}, gocql.One)
		var tokens []string
		err := s.Query(`SELECT tokens FROM system.local`).Scan(&tokens)
		s.Close()
		if err != nil || len(tokens) != 1 {
			t.Fatalf("tokens of %s: %v %v; want one token per node", h, tokens, err)
		}
		tok, err := strconv.ParseInt(tokens[0], 10, 64)
		if err != nil {
			t.Fatalf("token of %s: %v", h, err)
		}
		ring = append(ring, node{tok, i})
	}
	slices.SortFunc(ring, func(a, b node) int { return cmp.Compare(a.token, b.token) })

	s := session(t, ks.hosts, gocql.One)
	defer s.Close()
	owner := map[string]int{}
	it := s.Query(`SELECT uri, token(uri) FROM ` + ks.name + `.records`).PageSize(1000).Iter()
	var uri string
	var tok int64
	for it.Scan(&uri, &tok) {
		at, _ := slices.BinarySearchFunc(ring, tok, func(n node, tok int64) int { return cmp.Compare(n.token, tok) })
		owner[uri] = ring[at%len(ring)].index
	}
	if err := it.Close(); err != nil {
		t.Fatalf("tokens of the posts: %v", err)
	}
	if len(owner) != len(ks.uris) {
		t.Fatalf("token() of %d posts, want %d", len(owner), len(ks.uris))
	}
	return owner
}

// mostOwned returns the node that is the primary of the most posts, and
// those posts in the seed's order.
func mostOwned(owner map[string]int, ks *keyspace) (int, []string) {
	count := make([]int, len(ks.hosts))
	for _, i := range owner {
		count[i]++
	}
	p := slices.Index(count, slices.Max(count))
	var mine []string
	for _, uri := range ks.uris {
		if owner[uri] == p {
			mine = append(mine, uri)
		}
	}
	return p, mine
}

// readSeeded reads uris through r, batch at a time, as the "checker"
// client, and calls fatalf if a call fails or a seeded post is not found.
func readSeeded(fatalf func(format string, args ...any), r *replica, uris []string, batch int) {
	for i := 0; i < len(uris); i += batch {
		ctx, cancel := ctxAs("checker")
		resp, err := r.client().GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris[i:min(i+batch, len(uris))]})
		cancel()
		if err != nil {
			fatalf("read: %v", err)
		}
		for _, rec := range resp.GetRecords() {
			if !rec.GetFound() {
				fatalf("seeded post %s not found", rec.GetUri())
			}
		}
	}
}
