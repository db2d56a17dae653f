package telemetry

import (
	"math"
	"runtime/metrics"
	"sync"
	"testing"
)

// ns is n nanoseconds in seconds.
func ns(n float64) float64 { return n / 1e9 }

func TestRebucketCountsEachRuntimeBucketUnderTheFirstBoundAboveIt(t *testing.T) {
	const p13, p14, p19, p20, p28 = 1 << 13, 1 << 14, 1 << 19, 1 << 20, 1 << 28
	h := &metrics.Float64Histogram{
		Buckets: []float64{math.Inf(-1), 0, ns(p13), ns(p14), ns(1.5 * p19), ns(p20), ns(p28), math.Inf(1)},
		Counts:  []uint64{1, 2, 3, 4, 5, 6, 7},
	}
	count, sum, got := rebucket(h, schedLatencyBounds)
	if count != 28 {
		t.Errorf("count = %d, want 28 (every runtime bucket, those past the last bound too)", count)
	}
	if len(got) != len(schedLatencyBounds) || schedLatencyBounds[0] != ns(p13) || schedLatencyBounds[len(schedLatencyBounds)-1] != ns(1<<27) {
		t.Fatalf("bounds %v, want 2^13 … 2^27 ns", schedLatencyBounds)
	}
	// A runtime bucket ending on a bound counts under that bound.
	want := map[float64]uint64{ns(p13): 3, ns(p14): 6, ns(p19): 6, ns(p20): 15, ns(1 << 27): 15}
	for b, n := range want {
		if got[b] != n {
			t.Errorf("bucket le=%g: %d, want %d", b, got[b], n)
		}
	}
	// Midpoints; (-Inf, 0] counts at 0 and (2^28 ns, +Inf) at 2^28 ns.
	wantSum := ns(2*p13/2 + 3*(p13+p14)/2 + 4*(p14+1.5*p19)/2 + 5*(1.5*p19+p20)/2 + 6*(p20+p28)/2 + 7*p28)
	if math.Abs(sum-wantSum) > 1e-12 {
		t.Errorf("sum = %g, want %g", sum, wantSum)
	}
}

func TestSchedLatencyIsExported(t *testing.T) {
	tel, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(t.Context())
	// Make the scheduler run some goroutines.
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {})
	}
	wg.Wait()
	fams, err := tel.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "sluice_go_sched_latency_seconds" {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() == 0 {
			t.Fatal("no scheduling events counted after running 100 goroutines")
		}
		var last uint64
		for i, b := range h.GetBucket() {
			if b.GetUpperBound() != schedLatencyBounds[i] {
				t.Fatalf("bucket %d: le=%g, want %g", i, b.GetUpperBound(), schedLatencyBounds[i])
			}
			if b.GetCumulativeCount() < last || b.GetCumulativeCount() > h.GetSampleCount() {
				t.Fatalf("bucket le=%g: cumulative %d after %d, of %d", b.GetUpperBound(), b.GetCumulativeCount(), last, h.GetSampleCount())
			}
			last = b.GetCumulativeCount()
		}
		return
	}
	t.Fatal("sluice_go_sched_latency_seconds is not on /metrics")
}
