package telemetry

import (
	"math"
	"runtime/metrics"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// schedLatencyName is the runtime's histogram of how long goroutines
// were runnable before a P ran them: the time work queued for the Go
// scheduler in this process. Time the kernel keeps a running thread off
// a core is not in it. The runtime samples about one transition in
// eight, so its counts are not the number of events.
const schedLatencyName = "/sched/latencies:seconds"

// schedLatencyBounds are the upper bounds of
// sluice_go_sched_latency_seconds: powers of two nanoseconds from about
// 8 µs to 134 ms. They are edges of the runtime's own buckets (each
// power of two split in four), so every runtime bucket falls wholly
// under one of them and the counts at each bound are exact. The Go
// collector's go_sched_latencies_seconds (not registered here) keeps
// one bucket per factor of about eleven (82 µs, 0.92 ms, 10.5 ms):
// too coarse to read a p99 of 0.4 ms from one of 3 ms.
var schedLatencyBounds = func() []float64 {
	var b []float64
	for shift := 13; shift <= 27; shift++ {
		b = append(b, float64(int64(1)<<shift)/1e9)
	}
	return b
}()

// schedLatency exports the runtime's scheduler latency histogram, summed
// into SchedLatencyBounds, as sluice_go_sched_latency_seconds.
type schedLatency struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	read []metrics.Sample
}

func newSchedLatency() *schedLatency {
	return &schedLatency{
		desc: prometheus.NewDesc("sluice_go_sched_latency_seconds",
			"Time goroutines spent runnable before a P ran them (the runtime's "+schedLatencyName+", sampled): how long work queued for the Go scheduler in this process.",
			nil, nil),
		read: []metrics.Sample{{Name: schedLatencyName}},
	}
}

func (c *schedLatency) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect reads the runtime's histogram and sums it under the lock:
// metrics.Read reuses the histogram's storage, so a concurrent scrape
// must not read it while another sums it.
func (c *schedLatency) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	metrics.Read(c.read)
	v := c.read[0].Value
	if v.Kind() != metrics.KindFloat64Histogram {
		c.mu.Unlock()
		return
	}
	count, sum, buckets := rebucket(v.Float64Histogram(), schedLatencyBounds)
	c.mu.Unlock()
	ch <- prometheus.MustNewConstHistogram(c.desc, count, sum, buckets)
}

// rebucket sums a runtime histogram into cumulative counts at bounds.
// Each runtime bucket is counted under the first bound at or above its
// upper edge (exact when bounds are edges of the runtime's buckets, as
// schedLatencyBounds are). The sum is estimated from the buckets'
// midpoints (the runtime keeps none); a bucket with an infinite edge
// counts at its finite one.
func rebucket(h *metrics.Float64Histogram, bounds []float64) (count uint64, sum float64, cumulative map[float64]uint64) {
	perBound, sum := bucketCounts(h, bounds)
	cumulative = make(map[float64]uint64, len(bounds))
	var running uint64
	for j, b := range bounds {
		running += perBound[j]
		cumulative[b] = running
	}
	return running + perBound[len(bounds)], sum, cumulative
}

// bucketCounts sums a runtime histogram into one count per bound (each
// runtime bucket under the first bound at or above its upper edge) and
// one for what lies above the last bound, and estimates the sum from the
// buckets' midpoints.
func bucketCounts(h *metrics.Float64Histogram, bounds []float64) (perBound []uint64, sum float64) {
	perBound = make([]uint64, len(bounds)+1)
	for i, n := range h.Counts {
		if n == 0 {
			continue
		}
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		sum += float64(n) * midpoint(lo, hi)
		j, _ := slices.BinarySearch(bounds, hi) // the first bound >= hi; len(bounds) when none
		perBound[j] += n
	}
	return perBound, sum
}

func midpoint(lo, hi float64) float64 {
	switch {
	case math.IsInf(lo, -1):
		return max(hi, 0)
	case math.IsInf(hi, 1):
		return lo
	}
	return (lo + hi) / 2
}
