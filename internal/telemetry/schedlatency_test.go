package telemetry

import (
	"math"
	"runtime/metrics"
	"sync"
	"testing"
)

func TestRebucketCountsEachRuntimeBucketUnderTheFirstBoundAboveIt(t *testing.T) {
	inf := math.Inf(1)
	h := &metrics.Float64Histogram{
		Buckets: []float64{math.Inf(-1), 0, 20e-6, 50e-6, 0.3e-3, 0.6e-3, 0.2, inf},
		Counts:  []uint64{1, 2, 3, 4, 5, 6, 7},
	}
	count, sum, got := rebucket(h, SchedLatencyBounds)
	if count != 28 {
		t.Errorf("count = %d, want 28 (every runtime bucket, those past the last bound too)", count)
	}
	want := map[float64]uint64{
		10e-6: 1, 25e-6: 3, 50e-6: 6, 100e-6: 6, 250e-6: 6, 500e-6: 10,
		1e-3: 15, 2e-3: 15, 4e-3: 15, 8e-3: 15, 16e-3: 15, 32e-3: 15, 64e-3: 15, 128e-3: 15,
	}
	for b, n := range want {
		if got[b] != n {
			t.Errorf("bucket le=%g: %d, want %d", b, got[b], n)
		}
	}
	if len(got) != len(SchedLatencyBounds) {
		t.Errorf("%d buckets, want %d", len(got), len(SchedLatencyBounds))
	}
	// Midpoints: 0 + 2×10µs + 3×35µs + 4×175µs + 5×450µs + 6×0.1003 s + 7×0.2 s.
	wantSum := 2*10e-6 + 3*35e-6 + 4*175e-6 + 5*450e-6 + 6*(0.6e-3+0.2)/2 + 7*0.2
	if math.Abs(sum-wantSum) > 1e-9 {
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
			if b.GetUpperBound() != SchedLatencyBounds[i] {
				t.Fatalf("bucket %d: le=%g, want %g", i, b.GetUpperBound(), SchedLatencyBounds[i])
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
