package cache

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// Tests that a tombstone missed on a frozen server hides that key there,
// and only that key: the server's other entries are still read while the
// key is owed, its stale entry never is, Fill leaves it alone, and
// RetryTombstones pays the debt once the server answers (no store
// involved), after which the key refills.
func TestMissedTombstoneHidesOnlyItsKey(t *testing.T) {
	mc, c, cfg := newPausableDistrust(t)
	ctx := testContext(t, 8)
	stamp := time.Now().UnixNano()
	changed, other := fmt.Sprintf("at://did:plc:owed%d/p/1", stamp), fmt.Sprintf("at://did:plc:owed%d/p/2", stamp)
	c.Fill(ctx, map[string]Entry{changed: {Value: []byte("old")}, other: {Value: []byte("v1")}})
	if got := c.GetMulti(ctx, []string{changed, other}); len(got) != 2 {
		t.Fatalf("filled entries not cached: %v", got)
	}

	mc.Pause()
	if err := c.Invalidate(ctx, []string{changed}); err == nil {
		t.Fatal("a tombstone to a frozen memcached was reported written")
	}
	mc.Resume()
	// The frozen server may still apply the tombstone it had buffered;
	// put the stale entry back, as when the tombstone never reached it.
	raw := memcache.New(mc.Addr())
	time.Sleep(50 * time.Millisecond)
	if err := raw.Set(&memcache.Item{Key: Key(changed), Value: []byte("old"), Flags: flagValue}); err != nil {
		t.Fatalf("put the stale entry back: %v", err)
	}
	got := c.GetMulti(ctx, []string{changed, other})
	if _, ok := got[changed]; ok {
		t.Errorf("the key whose tombstone was missed answered its stale entry %q", got[changed].Value)
	}
	if _, ok := got[other]; !ok {
		t.Errorf("an untouched key on the same server was not read: the whole server was distrusted")
	}
	// A read of that key alone takes the single-key path; it hides too.
	if got := c.GetMulti(ctx, []string{changed}); len(got) != 0 {
		t.Errorf("read alone, the key whose tombstone was missed answered its stale entry %q", got[changed].Value)
	}
	st := c.Stats()[0]
	if st.OwedTombstones != 1 || st.Distrusted != 2 || st.Suspect {
		t.Errorf("stats %+v: want 1 owed tombstone, 2 distrusted hits (the pair's read and the single read), not suspect as a whole", st)
	}
	c.Fill(ctx, map[string]Entry{changed: {Value: []byte("refill while owed")}})

	n, err := c.RetryTombstones(ctx)
	if err != nil || n != 1 {
		t.Fatalf("RetryTombstones = %d, %v; want 1 written", n, err)
	}
	if st := c.Stats()[0]; st.OwedTombstones != 0 {
		t.Fatalf("still %d owed after the retry", st.OwedTombstones)
	}
	if got := c.GetMulti(ctx, []string{changed}); len(got) != 0 {
		t.Fatalf("the retried tombstone did not hide the stale entry: %v", got)
	}
	// The tombstone expires on memcached's whole seconds, and a refill
	// is best effort (one Timeout): try until the key refills.
	time.Sleep(cfg.TombstoneTTL)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c.Fill(ctx, map[string]Entry{changed: {Value: []byte("new")}})
		if got := c.GetMulti(ctx, []string{changed}); string(got[changed].Value) == "new" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key did not refill within 10s of its tombstone's expiry")
		}
	}
}

// Tests that a server owing more than maxOwedKeys becomes suspect as a
// whole, from its earliest miss.
func TestTooManyOwedKeysDistrustTheServer(t *testing.T) {
	d := newDistrust()
	first := time.Now().Add(-time.Minute)
	d.owe("k0", first)
	for i := 1; i <= maxOwedKeys; i++ {
		d.owe(fmt.Sprintf("k%d", i), time.Now())
	}
	s, on := d.suspect()
	if !on || !s.Since.Equal(first) {
		t.Fatalf("suspect = %+v, %v; want suspect since the first miss %v", s, on, first)
	}
	if d.owedLen() != 0 {
		t.Errorf("%d keys still owed; the whole-server replay covers them", d.owedLen())
	}
}

// Tests that a get sent while a key was owed, or its server suspect, and
// answered after the debt was paid (or the server trusted again) is not
// answered from memcached: memcached may have read the entry before the
// tombstone landed, when a get and a set queued on two connections while
// it was frozen. A get sent after the payment is answered as usual.
func TestDebtPaidDuringAGetHidesItsAnswer(t *testing.T) {
	items := func() map[string]*memcache.Item {
		return map[string]*memcache.Item{"changed": {Key: "changed"}, "other": {Key: "other"}}
	}
	d := newDistrust()
	missed := time.Now()
	d.owe("changed", missed)
	sent := time.Now()
	time.Sleep(time.Millisecond) // the clock moves between the send and the payment
	d.paid("changed", missed)
	got := items()
	if n := d.hide(got, sent); n != 1 || got["changed"] != nil || got["other"] == nil {
		t.Errorf("a get sent before the debt was paid: hid %d, kept %v; want the paid key hidden, the other kept", n, got)
	}
	got = items()
	if n := d.hide(got, time.Now()); n != 0 {
		t.Errorf("a get sent after the debt was paid: hid %d keys, want 0", n)
	}

	d.fail(time.Now())
	s, _ := d.suspect()
	sent = time.Now()
	time.Sleep(time.Millisecond)
	if !d.trust(s) {
		t.Fatal("trust refused with no failure since the suspicion was taken")
	}
	got = items()
	if n := d.hide(got, sent); n != 2 {
		t.Errorf("a get sent while the server was suspect, answered after Trust: hid %d keys, want 2", n)
	}
	got = items()
	if n := d.hide(got, time.Now()); n != 0 {
		t.Errorf("a get sent after Trust: hid %d keys, want 0", n)
	}
}

// Tests that a tombstone begun before a later write's tombstone was
// missed does not pay that later miss, even when the key already owed an
// earlier one: the later write's stale entry is still hidden, and its
// debt lives for the longest entry lifetime from the later miss.
func TestLaterMissIsNotPaidByAnEarlierTombstone(t *testing.T) {
	d := newDistrust()
	first := time.Now().Add(-time.Hour)
	d.owe("k", first)                 // a write's tombstone missed
	retried := first.Add(time.Minute) // a retried tombstone begins
	later := retried.Add(time.Minute) // a later write's tombstone is missed
	d.owe("k", later)                 // the key is still owed
	d.paid("k", retried)              // the retried tombstone, begun before the later write, lands
	if d.trusts("k") {
		t.Fatal("a tombstone begun before a later missed one paid the later debt: the later write's stale entry would be read")
	}
	if debts := d.debts(later.Add(-time.Second)); debts["k"].IsZero() {
		t.Fatalf("the debt expired from the first miss (debts %v), though the later miss is within the entry lifetime", debts)
	}
	d.paid("k", later)
	if !d.trusts("k") {
		t.Fatal("a tombstone begun after the later miss did not pay the debt")
	}
}

// Tests that a journal replay onto a server deletes the copies it holds
// as a key's stand-in (its second rendezvous choice), not only the keys
// it owns: a stand-in copy left from an earlier outage of the owner would
// be read again at its next outage.
func TestDropOnDeletesStandInCopies(t *testing.T) {
	standIn := testenv.SharedMemcached(t)
	owner := "127.0.0.1:1" // never reached: DropOn only talks to the server named
	cfg := DefaultConfig()
	cfg.Servers = []string{standIn, owner}
	cfg.Timeout = time.Second
	c, err := New(cfg, WithDistrust())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := testContext(t, 4)
	var uri string
	for i := 0; ; i++ {
		uri = fmt.Sprintf("at://did:plc:standin%d/p/%d", time.Now().UnixNano(), i)
		if pick(c.seeds, Key(uri)) == 1 {
			break
		}
	}
	raw := memcache.New(standIn)
	if err := raw.Set(&memcache.Item{Key: Key(uri), Value: []byte("stale"), Flags: flagValue}); err != nil {
		t.Fatalf("put a stand-in copy: %v", err)
	}
	if err := c.DropOn(ctx, standIn, []string{uri}); err != nil {
		t.Fatalf("DropOn: %v", err)
	}
	if it, err := raw.Get(Key(uri)); err == nil {
		t.Fatalf("after a replay onto the stand-in, it still holds %q for a key it stands in for", it.Value)
	}
}

// Tests that a replay of many URIs deletes every one the server holds,
// in pipelined writes, and takes a key it does not hold (NOT_FOUND) as
// deleted.
func TestDropOnDeletesManyKeys(t *testing.T) {
	addr := testenv.SharedMemcached(t)
	c := newCache(t, []string{addr}, nil) // 64 connections: 4 carry pipelines
	uris := uniqueURIs(t, 1500)
	held := uris[:1200]
	raw := memcache.New(addr)
	for _, u := range held {
		if err := raw.Set(&memcache.Item{Key: Key(u), Value: []byte("stale"), Flags: flagValue}); err != nil {
			t.Fatalf("put a copy: %v", err)
		}
	}
	dials := c.Stats()[0].Dials
	if err := c.DropOn(testContext(t, 8), addr, uris); err != nil {
		t.Fatalf("DropOn of %d URIs, %d of them held: %v", len(uris), len(held), err)
	}
	// Three pipelined writes of up to 500 deletes need at most three
	// connections; one delete per call at fan-out 8 would take eight.
	if n := c.Stats()[0].Dials - dials; n > 3 {
		t.Errorf("the replay dialled %d connections; want at most 3, one per pipelined write", n)
	}
	if got := c.GetMulti(testContext(t, 8), held); len(got) != 0 {
		t.Fatalf("after the replay, %d of the %d held keys are still there", len(got), len(held))
	}
}

// Tests that a replay spares the tombstones it finds, pipelined (one key
// or many) and through the gomemcache client (a server with too few
// connections for a pipeline): each stands between a recent write and a
// read from before it that has yet to refill, which a delete would let
// store the old record. Every other key it drops.
func TestDropOnSparesTombstones(t *testing.T) {
	addr := testenv.SharedMemcached(t)
	raw := memcache.New(addr)
	for _, run := range []struct{ conns, n int }{{64, 1}, {64, 40}, {8, 3}} {
		c := newCache(t, []string{addr}, func(cfg *Config) { cfg.MaxConnsPerServer = run.conns })
		if pipelined := c.servers[0].refills != nil; pipelined != (run.conns >= 16) {
			t.Fatalf("%d connections: pipelined %v", run.conns, pipelined)
		}
		n := run.n
		uris := uniqueURIs(t, 2*n)
		tombstoned, stale := uris[:n], uris[n:]
		for _, u := range tombstoned {
			if err := raw.Set(c.tombstone(Key(u))); err != nil {
				t.Fatalf("set a tombstone: %v", err)
			}
		}
		for _, u := range stale {
			if err := raw.Set(&memcache.Item{Key: Key(u), Value: []byte("stale"), Flags: flagValue}); err != nil {
				t.Fatalf("put a copy: %v", err)
			}
		}
		if err := c.DropOn(testContext(t, 8), addr, uris); err != nil {
			t.Fatalf("DropOn of %d URIs: %v", len(uris), err)
		}
		for _, u := range stale {
			if _, err := raw.Get(Key(u)); !errors.Is(err, memcache.ErrCacheMiss) {
				t.Errorf("%d connections, %d keys replayed: a stale copy after the replay: %v; want it deleted", run.conns, 2*n, err)
			}
		}
		c.Fill(testContext(t, 8), selfValued(tombstoned))
		for _, u := range tombstoned {
			it, err := raw.Get(Key(u))
			if err != nil || it.Flags != flagTombstone {
				t.Errorf("%d connections, %d keys replayed: a tombstone after the replay and a refill: %v, %+v; want it still there, blocking the refill", run.conns, 2*n, err, it)
			}
		}
	}
}

// Tests that a refill whose outcome is unknown — its adds went out to a
// frozen memcached and no answer came — leaves its keys owed, as a
// missed tombstone does: the add may still land, with a record read
// before a write whose tombstone could expire first, so the key reads as
// a miss there until RetryTombstones writes a tombstone over it. A
// refill that never reached a server (its dial refused) owes nothing.
func TestRefillOfUnknownOutcomeOwesItsKeys(t *testing.T) {
	mc, c, _ := newPausableDistrust(t)
	ctx := testContext(t, 8)
	uris := uniqueURIs(t, 2)
	refilled, other := uris[0], uris[1]
	c.Fill(ctx, map[string]Entry{other: {Value: []byte("v1")}})

	mc.Pause()
	c.Fill(ctx, map[string]Entry{refilled: {Value: []byte("old")}})
	mc.Resume()
	if st := c.Stats()[0]; st.OwedTombstones != 1 {
		t.Fatalf("stats %+v: want the refill's key owed after its exchange timed out", st)
	}
	// Whether or not the frozen server stored the add it had buffered,
	// put it there, as when it lands late.
	raw := memcache.New(mc.Addr())
	if err := raw.Set(&memcache.Item{Key: Key(refilled), Value: []byte("old"), Flags: flagValue}); err != nil {
		t.Fatalf("land the refill: %v", err)
	}
	got := c.GetMulti(ctx, []string{refilled, other})
	if e, ok := got[refilled]; ok {
		t.Errorf("the key of a refill of unknown outcome answered %q, want a miss while it is owed", e.Value)
	}
	if _, ok := got[other]; !ok {
		t.Errorf("an untouched key on the same server was not read")
	}
	if n, err := c.RetryTombstones(ctx); err != nil || n != 1 {
		t.Fatalf("RetryTombstones = %d, %v; want 1 written", n, err)
	}
	if got := c.GetMulti(ctx, []string{refilled}); len(got) != 0 {
		t.Fatalf("the tombstone written for the owed key did not hide the landed refill: %q", got[refilled].Value)
	}

	down := DefaultConfig()
	down.Servers = []string{closedAddr(t)}
	c2, err := New(down, WithDistrust())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c2.Close() })
	c2.Fill(ctx, map[string]Entry{refilled: {Value: []byte("old")}})
	if st := c2.Stats()[0]; st.OwedTombstones != 0 || st.Errors == 0 {
		t.Fatalf("stats %+v: want the refused dial counted as an error and nothing owed", st)
	}
}

// closedAddr is a local address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// newPausableDistrust starts a memcached the test may pause and a Cache
// on it with distrust, a 1s socket timeout (a call to the paused server
// fails after it; one to the running server, on a busy machine, does
// not) and a 1s tombstone TTL.
func newPausableDistrust(t *testing.T) (*testenv.Memcached, *Cache, Config) {
	t.Helper()
	mc := testenv.StartMemcached(t)
	cfg := DefaultConfig()
	cfg.Servers = []string{mc.Addr()}
	cfg.Timeout = time.Second
	cfg.TombstoneTTL = time.Second
	c, err := New(cfg, WithDistrust())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return mc, c, cfg
}

// Tests that a refill's debt does not lapse with age, as a missed
// tombstone's does once every entry it could hide has expired: the add
// may land when a frozen server resumes, long after it was missed. Both
// are paid by a tombstone begun after them.
func TestRefillDebtLastsUntilPaid(t *testing.T) {
	d := newDistrust()
	missed := time.Now()
	d.owe("tombstone", missed)
	d.oweUntilPaid("refill", missed)
	debts := d.debts(missed.Add(time.Hour)) // both older than any entry's lifetime
	if _, ok := debts["tombstone"]; ok {
		t.Errorf("a missed tombstone's debt outlived every entry it could hide")
	}
	if _, ok := debts["refill"]; !ok || d.trusts("refill") {
		t.Fatalf("debts %v: the refill's debt lapsed with age, want it owed until paid", debts)
	}
	d.paid("refill", missed.Add(time.Second))
	if !d.trusts("refill") || d.owedLen() != 0 {
		t.Errorf("a tombstone begun after the refill's miss did not pay its debt (%d owed)", d.owedLen())
	}
}
