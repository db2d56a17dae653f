package app

import (
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/sockets"
	"google.golang.org/grpc/status"
)

// load drives clients goroutines, each sending batches of batch URIs
// back to back until stop is closed, and counts outcomes.
type load struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value
	wg         sync.WaitGroup
	stop       chan struct{}
}

func startLoad(ts *testServer, clients, batch int) *load {
	l := &load{stop: make(chan struct{})}
	for c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			ctx := ts.ctx("load")
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				from := (c*batch + i*97) % (len(ts.posts) - batch)
				resp, err := ts.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: ts.uris(from, from+batch)})
				if err != nil || len(resp.Records) != batch || !resp.Records[0].GetFound() {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, status.Convert(err).Message())
					continue
				}
				l.ok.Add(1)
			}
		}()
	}
	return l
}

func (l *load) finish() {
	close(l.stop)
	l.wg.Wait()
}

// Tests that 20 clients sending 1,000-URI batches back to back never make
// sluice hold more memcached connections than the cap — counted by its
// open connections and the kernel's socket table, and by its dials, which
// go beyond the cap only to replace connections a failure closed — and that
// the goroutine count stays under the bound the config implies.
func TestConcurrentBatchesRespectPoolCap(t *testing.T) {
	const clients, batch, capConns = 20, 1000, 8
	// The assertions are about caps; a patient deadline keeps a 1,000-URI
	// batch that waits for one of 8 connections on a busy machine (a CPU
	// hog beside the race detector) from failing for want of time.
	ts := startServer(t, 6000, withPatientBatches(defaultTestTimeout/2, func(c *Config) { c.Cache.MaxConnsPerServer = capConns }))
	mcAddr := netip.MustParseAddrPort(ts.memcached.Addr())
	policy := ts.app.cfg.Guard.Methods["sluice.v1.PostRecords/GetPostRecords"]
	ts.warm(batch)
	baseGoroutines := runtime.NumGoroutine()
	// Each in-flight request runs its handler plus at most Concurrency
	// fan-out tasks; the client side adds one goroutine per caller, and
	// gRPC a fixed few per connection.
	bound := baseGoroutines + clients*(policy.Concurrency+1) + clients + 64
	baseThreads := osThreads(t)

	l := startLoad(ts, clients, batch)
	var peakGoroutines, peakEstablished, peakThreads int
	var peakOpen int64
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		peakGoroutines = max(peakGoroutines, runtime.NumGoroutine())
		peakThreads = max(peakThreads, osThreads(t))
		counts, err := sockets.To(mcAddr)
		if err != nil {
			t.Fatal(err)
		}
		peakEstablished = max(peakEstablished, counts[sockets.Established])
		peakOpen = max(peakOpen, ts.app.Cache.Stats()[0].OpenConns)
		time.Sleep(10 * time.Millisecond)
	}
	l.finish()

	s := ts.app.Cache.Stats()[0]
	t.Logf("requests ok=%d failed=%d; memcached dials=%d errors=%d breaker opens=%d peak open=%d peak established=%d waits=%d hits=%d; goroutines base=%d peak=%d bound=%d; threads base=%d peak=%d",
		l.ok.Load(), l.failed.Load(), s.Dials, s.Errors, s.BreakerOpens, peakOpen, peakEstablished, s.Waits, s.Hits, baseGoroutines, peakGoroutines, bound, baseThreads, peakThreads)
	if l.failed.Load() != 0 || l.ok.Load() < clients {
		t.Fatalf("ok=%d failed=%d (first error %v); want every request to succeed", l.ok.Load(), l.failed.Load(), l.firstErr.Load())
	}
	if peakOpen > capConns || peakEstablished > capConns {
		t.Errorf("peak open=%d peak established=%d; cap is %d", peakOpen, peakEstablished, capConns)
	}
	// A connection is closed only after a failed call (gomemcache drops a
	// connection that timed out) or when the breaker opens (it closes the
	// idle ones); any dial beyond the cap must replace one of those.
	if redials := s.Dials - capConns; redials > s.Errors+s.BreakerOpens*capConns {
		t.Errorf("dials=%d: %d beyond the cap of %d, but only %d failed calls and %d breaker openings closed connections", s.Dials, redials, capConns, s.Errors, s.BreakerOpens)
	}
	if peakEstablished == 0 || s.Hits == 0 {
		t.Errorf("the load never reached memcached (peak established %d, hits %d)", peakEstablished, s.Hits)
	}
	if peakGoroutines > bound {
		t.Errorf("peak goroutines %d over the bound %d", peakGoroutines, bound)
	}
}

// Tests that stopping memcached in the middle of the load fails no read
// (the store answers), and that starting it again brings cache hits back
// without restarting sluice.
func TestMemcachedStoppedMidLoad(t *testing.T) {
	ts := startServer(t, 3000, func(c *Config) { c.Cache.BreakerCoolDown = 500 * time.Millisecond })
	ts.warm(1000)
	l := startLoad(ts, 8, 200)
	time.Sleep(time.Second)
	ts.memcached.Stop()
	stoppedAt := ts.app.Cache.Stats()[0]
	time.Sleep(2 * time.Second)
	duringOutage := ts.app.Cache.Stats()[0]
	ts.memcached.Start()
	// Polled, not slept: a loaded machine may take longer than a
	// cool-down and a refill to show hits again.
	recovered := ts.app.Cache.Stats()[0]
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); recovered = ts.app.Cache.Stats()[0] {
		if recovered.BreakerState == "closed" && recovered.Hits > duringOutage.Hits {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	l.finish()

	t.Logf("ok=%d failed=%d; at stop %+v; during outage %+v; after restart %+v", l.ok.Load(), l.failed.Load(), stoppedAt, duringOutage, recovered)
	if l.failed.Load() != 0 {
		t.Fatalf("%d reads failed while memcached was down (first: %v)", l.failed.Load(), l.firstErr.Load())
	}
	if duringOutage.Skipped == stoppedAt.Skipped && duringOutage.Errors == stoppedAt.Errors {
		t.Errorf("the outage was not noticed by the cache: %+v", duringOutage)
	}
	if recovered.Hits <= duringOutage.Hits {
		t.Errorf("cache hits did not resume after memcached came back: %d → %d", duringOutage.Hits, recovered.Hits)
	}
	if recovered.BreakerState != "closed" {
		t.Errorf("breaker %s after recovery, want closed", recovered.BreakerState)
	}
}

// warm reads every seeded post once, so that load starts on a warm cache
// as it does in production.
func (ts *testServer) warm(batch int) {
	ts.t.Helper()
	for from := 0; from < len(ts.posts); from += batch {
		to := min(from+batch, len(ts.posts))
		if _, err := ts.client.GetPostRecords(ts.ctx("warmup"), &sluicev1.GetPostRecordsRequest{Uris: ts.uris(from, to)}); err != nil {
			ts.t.Fatalf("warm up: %v", err)
		}
	}
}
