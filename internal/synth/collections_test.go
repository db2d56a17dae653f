package synth

import (
	"encoding/json"
	"testing"

	"github.com/sluice-dev/sluice/internal/aturi"
)

// Tests that NextIn makes valid URIs of the asked collection whose JSON
// names that collection and carries the fields the record type needs.
func TestNextInCollections(t *testing.T) {
	g := New(7, 20)
	for _, tc := range []struct {
		collection string
		field      string // a field the record must carry
	}{
		{collection: LikeCollection, field: "subject"},
		{collection: RepostCollection, field: "subject"},
		{collection: FollowCollection, field: "subject"},
		{collection: BlockCollection, field: "subject"},
		{collection: ProfileCollection, field: "displayName"},
		{collection: "app.bsky.graph.list", field: "createdAt"},
		{collection: aturi.PostCollection, field: "text"},
	} {
		t.Run(tc.collection, func(t *testing.T) {
			r := g.NextIn(tc.collection)
			u, err := aturi.ParseIn(r.URI, tc.collection)
			if err != nil {
				t.Fatalf("uri %q: %v", r.URI, err)
			}
			if tc.collection == ProfileCollection && u.RKey != "self" {
				t.Errorf("profile rkey = %q, want self", u.RKey)
			}
			var rec map[string]any
			if err := json.Unmarshal(r.JSON, &rec); err != nil {
				t.Fatalf("json: %v", err)
			}
			if rec["$type"] != tc.collection || rec[tc.field] == nil {
				t.Errorf("record %s lacks $type %s or %s", r.JSON, tc.collection, tc.field)
			}
			if r.CID == "" || r.CreatedAt.IsZero() || r.IndexedAt.Before(r.CreatedAt) {
				t.Errorf("record metadata = %q %v %v", r.CID, r.CreatedAt, r.IndexedAt)
			}
		})
	}
}
