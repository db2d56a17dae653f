package cache

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/sony/gobreaker/v2"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
)

// withScriptedMemcached runs client against a memcached stand-in that
// answers the n-th command it reads (counted from 0 over its connections)
// with answer(n, the command's verb): for what a real memcached never
// answers, such as a refusal in the middle of a pipelined write, or a
// proxy's refusal of a delete. It serves one connection at a time; client
// must close its connections (its Cache) before it returns.
func withScriptedMemcached(t *testing.T, answer func(n int, verb string) string, client func(addr string)) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = fanout.Each(testContext(t, 2), 2, func(_ context.Context, i int) error {
		if i == 1 {
			defer l.Close()
			client(l.Addr().String())
			return nil
		}
		n := 0 // commands answered so far, over every connection
		counted := func(verb string) string {
			defer func() { n++ }()
			return answer(n, verb)
		}
		for {
			nc, err := l.Accept()
			if err != nil {
				return nil // the listener is closed: client is done
			}
			if err := serveStandIn(nc, counted); err != nil {
				return err
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// withScriptedCache runs client with a Cache with the defaults and opts
// on a memcached stand-in scripted by answer (withScriptedMemcached),
// and closes the Cache after.
func withScriptedCache(t *testing.T, answer func(n int, verb string) string, opts []Option, client func(c *Cache, addr string)) {
	t.Helper()
	withScriptedMemcached(t, answer, func(addr string) {
		onStandIn(t, addr, nil, func(c *Cache) { client(c, addr) }, opts...)
	})
}

// onStandIn runs client with a Cache over the memcached stand-in at addr,
// its default config with a 5 s socket timeout (room for a loaded
// machine's stalls in every exchange a test expects to succeed) adjusted
// by change (if not nil), and closes the Cache when client returns, as
// the stand-ins require.
func onStandIn(t *testing.T, addr string, change func(*Config), client func(c *Cache), opts ...Option) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Servers, cfg.Timeout = []string{addr}, 5*time.Second
	if change != nil {
		change(&cfg)
	}
	c, err := New(cfg, opts...)
	if err != nil {
		t.Error(err)
		return
	}
	defer c.Close()
	client(c)
}

// Tests that when memcached refuses some tombstones of a pipelined write,
// exactly those keys are owed and every other key is trusted: a
// refused tombstone reported written would let a stale entry be read, a
// written one reported refused would only cost a miss.
func TestRefusedTombstonesOfAPipelinedWriteAreOwedOneByOne(t *testing.T) {
	refusedAt := map[int]bool{0: true, 3: true}
	answer := func(n int, _ string) string {
		if refusedAt[n] {
			return "SERVER_ERROR out of memory storing object"
		}
		return "STORED"
	}
	withScriptedCache(t, answer, []Option{WithDistrust()}, func(c *Cache, addr string) {
		uris := uniqueURIs(t, 5)
		if err := c.Invalidate(testContext(t, 4), uris); !errors.Is(err, errItemRefused) {
			t.Errorf("Invalidate: %v; want the two refusals reported", err)
		}
		if w := c.Stats()[0].TombstoneWrites; w != 1 {
			t.Errorf("%d pipelined writes; want the 5 tombstones in 1", w)
		}
		for i, u := range uris {
			if owed := !c.servers[0].trusts(Key(u)); owed != refusedAt[i] {
				t.Errorf("tombstone %d (refused %v): owed %v", i, refusedAt[i], owed)
			}
		}
	})
}

// Tests that a replay's delete answered with a refusal (which a proxy in
// front of memcached may send) fails the replay, so the server is not
// trusted with a key it may still hold; and that a delete answered with
// another server error (a proxy whose memcached is down) fails it as a
// fault of the server, not as a refusal of one key.
func TestRefusedDeleteFailsTheReplay(t *testing.T) {
	for _, tc := range []struct {
		answer string
		want   error
	}{
		{"SERVER_ERROR out of memory storing object", errItemRefused},
		{"SERVER_ERROR backend unavailable", errRefillFault},
	} {
		answer := func(n int, verb string) string {
			switch {
			case verb == "mg":
				return "HD f0 c7" // every key holds a value
			case n == 4: // the second of the three deletes
				return tc.answer
			}
			return "HD"
		}
		withScriptedCache(t, answer, nil, func(c *Cache, addr string) {
			err := c.DropOn(testContext(t, 4), addr, uniqueURIs(t, 3))
			if !errors.Is(err, tc.want) || (tc.want == errRefillFault && errors.Is(err, errItemRefused)) {
				t.Errorf("DropOn with a delete answered %q: %v; want %v", tc.answer, err, tc.want)
			}
		})
	}
}

// Tests that a single tombstone, set with the gomemcache client, that is
// answered NOT_STORED counts as not written and leaves its key owed, as
// on the pipeline: for an add that answer is normal, for a set it means
// the tombstone is not there.
func TestSingleTombstoneAnsweredNotStoredIsOwed(t *testing.T) {
	withScriptedCache(t, func(int, string) string { return "NOT_STORED" }, []Option{WithDistrust()}, func(c *Cache, addr string) {
		uri := uniqueURIs(t, 1)[0]
		if err := c.Invalidate(testContext(t, 4), []string{uri}); !errors.Is(err, errItemRefused) {
			t.Errorf("Invalidate answered NOT_STORED: %v; want the tombstone reported not written", err)
		}
		if c.servers[0].trusts(Key(uri)) {
			t.Errorf("the key whose tombstone was not stored is trusted; want it owed")
		}
	})
}

// withStandIn runs client against a memcached stand-in that serves up to
// conns connections in all (a goroutine each), answering each command with
// answer(its verb), or not at all when that is "". answer may be called
// from several goroutines at once.
func withStandIn(t *testing.T, conns int, answer func(verb string) string, client func(addr string)) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = fanout.Each(testContext(t, conns+1), conns+1, func(_ context.Context, i int) error {
		if i == conns {
			defer l.Close()
			client(l.Addr().String())
			return nil
		}
		nc, err := l.Accept()
		if err != nil {
			return nil // the listener is closed: client is done
		}
		return serveStandIn(nc, answer)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// serveStandIn reads commands from nc until the client closes it,
// answering each as answer says (see withStandIn).
func serveStandIn(nc net.Conn, answer func(verb string) string) error {
	defer nc.Close()
	if err := nc.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	rw := bufio.NewReadWriter(bufio.NewReader(nc), bufio.NewWriter(nc))
	for {
		line, err := rw.ReadString('\n')
		if err != nil {
			return nil // the client closed the connection
		}
		verb, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if verb == "set" || verb == "add" {
			if _, err := rw.ReadString('\n'); err != nil {
				return nil
			}
		}
		a := answer(verb)
		if a == "" {
			continue
		}
		if _, err := rw.WriteString(a + "\r\n"); err != nil {
			return err
		}
		if rw.Reader.Buffered() == 0 {
			if err := rw.Flush(); err != nil {
				return err
			}
		}
	}
}

// withStalledAdds runs client against a stand-in (withStandIn) that
// answers every set STORED, fails every read (SERVER_ERROR) and never
// answers an add: refills that take a connection hold it until their
// socket timeout ends, as on a server that stalls under them.
func withStalledAdds(t *testing.T, conns int, client func(addr string)) {
	t.Helper()
	answers := map[string]string{"set": "STORED", "get": "SERVER_ERROR busy", "gets": "SERVER_ERROR busy"}
	withStandIn(t, conns, func(verb string) string { return answers[verb] }, client)
}

// Tests that refills, however many wait, never hold every refill
// connection: a batch of tombstones written while as many refills as
// there are refill connections stall on the server goes out on the
// connection kept for it, well before the refills' socket timeout, instead
// of waiting behind them until its caller gives up.
func TestStalledRefillsLeaveAConnectionForTombstones(t *testing.T) {
	const timeout = 2 * time.Second
	withStalledAdds(t, 8, func(addr string) {
		onStandIn(t, addr, func(cfg *Config) { cfg.Timeout = timeout }, func(c *Cache) {
			conns := int(c.servers[0].refills.size)
			whileRefillsStall(t, c, conns, func(ctx context.Context) {
				time.Sleep(300 * time.Millisecond) // room for one more refill to take a connection, were any open to it
				ctx, cancel := context.WithTimeout(ctx, timeout/4)
				defer cancel()
				if err := c.Invalidate(ctx, uniqueURIs(t, 5)); err != nil {
					t.Errorf("Invalidate behind %d stalled refills on %d refill connections: %v; want the tombstones written on the connection kept for them", conns, conns, err)
				}
			})
		})
	})
}

// whileRefillsStall starts n refills on c's one server, a stand-in that
// leaves adds unanswered, and runs then once as many of them as the adds'
// share allows are in flight.
func whileRefillsStall(t *testing.T, c *Cache, n int, then func(ctx context.Context)) {
	t.Helper()
	inFlight := func() bool { return c.Stats()[0].RefillWrites >= addShare(c.servers[0].refills.size) }
	err := fanout.Each(testContext(t, n+1), n+1, func(ctx context.Context, i int) error {
		if i < n {
			c.Fill(ctx, selfValued(uniqueURIs(t, 2)))
			return nil
		}
		for !inFlight() {
			if ctx.Err() != nil {
				t.Errorf("%d of %d refills in flight when the test's time ran out", c.Stats()[0].RefillWrites, n)
				return nil
			}
			time.Sleep(time.Millisecond)
		}
		then(ctx)
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// Tests that a replay's drop reads a key again when it changed between
// the read and the delete (the delete is answered EX, its CAS no longer
// the key's), and decides again: the first read saw a value, the second
// a tombstone, which the drop must spare, so no second delete is sent.
func TestDropRereadsAKeyThatChangedUnderIt(t *testing.T) {
	var verbs []string
	answer := func(n int, verb string) string {
		verbs = append(verbs, verb)
		switch n {
		case 0: // the first key's read: a value
			return "HD f0 c1"
		case 1: // the second's: nothing there
			return "EN"
		case 2: // the first's delete: the key changed meanwhile
			return "EX"
		case 3: // its second read: a tombstone set meanwhile
			return fmt.Sprintf("HD f%d c2", flagTombstone)
		}
		return "SERVER_ERROR unexpected command"
	}
	withScriptedCache(t, answer, nil, func(c *Cache, addr string) {
		if err := c.DropOn(testContext(t, 4), addr, uniqueURIs(t, 2)); err != nil {
			t.Errorf("DropOn: %v", err)
		}
	})
	if want := []string{"mg", "mg", "md", "mg"}; !slices.Equal(verbs, want) {
		t.Errorf("commands sent %v; want %v (read, delete refused as changed, read again and spare the tombstone)", verbs, want)
	}
}

// Tests that a server that does not understand the meta get — it
// answers ERROR (no meta commands), CLIENT_ERROR (a proxy), or OK (the
// meta protocol of memcached before 1.6.10) — is sent classic deletes
// instead, and the replay succeeds.
func TestDropFallsBackToDeletesWithoutMetaCommands(t *testing.T) {
	for _, unknown := range []string{"ERROR", "CLIENT_ERROR bad command line format", "OK f0 c1"} {
		var verbs []string
		answer := func(n int, verb string) string {
			verbs = append(verbs, verb)
			switch {
			case verb == "delete":
				return "DELETED"
			case n == 1:
				return unknown
			}
			return "EN"
		}
		withScriptedCache(t, answer, nil, func(c *Cache, addr string) {
			if err := c.DropOn(testContext(t, 4), addr, uniqueURIs(t, 3)); err != nil {
				t.Errorf("DropOn on a server answering a meta get %q: %v; want classic deletes sent", unknown, err)
			}
		})
		if want := []string{"mg", "mg", "mg", "delete", "delete", "delete"}; !slices.Equal(verbs, want) {
			t.Errorf("a meta get answered %q: commands sent %v; want %v", unknown, verbs, want)
		}
	}
}

// Tests that a key still changing after every read and delete a drop
// makes fails the replay as a key not deleted, not as a fault of the
// server: the connection is kept.
func TestDropOfAKeyThatKeepsChangingFailsTheReplay(t *testing.T) {
	var verbs []string
	answer := func(_ int, verb string) string {
		verbs = append(verbs, verb)
		if verb == "mg" {
			return "HD f0 c1"
		}
		return "EX"
	}
	withScriptedCache(t, answer, nil, func(c *Cache, addr string) {
		err := c.DropOn(testContext(t, 4), addr, uniqueURIs(t, 2))
		if !errors.Is(err, errItemRefused) || !strings.Contains(err.Error(), "2 of 2") {
			t.Errorf("DropOn of 2 keys that change after every read: %v; want both reported not deleted", err)
		}
		if n := c.Stats()[0].OpenConns; n != 1 {
			t.Errorf("%d connections open after the replay; want its one kept", n)
		}
	})
	if len(verbs) != 4*dropRounds {
		t.Errorf("%d commands sent; want a read and a delete of each key in each of %d rounds", len(verbs), dropRounds)
	}
}

// Tests that each exchange of a replay's drop gets a whole socket
// timeout: a read of the keys and their deletes, each answered in a
// little more than half the timeout, succeed together although they take
// longer than one.
func TestEachExchangeOfADropGetsTheSocketTimeout(t *testing.T) {
	// A timeout long enough that a loaded machine's scheduling delays
	// (hundreds of milliseconds at worst) fit in what each exchange has
	// left, and short enough that two exchanges overrun one.
	const timeout = time.Second
	late := timeout * 3 / 5
	answer := func(n int, verb string) string {
		if n%2 == 1 { // the last answer of each exchange comes late
			time.Sleep(late)
		}
		if verb == "mg" {
			return fmt.Sprintf("HD f0 c%d", n+1)
		}
		return "HD"
	}
	withScriptedMemcached(t, answer, func(addr string) {
		onStandIn(t, addr, func(cfg *Config) { cfg.Timeout = timeout }, func(c *Cache) {
			if err := c.DropOn(testContext(t, 4), addr, uniqueURIs(t, 2)); err != nil {
				t.Errorf("DropOn whose two exchanges each took %v of a %v timeout: %v", late, timeout, err)
			}
		})
	})
}

// Tests that a refill is refused at once while its server's breaker is
// open, even when stalled refills hold every slot of the adds' share: it
// is not made to wait for a slot only to be refused once it has one.
func TestRefillOfAnOpenServerDoesNotWaitForAShare(t *testing.T) {
	// The stalled refills hold the share for timeout; the refused one may
	// wait timeout/5, so that only a machine stalled for most of timeout
	// could free a slot in time and let a waiting refill pass unnoticed.
	const timeout = 5 * time.Second
	withStalledAdds(t, 8, func(addr string) {
		change := func(cfg *Config) {
			cfg.Timeout, cfg.BreakerFailures, cfg.BreakerCoolDown = timeout, 1, time.Minute
		}
		onStandIn(t, addr, change, func(c *Cache) {
			srv := c.servers[0]
			share := int(addShare(srv.refills.size))
			whileRefillsStall(t, c, share, func(ctx context.Context) {
				c.Get(ctx, uniqueURIs(t, 1)[0]) // answered SERVER_ERROR: opens the breaker
				if !srv.isOpen() {
					t.Errorf("breaker %v after a failed get with BreakerFailures 1; want open", srv.breaker.State())
					return
				}
				ctx, cancel := context.WithTimeout(ctx, timeout/5)
				defer cancel()
				if err := srv.addPipelined(ctx, []*memcache.Item{{Key: "k", Value: []byte("v")}}); !errors.Is(err, ErrUnavailable) {
					t.Errorf("refill of a server whose breaker is open, behind %d stalled refills: %v; want ErrUnavailable at once", share, err)
				}
			})
		})
	})
}

// Tests that a refill is never the probe of a half-open breaker: while
// the breaker is open or half open a refill is skipped, sends nothing
// and owes nothing; a read probes, and once it has closed the breaker
// refills go out again. A refill sent as the probe into a fault that
// still held would leave each of its keys owed a tombstone.
func TestRefillsNeverProbeAHalfOpenServer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conns int
	}{{"pipelined", 64}, {"one by one", 8}} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var verbs []string
			answer := func(verb string) string {
				mu.Lock()
				defer mu.Unlock()
				verbs = append(verbs, verb)
				switch {
				case len(verbs) == 1: // the first read fails: the breaker opens
					return "SERVER_ERROR busy"
				case verb == "gets":
					return "END"
				}
				return "" // adds stall: one sent owes its keys
			}
			const coolDown = 100 * time.Millisecond
			change := func(cfg *Config) {
				cfg.MaxConnsPerServer, cfg.BreakerFailures, cfg.BreakerCoolDown = tc.conns, 1, coolDown
				cfg.Timeout = time.Second // the last refill's stall
			}
			withStandIn(t, 4, answer, func(addr string) {
				onStandIn(t, addr, change, func(c *Cache) {
					refillsSkippedUntilAReadCloses(t, c, coolDown)
				}, WithDistrust())
			})
			if want := []string{"gets", "gets", "add"}; !slices.Equal(verbs, want) {
				t.Errorf("commands sent: %q; want %q (no add before the read that closed the breaker)", verbs, want)
			}
		})
	}
}

// refillsSkippedUntilAReadCloses opens c's breaker with a failed read,
// refills while it is not closed (open, or half open after coolDown),
// then reads (the probe, which closes it) and refills once more.
func refillsSkippedUntilAReadCloses(t *testing.T, c *Cache, coolDown time.Duration) {
	ctx := testContext(t, 4)
	srv := c.servers[0]
	c.Get(ctx, uniqueURIs(t, 1)[0])
	if st := srv.breaker.State(); st == gobreaker.StateClosed {
		t.Errorf("breaker %v after a failed read with BreakerFailures 1; want open", st)
		return
	}
	c.Fill(ctx, selfValued(uniqueURIs(t, 3)))
	time.Sleep(coolDown + coolDown/2)
	if st := srv.breaker.State(); st != gobreaker.StateHalfOpen {
		t.Errorf("breaker %v after its cool-down; want half-open", st)
		return
	}
	c.Fill(ctx, selfValued(uniqueURIs(t, 3)))
	if owed := c.Stats()[0].OwedTombstones; owed != 0 {
		t.Errorf("%d keys owed after refills while the breaker was not closed; want 0", owed)
	}
	c.Get(ctx, uniqueURIs(t, 1)[0])
	if st := srv.breaker.State(); st != gobreaker.StateClosed {
		t.Errorf("breaker %v after an answered read in half-open; want closed", st)
		return
	}
	c.Fill(ctx, selfValued(uniqueURIs(t, 1)))
}

// Tests that a refill that waited for a connection while the breaker
// opened and then half-opened is not sent as the half-open probe: it
// checks the breaker again once it has a connection, and gives up.
func TestRefillThatWaitedIsNotTheProbe(t *testing.T) {
	const timeout, coolDown = 2 * time.Second, 100 * time.Millisecond
	withStalledAdds(t, 8, func(addr string) {
		change := func(cfg *Config) {
			cfg.Timeout, cfg.BreakerFailures, cfg.BreakerCoolDown = timeout, 1, coolDown
		}
		onStandIn(t, addr, change, func(c *Cache) {
			srv := c.servers[0]
			share := int(addShare(srv.refills.size))
			whileRefillsStall(t, c, share, func(ctx context.Context) {
				time.Sleep(timeout / 2) // the stalled refills end about timeout/2 from now
				_ = fanout.Each(ctx, 2, func(ctx context.Context, i int) error {
					if i == 0 { // passes the first check while closed, then waits for a slot
						c.Fill(ctx, selfValued(uniqueURIs(t, 1)))
						return nil
					}
					time.Sleep(50 * time.Millisecond)
					c.Get(ctx, uniqueURIs(t, 1)[0]) // answered SERVER_ERROR: opens the breaker
					time.Sleep(2 * coolDown)
					srv.breaker.State() // half open from here on
					return nil
				})
			})
			if writes := c.Stats()[0].RefillWrites; writes != int64(share) {
				t.Errorf("%d refill writes sent; want only the %d stalled ones, not the refill that waited while the breaker opened and half-opened", writes, share)
			}
		})
	})
}
