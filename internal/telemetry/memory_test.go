package telemetry

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/promtext"
)

// Tests that sluice_grpc_keepalive_min_time_seconds keeps the fraction of
// a second of guard.keepalive_min_time: a policy of 500ms is exported as
// 0.5, not truncated to 0 (which reads as no minimum at all), and 1.5s as
// 1.5, not 1.
func TestKeepaliveMinTimeKeepsFractions(t *testing.T) {
	for _, c := range []struct {
		minTime time.Duration
		want    float64
	}{{500 * time.Millisecond, 0.5}, {1500 * time.Millisecond, 1.5}, {10 * time.Second, 10}} {
		tel, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		stats := guard.MemoryStats{Plan: guard.MemoryPlan{KeepaliveMinTime: c.minTime}}
		if err := tel.ObserveMemory(func() guard.MemoryStats { return stats }); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(tel.Handler())
		fams, err := promtext.Scrape(context.Background(), nil, srv.URL)
		srv.Close()
		_ = tel.Shutdown(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := fams.Sum("sluice_grpc_keepalive_min_time_seconds", nil); got != c.want {
			t.Errorf("keepalive_min_time %v exported as %v, want %v", c.minTime, got, c.want)
		}
	}
}
