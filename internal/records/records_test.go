package records

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/opthread"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/socialgraph"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
	"github.com/sluice-dev/sluice/internal/testenv"
)

const (
	alice = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
	bob   = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"
)

// fixture is a writer over a real store and cache, with the services it
// writes through.
type fixture struct {
	w        *Writer
	services map[string]*posts.Service
	threads  *posts.Service
	graph    *posts.Service
	store    store.Store
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	return newFixtureOn(t, bolt)
}

// newFixtureOn is newFixture over st.
func newFixtureOn(t testing.TB, st store.Store) *fixture {
	t.Helper()
	cfg := cache.DefaultConfig()
	cfg.Servers = []string{testenv.StartMemcached(t).Addr()}
	c, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f := &fixture{services: map[string]*posts.Service{}, store: st}
	for _, coll := range []string{PostCollection, ThreadgateCollection, PostgateCollection, socialgraph.FollowCollection, socialgraph.ListItemCollection, socialgraph.ListCollection, "app.bsky.feed.like"} {
		f.services[coll] = posts.New(coll, c, st, posts.DefaultWriteLimits())
	}
	f.threads = posts.New(opthread.Collection, c, st, posts.WriteLimits{MaxRecordBytes: MaxIndexBytes})
	f.graph = posts.New(socialgraph.Collection, c, st, posts.DefaultWriteLimits())
	f.w, err = New(f.services, f.threads, f.graph)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return fanout.WithLimit(ctx, 8)
}

func rec(uri, body string) store.Record {
	return store.Record{URI: uri, CID: "bafyreid", JSON: []byte(body)}
}

func postURI(did, rkey string) string { return "at://" + did + "/" + PostCollection + "/" + rkey }

// stored reports whether uri is in the store.
func (f *fixture) stored(t *testing.T, uri string) bool {
	t.Helper()
	_, err := f.store.Get(context.Background(), uri)
	switch {
	case err == nil:
		return true
	case errors.Is(err, store.ErrNotFound):
		return false
	}
	t.Fatal(err)
	return false
}

// Tests that a record whose URI is longer than any record can be stored
// under fails the batch before anything of it is written, naming its
// position, rather than after the records of other collections are.
func TestPutRefusesUnstorableURIBeforeWriting(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	post := postURI(alice, "3kpost2222222")
	long := "at://" + alice + "/app.bsky.feed.like/" + strings.Repeat("k", 500)
	_, err := f.w.Put(ctx, []store.Record{
		rec(post, `{"$type":"app.bsky.feed.post","text":"hi","createdAt":"2026-01-01T00:00:00Z"}`),
		rec(long, `{"$type":"app.bsky.feed.like","subject":{"uri":"`+post+`","cid":"c"},"createdAt":"2026-01-01T00:00:00Z"}`),
	})
	var bad *posts.InvalidRecordError
	if !errors.As(err, &bad) || bad.Index != 1 {
		t.Fatalf("Put = %v, want an InvalidRecordError at index 1", err)
	}
	if f.stored(t, post) {
		t.Error("the batch was refused, but its post was written")
	}
}

// Tests that a record whose CID the store could not keep fails the batch
// before anything is written, naming its position in the batch, rather
// than after the records of other collections are.
func TestPutRefusesUnstorableCIDBeforeWriting(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	post := postURI(alice, "3kpost3333333")
	like := rec("at://"+alice+"/app.bsky.feed.like/3klike333333", `{"$type":"app.bsky.feed.like","subject":{"uri":"`+post+`","cid":"c"},"createdAt":"2026-01-01T00:00:00Z"}`)
	like.CID = strings.Repeat("b", store.MaxCIDBytes+1)
	_, err := f.w.Put(ctx, []store.Record{
		rec(post, `{"$type":"app.bsky.feed.post","text":"hi","createdAt":"2026-01-01T00:00:00Z"}`),
		like,
	})
	var bad *posts.InvalidRecordError
	if !errors.As(err, &bad) || bad.Index != 1 || !strings.Contains(bad.Reason, "CID") {
		t.Fatalf("Put = %v, want an InvalidRecordError about the CID at index 1", err)
	}
	if f.stored(t, post) {
		t.Error("the batch was refused, but its post was written")
	}
}

// Tests that a follow or list item rewritten under its URI with a new
// subject leaves the edge its old version made (as the reference
// indexer deletes and re-inserts an updated record), and that its delete
// then leaves no edge behind. A URI given twice in one batch makes only
// its last version's edge.
func TestRewrittenGraphRecordMovesItsEdge(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	carol := "did:plc:cccccccccccccccccccccccc"
	follow := "at://" + alice + "/" + socialgraph.FollowCollection + "/3kfollow33333"
	body := func(subject string) string {
		return `{"$type":"app.bsky.graph.follow","subject":"` + subject + `","createdAt":"2026-01-01T00:00:00Z"}`
	}
	follows := func(subject string) bool {
		t.Helper()
		ok, err := f.w.graphAllows(ctx, subject, alice, GraphRules{Following: true})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	put := func(recs ...store.Record) {
		t.Helper()
		if _, err := f.w.Put(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	put(rec(follow, body(bob)))
	put(rec(follow, body(carol)))
	if follows(bob) || !follows(carol) {
		t.Errorf("after the follow of bob was rewritten to carol: follows bob %v, carol %v; want false, true", follows(bob), follows(carol))
	}
	put(rec(follow, body(bob)), rec(follow, body(carol)))
	if follows(bob) || !follows(carol) {
		t.Errorf("after a batch wrote bob then carol: follows bob %v, carol %v; want false, true", follows(bob), follows(carol))
	}
	if _, err := f.w.Delete(ctx, []string{follow}); err != nil {
		t.Fatal(err)
	}
	if follows(bob) || follows(carol) {
		t.Errorf("after the follow's delete: follows bob %v, carol %v; want neither", follows(bob), follows(carol))
	}
}

// Tests that an OP reply in a thread whose root has the longest storable
// URI is written and acknowledged, though the thread's index, whose URI
// would be longer, cannot be kept.
func TestPutOPReplyOfLongestRoot(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	prefix := postURI(alice, "")
	root := prefix + strings.Repeat("r", 512-len(prefix))
	if len(root) != 512 {
		t.Fatalf("root is %d bytes", len(root))
	}
	if _, err := f.w.Put(ctx, []store.Record{rec(root, `{"$type":"app.bsky.feed.post","text":"root","createdAt":"2026-01-01T00:00:00Z"}`)}); err != nil {
		t.Fatalf("Put(root) = %v", err)
	}
	reply := postURI(alice, "3kreply222222")
	body := `{"$type":"app.bsky.feed.post","text":"more","createdAt":"2026-01-01T00:00:01Z","reply":{"root":{"uri":"` + root + `","cid":"c"},"parent":{"uri":"` + root + `","cid":"c"}}}`
	if _, err := f.w.Put(ctx, []store.Record{rec(reply, body)}); err != nil {
		t.Fatalf("Put(OP reply) = %v, want it written", err)
	}
	if !f.stored(t, reply) {
		t.Error("the OP reply was not written")
	}
}

// Tests that a follow between two accounts whose DIDs are long did:web
// names is written and acknowledged, though its social-graph edge, whose
// URI would be longer than any record's, cannot be kept.
func TestPutFollowBetweenLongDIDs(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	host := func(c string) string {
		return strings.Repeat(c, 63) + "." + strings.Repeat(c, 63) + "." + strings.Repeat(c, 63) + "." + strings.Repeat(c, 57) + ".com"
	}
	creator, subject := "did:web:"+host("a"), "did:web:"+host("b")
	follow := "at://" + creator + "/" + socialgraph.FollowCollection + "/3kfollow22222"
	if len(follow) > 512 || len(subject) != 261 {
		t.Fatalf("follow URI is %d bytes, subject %d", len(follow), len(subject))
	}
	body := `{"$type":"app.bsky.graph.follow","subject":"` + subject + `","createdAt":"2026-01-01T00:00:00Z"}`
	if _, err := f.w.Put(ctx, []store.Record{rec(follow, body)}); err != nil {
		t.Fatalf("Put(follow) = %v, want it written", err)
	}
	if _, err := f.w.Delete(ctx, []string{follow}); err != nil {
		t.Fatalf("Delete(follow) = %v", err)
	}
}

// Tests that an account's follow records of one subject, however many,
// are written and acknowledged, and keep the edge that the thread-gates'
// rules read, though the edge can list only as many as fit in a record.
func TestPutManyFollowsOfOneSubject(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	prefix := "at://" + alice + "/" + socialgraph.FollowCollection + "/"
	body := `{"$type":"app.bsky.graph.follow","subject":"` + bob + `","createdAt":"2026-01-01T00:00:00Z"}`
	var recs []store.Record
	for i := range 150 {
		rkey := fmt.Sprintf("%03d", i) + strings.Repeat("f", 512-len(prefix)-3)
		recs = append(recs, rec(prefix+rkey, body))
	}
	if _, err := f.w.Put(ctx, recs); err != nil {
		t.Fatalf("Put(%d follows) = %v, want them written", len(recs), err)
	}
	if ok, err := f.w.graphAllows(ctx, bob, alice, GraphRules{Following: true}); err != nil || !ok {
		t.Fatalf("graphAllows(following) = %v, %v; want true", ok, err)
	}
}

// threadIndex is the stored OP-reply index of the thread rooted at root.
func (f *fixture) threadIndex(t *testing.T, root string) (opthread.Index, int) {
	t.Helper()
	u, err := aturi.ParseIn(root, PostCollection)
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := f.threads.Stored(context.Background(), opthread.IndexOf(u))
	if err != nil {
		t.Fatal(err)
	}
	return opthread.Decode(r.JSON), len(r.JSON)
}

func opReply(uri, root, parent string) store.Record {
	return rec(uri, `{"$type":"app.bsky.feed.post","text":"more","createdAt":"2026-01-01T00:00:01Z","reply":{"root":{"uri":"`+root+`","cid":"c"},"parent":{"uri":"`+parent+`","cid":"c"}}}`)
}

// Tests that a batch of more OP replies of one thread than its index can
// hold indexes those that fit, rather than none.
func TestPutOPRepliesPastTheIndexLimit(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	root := postURI(alice, "3kroot2222222")
	recs := []store.Record{rec(root, `{"$type":"app.bsky.feed.post","text":"root","createdAt":"2026-01-01T00:00:00Z"}`)}
	prefix := postURI(alice, "")
	for i := range 200 {
		rkey := fmt.Sprintf("%04d", i) + strings.Repeat("r", 512-len(prefix)-4)
		recs = append(recs, opReply(prefix+rkey, root, root))
	}
	if _, err := f.w.Put(ctx, recs); err != nil {
		t.Fatalf("Put = %v", err)
	}
	idx, size := f.threadIndex(t, root)
	if len(idx.Replies) == 0 || size > MaxIndexBytes {
		t.Fatalf("index holds %d replies in %d bytes; want as many as fit in %d", len(idx.Replies), size, MaxIndexBytes)
	}
	if idx.Replies[0].URI != recs[1].URI {
		t.Errorf("first indexed reply is %q, want the first written", idx.Replies[0].URI)
	}
}

// Tests that deleting an OP reply of a thread whose index is full marks
// it deleted there, and the delete succeeds.
func TestDeleteOPReplyOfAFullIndex(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	root := postURI(alice, "3kroot2222222")
	if _, err := f.w.Put(ctx, []store.Record{rec(root, `{"$type":"app.bsky.feed.post","text":"root","createdAt":"2026-01-01T00:00:00Z"}`)}); err != nil {
		t.Fatal(err)
	}
	prefix := postURI(alice, "")
	first := prefix + "3kfirst222222"
	if _, err := f.w.Put(ctx, []store.Record{opReply(first, root, root)}); err != nil {
		t.Fatal(err)
	}
	// Fill the index one reply at a time, the last sized to fill it to
	// the byte if the index would take it.
	for i := 0; ; i++ {
		_, size := f.threadIndex(t, root)
		room := MaxIndexBytes - size
		if room <= 0 || i > 1000 {
			break
		}
		entry := len(`,{"uri":"","parent":""}`) + len(prefix) + len(root)
		n := min(512-len(prefix), room-entry)
		if n < 5 {
			break
		}
		if _, err := f.w.Put(ctx, []store.Record{opReply(prefix+fmt.Sprintf("%04d", i)+strings.Repeat("r", n-4), root, root)}); err != nil {
			t.Fatal(err)
		}
		if _, after := f.threadIndex(t, root); after == size {
			break // the index is full
		}
	}
	if _, err := f.w.Delete(ctx, []string{first}); err != nil {
		t.Fatalf("Delete(OP reply) = %v", err)
	}
	idx, size := f.threadIndex(t, root)
	if size > MaxIndexBytes {
		t.Fatalf("index is %d bytes", size)
	}
	for _, r := range idx.Replies {
		if r.URI == first && r.DeletedAt.IsZero() {
			t.Fatalf("deleted reply %s is not marked deleted in its index", first)
		}
	}
}

// Tests that the takedowns of one request apply in order: when a record
// is named more than once, the last of them is its state afterwards.
func TestUpdateTakedownsInOrder(t *testing.T) {
	f := newFixture(t)
	ctx := testCtx(t)
	post := postURI(alice, "3kpost2222222")
	if _, err := f.w.Put(ctx, []store.Record{rec(post, `{"$type":"app.bsky.feed.post","text":"hi","createdAt":"2026-01-01T00:00:00Z"}`)}); err != nil {
		t.Fatal(err)
	}
	// One processor runs the newest of several started goroutines first.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for round := range 10 {
		var tds []Takedown
		for i := range 16 {
			tds = append(tds, Takedown{URI: post, TakedownRef: fmt.Sprintf("mod:%d:%d", round, i)})
		}
		last := tds[len(tds)-1].TakedownRef
		if round%2 == 1 {
			tds = append(tds, Takedown{URI: post}) // then lift it
			last = ""
		}
		n, err := f.w.UpdateTakedowns(ctx, tds)
		if err != nil || n != len(tds) {
			t.Fatalf("UpdateTakedowns = %d, %v; want %d", n, err, len(tds))
		}
		got, err := f.store.Get(ctx, post)
		if err != nil {
			t.Fatal(err)
		}
		if got.TakedownRef != last {
			t.Fatalf("round %d: takedown_ref is %q after the request, want its last, %q", round, got.TakedownRef, last)
		}
	}
}

// countingStore counts the store reads and writes made through it, a
// batch as one.
type countingStore struct {
	*boltstore.Store
	reads, writes atomic.Int64
}

func (s *countingStore) Put(ctx context.Context, recs []store.Record) error {
	s.writes.Add(1)
	return s.Store.Put(ctx, recs)
}

func (s *countingStore) Get(ctx context.Context, uri string) (store.Record, error) {
	s.reads.Add(1)
	return s.Store.Get(ctx, uri)
}

func (s *countingStore) GetMany(ctx context.Context, uris []string) (map[string]store.Record, error) {
	s.reads.Add(1)
	return s.Store.GetMany(ctx, uris)
}

// Tests that the records a batch's gate state depends on are read ahead
// in a few batched reads, not one read after another per post: 500
// replies, half of them to roots with a thread-gate, make a handful of
// store reads, and their gate state is as read one by one; deleting them
// reads what they were (OP replies, edges) in batched reads too.
func TestGateStateReadsAheadInBatches(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	st := &countingStore{Store: bolt}
	f := newFixtureOn(t, st)
	ctx := testCtx(t)
	const n = 500
	var roots, replies []store.Record
	for i := range n {
		root := postURI(bob, fmt.Sprintf("3kroot%05d", i))
		roots = append(roots, rec(root, `{"$type":"app.bsky.feed.post","text":"root","createdAt":"2024-01-01T00:00:00Z"}`))
		if i%2 == 0 {
			gate := "at://" + bob + "/" + ThreadgateCollection + fmt.Sprintf("/3kroot%05d", i)
			roots = append(roots, rec(gate, fmt.Sprintf(`{"$type":"app.bsky.feed.threadgate","post":%q,"allow":[],"createdAt":"2024-01-01T00:00:00Z"}`, root)))
		}
		replies = append(replies, rec(postURI(alice, fmt.Sprintf("3kreply%05d", i)), fmt.Sprintf(`{"$type":"app.bsky.feed.post","text":"re","createdAt":"2024-01-01T00:00:00Z","reply":{"root":{"uri":%q,"cid":"b"},"parent":{"uri":%q,"cid":"b"}}}`, root, root)))
	}
	if _, err := f.w.Put(ctx, roots); err != nil {
		t.Fatal(err)
	}
	before := st.reads.Load()
	if _, err := f.w.Put(ctx, replies); err != nil {
		t.Fatal(err)
	}
	if reads := st.reads.Load() - before; reads > 10 {
		t.Errorf("a batch of %d replies made %d store reads; want a few batched reads", n, reads)
	}
	uris := make([]string, len(replies))
	for i, r := range replies {
		got, err := f.store.Get(ctx, r.URI)
		if err != nil {
			t.Fatal(err)
		}
		if want := i%2 == 0; got.Gates.ViolatesThreadGate != want {
			t.Fatalf("reply %d: violates_thread_gate %v, want %v", i, got.Gates.ViolatesThreadGate, want)
		}
		uris[i] = r.URI
	}
	before = st.reads.Load()
	if n, err := f.w.Delete(ctx, uris); err != nil || n != len(uris) {
		t.Fatalf("Delete = %d, %v; want %d", n, err, len(uris))
	}
	if reads := st.reads.Load() - before; reads > 10 {
		t.Errorf("deleting %d posts made %d store reads; want a few batched reads", n, reads)
	}
}

// Tests that a batch's social-graph edges are changed in one
// read-modify-write of them all, not one store read and write per edge:
// 500 follows of different subjects make a handful of store reads and
// writes, and each makes its edge; deleting them does the same and
// removes every edge.
func TestEdgesChangedInOneReadModifyWrite(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	st := &countingStore{Store: bolt}
	f := newFixtureOn(t, st)
	ctx := testCtx(t)
	const n = 500
	recs := make([]store.Record, n)
	uris := make([]string, n)
	subject := func(i int) string { return fmt.Sprintf("did:plc:zzzzzzzzzzzzzzzzzzz%05d", i) }
	for i := range recs {
		uris[i] = "at://" + alice + "/" + socialgraph.FollowCollection + fmt.Sprintf("/3kfollow%05d", i)
		recs[i] = rec(uris[i], fmt.Sprintf(`{"$type":"app.bsky.graph.follow","subject":%q,"createdAt":"2026-01-01T00:00:00Z"}`, subject(i)))
	}
	follows := func(i int) bool {
		t.Helper()
		ok, err := f.w.graphAllows(ctx, subject(i), alice, GraphRules{Following: true})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	reads, writes := st.reads.Load(), st.writes.Load()
	if _, err := f.w.Put(ctx, recs); err != nil {
		t.Fatal(err)
	}
	if r, w := st.reads.Load()-reads, st.writes.Load()-writes; r > 10 || w > 10 {
		t.Errorf("writing %d follows made %d store reads and %d writes; want a few of each", n, r, w)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		if !follows(i) {
			t.Fatalf("follow %d made no edge", i)
		}
	}
	reads, writes = st.reads.Load(), st.writes.Load()
	if _, err := f.w.Delete(ctx, uris); err != nil {
		t.Fatal(err)
	}
	if r, w := st.reads.Load()-reads, st.writes.Load()-writes; r > 10 || w > 10 {
		t.Errorf("deleting %d follows made %d store reads and %d writes; want a few of each", n, r, w)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		if follows(i) {
			t.Fatalf("follow %d still makes its edge after its delete", i)
		}
	}
}
