package adaptive

import (
	"testing"
	"time"
)

// run feeds n requests of cost items taking took each, spaced by step,
// and returns the limit after them.
func run(l *Limiter, now *time.Time, n int, cost int64, took, step time.Duration) int64 {
	var limit int64
	for range n {
		*now = now.Add(step)
		limit = l.Observe(cost, took, *now)
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
