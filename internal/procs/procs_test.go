package procs

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// recorder is a set function that keeps every call: true to raise,
// false to lower.
type recorder struct{ calls []bool }

func (r *recorder) set(raise bool) { r.calls = append(r.calls, raise) }

const raise, lower = true, false

var testConfig = Config{PerCPU: 2, RaiseAfter: 100 * time.Millisecond, LowerAfter: 5 * time.Second}

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
	if !slices.Equal(r.calls, []bool{raise}) || !c.Raised() {
		t.Fatalf("two saturated readings 100ms apart: set %v, want a raise", r.calls)
	}
}

func TestLowersOnlyAfterCalmThatLasts(t *testing.T) {
	var r recorder
	c := New(testConfig, r.set)
	now := feed(c, time.Unix(0, 0), true, true)
	// Calm for 4.9s, then saturated again: no change.
	now = feed(c, now, append(repeat(false, 50), true)...)
	if !slices.Equal(r.calls, []bool{raise}) {
		t.Fatalf("calm shorter than LowerAfter changed the processors: %v", r.calls)
	}
	// Calm for 5s: back to Go's own number.
	feed(c, now, repeat(false, 51)...)
	if !slices.Equal(r.calls, []bool{raise, lower}) || c.Raised() {
		t.Fatalf("after 5s of calm: set %v, want a raise, then a lower", r.calls)
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
	if !slices.Equal(r.calls, []bool{raise, lower}) {
		t.Fatalf("Stop after a raise: set %v, want a raise, then a lower", r.calls)
	}
}

func TestRunFollowsReadingsAndRestoresOnExit(t *testing.T) {
	set := make(chan bool, 8)
	c := New(Config{PerCPU: 2, RaiseAfter: time.Millisecond, LowerAfter: time.Hour}, func(r bool) { set <- r })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Run(ctx, c, time.Millisecond, func() bool { return true })
		close(done)
	}()
	if r := <-set; r != raise {
		t.Fatal("Run under constant saturation lowered first")
	}
	cancel()
	<-done
	if r := <-set; r != lower {
		t.Fatal("Run's exit did not give the processors back")
	}
}

func TestPlan(t *testing.T) {
	cases := []struct {
		name              string
		perCPU            int
		env               string
		want              Config
		offReasonFragment string
	}{
		{name: "raised", perCPU: 2, want: Config{PerCPU: 2, RaiseAfter: DefaultRaiseAfter, LowerAfter: DefaultLowerAfter}},
		{name: "off by config", perCPU: 1, offReasonFragment: "saturated_procs_per_cpu is 1"},
		{name: "environment", perCPU: 2, env: "3", offReasonFragment: "GOMAXPROCS is set"},
	}
	for _, tc := range cases {
		got, off := Plan(tc.perCPU, tc.env)
		if got != tc.want {
			t.Errorf("%s: Plan = %+v, want %+v", tc.name, got, tc.want)
		}
		if tc.offReasonFragment == "" && off != "" || !strings.Contains(off, tc.offReasonFragment) {
			t.Errorf("%s: reason %q, want one containing %q", tc.name, off, tc.offReasonFragment)
		}
	}
}

func TestSaturatedProcsFollowTheDefaultAndRefuseAQuota(t *testing.T) {
	for _, tc := range []struct {
		perCPU, procs, cpus int
		want                int
		ok                  bool
	}{
		{perCPU: 2, procs: 2, cpus: 2, want: 4, ok: true},
		{perCPU: 2, procs: 8, cpus: 8, want: 16, ok: true}, // the CPUs grew while serving
		{perCPU: 3, procs: 4, cpus: 4, want: 12, ok: true},
		{perCPU: 2, procs: 2, cpus: 8, want: 2, ok: false}, // a quota of 2 CPUs on 8
	} {
		got, ok := SaturatedProcs(tc.perCPU, tc.procs, tc.cpus)
		if got != tc.want || ok != tc.ok {
			t.Errorf("SaturatedProcs(%d, %d, %d) = %d, %v; want %d, %v", tc.perCPU, tc.procs, tc.cpus, got, ok, tc.want, tc.ok)
		}
	}
}
