package guard

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// FuzzCheckShape feeds request shapes — a batch of URIs (split from one
// string on '|'), a max-items and a max-URI-length limit — to checkShape
// and checks its contract: it refuses exactly the batches that break a
// rule (no items, more than MaxItems, an empty URI, a URI over
// MaxURILength), and every refusal is InvalidArgument with a BadRequest
// field violation on "uris" or "uris[i]" whose message states the limit.
func FuzzCheckShape(f *testing.F) {
	f.Add("at://did:plc:abc/app.bsky.feed.post/3k", uint16(10), uint16(512))
	f.Add("", uint16(10), uint16(512))
	f.Add("a|b|c|d", uint16(3), uint16(512))
	f.Add("a||c", uint16(10), uint16(512))
	f.Add("short|"+strings.Repeat("x", 600), uint16(10), uint16(512))
	f.Add("\r\nflush_all\r\n|get k", uint16(2), uint16(8))
	field := findItemField((&sluicev1.GetPostRecordsRequest{}).ProtoReflect().Descriptor())
	f.Fuzz(func(t *testing.T, joined string, maxItems, maxLen uint16) {
		p := Policy{MaxItems: int(maxItems) + 1, MaxURILength: int(maxLen) + 1, Concurrency: 1, Timeout: 1}
		var uris []string
		if joined != "" {
			uris = strings.Split(joined, "|")
		}
		err := checkShape("GetPostRecords", field, uris, p)
		wantLimit, broken := brokenRule(uris, p)
		if !broken {
			if err != nil {
				t.Fatalf("refused a legal batch %q under %+v: %v", uris, p, err)
			}
			return
		}
		st := status.Convert(err)
		if err == nil || st.Code() != codes.InvalidArgument {
			t.Fatalf("batch %q under %+v: got %v, want InvalidArgument", uris, p, err)
		}
		if !strings.Contains(st.Message(), wantLimit) {
			t.Errorf("message %q does not state the limit %s", st.Message(), wantLimit)
		}
		if !hasViolationOn(st, "uris") {
			t.Errorf("no BadRequest violation on uris in %v", st.Details())
		}
	})
}

// brokenRule says whether uris break p, and the limit the refusal must
// state.
func brokenRule(uris []string, p Policy) (string, bool) {
	if len(uris) == 0 || len(uris) > p.MaxItems {
		return strconv.Itoa(p.MaxItems), true
	}
	for _, u := range uris {
		if u == "" {
			return "every item needs an AT-URI", true
		}
		if len(u) > p.MaxURILength {
			return strconv.Itoa(p.MaxURILength) + " bytes", true
		}
	}
	return "", false
}

func hasViolationOn(st *status.Status, prefix string) bool {
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if strings.HasPrefix(v.GetField(), prefix) {
					return true
				}
			}
		}
	}
	return false
}

// Tests that a request's items are the same read through its generated
// getter as through reflection, for every shape of item field, and that
// a "uris" field is answered with the request's own slice (no copy).
func TestItemsOfEveryShape(t *testing.T) {
	uris := []string{"at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/1", "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/2"}
	for _, req := range []proto.Message{
		&sluicev1.GetPostRecordsRequest{Uris: uris},
		&sluicev1.GetPostRecordRequest{Uri: uris[0]},
		&sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{{Uri: uris[0]}, {Uri: uris[1]}}},
	} {
		field := findItemField(req.ProtoReflect().Descriptor())
		got, want := field.items(req), field.reflected(req)
		if !slices.Equal(got, want) || len(got) == 0 {
			t.Errorf("%T: items %q, by reflection %q", req, got, want)
		}
	}
	req := &sluicev1.GetPostRecordsRequest{Uris: uris}
	if got := findItemField(req.ProtoReflect().Descriptor()).items(req); &got[0] != &req.Uris[0] {
		t.Error("GetPostRecords' uris were copied, not read through GetUris")
	}
}
