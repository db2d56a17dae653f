package client_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/pkg/client"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// dial returns a Client whose metrics go to a ManualReader.
func dial(t *testing.T, name string, opts ...client.Option) (*client.Client, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	c, err := client.Dial(testCtx(t), server.addr, name, append(opts, client.WithMeterProvider(mp), client.WithRandSeed(1))...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, reader
}

// counter sums a counter's points.
func counter(t *testing.T, r *sdkmetric.ManualReader, name string) float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					total += float64(p.Value)
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					total += p.Value
				}
			}
		}
	}
	return total
}

// Tests that a batch larger than any request is split to fit the
// caller's budget and answered whole, aligned with the request, with
// duplicates and missing posts in place; and that the client counts its
// chunks.
func TestSplitsAndReassemblesInOrder(t *testing.T) {
	c, reader := dial(t, "paced")
	if l := c.Limits(); l.ChunkSize != 250 || l.Client != "paced" || l.MaxItems != 1000 {
		t.Fatalf("limits %+v; want chunks of 250 (the paced budget's burst) under a method limit of 1000", l)
	}
	uris := append([]string{}, server.uris[:1200]...)
	uris = append(uris, server.uris[5], "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3zzzzzzzzzzzz")
	records, err := c.GetPostRecords(testCtx(t), uris)
	if err != nil {
		t.Fatal(err)
	}
	if len(records) != len(uris) {
		t.Fatalf("%d records for %d uris", len(records), len(uris))
	}
	for i, r := range records {
		wantFound := i != len(uris)-1
		if r.GetUri() != uris[i] || r.GetFound() != wantFound {
			t.Fatalf("records[%d] = %s found=%v, want %s found=%v", i, r.GetUri(), r.GetFound(), uris[i], wantFound)
		}
	}
	if n := counter(t, reader, "sluice.client.chunks"); n < 5 {
		t.Errorf("%v chunks for 1,202 URIs in chunks of 250, want at least 5", n)
	}
	if n := counter(t, reader, "sluice.client.requests"); n != 1 {
		t.Errorf("requests = %v, want 1", n)
	}
}

// Tests that the client paces itself to its budget: 2,250 items at
// 2,000/s with a burst of 250 cannot take less than a second, and the
// wait shows up as throttled time rather than server refusals.
func TestPacedToBudget(t *testing.T) {
	c, reader := dial(t, "pacer")
	start := time.Now()
	if _, err := c.GetPostRecords(testCtx(t), server.uris[:2250]); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	throttled := counter(t, reader, "sluice.client.throttled")
	t.Logf("2,250 items at 2,000/s (burst 250) took %v; throttled %.2fs; retries %v", took, throttled, counter(t, reader, "sluice.client.retries"))
	if took < 900*time.Millisecond {
		t.Errorf("took %v; a budget of 2,000 items/s with a burst of 250 needs at least 1s for 2,250", took)
	}
	if throttled < 0.5 {
		t.Errorf("throttled %.2fs, want the pacing recorded", throttled)
	}
	// Paced to its budget, the client is rarely refused: only when its
	// requests reach the server bunched up (a loaded machine).
	if n, chunks := counter(t, reader, "sluice.client.retries"), counter(t, reader, "sluice.client.chunks"); n > chunks/4 {
		t.Errorf("%v retries in %v chunks; a client paced to its own budget should seldom be refused", n, chunks)
	}
}

// Tests that the client retries a ResourceExhausted honouring RetryInfo:
// another caller with the same name drains the server-side bucket, the
// client's chunk is refused, waits as advised and succeeds.
func TestRetriesAfterRetryInfo(t *testing.T) {
	c, reader := dial(t, "retrier", client.WithParallelism(1))
	conn, err := grpc.NewClient(server.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := sluicev1.NewPostRecordsClient(conn)
	ctx := metadata.AppendToOutgoingContext(testCtx(t), "x-client-id", "retrier")
	// Drain the server's bucket for "retrier" until it refuses.
	var refused error
	for range 100 {
		if _, refused = raw.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: server.uris[:10]}); refused != nil {
			break
		}
	}
	if status.Code(refused) != codes.ResourceExhausted {
		t.Fatalf("draining the bucket: %v, want ResourceExhausted", refused)
	}
	records, err := c.GetPostRecords(testCtx(t), server.uris[:250])
	if err != nil {
		t.Fatalf("GetPostRecords after the bucket was drained: %v", err)
	}
	if len(records) != 250 {
		t.Fatalf("%d records", len(records))
	}
	if n := counter(t, reader, "sluice.client.retries"); n < 1 {
		t.Errorf("retries = %v, want at least one after a refusal", n)
	}
}

// Tests that a refusal that retrying cannot fix fails at once.
func TestNoRetryOnInvalidArgument(t *testing.T) {
	c, reader := dial(t, "example")
	_, err := c.GetPostRecords(testCtx(t), []string{"at://" + strings.Repeat("x", 600)})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("err = %v, want InvalidArgument", err)
	}
	if !strings.Contains(err.Error(), "chunk 1 of 1") {
		t.Errorf("error %q does not say which chunk", err)
	}
	if n := counter(t, reader, "sluice.client.retries"); n != 0 {
		t.Errorf("retries = %v for InvalidArgument, want 0", n)
	}
}

func TestDialNeedsAName(t *testing.T) {
	if _, err := client.Dial(testCtx(t), server.addr, ""); err == nil {
		t.Fatal("Dial with no name succeeded")
	}
}

// Tests that a budget lowered by a reload on the server is followed: the
// chunk the server now refuses as larger than the burst is split to the
// limits fetched again, and the call succeeds.
func TestFollowsReloadedBudget(t *testing.T) {
	c, _ := dial(t, "reloaded")
	if l := c.Limits(); l.ChunkSize != 1000 {
		t.Fatalf("limits %+v; want chunks of 1000 under the default budget", l)
	}
	lowered := testBudgets
	lowered.Clients = maps.Clone(testBudgets.Clients)
	lowered.Clients["reloaded"] = budget.Budget{ItemsPerSecond: 100_000, Burst: 300, MaxInflightItems: 1_200}
	if err := server.app.Guard.SetBudgets(lowered); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.app.Guard.SetBudgets(testBudgets) })
	uris := server.uris[:1000]
	records, err := c.GetPostRecords(testCtx(t), uris)
	if err != nil {
		t.Fatalf("after the budget was lowered: %v", err)
	}
	for i, r := range records {
		if r.GetUri() != uris[i] || !r.GetFound() {
			t.Fatalf("records[%d] = %s found=%v, want %s", i, r.GetUri(), r.GetFound(), uris[i])
		}
	}
	if l := c.Limits(); l.Burst != 300 || l.ChunkSize != 300 {
		t.Errorf("limits %+v, want the lowered burst of 300", l)
	}
}
