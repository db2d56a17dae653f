package probe

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/loadgen/report"
	"github.com/sluice-dev/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Tests that every scheduled get is sent and answered, and timed.
func TestProbeTimesEveryGet(t *testing.T) {
	addr := testenv.SharedMemcached(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c := start(t, Config{Addr: addr, Every: 10 * time.Millisecond}).Run(ctx, time.Now())
	if c.OK < 1 || c.Errors != 0 || c.Scheduled != c.OK || c.Dropped != 0 || c.Latency.Count != c.OK || c.Latency.Max <= 0 {
		t.Fatalf("probe = scheduled %d, ok %d, dropped %d, errors %d (%v), latency %+v; want every slot answered and timed", c.Scheduled, c.OK, c.Dropped, c.Errors, c.FirstErrors, c.Latency)
	}
}

// Tests that a get answering other bytes than the probe stored is an
// error.
func TestProbeCountsAWrongAnswer(t *testing.T) {
	addr := testenv.SharedMemcached(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	other := memcache.New(addr)
	defer other.Close()
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = other.Set(&memcache.Item{Key: key, Value: []byte("not the probe's")})
	}()
	c := start(t, Config{Addr: addr, Every: 10 * time.Millisecond}).Run(ctx, time.Now())
	if c.Errors < 1 || !strings.Contains(c.FirstErrors["Error"], "want the 500 stored") {
		t.Fatalf("probe = ok %d, errors %d (%v); want the overwritten value counted as errors", c.OK, c.Errors, c.FirstErrors)
	}
}

// Tests that a probe that cannot store its value fails at once, naming
// the address.
func TestProbeFailsWithoutMemcached(t *testing.T) {
	m := testenv.StartMemcached(t)
	m.Stop()
	if _, err := Start(Config{Addr: m.Addr()}); err == nil || !strings.Contains(err.Error(), m.Addr()) {
		t.Fatalf("Start against a stopped memcached: %v; want an error naming %s", err, m.Addr())
	}
}

// Tests that a get never waits behind the one before it, and that the
// slots it overran are still timed: with memcached frozen for 300 ms of
// the run and gets due every 10 ms, every slot is timed, about thirty of
// them by the one get the stall held (from their own slots to its
// answer), so the stall shows in the latency as the clients' would, and
// the probe sends about one get per slot outside the stall, not a burst
// after it.
func TestProbeTimesTheSlotsAGetOverran(t *testing.T) {
	m := testenv.StartMemcached(t)
	p := start(t, Config{Addr: m.Addr(), Every: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan report.Client, 1)
	go func() { done <- p.Run(ctx, time.Now()) }()
	time.Sleep(100 * time.Millisecond)
	m.Pause()
	time.Sleep(300 * time.Millisecond)
	m.Resume()
	time.Sleep(100 * time.Millisecond)
	cancel()
	c := <-done
	if c.Scheduled != c.Sent || c.Sent != c.OK+c.Errors || c.Latency.Count != c.Scheduled || c.Dropped != 0 {
		t.Fatalf("probe = scheduled %d, sent %d, ok %d, errors %d, dropped %d, timed %d; want every slot timed", c.Scheduled, c.Sent, c.OK, c.Errors, c.Dropped, c.Latency.Count)
	}
	if c.Latency.Max < 250 || c.Latency.P90 >= c.Latency.Max {
		t.Fatalf("probe latency %+v: want the 300 ms stall at the top of it, many slots below it", c.Latency)
	}
}

func start(t *testing.T, cfg Config) *Prober {
	t.Helper()
	p, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
