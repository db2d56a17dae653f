// Package procs gives the Go scheduler more processors than the machine
// has cores while the server is saturated, and Go's own number otherwise.
//
// Go looks for network answers that have arrived (a memcached reply, a
// caller's next request) when a processor runs out of goroutines to run,
// or from its monitor thread when nobody has looked for 10ms
// (golang/go#51651). A saturated server's processors never run out, so a
// small request's answer can sit unseen for milliseconds behind the heavy
// callers' work. With more processors than cores the kernel time-slices
// their threads, and one that runs dry looks sooner: on 2 cores, with
// eight heavy callers at 120% of capacity, 4 processors while saturated
// took the scheduler wait's p99 from 3.8–6.1ms to 2.1–2.7ms and the
// normal clients' p99 from 19.7–25.8ms to 16.6–20.8ms, goodput unchanged
// (docs/overload.md). At moderate load the same processors cost CPU (an
// idle one spins looking for work: 4 throughout cost 8–18% more per
// single-record request), so a Controller adds them only while the
// guard queues or sheds, and takes them away once it has been calm for
// a while.
//
// The package sets what it is told to; deciding when the server is
// saturated is its caller's.
package procs

import (
	"context"
	"fmt"
	"time"
)

// Config is how many processors to run while saturated and when to
// change.
type Config struct {
	// PerCPU multiplies Go's own number of processors (one per CPU it
	// may use) while saturated.
	PerCPU int
	// RaiseAfter is how long every reading must say saturated before
	// the processors are raised; LowerAfter how long every reading must
	// say calm before they go back to Go's own number.
	RaiseAfter, LowerAfter time.Duration
}

// Timing of the change: raised on a saturation that lasts past one
// reading, lowered after calm long enough that a load that comes and goes
// does not make the runtime stop the world at each turn.
const (
	DefaultEvery      = 100 * time.Millisecond
	DefaultRaiseAfter = 100 * time.Millisecond
	DefaultLowerAfter = 5 * time.Second
)

// Processors per CPU while saturated: the default, and the most a
// config may ask for.
const (
	DefaultPerCPU = 2
	MaxPerCPU     = 8
)

// Plan returns the Config for perCPU processors per CPU while saturated,
// or, when there is to be none, why: perCPU is 1 or less, or env (the
// GOMAXPROCS environment variable) is set, whose number stands.
func Plan(perCPU int, env string) (Config, string) {
	switch {
	case perCPU <= 1:
		return Config{}, fmt.Sprintf("saturated_procs_per_cpu is %d", perCPU)
	case env != "":
		return Config{}, "GOMAXPROCS is set in the environment"
	}
	return Config{PerCPU: perCPU, RaiseAfter: DefaultRaiseAfter, LowerAfter: DefaultLowerAfter}, ""
}

// SaturatedProcs returns the processors to run while saturated when Go runs
// procs by default on cpus CPUs, or false when Go runs fewer than the
// CPUs the process may use: a CPU quota below the CPU count, which more
// threads would spend early in each period and then be throttled for
// the rest of it. It is asked at each raise with Go's number then, so it
// follows a quota or affinity that changes while serving (cpus, from
// runtime.NumCPU, is the count at start-up).
func SaturatedProcs(perCPU, procs, cpus int) (int, bool) {
	if procs < cpus {
		return procs, false
	}
	return procs * perCPU, true
}

// Controller raises and lowers the processors from readings of whether
// the server is saturated. It is not safe for concurrent use: one
// goroutine (Run) feeds it.
type Controller struct {
	cfg    Config
	set    func(raise bool)
	raised bool
	// reading is the last reading and since when it has held.
	reading bool
	since   time.Time
	read    bool // a reading has been taken
}

// New returns a Controller that calls set(true) to raise the processors
// and set(false) to give them back to Go's own number.
func New(cfg Config, set func(raise bool)) *Controller {
	return &Controller{cfg: cfg, set: set}
}

// Observe takes one reading at now and changes the processors if the
// readings have held long enough.
func (c *Controller) Observe(saturated bool, now time.Time) {
	if !c.read || saturated != c.reading {
		c.reading, c.since, c.read = saturated, now, true
	}
	held := now.Sub(c.since)
	switch {
	case saturated && !c.raised && held >= c.cfg.RaiseAfter:
		c.set(true)
		c.raised = true
	case !saturated && c.raised && held >= c.cfg.LowerAfter:
		c.set(false)
		c.raised = false
	}
}

// Raised reports whether the processors are raised now.
func (c *Controller) Raised() bool { return c.raised }

// Stop gives the processors back to Go's own number if they are raised.
func (c *Controller) Stop() {
	if c.raised {
		c.set(false)
		c.raised = false
	}
}

// Run reads saturated every interval and feeds c until ctx ends, then
// puts the processors back.
func Run(ctx context.Context, c *Controller, every time.Duration, saturated func() bool) {
	t := time.NewTicker(every)
	defer t.Stop()
	defer c.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.Observe(saturated(), now)
		}
	}
}
