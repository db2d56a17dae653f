package app

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/api/bsky"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/bskyrpc"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/synth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// appviewCtx names the caller the way the AppView's data-plane client does.
func (ts *testServer) appviewCtx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	ts.t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "x-atlantis-caller", "appview")
}

// seedIn stores n synthetic records of collection and returns them.
func (ts *testServer) seedIn(collection string, n int) []store.Record {
	ts.t.Helper()
	gen := synth.New(uint64(len(collection)), 50)
	recs := make([]store.Record, n)
	for i := range recs {
		recs[i] = gen.NextIn(collection)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if err := ts.app.Store.Put(ctx, recs); err != nil {
		ts.t.Fatalf("seed %s: %v", collection, err)
	}
	return recs
}

// Tests bsky.Service/GetPostRecords on the sluice port: records aligned
// with the request, a missing post and a URI of another collection as
// empty records, meta derived from each post, and the second read served
// from the cache the sluice.v1 service shares.
func TestBskyGetPostRecords(t *testing.T) {
	ts := startServer(t, 100, func(c *Config) { c.Telemetry.Clients = []string{"appview"} })
	client := bsky.NewServiceClient(ts.conn)
	like := ts.seedIn(synth.LikeCollection, 1)[0]
	uris := append(ts.uris(0, 40), ts.missing[0], like.URI, ts.posts[3].URI)
	for round, source := range []string{"store", "cache"} {
		resp, err := client.GetPostRecords(ts.appviewCtx(), &bsky.GetPostRecordsRequest{Uris: uris})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if len(resp.Records) != len(uris) || len(resp.Meta) != len(uris) {
			t.Fatalf("round %d: %d records, %d meta for %d uris", round, len(resp.Records), len(resp.Meta), len(uris))
		}
		for i, rec := range resp.Records {
			checkBskyPost(t, ts, uris[i], rec, resp.Meta[i])
		}
		fams := ts.metrics()
		want := map[string]string{"client": "appview", "service": "bsky.Service", "method": "GetPostRecords", "source": source}
		if n := fams.Sum("sluice_items_total", want); n == 0 {
			t.Errorf("round %d: no items from %s counted for appview on bsky.Service", round, source)
		}
	}
	var replies, media, video int
	for _, p := range ts.posts[:40] {
		replies += strings.Count(string(p.JSON), `"reply":`)
		media += strings.Count(string(p.JSON), `app.bsky.embed.images`)
		video += strings.Count(string(p.JSON), `app.bsky.embed.video`)
	}
	if replies == 0 || media == 0 || video == 0 {
		t.Errorf("seed lacks a kind of post (replies %d, images %d, videos %d); the meta checks are weak", replies, media, video)
	}
}

// checkBskyPost compares one answer with what was seeded under uri.
func checkBskyPost(t *testing.T, ts *testServer, uri string, rec *bsky.Record, meta *bsky.PostRecordMeta) {
	t.Helper()
	for _, p := range ts.posts {
		if p.URI != uri {
			continue
		}
		if !bytes.Equal(rec.GetRecord(), p.JSON) || rec.GetCid() != p.CID ||
			!rec.GetCreatedAt().AsTime().Equal(p.CreatedAt) || !rec.GetIndexedAt().AsTime().Equal(p.IndexedAt) ||
			!rec.GetSortedAt().AsTime().Equal(p.CreatedAt) {
			t.Errorf("record %s differs from the stored post", uri)
		}
		json := string(p.JSON)
		if meta.GetIsReply() != strings.Contains(json, `"reply":{`) ||
			meta.GetHasMedia() != strings.Contains(json, `"$type":"app.bsky.embed.images"`) ||
			meta.GetHasVideo() != strings.Contains(json, `"$type":"app.bsky.embed.video"`) {
			t.Errorf("meta %v does not match post %s", meta, json)
		}
		return
	}
	if len(rec.GetRecord()) != 0 || rec.GetCid() != "" {
		t.Errorf("%s is not a stored post but was answered %q", uri, rec.GetRecord())
	}
}

// Tests that the other served Get…Records methods read their own
// collection through the same path, answering URIs of another
// collection as not found.
func TestBskyOtherCollections(t *testing.T) {
	ts := startServer(t, 10, nil)
	client := bsky.NewServiceClient(ts.conn)
	likes := ts.seedIn(synth.LikeCollection, 3)
	follows := ts.seedIn(synth.FollowCollection, 2)
	profile := ts.seedIn(synth.ProfileCollection, 1)[0]

	likeResp, err := client.GetLikeRecords(ts.appviewCtx(), &bsky.GetLikeRecordsRequest{Uris: []string{likes[0].URI, follows[0].URI, likes[2].URI}})
	if err != nil {
		t.Fatal(err)
	}
	checkAnswers(t, likeResp.GetRecords(), []*store.Record{&likes[0], nil, &likes[2]})

	followResp, err := client.GetFollowRecords(ts.appviewCtx(), &bsky.GetFollowRecordsRequest{Uris: []string{follows[1].URI, ts.posts[0].URI}})
	if err != nil {
		t.Fatal(err)
	}
	checkAnswers(t, followResp.GetRecords(), []*store.Record{&follows[1], nil})

	profResp, err := client.GetProfileRecords(ts.appviewCtx(), &bsky.GetProfileRecordsRequest{Uris: []string{profile.URI}})
	if err != nil {
		t.Fatal(err)
	}
	checkAnswers(t, profResp.GetRecords(), []*store.Record{&profile})
}

// Tests every declared bsky.Service method with an aligned answer: each
// is served, returning a record of its collection and an empty record for
// a post's URI. All requests and responses of these methods share one wire
// shape ({uris = 1} -> {records = 1}). The standard.site pair, the only
// other declared methods, is tested in sitestandard_test.go.
func TestBskyEveryMethod(t *testing.T) {
	ts := startServer(t, 1, nil)
	served := bskyrpc.Served()
	for _, m := range bsky.Service_ServiceDesc.Methods {
		if slices.Contains(bskyrpc.SiteStandardMethods(), m.MethodName) {
			continue
		}
		t.Run(m.MethodName, func(t *testing.T) {
			collection, ok := served[m.MethodName]
			if !ok {
				t.Fatalf("%s is not served", m.MethodName)
			}
			rec := ts.seedIn(collection, 1)[0]
			req := &bsky.GetLikeRecordsRequest{Uris: []string{rec.URI, ts.posts[0].URI}}
			var resp bsky.GetLikeRecordsResponse
			err := ts.conn.Invoke(ts.appviewCtx(), "/bsky.Service/"+m.MethodName, req, &resp)
			if err != nil {
				t.Fatal(err)
			}
			want := []*store.Record{&rec, nil}
			if collection == aturi.PostCollection {
				want[1] = &ts.posts[0]
			}
			checkAnswers(t, resp.GetRecords(), want)
		})
	}
}

func checkAnswers(t *testing.T, got []*bsky.Record, want []*store.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i, w := range want {
		switch {
		case w == nil && len(got[i].GetRecord()) != 0:
			t.Errorf("records[%d] = %s, want empty", i, got[i].GetRecord())
		case w != nil && (!bytes.Equal(got[i].GetRecord(), w.JSON) || got[i].GetCid() != w.CID):
			t.Errorf("records[%d] = %s, want %s", i, got[i].GetRecord(), w.JSON)
		}
	}
}

// Tests per-URI leniency: in a 50-URI batch, a handle-form URI, a did:key
// URI, a URI with a query string and a 600-byte URI are answered as
// missing at their positions, the other 46 correctly, and the four are
// counted as invalid items.
func TestBskyLenientURIs(t *testing.T) {
	ts := startServer(t, 100, func(c *Config) { c.Telemetry.Clients = []string{"appview"} })
	client := bsky.NewServiceClient(ts.conn)
	odd := map[int]string{
		3:  "at://alice.example.com/app.bsky.feed.post/3kabc",
		17: "at://did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK/app.bsky.feed.post/3kabc",
		30: ts.posts[0].URI + "?x=1",
		// Well-formed (a 55-byte did:web host, a 512-byte rkey) but longer
		// than any stored URI can be.
		44: "at://did:web:" + strings.Repeat("h", 50) + ".test/app.bsky.feed.post/" + strings.Repeat("k", 512),
	}
	uris := make([]string, 50)
	want := make([]*store.Record, 50)
	next := 1
	for i := range uris {
		if u, ok := odd[i]; ok {
			uris[i] = u
			continue
		}
		uris[i], want[i] = ts.posts[next].URI, &ts.posts[next]
		next++
	}
	if len(odd[44]) != 600 {
		t.Fatalf("long URI is %d bytes", len(odd[44]))
	}
	resp, err := client.GetPostRecords(ts.appviewCtx(), &bsky.GetPostRecordsRequest{Uris: uris})
	if err != nil {
		t.Fatal(err)
	}
	checkAnswers(t, resp.GetRecords(), want)
	if len(resp.GetMeta()) != 50 {
		t.Errorf("%d meta for 50 uris", len(resp.GetMeta()))
	}
	labels := map[string]string{"client": "appview", "service": "bsky.Service", "method": "GetPostRecords", "source": "invalid"}
	if n := ts.metrics().Sum("sluice_items_total", labels); n != 4 {
		t.Errorf("sluice_items_total{source=invalid} = %v, want 4", n)
	}
}

// Tests the refusals that remain: an empty URI and an oversized batch are
// InvalidArgument naming the problem; a bsky.Service method not declared
// at all is Unimplemented.
func TestBskyRefusals(t *testing.T) {
	ts := startServer(t, 10, nil)
	client := bsky.NewServiceClient(ts.conn)

	_, err := client.GetPostRecords(ts.appviewCtx(), &bsky.GetPostRecordsRequest{Uris: []string{ts.posts[0].URI, ""}})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "uris[1]") || !hasFieldViolation(st, "uris[1]") {
		t.Errorf("empty uri: %s %q", st.Code(), st.Message())
	}

	big := make([]string, 20_000)
	for i := range big {
		big[i] = ts.posts[i%len(ts.posts)].URI
	}
	_, err = client.GetLikeRecords(ts.appviewCtx(), &bsky.GetLikeRecordsRequest{Uris: big})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "GetLikeRecords: 20000 uris exceeds the limit of 1000") {
		t.Errorf("20,000 uris: %s %q", st.Code(), st.Message())
	}

	var out bsky.GetLikeRecordsResponse
	err = ts.conn.Invoke(ts.appviewCtx(), "/bsky.Service/GetActors", &bsky.GetLikeRecordsRequest{}, &out, grpc.WaitForReady(true))
	if st := status.Convert(err); st.Code() != codes.Unimplemented {
		t.Errorf("undeclared GetActors: %s %q", st.Code(), st.Message())
	}
	if p, ok := ts.app.Guard.Policy("/bsky.Service/GetPostRecords"); !ok || p.MaxItems != 1000 || p.MaxURILength != aturi.MaxLength {
		t.Errorf("GetPostRecords policy = %+v, %v", p, ok)
	}
}
