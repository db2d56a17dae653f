package probe

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Tests that every scheduled get is sent and answered, and timed.
func TestProbeTimesEveryGet(t *testing.T) {
	addr := testenv.SharedMemcached(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c, err := Run(ctx, Config{Addr: addr, Every: 10 * time.Millisecond}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if c.OK < 1 || c.Errors != 0 || c.Scheduled != c.OK || c.Latency.Count != c.OK || c.Latency.Max <= 0 {
		t.Fatalf("probe = scheduled %d, ok %d, errors %d (%v), latency %+v; want every scheduled get answered and timed", c.Scheduled, c.OK, c.Errors, c.FirstErrors, c.Latency)
	}
}

// Tests that a get answering other bytes than the probe stored is an
// error, not a latency: the probe times only correct answers.
func TestProbeCountsAWrongAnswer(t *testing.T) {
	addr := testenv.SharedMemcached(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = memcache.New(addr).Set(&memcache.Item{Key: key, Value: []byte("not the probe's")})
	}()
	c, err := Run(ctx, Config{Addr: addr, Every: 10 * time.Millisecond}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if c.Errors < 1 || !strings.Contains(c.FirstErrors["Error"], "want the 500 stored") {
		t.Fatalf("probe = ok %d, errors %d (%v); want the overwritten value counted as errors", c.OK, c.Errors, c.FirstErrors)
	}
}

// Tests that a probe that cannot store its value fails at once, naming
// the address.
func TestProbeFailsWithoutMemcached(t *testing.T) {
	m := testenv.StartMemcached(t)
	m.Stop()
	_, err := Run(context.Background(), Config{Addr: m.Addr()}, time.Now())
	if err == nil || !strings.Contains(err.Error(), m.Addr()) {
		t.Fatalf("Run against a stopped memcached: %v; want an error naming %s", err, m.Addr())
	}
}
