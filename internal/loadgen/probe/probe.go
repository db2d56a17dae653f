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

// timeout bounds one get: a get slower than this is an error, not a
// latency (gomemcache's own timeout, applied per socket operation).
const timeout = time.Second

// Run gets the probe's key every cfg.Every from start until ctx ends, and
// returns the outcomes as a report client. It fails only when the value
// cannot be stored at the beginning; a get that fails later is counted as
// an error of the probe.
func Run(ctx context.Context, cfg Config, start time.Time) (report.Client, error) {
	every := cfg.Every
	if every <= 0 {
		every = 5 * time.Millisecond
	}
	mc := memcache.New(cfg.Addr)
	mc.Timeout = timeout
	mc.MaxIdleConns = 1
	defer mc.Close()
	if err := mc.Set(&memcache.Item{Key: key, Value: value}); err != nil {
		return report.Client{}, fmt.Errorf("probe: store the probe's value on %s: %w", cfg.Addr, err)
	}
	rec := recorder.New(Name, "get", start)
	for at := start; ; at = at.Add(every) {
		if !sleepUntil(ctx, at) {
			return rec.Result(), nil
		}
		rec.Scheduled(at)
		rec.Sent(time.Since(at))
		code, msg := "OK", ""
		if err := get(mc); err != nil {
			code, msg = "Error", err.Error()
		}
		done := time.Now()
		rec.Done(done, done.Sub(at), code, msg, 1)
	}
}

// get reads the probe's key and checks its value, storing it again if
// memcached evicted it.
func get(mc *memcache.Client) error {
	it, err := mc.Get(key)
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return mc.Set(&memcache.Item{Key: key, Value: value})
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
