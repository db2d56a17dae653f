package faults

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// Tests the crash the journal's start-up replay exists for, with the real
// binary, a real memcached and a real SIGKILL. Posts are read twice
// (cached), then sluice's link to memcached is black-holed through
// toxiproxy (what sluice sends is dropped, so no tombstone reaches
// memcached) and three of the posts are deleted, rewritten and taken
// down: each write reaches the store and is acknowledged without its
// tombstone, which the process now owes in memory only. A fourth post is
// rewritten and the process is SIGKILLed as soon as that write's store
// write is seen — while it waits on its tombstone, or, on a machine slow
// enough, right after its acknowledgement. The link is healed and sluice
// restarted on the same data: no read of the new process may return the
// version from before any of the four writes (the killed one counts as
// acknowledged: the store holds it). The same run with the journal
// disabled must return old versions, which shows the test can fail.
func TestNoStaleReadAfterSIGKILLBeforeTombstone(t *testing.T) {
	t.Run("journal", func(t *testing.T) {
		if stale := killRun(t, false); len(stale) > 0 {
			t.Errorf("%d reads after the restart returned the version from before an acknowledged write, want 0; e.g. %s", len(stale), stale[0])
		}
	})
	t.Run("journal-disabled", func(t *testing.T) {
		if stale := killRun(t, true); len(stale) == 0 {
			t.Errorf("with the journal disabled no read after the restart returned an old version; the test no longer reproduces the crash")
		}
	})
}

// killedCID is the CID of the write the process is killed in.
const killedCID = "bafyreikilledbeforetombstone"

// killRun runs the writes, the kill and the restart once and describes
// each read of the new process that returned an old version.
func killRun(t *testing.T, disabled bool) []string {
	mc := testenv.StartMemcached(t)
	proxy := proxyTo(t, mc.Addr())
	// A patient memcached timeout keeps the last write waiting on its
	// tombstone while the test sees its store write and kills the
	// process; a breaker that never opens keeps it waiting (an open one
	// would skip the tombstone at once). The takedown waits out its
	// tombstone's timeout and then the near cache's horizon, so its
	// method gets a longer timeout, and tombstones outlive it.
	c, conn := startJournalServer(t, proxy.Listen, `cache:
  timeout: 1s
  breaker_failures: 1000
  tombstone_ttl: 8s
guard:
  methods:
    sluice.v1.Records/UpdateTakedowns: {timeout: 5s}
`, disabled)
	p := c.start()
	p.waitReady(t, time.Now(), 30*time.Second)
	uris := c.uris[:len(thawChanges)+1]
	old := map[string]*sluicev1.PostRecord{}
	for range 2 {
		for _, u := range uris {
			old[u] = readPost(t, conn, u)
		}
	}
	if hits := metric(t, p, "sluice_cache_hits_total"); hits < float64(len(uris)) {
		t.Fatalf("second reads were not cache hits (hits %v); the test needs the posts cached", hits)
	}

	rewire(t, proxy, toxic{"blackhole", "timeout", "upstream", 1, toxiclient.Attributes{"timeout": 0}})
	for i, ch := range thawChanges {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ch.change(ctx, t, conn, uris[i])
		cancel()
	}
	if owed := metric(t, p, "sluice_cache_owed_tombstones"); !disabled && owed < float64(len(thawChanges)) {
		t.Fatalf("%v tombstones owed after %d acknowledged writes into the black hole, want %d: the writes did not miss their tombstones", owed, len(thawChanges), len(thawChanges))
	}
	inFlight := killDuringWrite(t, p, conn, uris[len(thawChanges)], disabled)

	rewire(t, proxy)
	p2 := c.start()
	p2.waitReady(t, time.Now(), 30*time.Second)
	conn2 := dialSluice(t, c.grpcAddr)
	// Read every post until memcached has answered some of the reads
	// (reads the store answers prove nothing), for at most 20s. With the
	// journal disabled, one stale read is enough.
	var stale []string
	reads, hits := 0, 0.0
	for start := time.Now(); time.Since(start) < 20*time.Second; time.Sleep(50 * time.Millisecond) {
		for i, u := range uris {
			r := readPost(t, conn2, u)
			reads++
			if i < len(thawChanges) && thawChanges[i].stale(r, old[u].GetCid()) || i == len(thawChanges) && r.GetCid() != killedCID {
				stale = append(stale, fmt.Sprintf("%s after its %s: found %v, cid %s, takedown_ref %q", u, killWriteName(i), r.GetFound(), r.GetCid(), r.GetTakedownRef()))
			}
		}
		hits = metric(t, p2, "sluice_cache_hits_total")
		if disabled && len(stale) > 0 || hits >= 5 {
			break
		}
	}
	t.Logf("journal disabled %v: killed with the last write %s; %d of %d reads after the restart returned an old version; %v cache hits; %v tombstones replayed before serving",
		disabled, map[bool]string{true: "in flight", false: "acknowledged"}[inFlight], len(stale), reads, hits,
		metric(t, p2, "sluice_journal_tombstones_total"))
	if !disabled && hits < 5 {
		t.Fatalf("only %v reads after the restart were answered by memcached in 20s; the run shows nothing", hits)
	}
	return stale
}

// killDuringWrite rewrites uri and SIGKILLs p as soon as the store holds
// the write: the journal's entry count has grown or, with the journal
// disabled (no follower retries owed tombstones, so nothing else talks to
// memcached), a memcached connection is in use for its tombstone — or as
// soon as it is acknowledged, if that comes first. It reports whether the
// write was still unanswered when p died.
func killDuringWrite(t *testing.T, p *proc, conn *grpc.ClientConn, uri string, disabled bool) bool {
	t.Helper()
	entries := metric(t, p, "sluice_journal_entries")
	if inUse := metric(t, p, "sluice_memcached_connections_in_use"); disabled && inUse != 0 {
		t.Fatalf("%v memcached connections in use before the last write, want 0", inUse)
	}
	stored := func() bool {
		if disabled {
			return metric(t, p, "sluice_memcached_connections_in_use") >= 1
		}
		return metric(t, p, "sluice_journal_entries") > entries
	}
	answered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rec := &sluicev1.PostRecord{Uri: uri, Cid: killedCID,
			Record: []byte(`{"$type":"app.bsky.feed.post","text":"written just before the process was killed","createdAt":"2024-11-05T14:30:15Z"}`)}
		_, err := sluicev1.NewPostRecordsClient(conn).PutPostRecords(ctx, &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{rec}})
		answered <- err
	}()
	// Wait for the store write, or for the answer: on a machine slow
	// enough that the tombstone's timeout passes between two scrapes, the
	// write is acknowledged first and the kill comes right after the ack.
	var acked bool
	for deadline := time.Now().Add(30 * time.Second); !acked && !stored(); time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-answered:
			if err != nil {
				t.Fatalf("the last write failed before the kill: %v", err)
			}
			acked = true
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last write did not reach the store within 30s")
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	return !acked && <-answered != nil
}

func killWriteName(i int) string {
	if i < len(thawChanges) {
		return thawChanges[i].name
	}
	return "rewrite killed before its tombstone"
}

// dialSluice connects to a gRPC address; the connection closes when the
// test ends.
func dialSluice(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
