// Package adaptive sets how many items sluice works on at once from the
// latency it measures, instead of a constant: a gradient controller in
// the manner of Netflix's concurrency-limits and Envoy's adaptive
// concurrency filter.
//
// Every finished request reports its item count and service time. For
// each size class (1 item, 2–3, 4–7, … by powers of two) a Limiter keeps
// the no-load floor of that service time: a faster sample pulls it down
// by at most FloorStep (so one lucky outlier does not move it far), and
// slower ones let it rise by at most FloorDrift per second (so sustained
// queueing is not mistaken for a slower machine within one overload, yet
// a machine that really became slower is followed within a minute or
// two, like Envoy's periodic re-measuring of the minimum). Each Interval it
// compares the item-weighted median of service time over floor (1 when
// nothing waits for the CPU or a connection; a median, so that a busy
// machine's occasional stall does not read as a queue) with Tolerance:
//
//   - above Tolerance, work is queueing inside the process, so the limit
//     is multiplied by Tolerance/ratio (at least by 1/2);
//   - below it, the limit grows by up to a tenth, less the closer the
//     ratio is to Tolerance;
//
// always within [Min, Max]. The package knows nothing of gRPC or of the
// queue it sizes; the guard feeds it and applies the limit. Time is
// passed in, so the controller can be tested step by step.
package adaptive

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"
)

// Config bounds and tunes a Limiter.
type Config struct {
	// Min and Max bound the limit, in items. Min == Max fixes it.
	Min, Max int64
	// Tolerance is how far above its floor the mean service time may
	// rise before the limit shrinks; more than 1.
	Tolerance float64
	// Interval is how often the limit is recomputed.
	Interval time.Duration
}

// Defaults for the tuning fields.
const (
	DefaultTolerance = 2.0
	DefaultInterval  = 100 * time.Millisecond
)

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.Min < 1 || c.Max < c.Min:
		return fmt.Errorf("adaptive: need 1 <= min (%d) <= max (%d)", c.Min, c.Max)
	case !(c.Tolerance > 1) || math.IsInf(c.Tolerance, 0):
		return fmt.Errorf("adaptive: tolerance must be a number above 1, got %v", c.Tolerance)
	case c.Interval <= 0:
		return fmt.Errorf("adaptive: interval must be positive, got %v", c.Interval)
	}
	return nil
}

const (
	sizeClasses  = 16
	FloorStep    = 0.02 // the most one faster sample lowers a floor
	FloorDrift   = 0.01 // the most a floor rises per second
	floorSamples = 8    // samples a class needs before it is compared
	maxGrowth    = 0.1  // the most the limit grows per interval
	maxShrink    = 0.5  // the least it keeps per interval
)

// Limiter is the controller. It is safe for concurrent use.
type Limiter struct {
	cfg Config

	mu      sync.Mutex
	limit   float64
	floors  [sizeClasses]floor
	start   time.Time // of the current interval
	samples []ratio   // this interval's first maxSamples ratios
}

// ratio is one request's service time over its floor, and its items.
type ratio struct{ r, items float64 }

// maxSamples bounds the ratios kept per interval.
const maxSamples = 512

type floor struct {
	seconds float64
	samples int
	raised  time.Time // when it last rose
}

// New returns a Limiter whose limit starts at cfg.Max; now starts the
// first interval.
func New(cfg Config, now time.Time) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Limiter{cfg: cfg, limit: float64(cfg.Max), start: now}, nil
}

// Limit is the current limit in items.
func (l *Limiter) Limit() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(l.limit)
}

// Observe records that a request of cost items took took, finishing at
// now, and returns the limit, recomputed when an interval has passed.
func (l *Limiter) Observe(cost int64, took time.Duration, now time.Time) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := &l.floors[sizeClass(cost)]
	secs := max(took.Seconds(), 1e-7)
	if f.samples >= floorSamples && len(l.samples) < maxSamples {
		l.samples = append(l.samples, ratio{secs / f.seconds, float64(cost)})
	}
	f.observe(secs, now)
	if now.Sub(l.start) >= l.cfg.Interval {
		l.update()
		l.start = now
	}
	return int64(l.limit)
}

// observe moves the floor towards a sample x seen at now.
func (f *floor) observe(x float64, now time.Time) {
	f.samples++
	switch {
	case f.samples == 1:
		f.seconds, f.raised = x, now
	case x < f.seconds:
		f.seconds = max(x, f.seconds*(1-FloorStep))
	default:
		dt := max(now.Sub(f.raised).Seconds(), 0)
		f.seconds = min(x, f.seconds*(1+FloorDrift*dt))
		f.raised = now
	}
}

// update applies the gradient rule to the interval that just ended.
func (l *Limiter) update() {
	if len(l.samples) == 0 {
		return
	}
	ratio := weightedMedian(l.samples)
	l.samples = l.samples[:0]
	tol := l.cfg.Tolerance
	if ratio > tol {
		l.limit *= max(tol/ratio, maxShrink)
	} else {
		l.limit *= 1 + maxGrowth*min((tol-ratio)/(tol-1), 1)
	}
	l.limit = min(max(l.limit, float64(l.cfg.Min)), float64(l.cfg.Max))
}

// weightedMedian returns the ratio below which half the items lie.
func weightedMedian(samples []ratio) float64 {
	slices.SortFunc(samples, func(a, b ratio) int { return cmp.Compare(a.r, b.r) })
	total := 0.0
	for _, s := range samples {
		total += s.items
	}
	acc := 0.0
	for _, s := range samples {
		if acc += s.items; acc >= total/2 {
			return s.r
		}
	}
	return samples[len(samples)-1].r
}

func sizeClass(cost int64) int {
	return min(bits.Len64(uint64(max(cost, 1)))-1, sizeClasses-1)
}
