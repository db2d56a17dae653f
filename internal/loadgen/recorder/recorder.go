// Package recorder keeps what one load client saw: HDR histograms of
// latency (from the scheduled send time) and of send lag, counts by gRPC
// code, items answered, dropped and late requests, and a per-second
// timeline.
//
// A Recorder is safe for concurrent use; it sends nothing and knows no
// server. Latencies are recorded in microseconds from 1 µs to 10 minutes
// with 3 significant digits (HdrHistogram), so percentiles are within
// 0.1% of the exact value.
package recorder

import (
	"maps"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/sluice-dev/sluice/internal/loadgen/report"
)

// Histogram bounds, in microseconds.
const (
	minMicros = 1
	maxMicros = int64(10 * time.Minute / time.Microsecond)
)

// Recorder accumulates one client's outcomes.
type Recorder struct {
	name, method string
	start        time.Time

	mu        sync.Mutex
	latency   *hdrhistogram.Histogram
	lag       *hdrhistogram.Histogram
	codes     map[string]int64
	first     map[string]string // the first error message of each code
	scheduled int64
	sent      int64
	dropped   int64
	late      int64
	ok        int64
	errors    int64
	items     int64
	began     time.Time // earliest scheduled send
	last      time.Time // latest completion
	seconds   []*second
}

// second is one second of the timeline, by completion time.
type second struct {
	latency           *hdrhistogram.Histogram
	ok, errors, items int64
}

// New returns a Recorder for a client whose timeline starts at start.
func New(name, method string, start time.Time) *Recorder {
	return &Recorder{
		name: name, method: method, start: start,
		latency: newHistogram(3),
		lag:     newHistogram(3),
		codes:   map[string]int64{},
		first:   map[string]string{},
	}
}

func newHistogram(digits int) *hdrhistogram.Histogram {
	return hdrhistogram.New(minMicros, maxMicros, digits)
}

// micros converts d to a value the histograms accept.
func micros(d time.Duration) int64 {
	return min(max(d.Microseconds(), minMicros), maxMicros)
}

// Scheduled counts a request whose send time, at, came.
func (r *Recorder) Scheduled(at time.Time) {
	r.mu.Lock()
	r.scheduled++
	if r.began.IsZero() || at.Before(r.began) {
		r.began = at
	}
	r.mu.Unlock()
}

// Dropped counts a scheduled request that was not sent because the
// client's outstanding bound was reached.
func (r *Recorder) Dropped() {
	r.mu.Lock()
	r.dropped++
	r.mu.Unlock()
}

// Sent counts a request sent lag after its scheduled time.
func (r *Recorder) Sent(lag time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent++
	_ = r.lag.RecordValue(micros(lag))
	if lag > report.LateThreshold {
		r.late++
	}
}

// Done records a finished request: when it finished, its latency from
// the scheduled send time, its gRPC code name ("OK" on success), the
// error's message (kept for the first error of each code) and the items
// it answered.
func (r *Recorder) Done(at time.Time, latency time.Duration, code, message string, items int) {
	v := micros(latency)
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.latency.RecordValue(v)
	sec := r.second(at)
	_ = sec.latency.RecordValue(v)
	if code == "OK" {
		r.ok++
		r.items += int64(items)
		sec.ok++
		sec.items += int64(items)
	} else {
		r.errors++
		r.codes[code]++
		if _, ok := r.first[code]; !ok {
			r.first[code] = message
		}
		sec.errors++
	}
	if at.After(r.last) {
		r.last = at
	}
}

func (r *Recorder) second(at time.Time) *second {
	i := max(int(at.Sub(r.start)/time.Second), 0)
	for len(r.seconds) <= i {
		r.seconds = append(r.seconds, &second{latency: newHistogram(2)})
	}
	return r.seconds[i]
}

// Progress is a running summary for the progress line.
type Progress struct {
	Sent, OK, Dropped int64
	Codes             map[string]int64
	// P99 is over the last complete second, or over the run so far when
	// no second is complete yet.
	P99 time.Duration
}

// Progress returns the counts so far.
func (r *Recorder) Progress(now time.Time) Progress {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := Progress{Sent: r.sent, OK: r.ok, Dropped: r.dropped, Codes: maps.Clone(r.codes)}
	h := r.latency
	if i := int(now.Sub(r.start)/time.Second) - 1; i >= 0 && i < len(r.seconds) && r.seconds[i].latency.TotalCount() > 0 {
		h = r.seconds[i].latency
	}
	p.P99 = time.Duration(h.ValueAtQuantile(99)) * time.Microsecond
	return p
}

// Result returns the client's result. Items per second are over the
// client's active time, from its first scheduled send (a client may
// start after the run) to its last response.
func (r *Recorder) Result() report.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := report.Client{
		Name: r.name, Method: r.method,
		Scheduled: r.scheduled, Sent: r.sent, Dropped: r.dropped, Late: r.late,
		OK: r.ok, Errors: r.errors, Codes: maps.Clone(r.codes), FirstErrors: maps.Clone(r.first), Items: r.items,
		Latency: Summarize(r.latency),
		SendLag: Summarize(r.lag),
	}
	from := r.began
	if from.IsZero() {
		from = r.start
	}
	if active := r.last.Sub(from).Seconds(); active > 0 {
		c.ItemsPerSec = float64(r.items) / active
	}
	for i, s := range r.seconds {
		c.Timeline = append(c.Timeline, report.Point{
			Second: i, OK: s.ok, Errors: s.errors, Items: s.items,
			P50: ms(s.latency.ValueAtQuantile(50)),
			P99: ms(s.latency.ValueAtQuantile(99)),
			Max: ms(s.latency.Max()),
		})
	}
	return c
}

// Summarize turns a histogram of microseconds into percentiles in
// milliseconds.
func Summarize(h *hdrhistogram.Histogram) report.Latency {
	if h.TotalCount() == 0 {
		return report.Latency{}
	}
	return report.Latency{
		Count: h.TotalCount(),
		Mean:  h.Mean() / 1000,
		P50:   ms(h.ValueAtQuantile(50)),
		P90:   ms(h.ValueAtQuantile(90)),
		P99:   ms(h.ValueAtQuantile(99)),
		P999:  ms(h.ValueAtQuantile(99.9)),
		Max:   ms(h.Max()),
	}
}

func ms(micros int64) float64 { return float64(micros) / 1000 }
