package telemetry

import (
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// SchedWait is the Go scheduler's queue over a recent window: how long
// goroutines were runnable before a P ran them (sampled by the runtime,
// as sluice_go_sched_latency_seconds). It is the process's, not a
// client's; time the kernel keeps a running thread off a core is not in
// it.
type SchedWait struct {
	// Seconds is the span the quantiles cover: the window asked for,
	// longer when no reading was taken at its start (an idle second
	// takes none), shorter in a process younger than the window.
	Seconds int `json:"seconds"`
	// P50Ms and P99Ms are quantiles over the span, in milliseconds,
	// interpolated within sluice_go_sched_latency_seconds' buckets.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
}

// schedWindow keeps one reading of the runtime's scheduler-latency
// histogram per second for the last minute, so that the /clients page
// shows the scheduler's queue over the same window as the clients'
// figures. It reads the runtime at most once a second, and only when
// asked: by a request being recorded or by a snapshot.
type schedWindow struct {
	newest atomic.Int64 // the second of the newest reading; 0 before any
	mu     sync.Mutex
	sample []metrics.Sample
	ring   [historySeconds]schedReading
}

// schedReading is the histogram's counts since start at one second, per
// bound of schedLatencyBounds and one above the last.
type schedReading struct {
	unix   int64
	counts []int64
}

func newSchedWindow() *schedWindow {
	return &schedWindow{sample: []metrics.Sample{{Name: schedLatencyName}}}
}

// observe takes second now's reading unless it has one already.
func (w *schedWindow) observe(now int64) {
	if w.newest.Load() >= now {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.newest.Load() >= now {
		return
	}
	metrics.Read(w.sample)
	v := w.sample[0].Value
	if v.Kind() != metrics.KindFloat64Histogram {
		return
	}
	perBound, _ := bucketCounts(v.Float64Histogram(), schedLatencyBounds)
	r := &w.ring[now%historySeconds]
	r.unix = now
	r.counts = r.counts[:0]
	for _, n := range perBound {
		r.counts = append(r.counts, int64(n))
	}
	w.newest.Store(now)
}

// over returns the scheduler's queue between the newest reading at or
// before now (second now's own, unless a later second's was taken first)
// and the newest reading at least window seconds before that one (the
// oldest one kept, when none is); false when there are not two readings
// to compare.
func (w *schedWindow) over(now int64, window int) (SchedWait, bool) {
	w.observe(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	last, ok := w.newestAtOrBefore(now)
	if !ok {
		return SchedWait{}, false
	}
	first, ok := w.baseline(last.unix, window)
	if !ok {
		return SchedWait{}, false
	}
	diff := make([]int64, len(last.counts))
	for i := range diff {
		diff[i] = last.counts[i] - first.counts[i]
	}
	return SchedWait{
		Seconds: int(last.unix - first.unix),
		P50Ms:   quantileOf(diff, schedLatencyBounds, 0.5) * 1000,
		P99Ms:   quantileOf(diff, schedLatencyBounds, 0.99) * 1000,
	}, true
}

// newestAtOrBefore is the newest reading of the last minute up to now.
func (w *schedWindow) newestAtOrBefore(now int64) (schedReading, bool) {
	for ago := int64(0); ago < historySeconds; ago++ {
		if r, ok := w.at(now - ago); ok {
			return r, true
		}
	}
	return schedReading{}, false
}

// baseline is the reading the window ending at now starts from: the
// newest one at least window seconds before now, else the oldest one
// after that.
func (w *schedWindow) baseline(now int64, window int) (schedReading, bool) {
	for ago := int64(window); ago < historySeconds; ago++ {
		if r, ok := w.at(now - ago); ok {
			return r, true
		}
	}
	for ago := int64(window) - 1; ago >= 1; ago-- {
		if r, ok := w.at(now - ago); ok {
			return r, true
		}
	}
	return schedReading{}, false
}

// at is second unix's reading, if the ring still holds one.
func (w *schedWindow) at(unix int64) (schedReading, bool) {
	r := w.ring[unix%historySeconds]
	return r, r.unix == unix
}
