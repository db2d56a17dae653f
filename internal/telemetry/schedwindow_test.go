package telemetry

import (
	"math"
	"sync"
	"testing"
	"time"
)

// reading is a schedReading at unix whose first bucket (under 8 µs) holds
// fast and whose bucket under 2^21 ns (about 2.1 ms) holds slow.
func reading(unix, fast, slow int64) schedReading {
	counts := make([]int64, len(schedLatencyBounds)+1)
	counts[0], counts[8] = fast, slow
	return schedReading{unix: unix, counts: counts}
}

func TestSchedWindowComparesWithTheReadingAWindowAgo(t *testing.T) {
	w := newSchedWindow()
	for _, r := range []schedReading{reading(100, 10, 0), reading(105, 20, 5), reading(110, 70, 55)} {
		w.ring[r.unix%historySeconds] = r
	}
	w.newest.Store(110) // over must not read the runtime over the fakes
	tests := []struct {
		window   int
		wantSpan int
	}{
		{5, 5},   // a reading exactly a window ago
		{3, 5},   // none 3 or 4 s ago: the window stretches back to 105
		{7, 10},  // none 7–9 s ago: back to 100
		{30, 10}, // nothing that old: the oldest kept
	}
	for _, tt := range tests {
		got, ok := w.over(110, tt.window)
		if !ok || got.Seconds != tt.wantSpan {
			t.Errorf("window %d: span %d (ok %v), want %d", tt.window, got.Seconds, ok, tt.wantSpan)
		}
	}
	// Between 105 and 110: 50 fast, 50 slow. The median is in the first
	// bucket; the p99 is 49/50 of the way through (2^20, 2^21] ns.
	got, _ := w.over(110, 5)
	if want := float64(1<<13) / 1e6; math.Abs(got.P50Ms-want) > 1e-9 {
		t.Errorf("p50 %.6f ms, want %.6f (the first bucket's bound)", got.P50Ms, want)
	}
	if want := (float64(1<<20) + float64(1<<20)*49/50) / 1e6; math.Abs(got.P99Ms-want) > 1e-9 {
		t.Errorf("p99 %.6f ms, want %.6f", got.P99Ms, want)
	}
}

func TestSchedWindowNeedsTwoSeconds(t *testing.T) {
	w := newSchedWindow()
	w.ring[100%historySeconds] = reading(100, 1, 1)
	w.newest.Store(100)
	if got, ok := w.over(100, 10); ok {
		t.Errorf("one reading gave %+v; want none", got)
	}
}

// A slot of the ring still holding the reading of a minute ago is not
// this second's: the window ends at the newest reading of the last
// minute.
func TestSchedWindowSkipsAStaleSlot(t *testing.T) {
	w := newSchedWindow()
	w.ring[150%historySeconds] = reading(150, 10, 0)
	w.ring[155%historySeconds] = reading(155, 20, 0)
	w.ring[160%historySeconds] = reading(100, 70, 50) // second 100's, left in 160's slot
	w.newest.Store(160)
	got, ok := w.over(160, 5)
	if !ok || got.Seconds != 5 || got.P99Ms > 0.01 {
		t.Errorf("window ending at 160 (no reading since 155): %+v, %v; want 150 to 155, 5 s, every wait under 8 µs", got, ok)
	}
}

// Requests recorded take the readings: with no snapshot in between, the
// window spans the seconds requests came in.
func TestRecordedRequestsTakeSchedulerReadings(t *testing.T) {
	c := newClientStats(func(s string) string { return s })
	now := time.Unix(1_800_000_000, 0)
	c.now = func() time.Time { return now }
	c.finished("feed", 1, false, time.Millisecond)
	now = now.Add(3 * time.Second)
	c.finished("feed", 1, false, time.Millisecond)
	c.sched.newest.Store(now.Unix() + 1) // the snapshot must not take a reading of its own
	snap := c.Snapshot(10)
	if snap.SchedWait == nil || snap.SchedWait.Seconds != 3 {
		t.Fatalf("scheduler wait %+v; want one over the 3 s between the two requests", snap.SchedWait)
	}
}

func TestClientsSnapshotShowsTheSchedulerWait(t *testing.T) {
	c := newClientStats(func(s string) string { return s })
	now := time.Unix(1_800_000_000, 0)
	c.now = func() time.Time { return now }
	c.finished("feed", 1, false, time.Millisecond)
	if snap := c.Snapshot(10); snap.SchedWait != nil {
		t.Fatalf("scheduler wait %+v from one reading", snap.SchedWait)
	}
	var wg sync.WaitGroup
	for range 1000 {
		wg.Go(func() {})
	}
	wg.Wait()
	now = now.Add(3 * time.Second)
	snap := c.Snapshot(10)
	if snap.SchedWait == nil {
		t.Fatal("no scheduler wait after two readings 3 s apart")
	}
	if snap.SchedWait.Seconds != 3 || snap.SchedWait.P99Ms <= 0 || snap.SchedWait.P99Ms < snap.SchedWait.P50Ms {
		t.Errorf("scheduler wait %+v; want 3 s, p99 > 0 and ≥ p50 after 1000 goroutines ran", *snap.SchedWait)
	}
}
