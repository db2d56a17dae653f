// Package probe times a bare memcached get from the load generator while
// a run goes on: one get of one small value on one connection every
// interval, timed from its scheduled moment to its answer, as the harness
// times its requests. No server logic stands between it and memcached, so
// it is the machine's own floor for a round trip from the harness's
// process: whatever the load does to it, it does to every client too, and
// a client's latency ratio can be read beside the probe's.
package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/sluice-dev/sluice/internal/loadgen/recorder"
	"github.com/sluice-dev/sluice/internal/loadgen/report"
)

// Config says which memcached to probe and how often.
type Config struct {
	// Addr is memcached's host:port.
	Addr string
	// Every is the time between gets. Default 5ms.
	Every time.Duration
}

// Name is the probe's name in a report.
const Name = "memcached get (probe)"

// key is the probe's key, outside the key space of sluice's records; its
// value is the size of a small post.
const key = "sluice-load:probe"

var value = bytes.Repeat([]byte{'p'}, 500)

// timeout bounds one get: a get slower than this fails (gomemcache's
// own timeout, applied per socket operation).
const timeout = time.Second

// Prober is a probe whose value is stored, ready to run.
type Prober struct {
	mc    *memcache.Client
	every time.Duration
}

// Start stores the probe's value on cfg.Addr, failing at once (naming
// the address) when it cannot: before a run begins, not after it.
func Start(cfg Config) (*Prober, error) {
	every := cfg.Every
	if every <= 0 {
		every = 5 * time.Millisecond
	}
	mc := memcache.New(cfg.Addr)
	mc.Timeout = timeout
	mc.MaxIdleConns = 1
	if err := mc.Set(&memcache.Item{Key: key, Value: value}); err != nil {
		_ = mc.Close()
		return nil, fmt.Errorf("probe: store the probe's value on %s: %w", cfg.Addr, err)
	}
	return &Prober{mc: mc, every: every}, nil
}

// Close closes the probe's connection; for a probe that will not run.
func (p *Prober) Close() { _ = p.mc.Close() }

// Run gets the probe's key at every slot of its interval from start
// until ctx ends, and returns the outcomes as a report client, then
// closes the probe's connection. Each get is timed from its slot, as the
// harness times its requests from their scheduled moments. The gets go
// one at a time, and no get waits behind the one before it: a slot that
// passes while a get is out shares that get's answer, timed from its own
// slot (as a client with requests outstanding would have seen a stall:
// the correction HdrHistogram's RecordCorrectedValue makes), and the
// next get goes at the first slot after it. A get that fails, or answers
// other bytes than were stored, is an error (its latency is still
// recorded, as a client's failed request's is).
func (p *Prober) Run(ctx context.Context, start time.Time) report.Client {
	defer p.mc.Close()
	rec := recorder.New(Name, "get", start)
	for at := start; sleepUntil(ctx, at); {
		code, msg := "OK", ""
		sent := time.Now()
		if err := get(p.mc); err != nil {
			code, msg = "Error", err.Error()
		}
		done := time.Now()
		// The slots up to the answer, this get's own first; none after
		// the run ended.
		for first := true; first || at.Before(done) && ctx.Err() == nil; at, first = at.Add(p.every), false {
			rec.Scheduled(at)
			rec.Sent(max(0, sent.Sub(at))) // a shared slot's get went before it
			rec.Done(done, done.Sub(at), code, msg, 1)
		}
	}
	return rec.Result()
}

// get reads the probe's key and checks its value. A miss (memcached
// evicted it) is an error; the value is stored again for the next get.
func get(mc *memcache.Client) error {
	it, err := mc.Get(key)
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		_ = mc.Set(&memcache.Item{Key: key, Value: value})
		return errors.New("probe: the probe's value was evicted; stored again")
	case err != nil:
		return err
	case !bytes.Equal(it.Value, value):
		return fmt.Errorf("probe: got %d bytes, want the %d stored", len(it.Value), len(value))
	}
	return nil
}

// sleepUntil waits until at, reporting false when ctx ends first.
func sleepUntil(ctx context.Context, at time.Time) bool {
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
