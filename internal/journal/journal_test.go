package journal

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// memJournal is a store.Journal held in memory.
type memJournal struct {
	mu      sync.Mutex
	changes []store.Change
	fail    error
}

func (m *memJournal) add(uri, origin string, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.changes = append(m.changes, store.Change{URI: uri, Origin: origin, At: at})
}

func (m *memJournal) Changes(_ context.Context, from, to time.Time, fn func(store.Change) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	for _, c := range m.changes {
		if !c.At.Before(from) && c.At.Before(to) {
			if err := fn(c); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *memJournal) Retention() time.Duration { return time.Hour }

func newCache(t *testing.T, servers ...string) *cache.Cache {
	t.Helper()
	cfg := cache.DefaultConfig()
	cfg.Servers = servers
	cfg.Timeout = 200 * time.Millisecond
	c, err := cache.New(cfg, cache.WithDistrust())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// uri is a URI unique to the test and the run, so a tombstone left by an
// earlier run in the shared memcached does not block this run's fills.
func uri(t *testing.T, i int) string {
	return fmt.Sprintf("at://did:plc:%s%d/app.bsky.feed.post/3k%06d", t.Name()[len(t.Name())-6:], time.Now().UnixNano(), i)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// cached fills uris and reports which of them GetMulti then answers.
func hits(ctx context.Context, c *cache.Cache, uris ...string) map[string]bool {
	out := map[string]bool{}
	for u := range c.GetMulti(ctx, uris) {
		out[u] = true
	}
	return out
}

// Tests that a poll tombstones other writers' changes and leaves the
// follower's own alone (the write path tombstoned them).
func TestPollTombstonesOtherWritersOnly(t *testing.T) {
	ctx := ctx(t)
	c := newCache(t, testenv.SharedMemcached(t))
	j := &memJournal{}
	f := New(Config{}, j, c, "me")
	mine, theirs := uri(t, 1), uri(t, 2)
	c.Fill(ctx, map[string]cache.Entry{mine: {Value: []byte("v1")}, theirs: {Value: []byte("v1")}})
	if h := hits(ctx, c, mine, theirs); !h[mine] || !h[theirs] {
		t.Fatalf("filled entries not cached: %v", h)
	}
	now := time.Now()
	j.add(mine, "me", now)
	j.add(theirs, "another replica", now)
	f.step(ctx)
	h := hits(ctx, c, mine, theirs)
	if h[theirs] {
		t.Errorf("another writer's change was not tombstoned")
	}
	if !h[mine] {
		t.Errorf("the follower's own change was tombstoned again")
	}
	if s := f.Stats(); s.Applied != 1 || s.Own != 1 {
		t.Errorf("stats = %+v, want 1 applied and 1 own", s)
	}
	// A second poll sees the change again (Overlap) but does not count
	// it twice.
	f.step(ctx)
	if s := f.Stats(); s.Applied != 1 {
		t.Errorf("after a second poll applied = %d, want 1", s.Applied)
	}
}

// Tests that a change whose tombstone could not be written is not
// counted as applied.
func TestUnwrittenTombstoneIsNotCountedApplied(t *testing.T) {
	ctx := ctx(t)
	mc := testenv.StartMemcached(t)
	c := newCache(t, mc.Addr())
	j := &memJournal{}
	f := New(Config{}, j, c, "me")
	j.add(uri(t, 1), "another replica", time.Now())
	mc.Pause()
	f.step(ctx)
	mc.Resume()
	if s := f.Stats(); s.Applied != 0 {
		t.Errorf("applied = %d with memcached frozen, want 0", s.Applied)
	}
}

// Tests that a distrusted server is read as misses until a replay has
// deleted every URI changed since its failure, then trusted, and that
// the replay covers the follower's own changes too.
func TestReplayThenTrust(t *testing.T) {
	ctx := ctx(t)
	c := newCache(t, testenv.SharedMemcached(t))
	j := &memJournal{}
	f := New(Config{}, j, c, "me")
	changed, untouched := uri(t, 1), uri(t, 2)
	c.Fill(ctx, map[string]cache.Entry{changed: {Value: []byte("old")}, untouched: {Value: []byte("v1")}})
	failedAt := time.Now().Add(-10 * time.Millisecond)
	c.SuspectAll(failedAt)
	j.add(changed, "me", failedAt.Add(time.Millisecond))
	if h := hits(ctx, c, changed, untouched); len(h) != 0 {
		t.Fatalf("a distrusted server answered hits %v", h)
	}
	f.step(ctx)
	if s := c.Suspects(); len(s) != 0 {
		t.Fatalf("still distrusted after a replay: %+v", s)
	}
	h := hits(ctx, c, changed, untouched)
	if h[changed] {
		t.Errorf("the replay left the changed record's old entry")
	}
	if !h[untouched] {
		t.Errorf("an untouched entry is not read after the server was trusted again")
	}
	if s := f.Stats(); s.Replays != 1 || s.ReplayedURIs != 1 {
		t.Errorf("stats = %+v, want one replay of one URI", s)
	}
}

// Tests that a replay that cannot read the journal, or cannot reach the
// server, leaves it distrusted.
func TestFailedReplayKeepsDistrust(t *testing.T) {
	ctx := ctx(t)
	t.Run("journal unreadable", func(t *testing.T) {
		c := newCache(t, testenv.SharedMemcached(t))
		j := &memJournal{fail: store.ErrUnavailable}
		f := New(Config{}, j, c, "me")
		c.SuspectAll(time.Now())
		f.step(ctx)
		if len(c.Suspects()) != 1 || f.Stats().ReplayFailures != 1 || f.Stats().ReadErrors != 1 {
			t.Fatalf("suspects %v, stats %+v; want the server still distrusted and one failed replay", c.Suspects(), f.Stats())
		}
	})
	t.Run("server down", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := l.Addr().String()
		l.Close()
		c := newCache(t, dead)
		j := &memJournal{}
		j.add(uri(t, 1), "me", time.Now())
		f := New(Config{}, j, c, "me")
		c.SuspectAll(time.Now().Add(-time.Second))
		f.step(ctx)
		if len(c.Suspects()) != 1 {
			t.Fatalf("a server that refused the replay was trusted again")
		}
	})
}

// Tests that a failure during a replay is not forgotten: Trust refuses a
// suspect listed before the failure.
func TestTrustRefusesAfterNewFailure(t *testing.T) {
	c := newCache(t, testenv.SharedMemcached(t))
	c.SuspectAll(time.Now())
	s := c.Suspects()[0]
	c.SuspectAll(time.Now()) // another failure
	if c.Trust(s) {
		t.Fatal("Trust accepted a suspect that failed again since it was listed")
	}
	if !c.Trust(c.Suspects()[0]) {
		t.Fatal("Trust refused a current suspect")
	}
}

// Tests that the tombstones a memcached blip made this process miss are
// written again by the follower while the journal is unreadable: the
// store is not needed to trust those keys again, and the server's other
// keys were never distrusted.
func TestOwedTombstonesNeedNoStore(t *testing.T) {
	ctx := ctx(t)
	mc := testenv.StartMemcached(t)
	c := newCache(t, mc.Addr())
	j := &memJournal{fail: store.ErrUnavailable}
	f := New(Config{}, j, c, "me")
	changed, other := uri(t, 1), uri(t, 2)
	c.Fill(ctx, map[string]cache.Entry{changed: {Value: []byte("old")}, other: {Value: []byte("v1")}})
	mc.Pause()
	err := c.Invalidate(ctx, []string{changed})
	mc.Resume()
	if err == nil {
		t.Fatal("a tombstone to a frozen memcached was reported written")
	}
	if h := hits(ctx, c, changed, other); h[changed] || !h[other] {
		t.Fatalf("hits %v while the tombstone is owed: want the other key only", h)
	}
	f.retryOwed(ctx)
	f.step(ctx)
	if s := f.Stats(); s.Retried != 1 || s.ReadErrors != 1 || s.Suspects != 0 {
		t.Fatalf("stats %+v: want 1 tombstone retried with the journal unreadable, no suspects", s)
	}
	if st := c.Stats()[0]; st.OwedTombstones != 0 {
		t.Fatalf("%d tombstones still owed after the follower's step", st.OwedTombstones)
	}
	if h := hits(ctx, c, changed, other); h[changed] || !h[other] {
		t.Errorf("hits %v after the retry: want the other key only (the changed one is tombstoned)", h)
	}
}

// failAfterJournal passes its first n changes of a read to fn, then
// fails the read, as a CQL journal does when a later partition or page
// cannot be read; it stops failing when ok is set.
type failAfterJournal struct {
	*memJournal
	n  int
	ok bool
}

func (j *failAfterJournal) Changes(ctx context.Context, from, to time.Time, fn func(store.Change) error) error {
	if j.ok {
		return j.memJournal.Changes(ctx, from, to, fn)
	}
	passed := 0
	err := j.memJournal.Changes(ctx, from, to, func(c store.Change) error {
		if passed == j.n {
			return store.ErrUnavailable
		}
		passed++
		return fn(c)
	})
	if err == nil {
		err = store.ErrUnavailable
	}
	return err
}

// Tests that a poll whose read fails part-way does not count the
// changes it had already been given as seen: the next poll, with the
// journal readable again, still tombstones them.
func TestPartlyFailedPollIsReadAgain(t *testing.T) {
	ctx := ctx(t)
	c := newCache(t, testenv.SharedMemcached(t))
	j := &failAfterJournal{memJournal: &memJournal{}, n: 1}
	f := New(Config{}, j, c, "me")
	first, second := uri(t, 1), uri(t, 2)
	c.Fill(ctx, map[string]cache.Entry{first: {Value: []byte("old")}, second: {Value: []byte("old")}})
	now := time.Now()
	j.add(first, "another replica", now)
	j.add(second, "another replica", now)
	f.step(ctx)
	if s := f.Stats(); s.ReadErrors != 1 {
		t.Fatalf("stats %+v: want one failed read", s)
	}
	j.ok = true
	f.step(ctx)
	if h := hits(ctx, c, first, second); h[first] || h[second] {
		t.Fatalf("hits %v after the journal was readable again: a change given to a failed poll was never tombstoned", h)
	}
	if s := f.Stats(); s.Applied != 2 {
		t.Errorf("applied = %d, want 2", s.Applied)
	}
}

// Tests that an own change read again by later polls (Overlap) is
// counted once, as other writers' changes are.
func TestOwnChangeCountedOnce(t *testing.T) {
	ctx := ctx(t)
	c := newCache(t, testenv.SharedMemcached(t))
	j := &memJournal{}
	f := New(Config{}, j, c, "me")
	j.add(uri(t, 1), "me", time.Now())
	for range 3 {
		f.step(ctx)
	}
	if s := f.Stats(); s.Own != 1 {
		t.Fatalf("own = %d after three polls of one own change, want 1", s.Own)
	}
}

// hungJournal answers no read until its caller gives up, as a
// black-holed store does; entered is closed when the first read begins,
// and returned counts the reads that have ended.
type hungJournal struct {
	entered  chan struct{}
	once     sync.Once
	returned atomic.Int64
}

func (h *hungJournal) Changes(ctx context.Context, _, _ time.Time, _ func(store.Change) error) error {
	h.once.Do(func() { close(h.entered) })
	<-ctx.Done()
	h.returned.Add(1)
	return ctx.Err()
}

func (*hungJournal) Retention() time.Duration { return time.Hour }

// Tests that owed tombstones are written again while a journal read
// hangs on an unreachable store: the retries do not wait for the poll,
// which may take its whole step timeout to give up.
func TestOwedTombstonesRetriedWhileTheJournalHangs(t *testing.T) {
	ctx := ctx(t)
	mc := testenv.StartMemcached(t)
	c := newCache(t, mc.Addr())
	j := &hungJournal{entered: make(chan struct{})}
	f := New(Config{MaxLag: 100 * time.Millisecond}, j, c, "me")
	changed := uri(t, 1)
	c.Fill(ctx, map[string]cache.Entry{changed: {Value: []byte("old")}})
	mc.Pause()
	err := c.Invalidate(ctx, []string{changed})
	if err == nil {
		mc.Resume()
		t.Fatal("a tombstone to a frozen memcached was reported written")
	}
	runCtx, stop := context.WithCancel(ctx)
	var loops sync.WaitGroup
	defer func() { stop(); loops.Wait() }()
	loops.Go(func() { f.Run(runCtx) })
	loops.Go(func() { f.RetryOwed(runCtx) })
	<-j.entered // the follower's poll is now hung
	mc.Resume()
	for c.Stats()[0].OwedTombstones != 0 {
		if j.returned.Load() > 0 {
			t.Fatalf("the owed tombstone was not written before the hung journal read gave up (%v of step timeout)", f.stepTimeout())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if j.returned.Load() > 0 {
		t.Fatal("the owed tombstone was written only after the hung journal read gave up")
	}
}
