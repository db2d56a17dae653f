//go:build cluster

package cluster

import (
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
	for i := 0; i < len(ks.uris); i += 50 {
		ctx, cancel := ctxAs("checker")
		resp, err := r.client().GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: ks.uris[i:min(i+50, len(ks.uris))]})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range resp.GetRecords() {
			if !rec.GetFound() {
				t.Fatalf("seeded post %s not found", rec.GetUri())
			}
		}
	}
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
