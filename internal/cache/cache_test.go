package cache

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/testenv"
	"go.uber.org/goleak"
)

const defaultTestTimeout = 20 * time.Second

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testContext returns a context bounded by defaultTestTimeout that fans
// out up to limit calls at once.
func testContext(t testing.TB, limit int) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	return fanout.WithLimit(ctx, limit)
}

// newCache returns a Cache over servers, with cfg adjusted by change, that
// is closed when the test ends.
func newCache(t testing.TB, servers []string, change func(*Config)) *Cache {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Servers = servers
	cfg.Timeout = time.Second
	if change != nil {
		change(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// selfValued is a fill of uris, each with its own URI as the value.
func selfValued(uris []string) map[string]Entry {
	fill := make(map[string]Entry, len(uris))
	for _, u := range uris {
		fill[u] = Entry{Value: []byte(u)}
	}
	return fill
}

// uniqueURIs returns n post URIs no other test uses, so tests can share
// one memcached.
func uniqueURIs(t testing.TB, n int) []string {
	uris := make([]string, n)
	stamp := time.Now().UnixNano()
	for i := range uris {
		uris[i] = fmt.Sprintf("at://did:plc:%s-%d/app.bsky.feed.post/%d", t.Name(), stamp, i)
	}
	return uris
}

func sumStats(c *Cache) ServerStats {
	var sum ServerStats
	for _, s := range c.Stats() {
		sum.Dials += s.Dials
		sum.OpenConns += s.OpenConns
		sum.InUse += s.InUse
		sum.Hits += s.Hits
		sum.Misses += s.Misses
		sum.Errors += s.Errors
		sum.Skipped += s.Skipped
		sum.Waits += s.Waits
		sum.WaitExpired += s.WaitExpired
		sum.Gathered += s.Gathered
	}
	return sum
}

// Tests that filled values and negatives come back, across several gets
// per server, and that absent keys are missing from the result.
func TestFillThenGetMulti(t *testing.T) {
	c := newCache(t, []string{testenv.SharedMemcached(t)}, func(cfg *Config) { cfg.MaxKeysPerGet = 3 })
	ctx := testContext(t, 8)
	uris := uniqueURIs(t, 11)
	fill := map[string]Entry{}
	for i, u := range uris[:10] {
		if i%3 == 0 {
			fill[u] = Entry{Negative: true}
		} else {
			fill[u] = Entry{Value: []byte("record " + u)}
		}
	}
	c.Fill(ctx, fill)

	got := c.GetMulti(ctx, uris)
	if len(got) != len(fill) {
		t.Fatalf("GetMulti returned %d entries, want %d", len(got), len(fill))
	}
	for u, want := range fill {
		if e := got[u]; e.Negative != want.Negative || string(e.Value) != string(want.Value) {
			t.Errorf("GetMulti[%q] = %+v, want %+v", u, e, want)
		}
	}
	if _, ok := got[uris[10]]; ok {
		t.Errorf("GetMulti returned an entry for a URI never filled")
	}
	if s := sumStats(c); s.Hits != 10 || s.Misses != 1 || s.Errors != 0 {
		t.Errorf("stats = %+v, want 10 hits, 1 miss, 0 errors", s)
	}
}

// Tests that Fill uses ADD: it never replaces an entry already cached.
func TestFillDoesNotOverwrite(t *testing.T) {
	c := newCache(t, []string{testenv.SharedMemcached(t)}, nil)
	ctx := testContext(t, 4)
	u := uniqueURIs(t, 1)[0]
	c.Fill(ctx, map[string]Entry{u: {Value: []byte("first")}})
	c.Fill(ctx, map[string]Entry{u: {Value: []byte("second")}})
	c.Fill(ctx, map[string]Entry{u: {Negative: true}})
	if got := c.GetMulti(ctx, []string{u})[u]; string(got.Value) != "first" || got.Negative {
		t.Fatalf("after three fills got %+v, want the first value", got)
	}
	if s := sumStats(c); s.Errors != 0 {
		t.Errorf("refused ADDs were counted as %d errors", s.Errors)
	}
}

// Tests that Invalidate turns a hit into a miss and blocks refills until
// TombstoneTTL has passed. memcached counts expiry in whole seconds, so a
// 2 s tombstone lives between 1 s and 2 s: the refill right after it
// must be refused, and one tried after it has gone must be stored.
func TestInvalidateBlocksFillUntilTombstoneExpires(t *testing.T) {
	const ttl = 2 * time.Second
	c := newCache(t, []string{testenv.SharedMemcached(t)}, func(cfg *Config) { cfg.TombstoneTTL = ttl })
	ctx := testContext(t, 4)
	u := uniqueURIs(t, 1)[0]
	c.Fill(ctx, map[string]Entry{u: {Value: []byte("old")}})
	if err := c.Invalidate(ctx, []string{u}); err != nil {
		t.Fatalf("Invalidate: %v", err)
	}
	if got := c.GetMulti(ctx, []string{u}); len(got) != 0 {
		t.Fatalf("after Invalidate GetMulti = %+v, want a miss", got)
	}
	c.Fill(ctx, map[string]Entry{u: {Value: []byte("stale refill")}})
	if got := c.GetMulti(ctx, []string{u}); len(got) != 0 {
		t.Fatalf("Fill during the tombstone stored %+v, want a miss", got)
	}

	time.Sleep(ttl)
	// Polled for a little while: the tombstone has gone by now on
	// memcached's clock, and a refill (best effort) may need a retry on
	// a loaded machine.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c.Fill(ctx, map[string]Entry{u: {Value: []byte("new")}})
		if got := c.GetMulti(ctx, []string{u})[u]; string(got.Value) == "new" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Fill after the tombstone expired: got %+v 3 s after its %v TTL, want the new value", c.GetMulti(ctx, []string{u})[u], ttl)
		}
	}
}

// Tests that URIs shaped like protocol commands round-trip as data and
// leave the server's other items alone.
func TestHostileURIsRoundTrip(t *testing.T) {
	addr := testenv.StartMemcached(t).Addr()
	raw := memcache.New(addr)
	defer raw.Close()
	for _, k := range []string{"x", "foo", "bystander"} {
		if err := raw.Set(&memcache.Item{Key: k, Value: []byte("v-" + k)}); err != nil {
			t.Fatalf("raw Set %s: %v", k, err)
		}
	}

	c := newCache(t, []string{addr}, nil)
	ctx := testContext(t, 4)
	uris := []string{
		"\r\nflush_all\r\n",
		"at://did:plc:a/app.bsky.feed.post/x\r\nflush_all\r\n",
		"has some spaces in it",
		"get x",
		"delete foo\r\n",
		"set x 0 0 1\r\nz\r\n",
		"\x00\xff\xfe",
	}
	fill := map[string]Entry{}
	for _, u := range uris {
		fill[u] = Entry{Value: []byte("value of " + u)}
	}
	c.Fill(ctx, fill)
	got := c.GetMulti(ctx, uris)
	for _, u := range uris {
		if string(got[u].Value) != "value of "+u {
			t.Errorf("GetMulti[%q] = %q, want %q", u, got[u].Value, "value of "+u)
		}
	}
	if err := c.Invalidate(ctx, uris); err != nil {
		t.Fatalf("Invalidate: %v", err)
	}
	for _, k := range []string{"x", "foo", "bystander"} {
		it, err := raw.Get(k)
		if err != nil || string(it.Value) != "v-"+k {
			t.Errorf("raw Get %s after hostile URIs: %v, %v; want it untouched", k, it, err)
		}
	}
}

// Tests that keys spread over two servers and still round-trip.
func TestTwoServers(t *testing.T) {
	a, b := testenv.StartMemcached(t).Addr(), testenv.StartMemcached(t).Addr()
	c := newCache(t, []string{a, b}, nil)
	ctx := testContext(t, 8)
	uris := uniqueURIs(t, 200)
	c.Fill(ctx, selfValued(uris))
	if got := c.GetMulti(ctx, uris); len(got) != len(uris) {
		t.Fatalf("GetMulti returned %d of %d", len(got), len(uris))
	}
	for _, s := range c.Stats() {
		if s.Hits < 60 {
			t.Errorf("server %s served %d hits of 200, want a fair share", s.Addr, s.Hits)
		}
	}
}

// Tests that a context that has already ended yields no hits, no calls
// and no waiting, and that Invalidate reports the tombstones it could not
// write.
func TestExpiredContextReturnsPromptly(t *testing.T) {
	c := newCache(t, []string{testenv.SharedMemcached(t)}, func(cfg *Config) { cfg.MaxConnsPerServer = 1 })
	u := uniqueURIs(t, 1)[0]
	c.Fill(testContext(t, 1), map[string]Entry{u: {Value: []byte("v")}})

	ctx, cancel := context.WithCancel(testContext(t, 4))
	cancel()
	before := c.Stats()[0]
	if got := c.GetMulti(ctx, []string{u}); len(got) != 0 {
		t.Errorf("GetMulti with an ended context = %+v, want no hits", got)
	}
	if err := c.Invalidate(ctx, []string{u}); err == nil {
		t.Errorf("Invalidate with an ended context = nil, want an error counting 1 failure")
	}
	// No call reached memcached and none waited for a connection.
	after := c.Stats()[0]
	if after.Hits != before.Hits || after.Misses != before.Misses || after.Dials != before.Dials || after.Waits != before.Waits ||
		after.WaitExpired != before.WaitExpired || after.Skipped != before.Skipped {
		t.Errorf("stats went from %+v to %+v with an ended context, want no gets, dials, waits, expired waits or skips", before, after)
	}
	if s := sumStats(c); s.InUse != 0 || s.Errors != 0 {
		t.Errorf("stats = %+v, want nothing in use and no errors", s)
	}
}

// Tests that a caller waiting for the only connection gives up at its
// deadline, that giving up does not count against the breaker, and that
// a read timeout does. The slot is held by a get against a listener that
// accepts connections and never answers, for the read timeout of 2s; the
// waiter's deadline is 100ms, so a waiter that outlived its deadline
// would get the slot in the end instead of counting an expired wait.
func TestWaitIsBoundedByDeadline(t *testing.T) {
	stalled, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	c := newCache(t, []string{stalled.Addr().String()}, func(cfg *Config) {
		cfg.MaxConnsPerServer = 1
		cfg.SingleGetsInFlight = 2 // the second read waits for the connection, not for the first read's get
		cfg.BreakerFailures = 1
		cfg.Timeout = 2 * time.Second
	})
	ctx := testContext(t, 2)
	var stateAfterWait string
	err = fanout.Each(ctx, 2, func(ctx context.Context, i int) error {
		if i == 0 {
			c.GetMulti(ctx, []string{"holds the slot until the read times out"})
			return nil
		}
		for c.Stats()[0].InUse == 0 {
			time.Sleep(time.Millisecond)
		}
		short, cancel := context.WithTimeout(ctx, time.Second) // between the wait starting and the holder's 2 s timeout
		defer cancel()
		c.GetMulti(short, []string{"waits"})
		stateAfterWait = c.Stats()[0].BreakerState
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if stateAfterWait != "closed" {
		t.Errorf("breaker after an abandoned wait = %q, want closed", stateAfterWait)
	}
	s := c.Stats()[0]
	if s.Waits != 1 || s.WaitExpired != 1 || s.Errors != 1 || s.BreakerState != "open" {
		t.Errorf("stats = %+v, want 1 wait, 1 expired wait, 1 error and an open breaker", s)
	}
}

// Tests that with memcached down reads are fast empty misses, the breaker
// opens, and that the same Cache serves hits again once memcached is back
// and the cool-down has passed.
func TestMemcachedDownThenBack(t *testing.T) {
	mc := testenv.StartMemcached(t)
	c := newCache(t, []string{mc.Addr()}, func(cfg *Config) {
		cfg.Timeout = 250 * time.Millisecond
		cfg.BreakerFailures = 3
		// Longer than a loaded machine takes for the 20 reads below,
		// which must all find the breaker open, not half open.
		cfg.BreakerCoolDown = 3 * time.Second
	})
	ctx := testContext(t, 4)
	uris := uniqueURIs(t, 1)
	c.Fill(ctx, map[string]Entry{uris[0]: {Value: []byte("v")}})
	if len(c.GetMulti(ctx, uris)) != 1 {
		t.Fatalf("no hit while memcached is up")
	}

	if n := c.Stats()[0].BreakerOpens; n != 0 {
		t.Fatalf("breaker opened %d times while memcached was up", n)
	}
	mc.Stop()
	for i := 0; c.Stats()[0].BreakerState != "open"; i++ {
		if i == 10 {
			t.Fatalf("breaker still %q after %d failed reads", c.Stats()[0].BreakerState, i)
		}
		if got := c.GetMulti(ctx, uris); len(got) != 0 {
			t.Fatalf("GetMulti with memcached down = %+v, want empty", got)
		}
	}
	open := c.Stats()[0]
	for range 20 {
		if got := c.GetMulti(ctx, uris); len(got) != 0 {
			t.Fatalf("GetMulti with the breaker open = %+v, want empty", got)
		}
	}
	// Skipped without a call: no dial, no error, no wait (a call to the
	// stopped server would fail or time out, and count as an error).
	if s := c.Stats()[0]; s.Skipped-open.Skipped != 20 || s.Errors != open.Errors || s.Dials != open.Dials || s.Waits != open.Waits {
		t.Fatalf("20 reads with the breaker open took stats from %+v to %+v; want 20 skipped and no errors, dials or waits", open, s)
	}
	if err := c.Invalidate(ctx, uris); err == nil {
		t.Errorf("Invalidate with the breaker open = nil, want an error")
	}
	if s := c.Stats()[0]; s.Errors < 3 || s.Skipped < 20 {
		t.Errorf("stats = %+v, want ≥ 3 errors and ≥ 20 skipped", s)
	}

	mc.Start()
	deadline := time.Now().Add(c.cfg.BreakerCoolDown + 5*time.Second)
	for len(c.GetMulti(ctx, uris)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no hit a cool-down and 5 s after memcached came back; stats %+v", c.Stats()[0])
		}
		c.Fill(ctx, map[string]Entry{uris[0]: {Value: []byte("v")}})
		time.Sleep(50 * time.Millisecond)
	}
	if s := c.Stats()[0]; s.BreakerState != "closed" || s.BreakerOpens < 1 {
		t.Errorf("breaker after recovery = %q, opened %d times; want closed, opened at least once", s.BreakerState, s.BreakerOpens)
	}
}

// Tests that Close closes every connection and later calls are skipped.
func TestClose(t *testing.T) {
	c := newCache(t, []string{testenv.SharedMemcached(t)}, nil)
	ctx := testContext(t, 8)
	uris := uniqueURIs(t, 50)
	c.Fill(ctx, map[string]Entry{uris[0]: {Value: []byte("v")}})
	c.GetMulti(ctx, uris)
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := c.GetMulti(ctx, uris); len(got) != 0 {
		t.Errorf("GetMulti after Close = %+v, want empty", got)
	}
	if s := c.Stats()[0]; s.OpenConns != 0 || s.Skipped == 0 {
		t.Errorf("stats after Close = %+v, want no open conns and skipped calls", s)
	}
}
