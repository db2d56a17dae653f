package app

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/api/bsky"
	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/bskyrpc"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	alice = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
	bob   = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"
	carol = "did:plc:cccccccccccccccccccccccc"
)

func recURI(did, collection, rkey string) string {
	return fmt.Sprintf("at://%s/%s/%s", did, collection, rkey)
}

func writeRec(did, collection, rkey, body string) *sluicev1.Record {
	return &sluicev1.Record{
		Uri:    recURI(did, collection, rkey),
		Cid:    "bafyreib2rxk3rh6kzwq",
		Record: []byte(fmt.Sprintf(`{"$type":%q,"createdAt":"2026-01-01T00:00:00Z"%s}`, collection, body)),
	}
}

func ref(uri string) string { return fmt.Sprintf(`{"uri":%q,"cid":"bafyreib2rxk3rh6kzwq"}`, uri) }

// Tests the write path of sluice.v1.Records through bsky.Service: a
// takedown and its lift, tags, and the gate state computed when posts and
// gates are written or deleted, each visible on the very next read.
func TestRecordsModerationAndGates(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) {
		c.Telemetry.Clients = []string{"appview"}
	})
	w := sluicev1.NewRecordsClient(ts.conn)
	r := bsky.NewServiceClient(ts.conn)
	ctx := ts.appviewCtx()
	post := func(did, rkey, body string) *sluicev1.Record {
		return writeRec(did, "app.bsky.feed.post", rkey, `,"text":"t"`+body)
	}
	gated := recURI(bob, "app.bsky.feed.post", "3kgated")
	quoted := recURI(bob, "app.bsky.feed.post", "3kquoted")
	taken := post(alice, "3ktaken", "")
	taken.TakedownRef, taken.Tags = "mod:1", []string{"hide", "rank:-1"}
	batch := []*sluicev1.Record{
		taken,
		writeRec(bob, "app.bsky.feed.threadgate", "3kgated", `,"post":"`+gated+`","allow":[]`),
		post(bob, "3kgated", ""),
		post(carol, "3kreply", `,"reply":{"root":`+ref(gated)+`,"parent":`+ref(gated)+`}`),
		post(bob, "3kownreply", `,"reply":{"root":`+ref(gated)+`,"parent":`+ref(gated)+`}`),
		writeRec(bob, "app.bsky.feed.postgate", "3kquoted", `,"post":"`+quoted+`","embeddingRules":[{"$type":"app.bsky.feed.postgate#disableRule"}]`),
		post(bob, "3kquoted", ""),
		post(carol, "3kquote", `,"embed":{"$type":"app.bsky.embed.record","record":`+ref(quoted)+`}`),
		post(bob, "3kselfquote", `,"embed":{"$type":"app.bsky.embed.record","record":`+ref(quoted)+`}`),
		post(alice, "3klater", ""),
	}
	if resp, err := w.PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: batch}); err != nil || resp.GetWritten() != uint32(len(batch)) {
		t.Fatalf("PutRecords = %v, %v", resp, err)
	}
	uris := []string{taken.Uri, gated, batch[3].Uri, batch[4].Uri, quoted, batch[7].Uri, batch[8].Uri, batch[9].Uri}
	read := func() *bsky.GetPostRecordsResponse {
		t.Helper()
		resp, err := r.GetPostRecords(ctx, &bsky.GetPostRecordsRequest{Uris: uris})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	got := read()
	if rec := got.Records[0]; !rec.TakenDown || rec.TakedownRef != "mod:1" || fmt.Sprint(rec.Tags) != "[hide rank:-1]" {
		t.Errorf("taken-down post: taken_down %v, takedown_ref %q, tags %q", rec.TakenDown, rec.TakedownRef, rec.Tags)
	}
	want := []bsky.PostRecordMeta{
		{}, {HasThreadGate: true}, {IsReply: true, ViolatesThreadGate: true}, {IsReply: true},
		{HasPostGate: true}, {ViolatesEmbeddingRules: true}, {}, {},
	}
	for i := range want {
		m := got.Meta[i]
		if m.HasThreadGate != want[i].HasThreadGate || m.HasPostGate != want[i].HasPostGate || m.IsReply != want[i].IsReply ||
			m.ViolatesThreadGate != want[i].ViolatesThreadGate || m.ViolatesEmbeddingRules != want[i].ViolatesEmbeddingRules {
			t.Errorf("meta of %s = %v, want %v", uris[i], m, &want[i])
		}
	}

	// Once the write's tombstones expire, reads fill the cache and are
	// answered from it; the changes below must still be seen at once.
	fromCache := map[string]string{"client": "appview", "method": "GetPostRecords", "source": "cache"}
	for deadline := time.Now().Add(20 * time.Second); ts.metrics().Sum("sluice_items_total", fromCache) < float64(len(uris)); {
		if time.Now().After(deadline) {
			t.Fatal("the posts were never answered from the cache")
		}
		time.Sleep(100 * time.Millisecond)
		read()
	}

	// A lift, a gate deleted and a gate written after its post: each seen
	// by the next read, though the cache holds the old versions.
	if resp, err := w.UpdateTakedowns(ctx, &sluicev1.UpdateTakedownsRequest{Takedowns: []*sluicev1.Takedown{{Uri: taken.Uri}, {Uri: recURI(alice, "app.bsky.feed.post", "3knone"), TakedownRef: "x"}}}); err != nil || resp.GetUpdated() != 1 {
		t.Fatalf("UpdateTakedowns = %v, %v", resp, err)
	}
	if _, err := w.DeleteRecords(ctx, &sluicev1.DeleteRecordsRequest{Uris: []string{batch[1].Uri}}); err != nil {
		t.Fatal(err)
	}
	later := batch[9].Uri
	if _, err := w.PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{writeRec(alice, "app.bsky.feed.threadgate", "3klater", `,"post":"`+later+`"`)}}); err != nil {
		t.Fatal(err)
	}
	got = read()
	if rec := got.Records[0]; rec.TakenDown || rec.TakedownRef != "" || len(rec.Tags) != 2 {
		t.Errorf("after the lift: taken_down %v, takedown_ref %q, tags %q", rec.TakenDown, rec.TakedownRef, rec.Tags)
	}
	if got.Meta[1].HasThreadGate {
		t.Error("has_thread_gate still set after its thread-gate was deleted")
	}
	if !got.Meta[7].HasThreadGate {
		t.Error("has_thread_gate not set by a thread-gate written after its post")
	}
	if taken := ts.readTakedown(t, taken.Uri); taken {
		t.Error("sluice.v1 GetPostRecords still shows the takedown")
	}

	// Refusals: a collection bsky.Service does not read, a gate whose post
	// is another record's, and nothing of either batch is written.
	for name, rec := range map[string]*sluicev1.Record{
		"foreign collection":   writeRec(alice, "com.example.thing", "3kx", ""),
		"gate of another post": writeRec(alice, "app.bsky.feed.threadgate", "3kx", `,"post":"`+gated+`"`),
	} {
		_, err := w.PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{post(alice, "3kokay", ""), rec}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if resp, _ := r.GetPostRecords(ctx, &bsky.GetPostRecordsRequest{Uris: []string{recURI(alice, "app.bsky.feed.post", "3kokay")}}); len(resp.GetRecords()[0].GetRecord()) != 0 {
		t.Error("a refused batch wrote its valid record")
	}
}

// readTakedown reads uri through sluice.v1 and reports whether it is
// taken down.
func (ts *testServer) readTakedown(t *testing.T, uri string) bool {
	t.Helper()
	resp, err := sluicev1.NewPostRecordsClient(ts.conn).GetPostRecord(ts.appviewCtx(), &sluicev1.GetPostRecordRequest{Uri: uri})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetTakedownRef() != ""
}

// Tests that every one of the 19 record methods answers a record written
// through PutRecords.
func TestRecordsEveryMethod(t *testing.T) {
	ts := startServer(t, 1, nil)
	w := sluicev1.NewRecordsClient(ts.conn)
	served := bskyrpc.Served()
	if len(served) != 19 {
		t.Fatalf("%d methods served, want 19", len(served))
	}
	var batch []*sluicev1.Record
	for _, collection := range served {
		body := ""
		if collection == "app.bsky.feed.threadgate" || collection == "app.bsky.feed.postgate" {
			body = `,"post":"` + recURI(carol, "app.bsky.feed.post", "self") + `"`
		}
		batch = append(batch, writeRec(carol, collection, "self", body))
	}
	if _, err := w.PutRecords(ts.appviewCtx(), &sluicev1.PutRecordsRequest{Records: batch}); err != nil {
		t.Fatal(err)
	}
	for method, collection := range served {
		var resp bsky.GetLikeRecordsResponse
		uri := recURI(carol, collection, "self")
		if err := ts.conn.Invoke(ts.appviewCtx(), "/bsky.Service/"+method, &bsky.GetLikeRecordsRequest{Uris: []string{uri}}, &resp); err != nil {
			t.Errorf("%s: %v", method, err)
			continue
		}
		if rec := resp.GetRecords()[0]; len(rec.GetRecord()) == 0 || rec.GetCid() == "" {
			t.Errorf("%s did not answer %s", method, uri)
		}
	}
}

// Tests that sluice.v1.Records refuses bad input with an InvalidArgument
// naming what was wrong and the limit, and that a refused request changes
// nothing stored: too many records, a record over the size limit, a
// collection bsky.Service does not read, a malformed URI, a takedown_ref
// over its limit. The bad record is of another collection than the good
// one before it, so the whole batch must be checked before any of it is
// written.
func TestRecordsBadInput(t *testing.T) {
	ts := startServer(t, 1, nil)
	w := sluicev1.NewRecordsClient(ts.conn)
	ctx := ts.ctx("writer")
	like := func(rkey, body string) *sluicev1.Record {
		return writeRec(alice, "app.bsky.feed.like", rkey, body)
	}
	kept := like("3kkept", `,"n":1`)
	if _, err := w.PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{kept}}); err != nil {
		t.Fatal(err)
	}
	overwrite := like("3kkept", `,"n":2`)
	many := make([]*sluicev1.Record, 1001)
	for i := range many {
		many[i] = like(fmt.Sprintf("3kmany%d", i), "")
	}
	many[0] = overwrite
	cases := []struct {
		name, want string
		req        *sluicev1.PutRecordsRequest
	}{
		{"too many", "1001 records exceeds the limit of 1000", &sluicev1.PutRecordsRequest{Records: many}},
		{"too large", "over the limit of 65536", &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{overwrite, writeRec(alice, "app.bsky.feed.post", "3kbig", `,"text":"`+strings.Repeat("z", 70_000)+`"`)}}},
		{"unknown collection", `collection "com.example.thing" is not one bsky.Service reads`, &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{overwrite, writeRec(alice, "com.example.thing", "3kx", "")}}},
		{"malformed uri", "records[1]", &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{overwrite, {Uri: "at://did:plc:x/app.bsky.feed.like/\r\nflush_all", Record: []byte(`{"$type":"app.bsky.feed.like"}`)}}}},
		{"takedown_ref too long", "over the 1024-byte limit", &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{overwrite, {Uri: recURI(alice, "app.bsky.feed.like", "3kmod"), Cid: "bafy", Record: []byte(`{"$type":"app.bsky.feed.like"}`), TakedownRef: strings.Repeat("m", 2000)}}}},
	}
	for _, tc := range cases {
		_, err := w.PutRecords(ctx, tc.req)
		st := status.Convert(err)
		t.Logf("%s: %s %q", tc.name, st.Code(), st.Message())
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.want) {
			t.Errorf("%s: got %s %q, want InvalidArgument naming %q", tc.name, st.Code(), st.Message(), tc.want)
		}
	}
	for want, req := range map[string]func() error{
		`uris[1] "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/com.example.thing/3kx" is not a valid AT-URI: collection "com.example.thing" is not one bsky.Service reads`: func() error {
			_, err := w.DeleteRecords(ctx, &sluicev1.DeleteRecordsRequest{Uris: []string{kept.Uri, recURI(alice, "com.example.thing", "3kx")}})
			return err
		},
		"takedowns[1]": func() error {
			_, err := w.UpdateTakedowns(ctx, &sluicev1.UpdateTakedownsRequest{Takedowns: []*sluicev1.Takedown{{Uri: kept.Uri, TakedownRef: "x"}, {Uri: "not a uri", TakedownRef: "y"}}})
			return err
		},
	} {
		st := status.Convert(req())
		t.Logf("%s: %s %q", want, st.Code(), st.Message())
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), want) {
			t.Errorf("a request holding a bad URI: %s %q, want InvalidArgument naming %s", st.Code(), st.Message(), want)
		}
	}
	got, err := ts.app.Store.Get(ctx, kept.Uri)
	if err != nil || string(got.JSON) != string(kept.Record) || got.TakedownRef != "" {
		t.Errorf("the stored record changed under refused requests: %v %s takedown %q", err, got.JSON, got.TakedownRef)
	}
	if _, err := ts.app.Store.Get(ctx, many[1].Uri); err == nil {
		t.Error("a refused batch wrote a new record")
	}
}

// Tests op_threads through bsky.Service: OP replies written through
// PutRecords (in separate batches, a reply by another author between
// them) resolve to the root's canonical OP thread for any post of the
// thread when include_op_thread_metadata is set, and to none when it is
// not; deleting the last OP reply shortens the thread on the next read.
func TestRecordsOpThreads(t *testing.T) {
	ts := startServer(t, 1, nil)
	w := sluicev1.NewRecordsClient(ts.conn)
	r := bsky.NewServiceClient(ts.conn)
	ctx := ts.appviewCtx()
	post := func(did, rkey, body string) *sluicev1.Record {
		return writeRec(did, "app.bsky.feed.post", rkey, `,"text":"t"`+body)
	}
	root := recURI(alice, "app.bsky.feed.post", "3kroot0000000")
	reply := func(did, rkey, parent string) *sluicev1.Record {
		return post(did, rkey, `,"reply":{"root":`+ref(root)+`,"parent":`+ref(parent)+`}`)
	}
	first := reply(alice, "3kreply100000", root)
	other := reply(bob, "3kreply200000", root)
	second := reply(alice, "3kreply300000", first.Uri)
	for _, batch := range [][]*sluicev1.Record{{post(alice, "3kroot0000000", ""), first}, {other}, {second}} {
		if _, err := w.PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: batch}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(uri string, include bool) []*bsky.OpThread {
		t.Helper()
		resp, err := r.GetPostRecords(ctx, &bsky.GetPostRecordsRequest{Uris: []string{uri}, IncludeOpThreadMetadata: include})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOpThreads()
	}
	want := fmt.Sprint([]string{root, first.Uri, second.Uri})
	for _, uri := range []string{root, other.Uri, second.Uri} {
		got := read(uri, true)
		if len(got) != 1 || got[0].GetRootUri() != root || fmt.Sprint(got[0].GetUris()) != want {
			t.Errorf("op_threads for %s = %v, want root %s with %s", uri, got, root, want)
		}
	}
	if got := read(root, false); len(got) != 0 {
		t.Errorf("op_threads without include_op_thread_metadata = %v, want none", got)
	}
	if _, err := w.DeleteRecords(ctx, &sluicev1.DeleteRecordsRequest{Uris: []string{second.Uri}}); err != nil {
		t.Fatal(err)
	}
	if got := read(root, true); len(got) != 1 || fmt.Sprint(got[0].GetUris()) != fmt.Sprint([]string{root, first.Uri}) {
		t.Errorf("op_threads after deleting the last OP reply = %v, want [%s %s]", got, root, first.Uri)
	}
}

// Tests that a takedown through one replica is seen on the very next read
// through another replica that holds the record in its near cache and has
// no journal follower to tell it, and so is its lift: each is answered
// only once the near-cache horizon has passed, so no replica still
// answers the old state.
func TestTakedownSeenAtOnceThroughAnotherReplicasNearCache(t *testing.T) {
	keyspace := withCQL(cqltest.Keyspace(t, "sluice_test_app_horizon"))
	replica := func(c *Config) {
		keyspace(c)
		c.Telemetry.Clients = []string{"appview"}
		c.Near.TTL = time.Second
		// Patient writes on a busy machine: the takedown itself may take
		// longer than the default timeout leaves beside the horizon.
		for _, name := range []string{sluicev1.Records_ServiceDesc.ServiceName + "/PutRecords", sluicev1.Records_ServiceDesc.ServiceName + "/UpdateTakedowns",
			sluicev1.PostRecords_ServiceDesc.ServiceName + "/PutPostRecords"} {
			p, ok := c.Guard.Methods[name]
			if !ok {
				t.Fatalf("no policy for %s", name)
			}
			p.Timeout = 4 * time.Second
			c.Guard.Methods[name] = p
		}
		c.Cache.TombstoneTTL = 6 * time.Second
	}
	writer := startServer(t, 0, replica)
	reader := startServer(t, 0, func(c *Config) {
		replica(c)
		c.Cache.Servers = []string{writer.memcached.Addr()}
		c.Journal.Disabled = true
	})
	w := sluicev1.NewRecordsClient(writer.conn)
	rec := writeRec(alice, "app.bsky.feed.post", "3khorizon", `,"text":"t"`)
	if _, err := w.PutRecords(writer.appviewCtx(), &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{rec}}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name, ref string
	}{{"takedown", "mod:horizon"}, {"lift", ""}} {
		reader.readFromNearCache(t, rec.Uri, step.ref != "") // the state before the step
		resp, err := w.UpdateTakedowns(writer.appviewCtx(), &sluicev1.UpdateTakedownsRequest{Takedowns: []*sluicev1.Takedown{{Uri: rec.Uri, TakedownRef: step.ref}}})
		if err != nil || resp.GetUpdated() != 1 {
			t.Fatalf("%s: UpdateTakedowns = %v, %v", step.name, resp, err)
		}
		if got := reader.readTakedown(t, rec.Uri); got != (step.ref != "") {
			t.Fatalf("%s acknowledged, but the replica holding the post in its near cache answers taken down = %v", step.name, got)
		}
	}
	// A takedown sent as a plain put of the record (sluice.v1.PostRecords)
	// is answered only after the horizon too.
	reader.readFromNearCache(t, rec.Uri, true)
	posts := sluicev1.NewPostRecordsClient(writer.conn)
	got, err := posts.GetPostRecords(writer.appviewCtx(), &sluicev1.GetPostRecordsRequest{Uris: []string{rec.Uri}})
	if err != nil || len(got.GetRecords()) != 1 || !got.GetRecords()[0].GetFound() {
		t.Fatalf("GetPostRecords = %v, %v", got, err)
	}
	down := got.GetRecords()[0]
	down.TakedownRef = "mod:put"
	if _, err := posts.PutPostRecords(writer.appviewCtx(), &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{down}}); err != nil {
		t.Fatalf("PutPostRecords with a takedown: %v", err)
	}
	if !reader.readTakedown(t, rec.Uri) {
		t.Fatal("a takedown put through PutPostRecords acknowledged, but the replica holding the post in its near cache answers it visible")
	}
}

// readFromNearCache reads uri until this replica answers it from its near
// cache, checking every answer's takedown state is the one expected
// (taken down unless visible).
func (ts *testServer) readFromNearCache(t *testing.T, uri string, visible bool) {
	t.Helper()
	before := ts.app.Near.Stats().Hits
	for deadline := time.Now().Add(30 * time.Second); ts.app.Near.Stats().Hits == before; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s was never answered from the near cache: %+v", uri, ts.app.Near.Stats())
		}
		if ts.readTakedown(t, uri) == visible {
			t.Fatalf("%s reads as taken down = %v before the change", uri, visible)
		}
	}
}

// Tests the thread-gate rules decided from the social graph, as the
// reference's violatesThreadGate does: a follower rule lets those who
// follow the root's author reply, a following rule those the author
// follows, a list rule those on the list; a deleted follow no longer
// counts, and a follow of the wrong direction never does.
func TestRecordsThreadGateGraphRules(t *testing.T) {
	const (
		dave  = "did:plc:dddddddddddddddddddddddd"
		erin  = "did:plc:eeeeeeeeeeeeeeeeeeeeeeee"
		frank = "did:plc:ffffffffffffffffffffffff"
	)
	ts := startServer(t, 1, func(c *Config) { c.Telemetry.Clients = []string{"appview"} })
	w := sluicev1.NewRecordsClient(ts.conn)
	r := bsky.NewServiceClient(ts.conn)
	ctx := ts.appviewCtx()
	put := func(recs ...*sluicev1.Record) {
		t.Helper()
		if resp, err := w.PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: recs}); err != nil || resp.GetWritten() != uint32(len(recs)) {
			t.Fatalf("PutRecords = %v, %v", resp, err)
		}
	}
	post := func(did, rkey, body string) *sluicev1.Record {
		return writeRec(did, "app.bsky.feed.post", rkey, `,"text":"t"`+body)
	}
	replyTo := func(did, rkey, root string) *sluicev1.Record {
		return post(did, rkey, `,"reply":{"root":`+ref(root)+`,"parent":`+ref(root)+`}`)
	}
	follow := func(creator, rkey, subject string) *sluicev1.Record {
		return writeRec(creator, "app.bsky.graph.follow", rkey, `,"subject":"`+subject+`"`)
	}
	list := recURI(bob, "app.bsky.graph.list", "3klist")
	all := recURI(bob, "app.bsky.feed.post", "3kall")
	followersOnly := recURI(bob, "app.bsky.feed.post", "3kfollowers")
	carolFollowsBob := follow(carol, "3kf1", bob)
	put(
		writeRec(bob, "app.bsky.feed.threadgate", "3kall", `,"post":"`+all+`","allow":[{"$type":"app.bsky.feed.threadgate#followerRule"},{"$type":"app.bsky.feed.threadgate#followingRule"},{"$type":"app.bsky.feed.threadgate#listRule","list":"`+list+`"}]`),
		post(bob, "3kall", ""),
		writeRec(bob, "app.bsky.feed.threadgate", "3kfollowers", `,"post":"`+followersOnly+`","allow":[{"$type":"app.bsky.feed.threadgate#followerRule"}]`),
		post(bob, "3kfollowers", ""),
		carolFollowsBob,
		follow(bob, "3kf2", dave),
		writeRec(bob, "app.bsky.graph.list", "3klist", `,"name":"l","purpose":"app.bsky.graph.defs#curatelist"`),
		writeRec(bob, "app.bsky.graph.listitem", "3kli", `,"subject":"`+erin+`","list":"`+list+`"`),
	)
	replies := []*sluicev1.Record{
		replyTo(carol, "3kr1", all),          // follows bob: follower rule
		replyTo(dave, "3kr2", all),           // bob follows dave: following rule
		replyTo(erin, "3kr3", all),           // on bob's list: list rule
		replyTo(frank, "3kr4", all),          // none of them
		replyTo(dave, "3kr5", followersOnly), // followed by bob, but no follower of his
		replyTo(carol, "3kr6", followersOnly),
	}
	put(replies...)
	if _, err := w.DeleteRecords(ctx, &sluicev1.DeleteRecordsRequest{Uris: []string{carolFollowsBob.Uri}}); err != nil {
		t.Fatal(err)
	}
	afterUnfollow := replyTo(carol, "3kr7", followersOnly)
	put(afterUnfollow)

	uris := []string{afterUnfollow.Uri}
	for _, rec := range replies {
		uris = append(uris, rec.Uri)
	}
	resp, err := r.GetPostRecords(ctx, &bsky.GetPostRecordsRequest{Uris: uris})
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{true, false, false, false, true, true, false}
	for i, w := range want {
		if got := resp.Meta[i].ViolatesThreadGate; got != w {
			t.Errorf("%s: violates_thread_gate = %v, want %v", uris[i], got, w)
		}
	}
}

// Tests that sluice.v1.PostRecords writes posts as sluice.v1.Records
// does: a post put again without gates keeps the gate state its
// thread-gate gave it, a reply put into a gated thread is marked, a
// caller cannot set gates itself, and a URI of another collection is
// refused before anything is written or deleted.
func TestPostRecordsWritesComputeGates(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) {
		c.Telemetry.Clients = []string{"appview"}
	})
	ctx := ts.appviewCtx()
	root := recURI(bob, "app.bsky.feed.post", "3kgatedroot")
	gate := writeRec(bob, "app.bsky.feed.threadgate", "3kgatedroot", `,"post":"`+root+`","allow":[]`)
	if _, err := sluicev1.NewRecordsClient(ts.conn).PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{
		writeRec(bob, "app.bsky.feed.post", "3kgatedroot", `,"text":"root"`), gate,
	}}); err != nil {
		t.Fatal(err)
	}
	pr := sluicev1.NewPostRecordsClient(ts.conn)
	asPost := func(r *sluicev1.Record) *sluicev1.PostRecord {
		return &sluicev1.PostRecord{Uri: r.Uri, Cid: r.Cid, Record: r.Record,
			Gates: &sluicev1.PostGates{ViolatesEmbeddingRules: true}} // a caller's claim, ignored
	}
	rewritten := asPost(writeRec(bob, "app.bsky.feed.post", "3kgatedroot", `,"text":"root, edited"`))
	reply := asPost(writeRec(carol, "app.bsky.feed.post", "3kgatedreply", `,"text":"r","reply":{"root":`+ref(root)+`,"parent":`+ref(root)+`}`))
	if _, err := pr.PutPostRecords(ctx, &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{rewritten, reply}}); err != nil {
		t.Fatal(err)
	}
	got, err := bsky.NewServiceClient(ts.conn).GetPostRecords(ctx, &bsky.GetPostRecordsRequest{Uris: []string{root, reply.Uri}})
	if err != nil {
		t.Fatal(err)
	}
	if m := got.Meta[0]; !m.HasThreadGate || m.ViolatesEmbeddingRules {
		t.Errorf("root put again through PutPostRecords: meta %v, want has_thread_gate kept and no caller-set flag", m)
	}
	if m := got.Meta[1]; !m.IsReply || !m.ViolatesThreadGate || m.ViolatesEmbeddingRules {
		t.Errorf("reply put through PutPostRecords into a thread nobody may reply to: meta %v, want it marked violating", m)
	}

	like := recURI(carol, "app.bsky.feed.like", "3klike")
	okay := asPost(writeRec(carol, "app.bsky.feed.post", "3kokay2", `,"text":"t"`))
	_, err = pr.PutPostRecords(ctx, &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{okay,
		{Uri: like, Cid: "c", Record: []byte(`{"$type":"app.bsky.feed.like","createdAt":"2026-01-01T00:00:00Z"}`)}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("PutPostRecords with a like: %v, want InvalidArgument", err)
	}
	if _, err := pr.DeletePostRecords(ctx, &sluicev1.DeletePostRecordsRequest{Uris: []string{reply.Uri, gate.Uri}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("DeletePostRecords with a thread-gate's URI: %v, want InvalidArgument", err)
	}
	got, err = bsky.NewServiceClient(ts.conn).GetPostRecords(ctx, &bsky.GetPostRecordsRequest{Uris: []string{okay.Uri, reply.Uri}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Records[0].Record) != 0 || len(got.Records[1].Record) == 0 {
		t.Errorf("a refused batch changed something: the post put beside a like stored %v, the reply deleted beside a gate %v",
			len(got.Records[0].Record) != 0, len(got.Records[1].Record) == 0)
	}
}
