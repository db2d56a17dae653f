package adaptive

import (
	"math/rand/v2"
	"testing"
	"time"
)

// run feeds n requests of cost items taking took each, spaced by step,
// each finishing with depth items in flight (binding: as many as the
// limit allows), and returns the limit after them.
func run(l *Limiter, now *time.Time, n int, cost int64, took, step time.Duration, depth int64) int64 {
	var limit int64
	for range n {
		*now = now.Add(step)
		d := depth
		if d == binding {
			d = l.Limit()
		}
		limit = l.Observe(cost, took, d, *now)
	}
	return limit
}

// binding, as run's depth, is the limit itself.
const binding = -1

// Tests the controller on a fake clock: at the no-load service time the
// limit stays at Max; when service time per item rises well above its
// floor the limit falls towards Min; when it drops back the limit
// recovers to Max. Size classes keep their own floors, so a mix of
// small and large requests at their usual times changes nothing.
func TestLimitFollowsLatency(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l, err := New(Config{Min: 1_000, Max: 20_000, Tolerance: DefaultTolerance, Interval: DefaultInterval}, now)
	if err != nil {
		t.Fatal(err)
	}
	step := time.Millisecond
	for range 200 { // no load: 1-item requests take 1ms, 1,000-item ones 20ms
		run(l, &now, 1, 1, time.Millisecond, step, 1000)
		run(l, &now, 1, 1000, 20*time.Millisecond, step, 1000)
	}
	if got := l.Limit(); got != 20_000 {
		t.Fatalf("limit %d at the no-load service times, want Max 20000", got)
	}
	// Overload: everything takes 5× its floor.
	low := run(l, &now, 300, 1000, 100*time.Millisecond, step, binding)
	if low >= 10_000 {
		t.Fatalf("limit %d after 300ms at 5× the floor, want it well below Max", low)
	}
	low = run(l, &now, 2000, 1000, 100*time.Millisecond, step, binding)
	if low > 2_000 {
		t.Errorf("limit %d after 2s at 5× the floor, want near Min 1000", low)
	}
	// Latency back at the floor: the limit recovers.
	if got := run(l, &now, 5000, 1000, 20*time.Millisecond, step, binding); got != 20_000 {
		t.Errorf("limit %d 5s after latency returned to its floor, want Max 20000", got)
	}
	// A small rise within tolerance does not shrink it.
	if got := run(l, &now, 1000, 1000, 30*time.Millisecond, step, binding); got != 20_000 {
		t.Errorf("limit %d at 1.5× the floor (tolerance 2), want Max 20000", got)
	}
}

// Tests that the floor is a low quantile, not the minimum: one lucky fast
// sample does not make every ordinary one look like queueing.
func TestFloorIgnoresOutliers(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l, err := New(Config{Min: 10, Max: 1_000, Tolerance: DefaultTolerance, Interval: DefaultInterval}, now)
	if err != nil {
		t.Fatal(err)
	}
	run(l, &now, 50, 10, 2*time.Millisecond, time.Millisecond, 10)
	run(l, &now, 1, 10, 10*time.Microsecond, time.Millisecond, 10) // an outlier
	if got := run(l, &now, 2000, 10, 2*time.Millisecond, time.Millisecond, 10); got != 1_000 {
		t.Errorf("limit %d after one outlier among steady 2ms samples, want Max 1000", got)
	}
}

// Tests that a uniform slowdown at constant low concurrency (the whole
// host slower, say another process took a core, while the limit never
// binds) does not drive the limit to Min: it falls no lower than twice
// the depth in flight, and once the floors learnt on the idle machine
// expire (FloorWindow) it is back at Max although the slowdown lasts.
func TestUniformSlowdownAtLowDepth(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l, err := New(Config{Min: 500, Max: 20_000, Tolerance: DefaultTolerance, Interval: DefaultInterval}, now)
	if err != nil {
		t.Fatal(err)
	}
	const depth = 400 // four 100-item requests in flight, always
	feed := func(d time.Duration, took time.Duration) (lowest int64) {
		lowest = l.Limit()
		for end := now.Add(d); now.Before(end); {
			now = now.Add(took / 4)
			lowest = min(lowest, l.Observe(100, took, depth, now))
		}
		return lowest
	}
	feed(3*time.Second, 10*time.Millisecond)
	if got := l.Limit(); got != 20_000 {
		t.Fatalf("limit %d on the idle host, want Max 20000", got)
	}
	lowest := feed(FloorWindow+5*time.Second, 50*time.Millisecond) // 5× slower
	if lowest < 2*depth {
		t.Errorf("limit fell to %d under a 5× slowdown at %d items in flight, want at least %d (twice the depth), never Min 500", lowest, depth, 2*depth)
	}
	if got := l.Limit(); got != 20_000 {
		t.Errorf("limit %d %v into a steady 5× slowdown, want Max 20000 once the old floors expired", got, FloorWindow+5*time.Second)
	}
}

// Tests the controller against a model of a saturated process: more is
// offered than it serves, so the limit binds and a request's service
// time grows with the depth beyond the knee (the items that keep the
// cores busy): took = base × max(1, depth/knee). The limit settles
// within a few knees, not at Min nor Max, and when the host becomes 4×
// slower (base ×4, the knee unchanged) it still does, instead of
// collapsing to Min. (It starts on a lightly loaded process, as sluice
// does: it learns its floors at low depth.)
func TestSaturatedLimitTracksKnee(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l, err := New(Config{Min: 1_000, Max: 50_000, Tolerance: DefaultTolerance, Interval: DefaultInterval}, now)
	if err != nil {
		t.Fatal(err)
	}
	const knee = 2_000
	for range 1000 { // light load: one request at a time
		now = now.Add(20 * time.Millisecond)
		l.Observe(1000, 20*time.Millisecond, 1000, now)
	}
	phase := func(d time.Duration, base time.Duration) (lo, hi int64) {
		lo, hi = l.cfg.Max, l.cfg.Min
		for end := now.Add(d); now.Before(end); {
			depth := l.Limit()
			took := time.Duration(float64(base) * max(1, float64(depth)/knee))
			now = now.Add(took * 1000 / time.Duration(max(depth, 1))) // 1,000-item requests, depth/1,000 at once
			limit := l.Observe(1000, took, depth, now)
			if now.After(end.Add(-d / 2)) {
				lo, hi = min(lo, limit), max(hi, limit)
			}
		}
		return lo, hi
	}
	lo, hi := phase(30*time.Second, 20*time.Millisecond)
	t.Logf("idle host: limit %d..%d over the last 15s", lo, hi)
	if lo <= l.cfg.Min || hi > 8*knee {
		t.Errorf("idle host: limit %d..%d, want above Min %d and at most %d", lo, hi, l.cfg.Min, 8*knee)
	}
	lo, hi = phase(60*time.Second, 80*time.Millisecond)
	t.Logf("4× slower host: limit %d..%d over the last 30s", lo, hi)
	if lo <= l.cfg.Min || hi > 8*knee {
		t.Errorf("4× slower host: limit %d..%d, want above Min %d and at most %d", lo, hi, l.cfg.Min, 8*knee)
	}
}

// Tests that a noisy host does not read as queueing: service times
// spread widely (a CPU others share: from 10ms to 60ms, median about
// 22ms, the fastest of a second far below the typical) but not growing
// with depth (1,000 items in flight throughout). The floor is a median,
// so the ratio stays near 1 and the limit stays at Max; had the floor
// been the fastest samples, the ratio would be over 2 and the limit
// would fall (to twice the depth).
func TestNoisyHostIsNotQueueing(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l, err := New(Config{Min: 1_000, Max: 20_000, Tolerance: DefaultTolerance, Interval: DefaultInterval}, now)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	lowest := l.Limit()
	for range 30_000 { // 30s
		now = now.Add(time.Millisecond)
		u := rng.Float64()
		took := time.Duration(float64(10*time.Millisecond) * (1 + 5*u*u))
		lowest = min(lowest, l.Observe(100, took, 1000, now))
	}
	if got := l.Limit(); got != 20_000 || lowest < 10_000 {
		t.Errorf("limit %d after 30s of noisy service times (lowest %d), want Max 20000 and never below half of it", got, lowest)
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{Min: 1, Max: 2, Tolerance: 1.5, Interval: time.Millisecond}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{
		{Min: 0, Max: 2, Tolerance: 1.5, Interval: time.Millisecond},
		{Min: 3, Max: 2, Tolerance: 1.5, Interval: time.Millisecond},
		{Min: 1, Max: 2, Tolerance: 1, Interval: time.Millisecond},
		{Min: 1, Max: 2, Tolerance: 1.5},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
}
