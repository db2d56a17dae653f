package cache

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/sockets"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// Tests that 200 concurrent callers against a cap of 4 never open more
// than 4 connections, in the Cache's own counters and in the kernel's
// socket table, and that the excess callers wait instead of dialing.
func TestConnectionCapHolds(t *testing.T) {
	const capConns, callers, rounds = 4, 200, 10
	addr := testenv.StartMemcached(t).Addr()
	c := newCache(t, []string{addr}, func(cfg *Config) {
		cfg.MaxConnsPerServer = capConns
		cfg.Timeout = 2 * time.Second
	})
	uris := uniqueURIs(t, callers)

	var done atomic.Int32
	var peakOpen, peakDials, peakSockets int64
	samples := 0
	ctx := testContext(t, callers+1)
	err := fanout.Each(ctx, callers+1, func(ctx context.Context, i int) error {
		if i == callers { // the sampler
			for done.Load() < callers {
				s := c.Stats()[0]
				peakOpen, peakDials = max(peakOpen, s.OpenConns), max(peakDials, s.Dials)
				n, err := establishedTo(addr)
				if err != nil {
					return err
				}
				peakSockets = max(peakSockets, int64(n))
				samples++
				time.Sleep(time.Millisecond)
			}
			return nil
		}
		defer done.Add(1)
		u := uris[i]
		for r := range rounds {
			if r%2 == 0 {
				c.Fill(ctx, map[string]Entry{u: {Value: []byte(u)}})
			} else {
				c.GetMulti(ctx, []string{u, uris[(i+1)%callers]})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	s := c.Stats()[0]
	t.Logf("%d samples; peak open %d, peak sockets %d; final %+v", samples, peakOpen, peakSockets, s)
	if peakOpen > capConns || peakDials > capConns || s.Dials > capConns {
		t.Errorf("peak open conns %d, peak dials %d, final dials %d; want all ≤ %d", peakOpen, peakDials, s.Dials, capConns)
	}
	if peakSockets > capConns {
		t.Errorf("saw %d established sockets to memcached, want ≤ %d", peakSockets, capConns)
	}
	if peakSockets == 0 || samples < 3 {
		t.Errorf("sampler saw %d sockets in %d samples; the test did not observe the load", peakSockets, samples)
	}
	if s.Waits == 0 {
		t.Errorf("no caller waited; the cap was never reached")
	}
	if s.Errors != 0 || s.WaitExpired != 0 || s.Hits == 0 {
		t.Errorf("stats = %+v, want hits and no errors or expired waits", s)
	}
}

// establishedTo counts this process's ESTABLISHED TCP sockets to addr.
// It returns an error rather than failing the test, since the sampler
// calls it from a goroutine other than the test's.
func establishedTo(addr string) (int, error) {
	counts, err := sockets.To(netip.MustParseAddrPort(addr))
	if err != nil {
		return 0, fmt.Errorf("count sockets to %s: %w", addr, err)
	}
	return counts[sockets.Established], nil
}
