package faults

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/promtext"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// thawChange is a write that a frozen memcached misses: what the test
// does to the post while memcached is stopped, and how a read tells the
// old version from the new.
type thawChange struct {
	name string
	// change writes, deletes or takes down the post through sluice.
	change func(ctx context.Context, t *testing.T, conn *grpc.ClientConn, uri string)
	// stale reports whether a read answer shows the version from before
	// the change.
	stale func(r *sluicev1.PostRecord, oldCID string) bool
}

var thawChanges = []thawChange{
	{
		name: "delete",
		change: func(ctx context.Context, t *testing.T, conn *grpc.ClientConn, uri string) {
			resp, err := sluicev1.NewPostRecordsClient(conn).DeletePostRecords(ctx, &sluicev1.DeletePostRecordsRequest{Uris: []string{uri}})
			if err != nil || resp.GetDeleted() != 1 {
				t.Fatalf("DeletePostRecords = %v, %v; want 1 deleted", resp, err)
			}
		},
		stale: func(r *sluicev1.PostRecord, _ string) bool { return r.GetFound() },
	},
	{
		name: "new-version",
		change: func(ctx context.Context, t *testing.T, conn *grpc.ClientConn, uri string) {
			rec := &sluicev1.PostRecord{Uri: uri, Cid: "bafyreithawednewversion",
				Record: []byte(`{"$type":"app.bsky.feed.post","text":"edited while memcached was frozen","createdAt":"2024-11-05T14:30:15Z"}`)}
			resp, err := sluicev1.NewPostRecordsClient(conn).PutPostRecords(ctx, &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{rec}})
			if err != nil || resp.GetWritten() != 1 {
				t.Fatalf("PutPostRecords = %v, %v; want 1 written", resp, err)
			}
		},
		stale: func(r *sluicev1.PostRecord, oldCID string) bool { return r.GetCid() == oldCID },
	},
	{
		// A takedown issued during a memcached outage: the moderation
		// write, through sluice.v1.Records as a moderation service sends
		// it. Served without its takedown_ref, the post would be shown.
		name: "takedown",
		change: func(ctx context.Context, t *testing.T, conn *grpc.ClientConn, uri string) {
			resp, err := sluicev1.NewRecordsClient(conn).UpdateTakedowns(ctx, &sluicev1.UpdateTakedownsRequest{
				Takedowns: []*sluicev1.Takedown{{Uri: uri, TakedownRef: thawTakedownRef}}})
			if err != nil || resp.GetUpdated() != 1 {
				t.Fatalf("UpdateTakedowns = %v, %v; want 1 updated", resp, err)
			}
		},
		stale: func(r *sluicev1.PostRecord, _ string) bool { return r.GetTakedownRef() != thawTakedownRef },
	},
}

// thawTakedownRef is the reference the takedown variant sets.
const thawTakedownRef = "mod:thaw-test-takedown"

// Tests the outage the invalidation journal exists for, against the real
// binary and a real memcached: a post is read twice (cached), memcached is
// frozen with SIGSTOP, reads go on until the breaker opens, the post is
// deleted (or rewritten, or taken down) — sluice acknowledges it while its tombstone
// cannot be written — and memcached is thawed with SIGCONT. No read after
// the thaw may return the old version. The same run with the journal
// disabled (the behaviour before it) must return the old version after
// the thaw, which shows the test can fail.
func TestNoStaleReadAfterMemcachedThaw(t *testing.T) {
	for _, ch := range thawChanges {
		t.Run(ch.name, func(t *testing.T) {
			if stale := thawRun(t, ch, false); stale != 0 {
				t.Errorf("%d reads after the thaw returned the version from before the acknowledged %s, want 0", stale, ch.name)
			}
		})
		t.Run(ch.name+"/journal-disabled", func(t *testing.T) {
			// A tombstone the breaker lets through while memcached is
			// frozen (a half-open probe) waits in the kernel's socket
			// buffer and lands at the thaw; such a run shows nothing,
			// so the control runs up to three times and must show the
			// bug in one of them.
			for run := 1; run <= 3; run++ {
				if thawRun(t, ch, true) > 0 {
					return
				}
			}
			t.Errorf("with the journal disabled no read after the thaw returned the old version in 3 runs; the test no longer reproduces the outage")
		})
	}
}

// thawRun runs the freeze, change and thaw once and returns how many of
// the reads after the thaw returned the old version.
func thawRun(t *testing.T, ch thawChange, disabled bool) int {
	mc := testenv.StartMemcached(t)
	c, conn := startJournalServer(t, mc.Addr(), "cache:\n  timeout: 200ms\n  breaker_cool_down: 300ms\n", disabled)
	sl := c.start()
	sl.waitReady(t, time.Now(), 30*time.Second)
	uri := c.uris[3]
	read := func() *sluicev1.PostRecord { return readPost(t, conn, uri) }
	first := read()
	if !first.GetFound() || !ch.stale(first, first.GetCid()) {
		t.Fatalf("seeded post %s not found or already %s: %v", uri, ch.name, first)
	}
	read()
	if hits := metric(t, sl, "sluice_cache_hits_total"); hits < 1 {
		t.Fatalf("second read was not a cache hit (hits %v); the test needs the post cached", hits)
	}

	mc.Pause()
	paused := true
	defer func() {
		if paused {
			mc.Resume()
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for metric(t, sl, "sluice_cache_breaker_opens_total") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("breaker did not open within 30s of freezing memcached")
		}
		read()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	ch.change(ctx, t, conn, uri)
	cancel()
	if r := read(); ch.stale(r, first.GetCid()) {
		t.Fatalf("a read while memcached is frozen returned the old version: %v", r)
	}

	mc.Resume()
	paused = false
	// Read for at least three cool-downs and a few follower polls after
	// the thaw, and until memcached has answered some of the reads (on a
	// busy machine it may time out again for a while, and reads the
	// store answers prove nothing). With the journal disabled, one stale
	// read is enough.
	hitsAtThaw := metric(t, sl, "sluice_cache_hits_total")
	stale, reads, hits := 0, 0, 0.0
	start := time.Now()
	for time.Since(start) < 20*time.Second {
		reads++
		if ch.stale(read(), first.GetCid()) {
			stale++
		}
		hits = metric(t, sl, "sluice_cache_hits_total") - hitsAtThaw
		if disabled && stale > 0 || time.Since(start) > 3*time.Second && hits >= 5 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("journal disabled %v: %d of %d reads after the thaw returned the old version; %v cache hits after the thaw, breaker opens %v",
		disabled, stale, reads, hits, metric(t, sl, "sluice_cache_breaker_opens_total"))
	if !disabled && hits < 5 {
		t.Fatalf("only %v reads after the thaw were answered by memcached in 20s; the run shows nothing", hits)
	}
	if !disabled && metric(t, sl, "sluice_journal_replays_total") < 1 {
		t.Errorf("no journal replay was counted after the thaw")
	}
	return stale
}

// startJournalServer seeds a cluster of the real binary in front of
// memcached with the given config file (the journal disabled if asked)
// and returns it with a client connection to its gRPC address; the
// caller starts the process.
func startJournalServer(t *testing.T, memcached, cfg string, disabled bool) (*cluster, *grpc.ClientConn) {
	t.Helper()
	if disabled {
		cfg += "journal:\n  disabled: true\n"
	}
	cfgFile := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, memcached, 20, "--config", cfgFile)
	return c, dialSluice(t, c.grpcAddr)
}

// readPost reads one post through sluice.v1.PostRecords.
func readPost(t *testing.T, conn *grpc.ClientConn, uri string) *sluicev1.PostRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := sluicev1.NewPostRecordsClient(conn).GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: []string{uri}})
	if err != nil {
		t.Fatalf("GetPostRecords: %v", err)
	}
	return resp.GetRecords()[0]
}

// metric sums one family on the process's /metrics.
func metric(t *testing.T, p *proc, name string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fams, err := promtext.Scrape(ctx, &http.Client{Timeout: 5 * time.Second}, p.adminURL+"/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", fmt.Sprint(p.adminURL), err)
	}
	return fams.Sum(name, nil)
}
