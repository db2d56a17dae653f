package procs

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// recorder is a set function that keeps every number it was given.
type recorder struct{ calls []int }

func (r *recorder) set(n int) { r.calls = append(r.calls, n) }

var testConfig = Config{Base: 2, Saturated: 4, RaiseAfter: 100 * time.Millisecond, LowerAfter: 5 * time.Second}

// feed gives c one reading every 100ms from start, and returns the time
// after the last.
func feed(c *Controller, start time.Time, readings ...bool) time.Time {
	now := start
	for _, r := range readings {
		c.Observe(r, now)
		now = now.Add(100 * time.Millisecond)
	}
	return now
}

func repeat(v bool, n int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestRaisesOnlyOnSaturationThatLasts(t *testing.T) {
	var r recorder
	c := New(testConfig, r.set)
	now := feed(c, time.Unix(0, 0), true, false, true, false, true, false)
	if len(r.calls) != 0 || c.Raised() {
		t.Fatalf("single saturated readings between calm ones changed the processors: %v", r.calls)
	}
	feed(c, now, true, true)
	if !slices.Equal(r.calls, []int{4}) || !c.Raised() {
		t.Fatalf("two saturated readings 100ms apart: set %v, want [4]", r.calls)
	}
}

func TestLowersOnlyAfterCalmThatLasts(t *testing.T) {
	var r recorder
	c := New(testConfig, r.set)
	now := feed(c, time.Unix(0, 0), true, true)
	// Calm for 4.9s, then saturated again: no change.
	now = feed(c, now, append(repeat(false, 50), true)...)
	if !slices.Equal(r.calls, []int{4}) {
		t.Fatalf("calm shorter than LowerAfter changed the processors: %v", r.calls)
	}
	// Calm for 5s: back to Base.
	feed(c, now, repeat(false, 51)...)
	if !slices.Equal(r.calls, []int{4, 2}) || c.Raised() {
		t.Fatalf("after 5s of calm: set %v, want [4 2]", r.calls)
	}
}

func TestStopPutsTheProcessorsBack(t *testing.T) {
	var r recorder
	c := New(testConfig, r.set)
	c.Stop()
	if len(r.calls) != 0 {
		t.Fatalf("Stop of a controller never raised set %v", r.calls)
	}
	feed(c, time.Unix(0, 0), true, true)
	c.Stop()
	if !slices.Equal(r.calls, []int{4, 2}) {
		t.Fatalf("Stop after a raise: set %v, want [4 2]", r.calls)
	}
}

func TestRunFollowsReadingsAndRestoresOnExit(t *testing.T) {
	var r recorder
	set := make(chan int, 8)
	c := New(Config{Base: 2, Saturated: 4, RaiseAfter: time.Millisecond, LowerAfter: time.Hour}, func(n int) { r.set(n); set <- n })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Run(ctx, c, time.Millisecond, func() bool { return true })
		close(done)
	}()
	if n := <-set; n != 4 {
		t.Fatalf("Run under constant saturation set %d first, want 4", n)
	}
	cancel()
	<-done
	if n := <-set; n != 2 {
		t.Fatalf("Run's exit set %d, want the base 2", n)
	}
}

func TestPlan(t *testing.T) {
	cases := []struct {
		name              string
		perCPU            int
		env               string
		procs, cpus       int
		want              Config
		offReasonFragment string
	}{
		{name: "raised", perCPU: 2, procs: 2, cpus: 2,
			want: Config{Base: 2, Saturated: 4, RaiseAfter: DefaultRaiseAfter, LowerAfter: DefaultLowerAfter}},
		{name: "off by config", perCPU: 1, procs: 2, cpus: 2, offReasonFragment: "saturated_procs_per_cpu is 1"},
		{name: "environment", perCPU: 2, env: "3", procs: 3, cpus: 8, offReasonFragment: "GOMAXPROCS is set"},
		{name: "quota", perCPU: 2, procs: 2, cpus: 8, offReasonFragment: "2 processors on 8 CPUs"},
	}
	for _, tc := range cases {
		got, off := Plan(tc.perCPU, tc.env, tc.procs, tc.cpus)
		if got != tc.want {
			t.Errorf("%s: Plan = %+v, want %+v", tc.name, got, tc.want)
		}
		if tc.offReasonFragment == "" && off != "" || !strings.Contains(off, tc.offReasonFragment) {
			t.Errorf("%s: reason %q, want one containing %q", tc.name, off, tc.offReasonFragment)
		}
	}
}
