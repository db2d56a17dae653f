package app

import (
	"bytes"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"github.com/sluice-dev/sluice/internal/posts"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tests that a 20,000-URI batch is refused with a message that explains
// the limit, and that neither memcached nor the store sees a single call.
func TestOversizedBatchRejectedBeforeAnyIO(t *testing.T) {
	ts := startServer(t, 100, nil)
	before := ts.app.Cache.Stats()[0] // the start-up journal replay has used memcached
	uris := make([]string, 20_000)
	for i := range uris {
		uris[i] = ts.posts[i%len(ts.posts)].URI
	}
	_, err := ts.client.GetPostRecords(ts.ctx("bulk"), &sluicev1.GetPostRecordsRequest{Uris: uris})
	st := status.Convert(err)
	t.Logf("20,000-URI batch: code=%s message=%q", st.Code(), st.Message())
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("code = %s, want InvalidArgument (%v)", st.Code(), err)
	}
	for _, want := range []string{"GetPostRecords", "20000 uris exceeds the limit of 1000 per request", "split the batch"} {
		if !strings.Contains(st.Message(), want) {
			t.Errorf("message %q lacks %q", st.Message(), want)
		}
	}
	if !hasFieldViolation(st, "uris") {
		t.Errorf("details %v lack a BadRequest violation for field uris", st.Details())
	}
	s := ts.app.Cache.Stats()[0]
	if s.Dials != before.Dials || s.Hits+s.Misses+s.Errors+s.Skipped != before.Hits+before.Misses+before.Errors+before.Skipped {
		t.Errorf("cache saw calls: %+v, before the request %+v", s, before)
	}
	fams := ts.metrics()
	if n := fams.Sum("sluice_store_reads_total", nil); n != 0 {
		t.Errorf("store reads = %v, want 0", n)
	}
	if n := fams.Sum("sluice_rejections_total", map[string]string{"reason": "shape", "method": "GetPostRecords"}); n != 1 {
		t.Errorf("shape rejections = %v, want 1", n)
	}
}

// Tests that a 50-URI batch of found, missing and duplicate URIs is
// answered position by position, first from the store, then from cache.
func TestBatchAnsweredInOrder(t *testing.T) {
	ts := startServer(t, 200, nil)
	var uris []string
	for i := range 50 {
		switch {
		case i%10 == 3:
			uris = append(uris, ts.missing[i])
		case i%10 == 7:
			uris = append(uris, uris[i-1]) // duplicate of the previous position
		default:
			uris = append(uris, ts.posts[i].URI)
		}
	}
	for round, source := range []string{"store", "cache"} {
		resp, err := ts.client.GetPostRecords(ts.ctx("feed"), &sluicev1.GetPostRecordsRequest{Uris: uris})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if len(resp.Records) != len(uris) {
			t.Fatalf("round %d: %d records for %d uris", round, len(resp.Records), len(uris))
		}
		for i, rec := range resp.Records {
			checkRecord(t, ts, uris[i], rec)
		}
		fams := ts.metrics()
		if n := fams.Sum("sluice_items_total", map[string]string{"client": "unknown", "source": source}); n != 0 {
			t.Errorf("round %d: items for client unknown = %v, want them under other", round, n)
		}
		if n := fams.Sum("sluice_items_total", map[string]string{"source": source}); n == 0 {
			t.Errorf("round %d: no items counted from %s", round, source)
		}
	}
	single, err := ts.client.GetPostRecord(ts.ctx("feed"), &sluicev1.GetPostRecordRequest{Uri: ts.posts[5].URI})
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, ts, ts.posts[5].URI, single)
}

// checkRecord compares a response record with what was seeded.
func checkRecord(t *testing.T, ts *testServer, uri string, rec *sluicev1.PostRecord) {
	t.Helper()
	if rec.GetUri() != uri {
		t.Fatalf("record for %s has uri %s", uri, rec.GetUri())
	}
	for _, p := range ts.posts {
		if p.URI != uri {
			continue
		}
		if !rec.GetFound() || !bytes.Equal(rec.GetRecord(), p.JSON) || rec.GetCid() != p.CID ||
			!rec.GetCreatedAt().AsTime().Equal(p.CreatedAt) {
			t.Errorf("record %s differs from the stored post", uri)
		}
		return
	}
	if rec.GetFound() || len(rec.GetRecord()) != 0 {
		t.Errorf("missing %s answered as found", uri)
	}
}

// Tests that reads after a write or a delete never return the old
// version, with the cache warm, and that a cached "not found" is
// replaced when the post is created.
func TestReadAfterWriteAndDelete(t *testing.T) { readAfterWriteAndDelete(t, nil) }

// readAfterWriteAndDelete is TestReadAfterWriteAndDelete's body on the
// backend mutate selects (nil: the embedded store).
func readAfterWriteAndDelete(t *testing.T, mutate func(*Config)) {
	ts := startServer(t, 20, mutate)
	target, absent := ts.posts[3], ts.missing[0]
	get := func(uri string) *sluicev1.PostRecord {
		t.Helper()
		resp, err := ts.client.GetPostRecords(ts.ctx("writer"), &sluicev1.GetPostRecordsRequest{Uris: []string{uri}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Records[0]
	}
	for range 2 { // warm: the second read is a cache hit
		get(target.URI)
		get(absent)
	}
	if s := ts.app.Cache.Stats()[0]; s.Hits < 2 {
		t.Fatalf("cache not warm: %+v", s)
	}

	updated := posts.ToProto(target, true)
	updated.Record = bytes.Replace(target.JSON, []byte(`"text":"`), []byte(`"text":"edited `), 1)
	created := &sluicev1.PostRecord{Uri: absent, Cid: "bafyreicreated", Record: []byte(`{"$type":"app.bsky.feed.post","text":"new","createdAt":"2026-01-02T03:04:05Z"}`)}
	if _, err := ts.client.PutPostRecords(ts.ctx("writer"), &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{updated, created}}); err != nil {
		t.Fatalf("put: %v", err)
	}
	if got := get(target.URI); !bytes.Equal(got.GetRecord(), updated.Record) {
		t.Errorf("read after write returned the old version: %s", got.GetRecord())
	}
	if got := get(absent); !got.GetFound() || got.GetCid() != "bafyreicreated" {
		t.Errorf("read after create = %v, want the new post", got)
	}

	resp, err := ts.client.DeletePostRecords(ts.ctx("writer"), &sluicev1.DeletePostRecordsRequest{Uris: []string{target.URI, ts.missing[1]}})
	if err != nil || resp.GetDeleted() != 1 {
		t.Fatalf("delete = %v, %v; want 1 deleted", resp, err)
	}
	for range 2 {
		if got := get(target.URI); got.GetFound() {
			t.Errorf("read after delete still found %s", target.URI)
		}
	}
}

// Tests hostile and malformed input: each gets a clear InvalidArgument
// naming the bad position, or a correct answer; memcached keeps working
// and never sees a malformed request.
func TestHostileInput(t *testing.T) {
	ts := startServer(t, 20, nil)
	good := ts.posts[0].URI
	cases := []struct {
		name      string
		uris      []string
		wantField string
		wantMsg   string
	}{
		{name: "empty batch", uris: nil, wantField: "uris", wantMsg: "the request has no uris; send between 1 and 1000"},
		{name: "not an at-uri", uris: []string{good, "https://bsky.app/profile/x/post/y"}, wantField: "uris[1]", wantMsg: "uris[1]"},
		{name: "space", uris: []string{good + " x"}, wantField: "uris[0]", wantMsg: "not a valid AT-URI"},
		{name: "crlf and command", uris: []string{good, good, good + "\r\nflush_all\r\n"}, wantField: "uris[2]", wantMsg: `\r\nflush_all`},
		{name: "memcached get", uris: []string{"get " + good}, wantField: "uris[0]", wantMsg: "at://"},
		{name: "wrong collection", uris: []string{strings.Replace(good, "app.bsky.feed.post", "app.bsky.feed.like", 1)}, wantField: "uris[0]", wantMsg: "want \"app.bsky.feed.post\""},
		{name: "too long", uris: []string{good + strings.Repeat("a", 600)}, wantField: "uris[0]", wantMsg: "over the limit of 512 bytes"},
		{name: "empty uri", uris: []string{good, ""}, wantField: "uris[1]", wantMsg: "uris[1] is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ts.client.GetPostRecords(ts.ctx("fuzzer"), &sluicev1.GetPostRecordsRequest{Uris: tc.uris})
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("got %s %q, want InvalidArgument containing %q", st.Code(), st.Message(), tc.wantMsg)
			}
			if !hasFieldViolation(st, tc.wantField) {
				t.Errorf("no BadRequest violation for %s in %v", tc.wantField, st.Details())
			}
		})
	}
	t.Run("duplicates answered at each position", func(t *testing.T) {
		uris := []string{good, ts.missing[0], good, good, ts.missing[0]}
		resp, err := ts.client.GetPostRecords(ts.ctx("fuzzer"), &sluicev1.GetPostRecordsRequest{Uris: uris})
		if err != nil {
			t.Fatal(err)
		}
		for i, rec := range resp.Records {
			checkRecord(t, ts, uris[i], rec)
		}
	})
	t.Run("bad write changes nothing", func(t *testing.T) {
		bad := []*sluicev1.PostRecord{
			{Uri: ts.posts[1].URI, Record: []byte(`{"$type":"app.bsky.feed.post","text":"overwrite"}`)},
			{Uri: ts.posts[2].URI, Record: []byte(`not json`)},
		}
		_, err := ts.client.PutPostRecords(ts.ctx("fuzzer"), &sluicev1.PutPostRecordsRequest{Records: bad})
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "records[1]") || !strings.Contains(st.Message(), "nothing in this batch was written") {
			t.Fatalf("got %s %q", st.Code(), st.Message())
		}
		resp, err := ts.client.GetPostRecords(ts.ctx("fuzzer"), &sluicev1.GetPostRecordsRequest{Uris: []string{ts.posts[1].URI}})
		if err != nil {
			t.Fatal(err)
		}
		checkRecord(t, ts, ts.posts[1].URI, resp.Records[0])
	})
	s := ts.app.Cache.Stats()[0]
	if s.Errors != 0 || s.BreakerState != "closed" {
		t.Errorf("memcached saw errors after hostile input: %+v", s)
	}
	resp, err := ts.client.GetPostRecords(ts.ctx("fuzzer"), &sluicev1.GetPostRecordsRequest{Uris: []string{good}})
	if err != nil || !resp.Records[0].GetFound() {
		t.Fatalf("good read after hostile input: %v %v", resp, err)
	}
}

func hasFieldViolation(st *status.Status, field string) bool {
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if v.GetField() == field {
					return true
				}
			}
		}
	}
	return false
}

// Tests oversize: split end to end: the trusted indexer's 20,000-URI
// batch (100 posts, each asked for 200 times) is answered whole and in
// request order from the store and cache, while the same batch from a
// caller without a name is refused as before, with zero cache and store
// calls.
func TestTrustedBatchSplit(t *testing.T) {
	ts := startServer(t, 100, func(c *Config) {
		c.Guard.Admission.Clients["indexer"] = budget.Budget{ItemsPerSecond: 1e6, Burst: 10_000, MaxInflightItems: 10_000}
		p := c.Guard.Methods[getManyMethod]
		// A patient timeout: the test asserts the answer, not its speed.
		p.Oversize = map[string]guard.Oversize{"indexer": {Mode: guard.OversizeSplit, MaxSplitItems: 25_000, Timeout: time.Minute}}
		c.Guard.Methods[getManyMethod] = p
		c.Cache.TombstoneTTL = 2 * time.Minute // outlives the split batch and its refills
		// The flood test's budget: a split batch fits the memory caps
		// (its stream reserves for max_split_items, within the share).
		c.Guard.MemoryLimit = 512 * membudget.MiB
	})
	uris := make([]string, 20_000)
	for i := range uris {
		uris[i] = ts.posts[(i*7)%len(ts.posts)].URI
	}
	big := grpc.MaxCallRecvMsgSize(64 << 20)
	began := time.Now()
	resp, err := ts.client.GetPostRecords(ts.ctx("indexer"), &sluicev1.GetPostRecordsRequest{Uris: uris}, big)
	t.Logf("20,000 URIs in pieces of 1,000: %v", time.Since(began))
	if err != nil {
		t.Fatalf("indexer's 20,000 URIs: %v", err)
	}
	if len(resp.Records) != len(uris) {
		t.Fatalf("%d records for %d uris", len(resp.Records), len(uris))
	}
	for i, rec := range resp.Records {
		if rec.GetUri() != uris[i] {
			t.Fatalf("record %d is %s, want %s: not in request order", i, rec.GetUri(), uris[i])
		}
		checkRecord(t, ts, uris[i], rec)
	}

	before := ts.app.Cache.Stats()[0]
	reads := ts.metrics().Sum("sluice_store_reads_total", nil)
	_, err = ts.client.GetPostRecords(ts.ctx(""), &sluicev1.GetPostRecordsRequest{Uris: uris}, big)
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "limit of 1000") {
		t.Fatalf("unnamed caller's 20,000 URIs: %v, want InvalidArgument naming the limit of 1000", err)
	}
	s := ts.app.Cache.Stats()[0]
	if s.Dials != before.Dials || s.Hits+s.Misses+s.Errors+s.Skipped != before.Hits+before.Misses+before.Errors+before.Skipped {
		t.Errorf("cache saw calls for the refused batch: %+v, before it %+v", s, before)
	}
	if n := ts.metrics().Sum("sluice_store_reads_total", nil); n != reads {
		t.Errorf("store reads = %v after the refused batch, %v before", n, reads)
	}
}

const getManyMethod = "sluice.v1.PostRecords/GetPostRecords"
