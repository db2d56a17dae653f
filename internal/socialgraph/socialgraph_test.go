package socialgraph

import (
	"testing"

	"github.com/sluice-dev/sluice/internal/aturi"
)

const (
	bob   = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"
	carol = "did:plc:cccccccccccccccccccccccc"
)

// Tests that follow and list-item records name their edges, that a list
// item on someone else's list or without a subject names none, and that
// an edge exists while any record makes it.
func TestEdges(t *testing.T) {
	follow := aturi.URI{DID: carol, Collection: FollowCollection, RKey: "3kf"}
	got, ok := EdgeOf(follow, []byte(`{"subject":"`+bob+`"}`))
	if want, _ := Follows(carol, bob); !ok || got != want || got != "at://"+carol+"/"+Collection+"/f:"+bob {
		t.Fatalf("EdgeOf(follow) = %q, %v; want %q", got, ok, want)
	}
	list := "at://" + bob + "/app.bsky.graph.list/3kl"
	item := aturi.URI{DID: bob, Collection: ListItemCollection, RKey: "3ki"}
	got, ok = EdgeOf(item, []byte(`{"subject":"`+carol+`","list":"`+list+`"}`))
	if want, _ := OnList(list, carol); !ok || got != want {
		t.Fatalf("EdgeOf(listitem) = %q, %v; want %q", got, ok, want)
	}
	for name, tc := range map[string]struct {
		u    aturi.URI
		body string
	}{
		"another's list": {aturi.URI{DID: carol, Collection: ListItemCollection, RKey: "3ki"}, `{"subject":"` + carol + `","list":"` + list + `"}`},
		"no subject":     {follow, `{}`},
		"a like":         {aturi.URI{DID: carol, Collection: "app.bsky.feed.like", RKey: "3k"}, `{"subject":"` + bob + `"}`},
		"bad subject":    {follow, `{"subject":"did:web:host%3A8080"}`},
	} {
		if got, ok := EdgeOf(tc.u, []byte(tc.body)); ok {
			t.Errorf("%s: EdgeOf = %q, want no edge", name, got)
		}
	}

	e := Decode(nil)
	if e.Exists() || !e.Add("a") || e.Add("a") || !e.Add("b") || !e.Remove("a") || e.Remove("a") || !e.Exists() {
		t.Fatalf("Add/Remove misbehaved: %+v", e)
	}
	if back := Decode(e.Encode()); len(back.Records) != 1 || back.Records[0] != "b" || back.Type != Collection {
		t.Fatalf("round trip = %+v", back)
	}
	e.Remove("b")
	if e.Exists() {
		t.Fatal("an edge with no records left exists")
	}
}
