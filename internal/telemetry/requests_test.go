package telemetry

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard"
	"google.golang.org/grpc/codes"
)

// Tests that recording a request builds no attribute set: once a (client,
// method) pair has been seen, each call allocates at most what the
// metrics SDK allocates per measurement (one per instrument recorded),
// nothing per attribute. Building the sets per request, as before they
// were precomputed, costs several allocations per instrument.
func TestRecordingBuildsNoAttributeSets(t *testing.T) {
	tel, err := New(Config{Clients: []string{"feed"}})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	r, err := tel.NewRequests(DefaultSLO())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := guard.Request{Client: "feed", Method: "/sluice.v1.PostRecords/GetPostRecords", Items: 10}
	r.Finished(ctx, req, codes.OK, time.Second)
	r.Rejected(ctx, req, guard.ReasonShape)
	for _, c := range []struct {
		name        string
		instruments float64 // measurements the call records
		call        func()
	}{
		{"Finished, fast", 3, func() { r.Finished(ctx, req, codes.OK, time.Millisecond) }},
		{"Finished, slower than the objective", 4, func() { r.Finished(ctx, req, codes.OK, time.Second) }},
		{"Finished, failed", 3, func() { r.Finished(ctx, req, codes.Unavailable, time.Millisecond) }},
		{"Rejected", 4, func() { r.Rejected(ctx, req, guard.ReasonShape) }},
	} {
		if got := testing.AllocsPerRun(200, c.call); got > c.instruments {
			t.Errorf("%s: %v allocations per call; want at most %v, one per measurement", c.name, got, c.instruments)
		}
	}
}
