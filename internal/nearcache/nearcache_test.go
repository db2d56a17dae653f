package nearcache

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/testenv"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return fanout.WithLimit(ctx, 8)
}

// sharedCache returns a memcached-backed cache closed when the test ends.
func sharedCache(t *testing.T) *cache.Cache {
	t.Helper()
	cfg := cache.DefaultConfig()
	cfg.Servers = []string{testenv.SharedMemcached(t)}
	cfg.Timeout = time.Second
	c, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newNear(t *testing.T, cfg Config, shared Shared) *Cache {
	t.Helper()
	c, err := New(cfg, shared)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func uniqueURIs(t *testing.T, n int) []string {
	uris := make([]string, n)
	stamp := time.Now().UnixNano()
	for i := range uris {
		uris[i] = fmt.Sprintf("at://did:plc:near%d/app.bsky.feed.post/%s%d", stamp, t.Name(), i)
	}
	return uris
}

func sharedHits(c *cache.Cache) int64 {
	var n int64
	for _, s := range c.Stats() {
		n += s.Hits
	}
	return n
}

// getMulti is Lookup keyed by URI.
func getMulti(c *Cache, ctx context.Context, uris []string) map[string]cache.Entry {
	into := make([]cache.Answer, len(uris))
	c.Lookup(ctx, uris, into)
	return cache.ByURI(uris, into)
}

// readers are the two ways to read one URI: in a batch (Lookup) and
// alone (Get). The rules hold for both.
var readers = []struct {
	name string
	read func(c *Cache, ctx context.Context, uri string) (cache.Entry, bool)
}{
	{"Lookup", func(c *Cache, ctx context.Context, uri string) (cache.Entry, bool) {
		e, ok := getMulti(c, ctx, []string{uri})[uri]
		return e, ok
	}},
	{"Get", (*Cache).Get},
}

// Tests that with TTL 0 every read reaches memcached, and (the control)
// that with a TTL most repeated reads do not.
func TestTTLZeroEveryReadReachesMemcached(t *testing.T) {
	ctx := testContext(t)
	for _, rd := range readers {
		for _, tc := range []struct {
			ttl     time.Duration
			wantAll bool
		}{{0, true}, {MaxTTL, false}} {
			shared := sharedCache(t)
			uri := uniqueURIs(t, 1)
			shared.Fill(ctx, map[string]cache.Entry{uri[0]: {Value: []byte("v1")}})
			near := newNear(t, Config{TTL: tc.ttl, MaxBytes: 1 << 20}, shared)
			const reads = 20
			before := sharedHits(shared)
			for i := range reads {
				if got, _ := rd.read(near, ctx, uri[0]); string(got.Value) != "v1" {
					t.Fatalf("%s, ttl %v: read %d = %+v, want v1", rd.name, tc.ttl, i, got)
				}
			}
			hits := sharedHits(shared) - before
			switch {
			case tc.wantAll && hits != reads:
				t.Errorf("%s, ttl 0: %d reads reached memcached %d times, want every one", rd.name, reads, hits)
			case !tc.wantAll && hits >= reads:
				t.Errorf("%s, ttl %v: %d reads reached memcached %d times; the near cache answered none", rd.name, tc.ttl, reads, hits)
			}
		}
	}
}

// Tests that the bytes held (counted from the entries themselves, not
// from the weigher) never exceed MaxBytes while far more is read, and
// that the cap was reached (entries were evicted), so the bound was
// tested.
func TestBytesStayUnderTheCap(t *testing.T) {
	ctx := testContext(t)
	shared := sharedCache(t)
	const maxBytes = 1 << 20
	near := newNear(t, Config{TTL: MaxTTL, MaxBytes: maxBytes}, shared)
	uris := uniqueURIs(t, 400)
	fills := map[string]cache.Entry{}
	for i, uri := range uris {
		fills[uri] = cache.Entry{Value: bytes.Repeat([]byte{'x'}, 2<<10+i*16)} // 2–8 KiB each, 2 MiB in all
	}
	shared.Fill(ctx, fills)
	for pass := range 3 {
		for i := 0; i < len(uris); i += 20 {
			getMulti(near, ctx, uris[i:i+20])
			if held := heldBytes(near); held > maxBytes {
				t.Fatalf("pass %d, after %d keys: %d bytes held, over the %d cap", pass, i+20, held, maxBytes)
			}
		}
	}
	st := near.Stats()
	if st.Evictions == 0 || heldBytes(near) < maxBytes/2 {
		t.Fatalf("the cap was never reached (stats %+v, held %d): the test proves nothing", st, heldBytes(near))
	}
	if st.Bytes > st.MaxBytes {
		t.Errorf("stats report %d bytes, over the %d cap", st.Bytes, st.MaxBytes)
	}
}

func heldBytes(c *Cache) int {
	n := 0
	for _, e := range c.mem.All() {
		n += len(e.uri) + len(e.entry.Value) + entryOverhead
	}
	return n
}

// Two URIs whose hashes collide share one slot in memory: each is
// answered only with its own entry, a miss while the other holds the
// slot.
func TestHashCollisionIsAMiss(t *testing.T) {
	ctx := testContext(t)
	shared := sharedCache(t)
	near := newNear(t, Config{TTL: MaxTTL, MaxBytes: 1 << 20}, shared)
	uris := uniqueURIs(t, 2)
	shared.Fill(ctx, map[string]cache.Entry{uris[0]: {Value: []byte("first")}, uris[1]: {Value: []byte("second")}})
	getMulti(near, ctx, uris[:1])
	getMulti(near, ctx, uris[:1]) // held now
	// uris[1] looked up under uris[0]'s hash finds an entry for another URI.
	if _, ok, _ := near.lookupHashed(uris[1], near.hash(uris[0]), time.Now()); ok {
		t.Fatal("an entry held for one URI answered another with the same hash")
	}
	if e, ok, _ := near.lookupHashed(uris[0], near.hash(uris[0]), time.Now()); !ok || string(e.Value) != "first" {
		t.Fatalf("the held URI itself: %q, %v; want first, true", e.Value, ok)
	}
}

// gatedShared holds a read (Lookup or Get) after the shared cache
// answered, until released: the instant a concurrent write cannot be
// timed into with a real server alone.
type gatedShared struct {
	*cache.Cache
	answered chan struct{}
	release  chan struct{}
}

func (g *gatedShared) Lookup(ctx context.Context, uris []string, into []cache.Answer) int {
	hits := g.Cache.Lookup(ctx, uris, into)
	g.hold()
	return hits
}

func (g *gatedShared) Get(ctx context.Context, uri string) (cache.Entry, bool) {
	e, ok := g.Cache.Get(ctx, uri)
	g.hold()
	return e, ok
}

// startHeldRead starts a read of uri whose shared-cache answer shared
// holds until its release is closed, as the second answer for uri (the
// doorkeeper has seen it, so the read would keep what it fetched), and
// returns once shared holds the answer. The read's entry arrives on the
// channel after the release.
func startHeldRead(ctx context.Context, near *Cache, shared *gatedShared, read func(*Cache, context.Context, string) (cache.Entry, bool), uri string) <-chan cache.Entry {
	near.admit(near.hash(uri))
	answered := shared.answered
	done := make(chan cache.Entry)
	go func() {
		e, _ := read(near, ctx, uri)
		done <- e
	}()
	<-answered
	return done
}

// hold holds the first read that calls it until released.
func (g *gatedShared) hold() {
	if g.answered != nil {
		close(g.answered)
		g.answered = nil
		<-g.release
	}
}

// Tests that a read which fetched the old value from memcached before an
// Invalidate does not keep it in memory after the Invalidate returned.
func TestReadInFlightDuringInvalidateDoesNotKeepTheOldValue(t *testing.T) {
	for _, rd := range readers {
		t.Run(rd.name, func(t *testing.T) {
			ctx := testContext(t)
			shared := &gatedShared{Cache: sharedCache(t), answered: make(chan struct{}), release: make(chan struct{})}
			near := newNear(t, Config{TTL: MaxTTL, MaxBytes: 1 << 20}, shared)
			uri := uniqueURIs(t, 1)
			shared.Fill(ctx, map[string]cache.Entry{uri[0]: {Value: []byte("old")}})

			done := startHeldRead(ctx, near, shared, rd.read, uri[0]) // the read holds "old"
			if err := near.Invalidate(ctx, uri); err != nil {
				t.Fatal(err)
			}
			close(shared.release)
			if got := <-done; string(got.Value) != "old" {
				t.Fatalf("the slow read returned %+v, want the old value it fetched", got)
			}
			shared.Fill(ctx, map[string]cache.Entry{uri[0]: {Value: []byte("new")}}) // blocked by the tombstone
			if got, ok := rd.read(near, ctx, uri[0]); ok {
				t.Fatalf("read after Invalidate returned %q; the old value was kept in memory", got.Value)
			}
		})
	}
}

// Tests that an entry is answered from memory only until TTL after the
// shared-cache read that fetched it began, not TTL after that read
// returned: a read slower than the TTL keeps nothing servable, so Horizon
// bounds every replica's staleness however slow its reads are.
func TestEntryLifetimeStartsWhenTheReadBegins(t *testing.T) {
	for _, rd := range readers {
		t.Run(rd.name, func(t *testing.T) {
			ctx := testContext(t)
			const ttl = 50 * time.Millisecond
			shared := &gatedShared{Cache: sharedCache(t), answered: make(chan struct{}), release: make(chan struct{})}
			near := newNear(t, Config{TTL: ttl, MaxBytes: 1 << 20}, shared)
			if near.Horizon() != ttl {
				t.Fatalf("Horizon = %v, want the TTL %v", near.Horizon(), ttl)
			}
			uri := uniqueURIs(t, 1)
			shared.Fill(ctx, map[string]cache.Entry{uri[0]: {Value: []byte("v")}})

			done := startHeldRead(ctx, near, shared, rd.read, uri[0])
			time.Sleep(2 * ttl) // the read is slower than the TTL
			close(shared.release)
			if got := <-done; string(got.Value) != "v" {
				t.Fatalf("the slow read returned %+v, want the value", got)
			}
			before := sharedHits(shared.Cache)
			rd.read(near, ctx, uri[0])
			if sharedHits(shared.Cache) == before {
				t.Fatal("the next read was answered from memory, though the read that fetched the entry began over a TTL ago")
			}
		})
	}
}

// Tests that Invalidate forgets a key held in memory even when the shared
// cache cannot be reached.
func TestInvalidateForgetsWhenMemcachedIsDown(t *testing.T) {
	ctx := testContext(t)
	mc := testenv.StartMemcached(t)
	cfg := cache.DefaultConfig()
	cfg.Servers, cfg.Timeout = []string{mc.Addr()}, 200*time.Millisecond
	shared, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shared.Close() })
	near := newNear(t, Config{TTL: MaxTTL, MaxBytes: 1 << 20}, shared)
	uri := uniqueURIs(t, 1)
	shared.Fill(ctx, map[string]cache.Entry{uri[0]: {Value: []byte("old")}})
	getMulti(near, ctx, uri)
	getMulti(near, ctx, uri) // the second answer passes the doorkeeper
	if _, ok := near.mem.GetIfPresent(near.hash(uri[0])); !ok {
		t.Fatal("the entry read from memcached is not held in memory")
	}
	mc.Stop()
	if err := near.Invalidate(ctx, uri); err == nil {
		t.Fatal("Invalidate with memcached stopped reported no error")
	}
	if got, ok := getMulti(near, ctx, uri)[uri[0]]; ok {
		t.Fatalf("read after a failed Invalidate returned %q from memory", got.Value)
	}
}

// Tests the doorkeeper: a key the shared cache answered once is not
// stored, on its second answer it is, and after doorBits/4 other keys the
// doorkeeper has forgotten the first answer.
func TestDoorkeeperStoresOnTheSecondAnswer(t *testing.T) {
	ctx := testContext(t)
	shared := sharedCache(t)
	near := newNear(t, Config{TTL: MaxTTL, MaxBytes: 1 << 20}, shared)
	uri := uniqueURIs(t, 1)
	shared.Fill(ctx, map[string]cache.Entry{uri[0]: {Value: []byte("v")}})
	getMulti(near, ctx, uri)
	if _, ok := near.mem.GetIfPresent(near.hash(uri[0])); ok {
		t.Fatal("a key answered once by the shared cache was stored")
	}
	getMulti(near, ctx, uri)
	if _, ok := near.mem.GetIfPresent(near.hash(uri[0])); !ok {
		t.Fatal("a key answered twice by the shared cache was not stored")
	}

	other := uniqueURIs(t, 2)
	if near.admit(near.hash(other[0])) {
		t.Fatal("a key never answered passed the doorkeeper")
	}
	period := uint64(doorBits / 4)
	for i, start := 0, near.doorAdds.Load(); near.doorAdds.Load()/period == start/period; i++ {
		near.admit(near.hash(fmt.Sprintf("%s-%d", other[1], i))) // new keys until the doorkeeper clears
	}
	if near.admit(near.hash(other[0])) {
		t.Fatal("the doorkeeper still remembered a key after it should have been cleared")
	}
}

// Tests the count of held entries per hash slot that lets reads of keys
// not held skip the lookup in memory: a stored key is still answered from
// memory, reads of keys not held are counted as misses, and when the
// stored entries are gone the counts are back to zero.
func TestHeldCountsLetStoredKeysThrough(t *testing.T) {
	ctx := testContext(t)
	shared := sharedCache(t)
	near := newNear(t, Config{TTL: MaxTTL, MaxBytes: 1 << 20}, shared)
	uris := uniqueURIs(t, 3)
	fill := map[string]cache.Entry{}
	for _, u := range uris {
		fill[u] = cache.Entry{Value: []byte("v " + u)}
	}
	shared.Fill(ctx, fill)
	getMulti(near, ctx, uris[:2])
	getMulti(near, ctx, uris[:2]) // the second answer: both are stored
	before := near.Stats()
	got := getMulti(near, ctx, uris)
	after := near.Stats()
	for _, u := range uris {
		if string(got[u].Value) != "v "+u {
			t.Errorf("%s read %q, want its record", u, got[u].Value)
		}
	}
	if hits := after.Hits - before.Hits; hits != 2 {
		t.Errorf("%d of the 2 stored keys answered from memory", hits)
	}
	if misses := after.Misses - before.Misses; misses != 1 {
		t.Errorf("%d misses counted for the 1 key not held", misses)
	}
	near.Forget(uris)
	total := int32(0)
	for i := range near.held {
		total += near.held[i].Load()
	}
	if total != 0 {
		t.Errorf("the held counts add up to %d with nothing stored, want 0", total)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{DefaultConfig(), ""},
		{Config{TTL: 0}, ""},
		{Config{TTL: -time.Second, MaxBytes: 1 << 20}, "near_cache.ttl"},
		{Config{TTL: 2 * time.Minute, MaxBytes: 1 << 20}, "near_cache.ttl"},
		{Config{TTL: time.Second, MaxBytes: 10}, "near_cache.max_bytes: must be between 1048576"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want))):
			t.Errorf("%+v: err = %v, want it to mention %q", tc.cfg, err, tc.want)
		}
	}
}

// Tests that with a check the cache keeps only entries the check
// accepts, answers those from memory marked Checked, and answers an entry
// the check refuses from the shared cache on every read, never marked.
func TestCheckedEntriesOnly(t *testing.T) {
	ctx := testContext(t)
	shared := sharedCache(t)
	uris := uniqueURIs(t, 2)
	good, bad := uris[0], uris[1]
	shared.Fill(ctx, map[string]cache.Entry{good: {Value: []byte("good")}, bad: {Value: []byte("bad")}})
	checks := 0
	near, err := New(Config{TTL: MaxTTL, MaxBytes: 1 << 20}, shared, WithCheck(func(key string, e cache.Entry) bool {
		checks++
		return string(e.Value) == "good"
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { near.Close() })

	const reads = 10
	var checked int
	before := sharedHits(shared)
	for range reads {
		got := getMulti(near, ctx, []string{good})
		if string(got[good].Value) != "good" {
			t.Fatalf("read of the accepted entry = %+v", got)
		}
		if got[good].Checked {
			checked++
		}
	}
	// The shared cache answers until the entry is kept (the doorkeeper
	// lets the second answer in); the read that keeps it and every read
	// from memory after it are answered Checked.
	if viaShared := int(sharedHits(shared) - before); viaShared >= reads || checked != reads-viaShared+1 {
		t.Errorf("accepted entry: %d of %d reads answered marked Checked, %d from the shared cache; want all but the reads before the one that kept it", checked, reads, viaShared)
	}
	if checks != 1 {
		t.Errorf("the accepted entry was checked %d times, want once (when kept)", checks)
	}
	if e, ok := near.Get(ctx, good); !ok || !e.Checked || string(e.Value) != "good" || checks != 1 {
		t.Errorf("Get of the kept entry = %+v, %v after %d checks; want it from memory, marked Checked, not checked again", e, ok, checks)
	}

	before = sharedHits(shared)
	for i := range reads {
		if got := getMulti(near, ctx, []string{bad}); string(got[bad].Value) != "bad" || got[bad].Checked {
			t.Fatalf("read %d of the refused entry = %+v, want it unchecked", i, got[bad])
		}
	}
	if viaShared := sharedHits(shared) - before; viaShared != reads {
		t.Errorf("refused entry: %d of %d reads reached the shared cache, want every one", viaShared, reads)
	}
}

// answering is a shared cache that answers every URI at once with a
// value of its own size, so that many readers keep entries in memory at
// the same moment: memcached would answer them too, only slower than the
// cap's bookkeeping needs to be raced.
type answering struct{ size func(uri string) int }

func (a answering) Lookup(_ context.Context, uris []string, into []cache.Answer) int {
	for i, uri := range uris {
		into[i] = cache.Answer{Entry: cache.Entry{Value: bytes.Repeat([]byte{'x'}, a.size(uri))}, Hit: true}
	}
	return len(uris)
}

func (a answering) Get(_ context.Context, uri string) (cache.Entry, bool) {
	return cache.Entry{Value: bytes.Repeat([]byte{'x'}, a.size(uri))}, true
}

func (answering) Fill(context.Context, map[string]cache.Entry) {}
func (answering) Invalidate(context.Context, []string) error   { return nil }

// Tests that the cap holds while many readers keep entries at once, not
// only after each reader's own store: rounds of readers keep entries
// together, each round first with otter's maintenance held off (as it is
// for writers while another holds its lock, so otter evicts nothing and
// only the reservation stands between the readers and the cap), and after
// every store (the afterStore hook) the bytes held are counted from the
// entries themselves, with the other stores held off meanwhile so that
// the count is a snapshot (entries removed during it only make it
// smaller).
func TestBytesStayUnderTheCapUnderConcurrentReads(t *testing.T) {
	const maxBytes = 1 << 20
	near := newNear(t, Config{TTL: MaxTTL, MaxBytes: maxBytes}, answering{size: func(string) int { return 8 << 10 }})
	ctx := testContext(t)
	const readers, rounds, batch = 8, 100, 10 // 8 × 100 × 10 × 8 KiB: 60 times the cap
	uris := uniqueURIs(t, readers*rounds*batch+1)
	var storing sync.RWMutex // held shared by each store, alone by each count
	var stores atomic.Int64
	most, samples, over := 0, 0, 0
	near.hooks.before = storing.RLock
	near.hooks.after = func() {
		storing.RUnlock()
		storing.Lock()
		held := heldBytes(near)
		samples++
		most = max(most, held)
		if held > maxBytes {
			over = max(over, held)
		}
		storing.Unlock()
		stores.Add(1)
	}
	getMulti(near, ctx, uris[len(uris)-1:])
	getMulti(near, ctx, uris[len(uris)-1:]) // an entry to hold maintenance off on
	for round := range rounds {
		var wg sync.WaitGroup
		var done atomic.Int64
		holdMaintenance(near, func() {
			for r := range readers {
				keys := uris[(round*readers+r)*batch:][:batch]
				wg.Go(func() {
					defer done.Add(1)
					getMulti(near, ctx, keys) // the doorkeeper notes them
					getMulti(near, ctx, keys) // and lets them in
				})
			}
			// Maintenance stays held off until the readers are done or
			// stop making progress (no store and none done for a
			// millisecond): with every byte of the cap taken, they wait
			// for it. How long it is held changes how much is tested,
			// never whether the test passes.
			for last := int64(-1); done.Load() < readers; time.Sleep(time.Millisecond) {
				now := stores.Load() + done.Load()
				if now == last {
					break
				}
				last = now
			}
		})
		wg.Wait()
	}
	near.hooks = keepHooks{}
	if over > 0 {
		t.Fatalf("%d bytes held at a moment during the rounds, over the %d cap (most held %d in %d samples)", over, maxBytes, most, samples)
	}
	if st := near.Stats(); st.Evictions == 0 || most < maxBytes/2 || st.Bytes > st.MaxBytes {
		t.Fatalf("the cap was never reached, or the stats are over it (stats %+v, most held %d in %d samples): the test proves nothing", st, most, samples)
	}
}

// holdMaintenance runs fn while otter's maintenance (its evictions) is
// held off, as it is for a writer while another holds its lock: fn runs
// inside an iteration of the coldest entries, which holds that lock.
// With nothing held to iterate over, fn runs with nothing held off.
func holdMaintenance(c *Cache, fn func()) {
	for range c.mem.Coldest() {
		fn()
		return
	}
	fn()
}

// Tests that an entry heavier than the share of the cap kept for storing
// is never kept, however often it is read (eviction never leaves it
// room), while a light one read as often is.
func TestEntryOverAnEighthOfTheCapIsNotKept(t *testing.T) {
	const maxBytes = 1 << 20
	heavy, light := "at://did:plc:near/app.bsky.feed.post/heavy", "at://did:plc:near/app.bsky.feed.post/light"
	near := newNear(t, Config{TTL: MaxTTL, MaxBytes: maxBytes}, answering{size: func(uri string) int {
		if uri == heavy {
			return maxBytes/storingShare + 1
		}
		return 100
	}})
	ctx := testContext(t)
	for range 4 {
		getMulti(near, ctx, []string{heavy, light})
	}
	held := map[string]bool{}
	for _, e := range near.mem.All() {
		held[e.uri] = true
	}
	if held[heavy] || !held[light] {
		t.Fatalf("held after 4 reads: heavy %v, light %v; want only the light entry", held[heavy], held[light])
	}
	if st := near.Stats(); st.Bytes > st.MaxBytes/storingShare {
		t.Fatalf("stats report %d bytes held for one light entry", st.Bytes)
	}
}

// Tests that a value a read fetched before a write's Forget is never
// readable from memory once that Forget has returned, not even for a
// moment while the read stores it: the Forget lands between the read's
// check of the write counter and its store, and a read made right after
// the store must miss.
func TestOldValueNotReadableOnceForgetReturned(t *testing.T) {
	ctx := testContext(t)
	shared := sharedCache(t)
	near := newNear(t, Config{TTL: MaxTTL, MaxBytes: 1 << 20}, shared)
	uri := uniqueURIs(t, 1)[0]
	shared.Fill(ctx, map[string]cache.Entry{uri: {Value: []byte("old")}})
	near.Get(ctx, uri) // the doorkeeper notes the key: its next answer is kept

	var seen []string
	near.hooks.before = func() { near.Forget([]string{uri}) } // the write's invalidation, acknowledged
	near.hooks.after = func() {
		if e, ok, _ := near.lookup(uri, time.Now()); ok {
			seen = append(seen, string(e.Value))
		}
	}
	got, ok := near.Get(ctx, uri)
	near.hooks = keepHooks{}
	if !ok || string(got.Value) != "old" {
		t.Fatalf("the read returned %q, %v; want the old value it fetched", got.Value, ok)
	}
	if len(seen) > 0 {
		t.Fatalf("a read after Forget returned found %q in memory", seen)
	}
	if e, ok, _ := near.lookup(uri, time.Now()); ok {
		t.Fatalf("%q was kept in memory after Forget returned", e.Value)
	}
}

// Tests that an entry removed after its TTL ended is counted as expired,
// not as evicted for the byte cap.
func TestExpiredEntriesAreCounted(t *testing.T) {
	ctx := testContext(t)
	shared := sharedCache(t)
	// A TTL a loaded machine cannot outlast between the read that keeps
	// the entry and the lookup after it; the lookup is made as of the
	// moment before that read, so the check does not depend on time.
	const ttl = time.Second
	near := newNear(t, Config{TTL: ttl, MaxBytes: 1 << 20}, shared)
	uri := uniqueURIs(t, 1)[0]
	shared.Fill(ctx, map[string]cache.Entry{uri: {Value: []byte("v")}})
	near.Get(ctx, uri)
	before := time.Now()
	near.Get(ctx, uri) // the second answer is kept
	if _, ok, _ := near.lookup(uri, before); !ok {
		t.Fatal("the entry was not kept")
	}
	deadline := time.Now().Add(10 * time.Second)
	for near.Stats().Expired == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v 10 s after a %v TTL: want the entry counted as expired", near.Stats(), ttl)
		}
		time.Sleep(20 * time.Millisecond)
		near.mem.CleanUp()
	}
	if s := near.Stats(); s.Expired != 1 || s.Evictions != 0 || s.Bytes != 0 {
		t.Fatalf("stats %+v: want one entry expired, none evicted, no bytes held", s)
	}
}
