package app

import (
	"bytes"
	"strings"
	"testing"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tests the transport's receive cap against the guard's shape check
// through the real server: a 20,000-URI batch of maximum-length URIs
// (about 10 MiB) is under max_recv_msg_bytes, so it reaches the guard and
// gets the shape error that explains the limit; a 17 MiB message is cut
// by the transport (ResourceExhausted) before it is decoded. Neither
// touches memcached or the store.
func TestReceiveCapAndShapeCheck(t *testing.T) {
	ts := startServer(t, 10, nil)
	before := ts.app.Cache.Stats()[0] // the start-up journal replay has used memcached
	prefix := ts.posts[0].URI
	long := prefix + strings.Repeat("a", 512-len(prefix))
	uris := make([]string, 20_000)
	for i := range uris {
		uris[i] = long
	}
	_, err := ts.client.GetPostRecords(ts.ctx("bulk"), &sluicev1.GetPostRecordsRequest{Uris: uris})
	st := status.Convert(err)
	t.Logf("20,000 × 512-byte URIs: %s %q", st.Code(), st.Message())
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "20000 uris exceeds the limit of 1000") {
		t.Errorf("got %s %q, want the guard's shape error", st.Code(), st.Message())
	}

	huge := []string{strings.Repeat("x", 9<<20), strings.Repeat("y", 9<<20)}
	_, err = ts.client.GetPostRecords(ts.ctx("abuser"), &sluicev1.GetPostRecordsRequest{Uris: huge})
	st = status.Convert(err)
	t.Logf("18 MiB message: %s %q", st.Code(), st.Message())
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "larger than max") {
		t.Errorf("got %s %q, want ResourceExhausted from the transport", st.Code(), st.Message())
	}
	if s := ts.app.Cache.Stats()[0]; s.Hits+s.Misses+s.Errors+s.Dials != before.Hits+before.Misses+before.Errors+before.Dials {
		t.Errorf("memcached was reached: %+v, before the requests %+v", s, before)
	}
	if n := ts.metrics().Sum("sluice_store_reads_total", nil); n != 0 {
		t.Errorf("store reads = %v, want 0", n)
	}
}

// Tests that a write batch refused for any one record — too large, wrong
// $type, not JSON — changes nothing: neither the valid records before
// it, nor the existing record it would replace, nor a new URI.
func TestRejectedWriteChangesNothing(t *testing.T) {
	ts := startServer(t, 10, nil)
	valid := func(uri, text string) *sluicev1.PostRecord {
		return &sluicev1.PostRecord{Uri: uri, Cid: "bafyreichanged", Record: []byte(`{"$type":"app.bsky.feed.post","text":"` + text + `"}`)}
	}
	cases := []struct {
		name, want string
		bad        *sluicev1.PostRecord
	}{
		{"too large", "over the limit of 65536", valid(ts.posts[2].URI, strings.Repeat("z", 70_000))},
		{"wrong type", `want "app.bsky.feed.post"`, &sluicev1.PostRecord{Uri: ts.posts[2].URI, Record: []byte(`{"$type":"app.bsky.feed.like"}`)}},
		{"not json", "not a JSON object", &sluicev1.PostRecord{Uri: ts.posts[2].URI, Record: []byte(`{"$type":`)}},
		{"bad uri", "records[2]", valid("at://did:plc:x/app.bsky.feed.post/\r\nflush_all", "x")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			batch := []*sluicev1.PostRecord{valid(ts.posts[1].URI, "overwrite"), valid(ts.missing[0], "create"), tc.bad}
			_, err := ts.client.PutPostRecords(ts.ctx("writer"), &sluicev1.PutPostRecordsRequest{Records: batch})
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.want) || !strings.Contains(st.Message(), "nothing in this batch was written") {
				t.Fatalf("got %s %q, want InvalidArgument naming %q", st.Code(), st.Message(), tc.want)
			}
			for _, i := range []int{1, 2} {
				got, err := ts.app.Store.Get(ts.ctx("check"), ts.posts[i].URI)
				if err != nil || !bytes.Equal(got.JSON, ts.posts[i].JSON) || got.CID != ts.posts[i].CID {
					t.Errorf("post %d changed by a refused write: %v %s", i, err, got.JSON)
				}
			}
			if _, err := ts.app.Store.Get(ts.ctx("check"), ts.missing[0]); err == nil {
				t.Errorf("a refused write created %s", ts.missing[0])
			}
		})
	}
}
