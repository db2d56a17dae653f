package adaptive

import (
	"testing"
	"time"
)

// run feeds n requests of cost items taking took each, spaced by step,
// each finishing with as many items in flight as the limit allows (it
// binds), and returns the limit after them.
func run(l *Limiter, now *time.Time, n int, cost int64, took, step time.Duration) int64 {
	var limit int64
	for range n {
		*now = now.Add(step)
		limit = l.Observe(cost, took, l.Limit(), *now)
	}
	return limit
}

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
		run(l, &now, 1, 1, time.Millisecond, step)
		run(l, &now, 1, 1000, 20*time.Millisecond, step)
	}
	if got := l.Limit(); got != 20_000 {
		t.Fatalf("limit %d at the no-load service times, want Max 20000", got)
	}
	// Overload: everything takes 5× its floor.
	low := run(l, &now, 300, 1000, 100*time.Millisecond, step)
	if low >= 10_000 {
		t.Fatalf("limit %d after 300ms at 5× the floor, want it well below Max", low)
	}
	low = run(l, &now, 2000, 1000, 100*time.Millisecond, step)
	if low > 2_000 {
		t.Errorf("limit %d after 2s at 5× the floor, want near Min 1000", low)
	}
	// Latency back at the floor: the limit recovers.
	if got := run(l, &now, 5000, 1000, 20*time.Millisecond, step); got != 20_000 {
		t.Errorf("limit %d 5s after latency returned to its floor, want Max 20000", got)
	}
	// A small rise within tolerance does not shrink it.
	if got := run(l, &now, 1000, 1000, 30*time.Millisecond, step); got != 20_000 {
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
	run(l, &now, 50, 10, 2*time.Millisecond, time.Millisecond)
	run(l, &now, 1, 10, 10*time.Microsecond, time.Millisecond) // an outlier
	if got := run(l, &now, 2000, 10, 2*time.Millisecond, time.Millisecond); got != 1_000 {
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
	l, err := New(Config{Min: 100, Max: 20_000, Tolerance: DefaultTolerance, Interval: DefaultInterval}, now)
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
		t.Errorf("limit fell to %d under a 5× slowdown at %d items in flight, want at least %d (twice the depth), never Min 100", lowest, depth, 2*depth)
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
	l, err := New(Config{Min: 100, Max: 50_000, Tolerance: DefaultTolerance, Interval: DefaultInterval}, now)
	if err != nil {
		t.Fatal(err)
	}
	const knee = 2_000
	for range 2000 { // light load: two requests at a time
		now = now.Add(10 * time.Millisecond)
		l.Observe(1000, 20*time.Millisecond, 2000, now)
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
	if lo < knee/2 || hi > 8*knee {
		t.Errorf("idle host: limit %d..%d, want within [%d, %d]", lo, hi, knee/2, 8*knee)
	}
	lo, hi = phase(60*time.Second, 80*time.Millisecond)
	t.Logf("4× slower host: limit %d..%d over the last 30s", lo, hi)
	if lo < knee/2 || hi > 8*knee {
		t.Errorf("4× slower host: limit %d..%d, want within [%d, %d]", lo, hi, knee/2, 8*knee)
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
