package telemetry

import (
	"math"
	"runtime/metrics"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// schedLatencyName is the runtime's histogram of how long goroutines
// were runnable before they ran: the time work waited for a CPU inside
// this process.
const schedLatencyName = "/sched/latencies:seconds"

// SchedLatencyBounds are the upper bounds of sluice_go_sched_latency_seconds.
// The Go collector's go_sched_latencies_seconds has one bucket per
// factor of about eleven (64 µs, 0.9 ms, 10 ms), too coarse to tell a
// process whose goroutines wait 0.2 ms for a CPU from one where they
// wait 2 ms; these are about a factor of two apart over the range where
// request latency lives.
var SchedLatencyBounds = []float64{
	10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2e-3, 4e-3, 8e-3, 16e-3, 32e-3, 64e-3, 128e-3,
}

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
			"Time goroutines spent runnable before they ran (the runtime's "+schedLatencyName+"): how long work waited for a CPU in this process.",
			nil, nil),
		read: []metrics.Sample{{Name: schedLatencyName}},
	}
}

func (c *schedLatency) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *schedLatency) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	metrics.Read(c.read)
	v := c.read[0].Value
	c.mu.Unlock()
	if v.Kind() != metrics.KindFloat64Histogram {
		return
	}
	count, sum, buckets := rebucket(v.Float64Histogram(), SchedLatencyBounds)
	ch <- prometheus.MustNewConstHistogram(c.desc, count, sum, buckets)
}

// rebucket sums a runtime histogram into cumulative counts at bounds.
// Each runtime bucket is counted under the first bound at or above its
// upper edge, so a quantile read from the result is never below the
// true one. The sum is estimated from the buckets' midpoints (the
// runtime keeps none); a bucket with an infinite edge counts at its
// finite one.
func rebucket(h *metrics.Float64Histogram, bounds []float64) (count uint64, sum float64, cumulative map[float64]uint64) {
	perBound := make([]uint64, len(bounds))
	for i, n := range h.Counts {
		if n == 0 {
			continue
		}
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		count += n
		sum += float64(n) * midpoint(lo, hi)
		for j, b := range bounds {
			if hi <= b {
				perBound[j] += n
				break
			}
		}
	}
	cumulative = make(map[float64]uint64, len(bounds))
	var running uint64
	for j, b := range bounds {
		running += perBound[j]
		cumulative[b] = running
	}
	return count, sum, cumulative
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
