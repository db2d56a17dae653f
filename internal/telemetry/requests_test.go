package telemetry

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard"
	"google.golang.org/grpc/codes"
)

// newRequests returns a Telemetry naming clients, shut down when the
// test ends, and its request metrics.
func newRequests(tb testing.TB, clients ...string) (*Telemetry, *Requests) {
	tb.Helper()
	tel, err := New(Config{Clients: clients})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tel.Shutdown(context.Background()) })
	r, err := tel.NewRequests(DefaultSLO())
	if err != nil {
		tb.Fatal(err)
	}
	return tel, r
}

// Tests that recording a request builds no attribute set and allocates
// nothing for its four everyday measurements (count, latency, batch size,
// items): once a (client, method) pair has been seen, a call allocates
// at most one per measurement of the rarer OpenTelemetry instruments
// (slow requests, rejections). Building the sets per request, as before
// they were precomputed, costs several allocations per instrument.
func TestRecordingBuildsNoAttributeSets(t *testing.T) {
	_, r := newRequests(t, "feed")
	ctx := context.Background()
	req := guard.Request{Client: "feed", Method: "/sluice.v1.PostRecords/GetPostRecords", Items: 10}
	r.Finished(ctx, req, codes.OK, time.Second)
	r.Rejected(ctx, req, guard.ReasonShape)
	for _, c := range []struct {
		name        string
		instruments float64 // OpenTelemetry measurements the call records
		call        func()
	}{
		{"Finished, fast", 0, func() { r.Finished(ctx, req, codes.OK, time.Millisecond) }},
		{"Finished, slower than the objective", 1, func() { r.Finished(ctx, req, codes.OK, time.Second) }},
		{"Finished, failed", 0, func() { r.Finished(ctx, req, codes.Unavailable, time.Millisecond) }},
		{"Rejected", 2, func() { r.Rejected(ctx, req, guard.ReasonShape) }},
	} {
		if got := testing.AllocsPerRun(200, c.call); got > c.instruments {
			t.Errorf("%s: %v allocations per call; want at most %v, one per OpenTelemetry measurement", c.name, got, c.instruments)
		}
	}
}

// Tests that a method name Prometheus cannot take as a label value (not
// UTF-8) is counted under guard.UnknownMethod instead of stopping the
// process: the guard reports paths it does not serve that way already,
// and the series must never be the caller's bytes.
func TestInvalidMethodNameCountedAsUnknown(t *testing.T) {
	tel, r := newRequests(t, "feed")
	r.Rejected(context.Background(), guard.Request{Client: "feed", Method: "/\xff\xfe/x", Items: 1}, guard.ReasonMemory)
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	want := `sluice_requests_total{client="feed",code="Unavailable",method="unknown",service="unknown"} 1`
	if !strings.Contains(rec.Body.String(), want) {
		t.Errorf("/metrics has no %s", want)
	}
}

// Tests that a request refused before it was read (its items unknown) is
// counted as a refusal but not as a batch of 0 items, which would pull
// the batch-size means down.
func TestRefusalBeforeReadingIsNoBatchSize(t *testing.T) {
	tel, r := newRequests(t, "feed")
	ctx := context.Background()
	r.Rejected(ctx, guard.Request{Client: "feed", Method: "/sluice.v1.PostRecords/GetPostRecords", Items: 10}, guard.ReasonShape)
	r.Rejected(ctx, guard.Request{Client: "feed", Method: "/sluice.v1.PostRecords/GetPostRecords"}, guard.ReasonMemoryShare)
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`sluice_request_items_count{client="feed",method="GetPostRecords",service="sluice.v1.PostRecords"} 1`,
		`sluice_rejections_total{client="feed",method="GetPostRecords",reason="memory_share",service="sluice.v1.PostRecords"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}

// Tests that the goroutine bound allows for every open stream (queued
// ones too, each a handler and a stream goroutine) and every connection's
// own goroutines: with many connections and small in-flight caps, idle
// connections alone went over a bound of 2 × requests + items + 200.
func TestGoroutineBoundCountsStreamsAndConnections(t *testing.T) {
	base := GoroutineBound(100, 1000, 0)
	if got := GoroutineBound(100, 1000, 4000) - base; got < 3*4000 {
		t.Errorf("4,000 connections add %d to the bound; each holds at least gRPC's reader, writer and keepalive goroutines", got)
	}
	if got := GoroutineBound(300, 1000, 0) - base; got != 2*200 {
		t.Errorf("200 more streams add %d to the bound, want 2 each (a handler and a stream goroutine)", got)
	}
}
