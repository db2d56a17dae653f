package cache

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// Tests that a large refill goes out in pipelined writes of
// refillItemsPerWrite adds, that every entry is stored as Fill stored it
// one call at a time (values and negatives), and that the pipeline still
// adds: a key holding a tombstone is left alone, and refused adds are not
// errors.
func TestPipelinedRefill(t *testing.T) {
	c := newCache(t, []string{testenv.SharedMemcached(t)}, nil) // 64 connections: 4 carry refills
	ctx := testContext(t, 8)
	uris := uniqueURIs(t, 1200)
	tombstoned := uris[:7]
	if err := c.Invalidate(ctx, tombstoned); err != nil {
		t.Fatalf("Invalidate: %v", err)
	}
	fill := map[string]Entry{}
	for i, u := range uris {
		if i%3 == 0 {
			fill[u] = Entry{Negative: true}
		} else {
			fill[u] = Entry{Value: bytes.Repeat([]byte{byte(i)}, 300+i%200)}
		}
	}
	c.Fill(ctx, fill)

	s := sumStats(c)
	if writes := c.Stats()[0].RefillWrites; writes != 3 {
		t.Errorf("a refill of 1200 items took %d pipelined writes, want 3 (of at most %d items)", writes, refillItemsPerWrite)
	}
	if s.Errors != 0 || s.OpenConns > 64 {
		t.Errorf("stats after the refill = %+v, want no errors and at most 64 connections", s)
	}
	got := c.GetMulti(ctx, uris)
	for _, u := range tombstoned {
		if e, ok := got[u]; ok {
			t.Errorf("the refill replaced the tombstone of %s with %+v", u, e)
		}
	}
	for _, u := range uris[len(tombstoned):] {
		want := fill[u]
		if e, ok := got[u]; !ok || e.Negative != want.Negative || !bytes.Equal(e.Value, want.Value) {
			t.Errorf("GetMulti[%s] = %+v, %v after the refill; want %d bytes, negative %v", u, e, ok, len(want.Value), want.Negative)
		}
	}
}

// Tests that an item memcached refuses to store (larger than its item
// size limit) is counted as an error, that the other items of the same
// pipelined write are stored, that the connection stays usable, and that
// the refused add leaves the key's tombstone in place: a later refill of
// the same key (an older read's) is still refused. memcached's meta set
// drops the item under a key whose new value it cannot store, whatever
// the mode; its classic add does not.
func TestPipelinedRefillRefusedItem(t *testing.T) {
	c := newCache(t, []string{testenv.SharedMemcached(t)}, nil)
	ctx := testContext(t, 1)
	uris := uniqueURIs(t, 4)
	fill := map[string]Entry{}
	for i, u := range uris[:3] {
		fill[u] = Entry{Value: []byte(fmt.Sprintf("value %d", i))}
	}
	tooLarge := uris[3]
	if err := c.Invalidate(ctx, []string{tooLarge}); err != nil {
		t.Fatalf("Invalidate: %v", err)
	}
	fill[tooLarge] = Entry{Value: make([]byte, 2<<20)} // memcached's default item limit is 1 MiB
	c.Fill(ctx, fill)
	if s := sumStats(c); s.Errors != 1 {
		t.Errorf("errors after a refill with one item too large = %d, want 1", s.Errors)
	}
	c.Fill(ctx, map[string]Entry{tooLarge: {Value: []byte("stale")}, uris[0]: fill[uris[0]]})
	got := c.GetMulti(ctx, uris)
	if e, ok := got[tooLarge]; ok {
		t.Errorf("GetMulti[%s] = %q after a refused refill and a later one; want the tombstone still in place", tooLarge, e.Value)
	}
	for _, u := range uris[:3] {
		if !bytes.Equal(got[u].Value, fill[u].Value) {
			t.Errorf("GetMulti[%s] = %q, want %q: the refused item took its neighbours with it", u, got[u].Value, fill[u].Value)
		}
	}
	dials := c.Stats()[0].Dials
	more := uniqueURIs(t, 2)
	c.Fill(ctx, map[string]Entry{more[0]: {Value: []byte("a")}, more[1]: {Value: []byte("b")}})
	st := c.Stats()[0]
	if st.Dials != dials || st.RefillWrites != 3 || st.Errors != 1 {
		t.Errorf("after a third refill: dials %d → %d, refill writes %d, errors %d; want the same connection reused, 3 writes, still 1 error", dials, st.Dials, st.RefillWrites, st.Errors)
	}
	if got := c.GetMulti(ctx, more); len(got) != 2 {
		t.Errorf("the second refill stored %d of 2 items", len(got))
	}
}

// Tests that under 16 connections a server has no refill pipeline and
// refills go one add per call, still stored.
func TestSmallCapRefillsOneByOne(t *testing.T) {
	c := newCache(t, []string{testenv.SharedMemcached(t)}, func(cfg *Config) { cfg.MaxConnsPerServer = 15 })
	ctx := testContext(t, 4)
	uris := uniqueURIs(t, 20)
	c.Fill(ctx, selfValued(uris))
	if st := c.Stats()[0]; st.RefillWrites != 0 || st.Errors != 0 {
		t.Errorf("stats = %+v, want no pipelined writes and no errors", st)
	}
	if got := c.GetMulti(ctx, uris); len(got) != len(uris) {
		t.Errorf("stored %d of %d refills", len(got), len(uris))
	}
}

// Tests that a pipelined refill that has its connection gets the whole
// socket timeout, however little is left of its caller's deadline, as a
// gomemcache call does: a caller about to leave cannot turn a slow
// exchange into an error against a healthy server (and its breaker).
func TestRefillOutlivesItsCallersDeadline(t *testing.T) {
	m := testenv.StartMemcached(t)
	c := newCache(t, []string{m.Addr()}, func(cfg *Config) { cfg.Timeout = 5 * time.Second })
	uris := uniqueURIs(t, 2)
	m.Pause()
	// The caller's deadline leaves room for a loaded machine to reach the
	// connection before it passes; memcached resumes well after it and
	// well before the socket timeout.
	ctx, cancel := context.WithTimeout(testContext(t, 1), 500*time.Millisecond)
	defer cancel()
	resumed := time.AfterFunc(2*time.Second, m.Resume)
	defer resumed.Stop()
	c.Fill(ctx, selfValued(uris))
	if s := c.Stats()[0]; s.Errors != 0 || s.RefillWrites != 1 {
		t.Errorf("stats after a refill that outlived its caller's deadline = %+v; want 1 refill write and no errors", s)
	}
	if got := c.GetMulti(testContext(t, 1), uris); len(got) != len(uris) {
		t.Errorf("the refill stored %d of %d items", len(got), len(uris))
	}
}

// Tests that items memcached refuses to store (larger than its item size
// limit) leave the server's breaker closed, however many refills carry
// them, both through the refill pipeline and one add per call: memcached
// answered each of them, so it is up, and reads must still reach it.
// They are still counted as errors.
func TestRefusedItemsDoNotOpenTheBreaker(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conns int
	}{{"pipelined", 64}, {"one by one", 15}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCache(t, []string{testenv.SharedMemcached(t)}, func(cfg *Config) { cfg.MaxConnsPerServer = tc.conns })
			ctx := testContext(t, 1)
			refills := int(DefaultConfig().BreakerFailures) * 2
			for _, uri := range uniqueURIs(t, refills) {
				c.Fill(ctx, map[string]Entry{uri: {Value: make([]byte, 2<<20)}}) // memcached's default item limit is 1 MiB
			}
			st := c.Stats()[0]
			if st.BreakerOpens != 0 || st.BreakerState != "closed" || st.Errors != int64(refills) {
				t.Fatalf("after %d refused refills: breaker %s, opened %d times, %d errors; want closed, never opened, %d errors", refills, st.BreakerState, st.BreakerOpens, st.Errors, refills)
			}
			uri := uniqueURIs(t, 1)[0]
			c.Fill(ctx, map[string]Entry{uri: {Value: []byte("small")}})
			if got := c.GetMulti(ctx, []string{uri}); string(got[uri].Value) != "small" {
				t.Fatalf("GetMulti after the refused refills = %+v, want the small value stored and read", got)
			}
		})
	}
}

// Tests that a tombstone memcached refuses to store (it is out of memory
// and may not evict) is reported as not written, so its key stays owed,
// while the breaker, which sees memcached answering, stays closed.
func TestRefusedTombstoneIsNotWritten(t *testing.T) {
	m := testenv.StartMemcachedWith(t, "-m", "2", "-I", "512k", "-M") // 2 MB, no eviction
	cfg := DefaultConfig()
	cfg.Servers = []string{m.Addr()}
	cfg.Timeout = 5 * time.Second // every exchange must be answered, on a loaded machine too
	cfg.TombstoneTTL = time.Hour  // none expires, however slowly the memory fills
	c, err := New(cfg, WithDistrust())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := testContext(t, 8)
	for round := 0; err == nil; round++ {
		if round == 200 {
			t.Fatalf("200 rounds of 500 tombstones in 2 MB of memcached, all reported written")
		}
		err = c.Invalidate(ctx, uniqueURIs(t, 500))
	}
	if !errors.Is(err, errItemRefused) {
		t.Fatalf("Invalidate in a full memcached: %v; want the refused tombstones reported", err)
	}
	if st := c.Stats()[0]; st.BreakerState != "closed" || st.BreakerOpens != 0 || st.Errors == 0 || st.OwedTombstones == 0 {
		t.Fatalf("stats %+v: want the breaker closed, never opened, the refusals counted as errors and their keys owed", st)
	}
	// A refusal is an answer: the connection that carried it is reused,
	// so more refused tombstones dial nothing.
	dials := c.Stats()[0].Dials
	for range 3 {
		if err := c.Invalidate(ctx, uniqueURIs(t, 500)); !errors.Is(err, errItemRefused) {
			t.Fatalf("Invalidate in a full memcached, again: %v; want the refused tombstones reported", err)
		}
	}
	if n := c.Stats()[0].Dials - dials; n != 0 {
		t.Fatalf("three more rounds of refused tombstones dialled %d connections; want 0, the connection kept", n)
	}
}

// Tests that the tombstones of a many-record write go to a server in
// pipelined writes of refillItemsPerWrite sets, that each is written (the
// keys read as misses, and a refill of an older read cannot store them),
// and that a single tombstone is a call of its own.
func TestBatchTombstonesArePipelined(t *testing.T) {
	c := newCache(t, []string{testenv.SharedMemcached(t)}, nil) // 64 connections: 4 carry pipelines
	ctx := testContext(t, 8)
	uris := uniqueURIs(t, 1000)
	c.Fill(ctx, selfValued(uris))
	if got := c.GetMulti(ctx, uris); len(got) != len(uris) {
		t.Fatalf("GetMulti after the fill: %d of %d cached", len(got), len(uris))
	}
	if err := c.Invalidate(ctx, uris); err != nil {
		t.Fatalf("Invalidate: %v", err)
	}
	if writes := c.Stats()[0].TombstoneWrites; writes != 2 {
		t.Errorf("1000 tombstones took %d pipelined writes, want 2 (of at most %d sets)", writes, refillItemsPerWrite)
	}
	c.Fill(ctx, selfValued(uris))
	if got := c.GetMulti(ctx, uris); len(got) != 0 {
		t.Fatalf("GetMulti after the tombstones and a refill: %d of %d cached; want every key held by its tombstone", len(got), len(uris))
	}
	one := uniqueURIs(t, 1)
	if err := c.Invalidate(ctx, one); err != nil {
		t.Fatalf("Invalidate of one URI: %v", err)
	}
	if writes := c.Stats()[0].TombstoneWrites; writes != 2 {
		t.Errorf("a single tombstone went out in a pipelined write (%d writes, want still 2)", writes)
	}
	c.Fill(ctx, selfValued(one))
	if got := c.GetMulti(ctx, one); len(got) != 0 {
		t.Fatalf("GetMulti of the single tombstoned key after a refill = %+v; want a miss", got)
	}
}

// Tests that a pipelined refill answered with a SERVER_ERROR that is not
// a refusal of the item is a failure, and its connection is not reused
// (memcached may have closed it).
func TestRefillServerFaultClosesTheConnection(t *testing.T) {
	_, err := readAnswers(bufio.NewReader(strings.NewReader("STORED\r\nSERVER_ERROR out of memory reading request\r\n")), "add", 2)
	if err == nil || errors.Is(err, errItemRefused) {
		t.Fatalf("readAnswers on a server fault: err %v; want a failure, not a refusal", err)
	}
	refused, err := readAnswers(bufio.NewReader(strings.NewReader("SERVER_ERROR object too large for cache\r\nSTORED\r\n")), "add", 2)
	if err != nil || !errors.Is(refused.err("refilled"), errItemRefused) {
		t.Fatalf("readAnswers on a refusal: refused %v, err %v; want the refusal, the connection kept", refused, err)
	}
}

// Tests that the answers to pipelined tombstones (sets) name each one
// memcached did not store, and only those: a refusal and a set answered
// NOT_STORED, where an add's NOT_STORED (the key exists) is no refusal;
// and that a delete takes DELETED and NOT_FOUND, and nothing else.
func TestPipelinedAnswersNameEachRefusedItem(t *testing.T) {
	answers := "STORED\r\nSERVER_ERROR out of memory storing object\r\nSTORED\r\nNOT_STORED\r\n"
	refused, err := readAnswers(bufio.NewReader(strings.NewReader(answers)), "set", 4)
	if err != nil || !slices.Equal(refused.at, []int{1, 3}) {
		t.Fatalf("readAnswers of sets: refused %v, err %v; want items 1 and 3 refused", refused.at, err)
	}
	refused, err = readAnswers(bufio.NewReader(strings.NewReader(answers)), "add", 4)
	if err != nil || !slices.Equal(refused.at, []int{1}) {
		t.Fatalf("readAnswers of adds: refused %v, err %v; want item 1 refused", refused.at, err)
	}
	refused, err = readAnswers(bufio.NewReader(strings.NewReader("DELETED\r\nNOT_FOUND\r\n")), "delete", 2)
	if err != nil || len(refused.at) != 0 {
		t.Fatalf("readAnswers of deletes: refused %v, err %v; want both deleted, a missing key no failure", refused.at, err)
	}
	if _, err := readAnswers(bufio.NewReader(strings.NewReader("STORED\r\n")), "delete", 1); !errors.Is(err, errRefillProtocol) {
		t.Fatalf("readAnswers of a delete answered STORED: %v; want errRefillProtocol", err)
	}
}

// Tests that a pipelined refill whose exchange fails resets its
// connection (SO_LINGER 0) rather than closing it in order: the server
// sees the connection reset, not an end of stream after the data, so
// adds still in the client's buffers are dropped, never delivered once
// the tombstone that should stop them has expired. The server is a
// listener that reads and never answers.
func TestFailedRefillResetsItsConnection(t *testing.T) {
	stalled, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	c := newCache(t, []string{stalled.Addr().String()}, func(cfg *Config) { cfg.Timeout = 200 * time.Millisecond })
	var ended error // how the server's read of the connection ended
	err = fanout.Each(testContext(t, 2), 2, func(ctx context.Context, i int) error {
		if i == 1 {
			c.Fill(ctx, map[string]Entry{"at://did:plc:reset/p/1": {Value: []byte("v")}})
			return nil
		}
		nc, err := stalled.Accept()
		if err != nil {
			return err
		}
		defer nc.Close()
		if err := nc.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			return err
		}
		_, ended = io.Copy(io.Discard, nc) // until the client closes or resets
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := c.Stats()[0]; st.RefillWrites != 1 || st.Errors != 1 {
		t.Fatalf("stats %+v: want one pipelined refill, failed", st)
	}
	if !errors.Is(ended, syscall.ECONNRESET) {
		t.Fatalf("the server's read ended with %v, want the connection reset", ended)
	}
}
