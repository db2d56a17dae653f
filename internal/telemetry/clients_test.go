package telemetry

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluice-dev/sluice/internal/guard"
	"google.golang.org/grpc/codes"
)

// Tests that the aggregator's rates, batch sizes, quantiles and ring
// follow a clock it is given, per bounded client label.
func TestClientStatsWindow(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := newClientStats(newClientLabels([]string{"bulk", "feed"}).label)
	c.now = func() time.Time { return now }
	for range 10 { // ten seconds of traffic
		c.finished("bulk", 900, false, 80*time.Millisecond)
		c.served("bulk", 800, 100, 0)
		for range 20 {
			c.finished("feed", 10, false, 2*time.Millisecond)
		}
		c.finished("feed", 10, true, 2*time.Millisecond)
		c.served("feed", 100, 0, 0)
		c.rejected("mystery", 5000, guard.ReasonShape)
		c.rejected("mystery", 200, guard.ReasonQuota)
		now = now.Add(time.Second)
	}
	snap := c.Snapshot(10)
	if len(snap.Clients) != 3 || snap.Clients[0].Client != "bulk" || snap.Clients[1].Client != "feed" || snap.Clients[2].Client != Other {
		t.Fatalf("rows %+v; want by items served per second: bulk (900/s), feed (100/s), other (0/s, though it asked for 5,200/s)", snap.Clients)
	}
	rows := map[string]ClientRow{}
	for _, r := range snap.Clients {
		rows[r.Client] = r
	}
	bulk, feed, other := rows["bulk"], rows["feed"], rows[Other]
	check := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("bulk items/s", bulk.ItemsPerSec, 900)
	check("bulk requests/s", bulk.RequestsPerSec, 1)
	check("bulk mean batch", bulk.MeanBatch, 900)
	check("bulk cache hit ratio", bulk.CacheHitRatio, 800.0/900)
	check("feed requests/s", feed.RequestsPerSec, 21)
	check("feed errors/s", feed.ErrorsPerSec, 1)
	check("other rejections/s", other.RejectionsPerSec, 2)
	check("other items requested/s", other.ItemsPerSec, 5200)
	check("other items served/s", other.ServedItemsPerSec, 0)
	check("other items refused/s", other.RefusedItemsPerSec, 5200)
	check("other items refused for shape/s", other.RefusedByReason[guard.ReasonShape], 5000)
	check("other items refused for quota/s", other.RefusedByReason[guard.ReasonQuota], 200)
	check("other items refused for overload/s", other.RefusedByReason[guard.ReasonOverload], 0)
	check("bulk items served/s", bulk.ServedItemsPerSec, 900)
	check("bulk items refused/s", bulk.RefusedItemsPerSec, 0)
	check("all items served/s", snap.ServedItemsPerSec, 1000)
	check("bulk share of items served", bulk.ServedShare, 0.9)
	check("feed share of items served", feed.ServedShare, 0.1)
	check("other share of items served", other.ServedShare, 0)
	if other.RefusedItems != 52_000 || bulk.ServedItems != 9_000 {
		t.Errorf("totals: other refused %d items, bulk served %d; want 52000 and 9000", other.RefusedItems, bulk.ServedItems)
	}
	check("feed cache hit ratio", feed.CacheHitRatio, 1)
	check("other cache hit ratio (none answered)", other.CacheHitRatio, -1)
	// 80ms falls in the (50ms, 100ms] bucket: p50 interpolates to its middle.
	check("bulk p50 ms", bulk.P50Ms, 75)
	if feed.P99Ms <= 1 || feed.P99Ms > 2.5 {
		t.Errorf("feed p99 %v ms; want within the (1ms, 2.5ms] bucket", feed.P99Ms)
	}
	if len(bulk.History.Items) != historySeconds-1 || bulk.History.Items[len(bulk.History.Items)-1] != 900 {
		t.Errorf("bulk history %v; want %d seconds ending in 900", bulk.History.Items, historySeconds-1)
	}
	// A minute later the window is empty but the totals remain.
	now = now.Add(time.Minute)
	later := c.Snapshot(10)
	for _, r := range later.Clients {
		if r.RequestsPerSec != 0 || r.Requests == 0 {
			t.Errorf("%s a minute later: %v requests/s, %d total; want 0 and the total kept", r.Client, r.RequestsPerSec, r.Requests)
		}
	}
}

// Tests that a client's first request creates a zero series for every
// rejection reason, quota included, and that a rejection is counted under
// its reason with the code the guard answers.
func TestRejectionReasonsAreAFixedSet(t *testing.T) {
	tel, r := newRequests(t, "feed")
	ctx := context.Background()
	req := guard.Request{Client: "feed", Method: "/sluice.v1.PostRecords/GetPostRecords", Items: 10}
	r.Finished(ctx, req, codes.OK, time.Millisecond)
	r.Finished(ctx, req, codes.OK, time.Second)          // slower than the 250ms objective
	r.Finished(ctx, req, codes.Unavailable, time.Second) // slow, but not a success
	r.Rejected(ctx, req, guard.ReasonDeadline)
	r.Rejected(ctx, req, "made-up")
	want := `
# HELP sluice_rejections_total Requests refused before work started, by client, method and reason (shape, quota, overload, deadline, identity, memory, memory_share).
# TYPE sluice_rejections_total counter
sluice_rejections_total{client="feed",method="GetPostRecords",reason="deadline",service="sluice.v1.PostRecords"} 1
sluice_rejections_total{client="feed",method="GetPostRecords",reason="identity",service="sluice.v1.PostRecords"} 0
sluice_rejections_total{client="feed",method="GetPostRecords",reason="memory",service="sluice.v1.PostRecords"} 0
sluice_rejections_total{client="feed",method="GetPostRecords",reason="memory_share",service="sluice.v1.PostRecords"} 0
sluice_rejections_total{client="feed",method="GetPostRecords",reason="other",service="sluice.v1.PostRecords"} 1
sluice_rejections_total{client="feed",method="GetPostRecords",reason="overload",service="sluice.v1.PostRecords"} 0
sluice_rejections_total{client="feed",method="GetPostRecords",reason="quota",service="sluice.v1.PostRecords"} 0
sluice_rejections_total{client="feed",method="GetPostRecords",reason="shape",service="sluice.v1.PostRecords"} 0
`
	if err := testutil.GatherAndCompare(tel.registry, strings.NewReader(want), "sluice_rejections_total"); err != nil {
		t.Error(err)
	}
	wantItems := `
# HELP sluice_rejected_items_total Items (URIs) of the requests refused before work started, by client, method and reason.
# TYPE sluice_rejected_items_total counter
sluice_rejected_items_total{client="feed",method="GetPostRecords",reason="deadline",service="sluice.v1.PostRecords"} 10
sluice_rejected_items_total{client="feed",method="GetPostRecords",reason="identity",service="sluice.v1.PostRecords"} 0
sluice_rejected_items_total{client="feed",method="GetPostRecords",reason="memory",service="sluice.v1.PostRecords"} 0
sluice_rejected_items_total{client="feed",method="GetPostRecords",reason="memory_share",service="sluice.v1.PostRecords"} 0
sluice_rejected_items_total{client="feed",method="GetPostRecords",reason="other",service="sluice.v1.PostRecords"} 10
sluice_rejected_items_total{client="feed",method="GetPostRecords",reason="overload",service="sluice.v1.PostRecords"} 0
sluice_rejected_items_total{client="feed",method="GetPostRecords",reason="quota",service="sluice.v1.PostRecords"} 0
sluice_rejected_items_total{client="feed",method="GetPostRecords",reason="shape",service="sluice.v1.PostRecords"} 0
`
	if err := testutil.GatherAndCompare(tel.registry, strings.NewReader(wantItems), "sluice_rejected_items_total"); err != nil {
		t.Error(err)
	}
	wantCodes := `
# HELP sluice_requests_total Requests finished, by client, method and gRPC code.
# TYPE sluice_requests_total counter
sluice_requests_total{client="feed",code="DeadlineExceeded",method="GetPostRecords",service="sluice.v1.PostRecords"} 1
sluice_requests_total{client="feed",code="OK",method="GetPostRecords",service="sluice.v1.PostRecords"} 2
sluice_requests_total{client="feed",code="Unavailable",method="GetPostRecords",service="sluice.v1.PostRecords"} 2
`
	if err := testutil.GatherAndCompare(tel.registry, strings.NewReader(wantCodes), "sluice_requests_total"); err != nil {
		t.Error(err)
	}
	wantSlow := `
# HELP sluice_requests_slow_total Successful requests slower than the latency objective's threshold (slo.latency.threshold), by client and method.
# TYPE sluice_requests_slow_total counter
sluice_requests_slow_total{client="feed",method="GetPostRecords",service="sluice.v1.PostRecords"} 1
`
	if err := testutil.GatherAndCompare(tel.registry, strings.NewReader(wantSlow), "sluice_requests_slow_total"); err != nil {
		t.Error(err)
	}
}

// Tests that reading the /clients figures leaves
// sluice_clients_unknown_names alone: the rows are keyed by label, and
// the label "other" is not a caller's name, so one unlisted caller stays
// one distinct name however often the page is read.
func TestSnapshotCountsNoUnknownName(t *testing.T) {
	tel, r := newRequests(t, "feed")
	ctx := context.Background()
	r.Finished(ctx, guard.Request{Client: "mystery", Method: "/sluice.v1.PostRecords/GetPostRecords", Items: 1}, codes.OK, time.Millisecond)
	if n := tel.clients.unknownCount(); n != 1 {
		t.Fatalf("%d unknown names after one unlisted caller; want 1", n)
	}
	snap := tel.Clients().Snapshot(10)
	if len(snap.Clients) != 1 || snap.Clients[0].Client != Other {
		t.Fatalf("rows %+v; want one, %q", snap.Clients, Other)
	}
	if n := tel.clients.unknownCount(); n != 1 {
		t.Errorf("%d unknown names after the page was read; want 1 (mystery)", n)
	}
}
