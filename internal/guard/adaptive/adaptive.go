// Package adaptive sets how many items sluice works on at once from the
// latency it measures, instead of a constant: a gradient controller in
// the manner of Netflix's concurrency-limits and Envoy's adaptive
// concurrency filter.
//
// Every finished request reports its item count, its service time and
// how many items were in flight when it finished. For each size class
// (1 item, 2–3, 4–7, … by powers of two) a Limiter keeps the no-load
// floor of that service time as a windowed minimum, as BBR keeps its
// minimum round-trip time: the second-fastest sample of each second,
// the lowest of those over the last FloorWindow (10 s). So one lucky
// outlier does not set the floor, and a floor learnt on an idle machine
// expires: when the whole host becomes slower (another process takes a
// core), the floors follow it within FloorWindow instead of reading the
// slowdown as queueing for good. Each Interval the controller compares
// the item-weighted median of service time over floor (1 when nothing
// waits for the CPU or a connection; a median, so that a busy machine's
// occasional stall does not read as a queue) with Tolerance:
//
//   - above Tolerance, work may be queueing inside the process, so the
//     limit is multiplied by Tolerance/ratio (at least by 1/2). But when
//     the limit did not bind in that interval (the most items in flight
//     stayed under three quarters of it), the latency did not come from the depth
//     the limit allows, and lowering it further would not shorten it:
//     the limit then falls no lower than twice the depth seen, keeping
//     headroom, rather than to Min;
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
	sizeClasses = 16
	// FloorWindow is how long a floor sample counts.
	FloorWindow  = 10 * time.Second
	floorBuckets = 10   // FloorWindow in buckets of a second
	floorSamples = 8    // samples a class needs before it is compared
	maxGrowth    = 0.1  // the most the limit grows per interval
	maxShrink    = 0.5  // the least it keeps per interval
	bindFraction = 0.75 // depth, as a share of the limit, at which it binds
	headroom     = 2    // the limit over the depth, when it does not bind
)

// Limiter is the controller. It is safe for concurrent use.
type Limiter struct {
	cfg Config

	mu      sync.Mutex
	limit   float64
	floors  [sizeClasses]floor
	start   time.Time // of the current interval
	samples []ratio   // this interval's first maxSamples ratios
	depth   int64     // the most items in flight seen this interval
}

// ratio is one request's service time over its floor, and its items.
type ratio struct{ r, items float64 }

// maxSamples bounds the ratios kept per interval.
const maxSamples = 512

// floor is one size class's windowed minimum: per bucket of
// FloorWindow/floorBuckets, the two fastest samples that finished no
// deeper than the floor in force was learnt at (or than the Limiter's
// Min). Deeper samples may include queueing, so they never raise it.
type floor struct {
	buckets [floorBuckets]bucket
	samples int // samples seen, up to floorSamples
	// seconds is the floor in force, learnt at depth items in flight.
	seconds float64
	depth   int64
}

type bucket struct {
	start         time.Time
	first, second float64 // the fastest and second-fastest, seconds; 0 unset
	firstDepth    int64   // the depths they finished at
	secondDepth   int64
}

// observe records a sample x, finishing at depth items in flight at now,
// in its bucket if it is no deeper than max(the floor's depth, least).
func (f *floor) observe(x float64, depth, least int64, now time.Time) {
	f.samples = min(f.samples+1, floorSamples)
	if f.seconds > 0 && depth > max(f.depth, least) {
		return
	}
	width := FloorWindow / floorBuckets
	b := &f.buckets[int(now.UnixNano()/int64(width))%floorBuckets]
	if now.Sub(b.start) >= width {
		*b = bucket{start: now.Truncate(width)}
	}
	switch {
	case b.first == 0 || x < b.first:
		b.second, b.secondDepth = b.first, b.firstDepth
		b.first, b.firstDepth = x, depth
	case b.second == 0 || x < b.second:
		b.second, b.secondDepth = x, depth
	}
}

// value is the floor at now: the lowest second-fastest sample of the
// buckets still in the window, or, when none is, the last floor. ok is
// false until the class has enough samples.
func (f *floor) value(now time.Time, least int64) (seconds float64, ok bool) {
	if f.samples < floorSamples {
		return 0, false
	}
	best, bestDepth := 0.0, int64(0)
	for _, b := range f.buckets {
		if b.second > 0 && now.Sub(b.start) < FloorWindow && (best == 0 || b.second < best) {
			best, bestDepth = b.second, b.secondDepth
		}
	}
	switch {
	case best == 0:
	case f.seconds == 0: // the first floor
		f.seconds, f.depth = best, bestDepth
	default: // never deeper than before, so it cannot creep up with the depth
		f.seconds, f.depth = best, min(bestDepth, max(f.depth, least))
	}
	return f.seconds, f.seconds > 0
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
// now with inflight items in flight, and returns the limit, recomputed
// when an interval has passed.
func (l *Limiter) Observe(cost int64, took time.Duration, inflight int64, now time.Time) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := &l.floors[sizeClass(cost)]
	secs := max(took.Seconds(), 1e-7)
	f.observe(secs, inflight, l.cfg.Min, now)
	if lo, ok := f.value(now, l.cfg.Min); ok && len(l.samples) < maxSamples {
		l.samples = append(l.samples, ratio{secs / lo, float64(cost)})
	}
	l.depth = max(l.depth, inflight)
	if now.Sub(l.start) >= l.cfg.Interval {
		l.update()
		l.start = now
	}
	return int64(l.limit)
}

// update applies the gradient rule to the interval that just ended.
func (l *Limiter) update() {
	depth := float64(l.depth)
	l.depth = 0
	if len(l.samples) == 0 {
		return
	}
	ratio := weightedMedian(l.samples)
	l.samples = l.samples[:0]
	tol := l.cfg.Tolerance
	switch {
	case ratio <= tol:
		l.limit *= 1 + maxGrowth*min((tol-ratio)/(tol-1), 1)
	case depth >= bindFraction*l.limit:
		l.limit *= max(tol/ratio, maxShrink)
	default: // slower, but not from the depth the limit allows
		l.limit = max(l.limit*max(tol/ratio, maxShrink), min(l.limit, headroom*depth))
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
