package bskyrpc

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/api/bsky"
	"github.com/sluice-dev/sluice/internal/aturi"
)

// Tests that every method of the declared service has a policy (or the
// guard would refuse to register it) and that every served method is
// declared and reads a valid collection.
func TestPoliciesCoverEveryMethod(t *testing.T) {
	policies := DefaultPolicies()
	declared := map[string]bool{}
	for _, m := range bsky.Service_ServiceDesc.Methods {
		declared[m.MethodName] = true
		p, ok := policies["bsky.Service/"+m.MethodName]
		if !ok {
			t.Errorf("no policy for %s", m.MethodName)
			continue
		}
		if err := p.Validate(); err != nil {
			t.Errorf("%s: %v", m.MethodName, err)
		}
	}
	if len(policies) != len(declared) {
		t.Errorf("%d policies for %d methods", len(policies), len(declared))
	}
	for method, collection := range Served() {
		if !declared[method] {
			t.Errorf("served method %s is not declared in proto/bsky", method)
		}
		if _, err := aturi.Parse("at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/" + collection + "/self"); err != nil {
			t.Errorf("%s reads %q: %v", method, collection, err)
		}
	}
	if Served()["GetPostRecords"] != aturi.PostCollection {
		t.Errorf("GetPostRecords reads %q", Served()["GetPostRecords"])
	}
}

// Tests which URIs can name a stored record: the rest are answered as
// missing without a read.
func TestReadable(t *testing.T) {
	const post = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3kabc"
	long := "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/" + strings.Repeat("a", MaxStoredURILength)
	for _, tc := range []struct {
		uri  string
		want bool
	}{
		{post, true},
		{"at://did:web:example.com/app.bsky.feed.post/3kabc", true},
		{"at://alice.example.com/app.bsky.feed.post/3kabc", false},
		{"at://did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK/app.bsky.feed.post/3kabc", false},
		{post + "?x=1", false},
		{post + "#frag", false},
		{"at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.like/3kabc", false},
		{"not a uri", false},
		{"", false},
		{long, false},
	} {
		if got := Readable(tc.uri, aturi.PostCollection); got != tc.want {
			t.Errorf("Readable(%.80q) = %v, want %v", tc.uri, got, tc.want)
		}
	}
}
