package app

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
)

// Tests that the request slots show on /metrics: with one slot, a
// request whose store read takes a second holds it, another request
// waits its controlled-delay wait (100ms) for it and is shed with
// Unavailable, and the slot taken and the shed are counted.
func TestRequestSlotsShowOnMetrics(t *testing.T) {
	ts := startServer(t, 10, func(c *Config) {
		c.Guard.MaxInflightRequests = 1
		c.StoreReadDelay = time.Second // a cold read holds the slot that long
	})
	slots := func(name string) float64 { return ts.metrics().Sum("sluice_guard_request_slots_"+name, nil) }
	if n, limit := ts.metrics().Count("sluice_guard_request_slots_waiting", nil), slots("limit"); n != 1 || limit != 1 {
		t.Fatalf("%d sluice_guard_request_slots_waiting series, a limit of %v slots; want 1 series, 1 slot", n, limit)
	}
	var heldWhileSlow float64
	var second error
	err := fanout.Each(fanout.WithLimit(context.Background(), 2), 2, func(_ context.Context, i int) error {
		if i == 0 {
			_, err := ts.client.GetPostRecords(ts.ctx("slow"), &sluicev1.GetPostRecordsRequest{Uris: ts.uris(0, 1)})
			return err
		}
		for deadline := time.Now().Add(defaultTestTimeout); heldWhileSlow == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("the slow request's slot never showed on /metrics")
				return nil
			}
			heldWhileSlow = slots("in_use")
		}
		_, second = ts.client.GetPostRecords(ts.ctx("second"), &sluicev1.GetPostRecordsRequest{Uris: ts.uris(1, 2)})
		return nil
	})
	if err != nil {
		t.Fatalf("the slow request: %v", err)
	}
	if st := status.Convert(second); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "request slots stayed busy") {
		t.Fatalf("a request while the one slot was held: %v, want Unavailable saying every request slot stayed busy", second)
	}
	if heldWhileSlow != 1 || slots("in_use") != 0 || slots("shed_total") != 1 || slots("waiting") != 0 {
		t.Errorf("request slots in use %v while the slow request ran, then %v; shed %v, waiting %v; want 1, then 0; 1 shed, none waiting",
			heldWhileSlow, slots("in_use"), slots("shed_total"), slots("waiting"))
	}
}
