package cache

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// Tests that single-key reads arriving while the server's gets are all
// out wait, and go out together as one get when the first returns: each
// reader gets its own record, a key asked twice is read once, and a
// reader whose deadline ends while waiting gives up alone, counted as an
// expired wait. memcached is paused (SIGSTOP) to hold the first get out.
func TestSingleReadsAreGathered(t *testing.T) {
	mc := testenv.StartMemcached(t)
	c := newCache(t, []string{mc.Addr()}, func(cfg *Config) {
		cfg.SingleGetsInFlight = 1
		cfg.Timeout = 20 * time.Second
	})
	ctx := testContext(t, 8)
	uris := uniqueURIs(t, 5)
	fill := map[string]Entry{}
	for _, u := range uris {
		fill[u] = Entry{Value: []byte("record " + u)}
	}
	c.Fill(ctx, fill)
	c.GetMulti(ctx, []string{uris[0]}) // the connection is dialled before the pause
	g := c.servers[0].singles
	before := sumStats(c)
	hitsBefore := memcachedStat(t, mc.Addr(), "get_hits")

	mc.Pause()
	resumed := false
	defer func() {
		if !resumed {
			mc.Resume()
		}
	}()
	asks := []string{uris[0], uris[1], uris[2], uris[2], uris[3]} // the first goes out alone, the rest wait
	got := make([]map[string]Entry, len(asks))
	var expired map[string]Entry
	firstOut := func() bool { return c.Stats()[0].InUse == 1 }
	// Tasks: the reads of asks, then one with a short deadline, then the
	// one that resumes memcached once the rest are waiting.
	err := fanout.Each(ctx, len(asks)+2, func(ctx context.Context, i int) error {
		if i > 0 {
			if err := waitUntil("the first get is out", firstOut); err != nil {
				return err
			}
		}
		switch {
		case i < len(asks):
			got[i] = c.GetMulti(ctx, []string{asks[i]})
		case i == len(asks):
			// Long enough to reach the wait on a busy machine.
			short, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			expired = c.GetMulti(short, []string{uris[4]})
		default:
			err := waitUntil("four reads waiting after the fifth gave up", func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				return len(g.waiting) == len(asks)-1 && c.Stats()[0].WaitExpired == before.WaitExpired+1
			})
			mc.Resume()
			resumed = true
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	for i, u := range asks {
		if e := got[i][u]; string(e.Value) != "record "+u {
			t.Errorf("read %d of %s got %q, want its own record", i, u, e.Value)
		}
	}
	if len(expired) != 0 {
		t.Errorf("the read that gave up got %v, want nothing", expired)
	}
	after := sumStats(c)
	if n := after.Gathered - before.Gathered; n != int64(len(asks)-1) {
		t.Errorf("%d reads gathered, want the %d that waited", n, len(asks)-1)
	}
	// The first get read one key; the gathered one read three, not four.
	if n := memcachedStat(t, mc.Addr(), "get_hits") - hitsBefore; n != 4 {
		t.Errorf("memcached found %d keys, want 4: one alone, then three together with the repeated key read once", n)
	}
}

// memcachedStat reads one counter of memcached's "stats".
func memcachedStat(t *testing.T, addr, name string) int64 {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("stats\r\n")); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(conn)
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) == 1 && f[0] == "END" {
			break
		}
		if len(f) == 3 && f[0] == "STAT" && f[1] == name {
			n, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				t.Fatalf("stat %s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("memcached at %s reported no %s (%v)", addr, name, lines.Err())
	return 0
}

// waitUntil polls cond until it holds, or fails after 10 s.
func waitUntil(what string, cond func() bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within 10s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// Tests that a gathered get answers every read in it whatever becomes of
// the read that runs it: the runner's deadline ends while the get waits
// for the server's only connection, and the other read still gets its
// record once the connection is free.
func TestGatheredGetOutlivesItsRunner(t *testing.T) {
	c := newCache(t, []string{testenv.SharedMemcached(t)}, func(cfg *Config) {
		cfg.SingleGetsInFlight = 1
		cfg.MaxConnsPerServer = 1
		cfg.Timeout = 10 * time.Second
	})
	ctx := testContext(t, 2)
	uris := uniqueURIs(t, 2)
	c.Fill(ctx, map[string]Entry{uris[0]: {Value: []byte("first")}, uris[1]: {Value: []byte("second")}})
	srv := c.servers[0]
	if err := srv.sem.Acquire(ctx, 1); err != nil { // the only connection is busy
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	runner := &asked{ctx: short, key: Key(uris[0]), turn: make(chan []*asked, 1), runs: true}
	other := &asked{ctx: ctx, key: Key(uris[1]), turn: make(chan []*asked, 1)}
	srv.singles.running = 1 // the slot that comes with a batch
	err := fanout.Each(ctx, 2, func(ctx context.Context, i int) error {
		if i == 0 {
			srv.singles.serve([]*asked{runner, other})
			return nil
		}
		<-short.Done()
		time.Sleep(50 * time.Millisecond)
		srv.sem.Release(1)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if other.item == nil || string(other.item.Value) != "second" {
		t.Fatalf("the other read got %v after its runner's deadline ended, want its record", other.item)
	}
	if answered := <-other.turn; answered != nil {
		t.Fatalf("the other read was handed a batch, want its answer")
	}
	if srv.singles.running != 0 {
		t.Fatalf("%d gets still counted out after the batch, want 0", srv.singles.running)
	}
}
