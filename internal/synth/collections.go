package synth

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// Collections other than posts that NextIn shapes like the real records;
// any other collection gets a minimal record of its $type and createdAt.
const (
	LikeCollection    = "app.bsky.feed.like"
	RepostCollection  = "app.bsky.feed.repost"
	FollowCollection  = "app.bsky.graph.follow"
	BlockCollection   = "app.bsky.graph.block"
	ProfileCollection = "app.bsky.actor.profile"
)

// NextIn returns the next record of collection: for app.bsky.feed.post the
// same as Next; likes and reposts point at a post URI, follows and blocks
// at an author DID; a profile's record key is "self", so an author has at
// most one and NextIn may return the same URI again.
func (g *Generator) NextIn(collection string) store.Record {
	if collection == "app.bsky.feed.post" {
		return g.Next()
	}
	g.seq++
	g.clock = g.clock.Add(time.Duration(1+g.rng.IntN(5000)) * time.Millisecond)
	author := g.authors[g.rng.IntN(len(g.authors))]
	rkey := tid(g.clock, g.seq)
	if collection == ProfileCollection {
		rkey = "self"
	}
	body := g.body(collection)
	return store.Record{
		URI:       fmt.Sprintf("at://%s/%s/%s", author, collection, rkey),
		CID:       cidFor(body),
		JSON:      body,
		CreatedAt: g.clock,
		IndexedAt: g.clock.Add(time.Duration(g.rng.IntN(2000)) * time.Millisecond),
	}
}

// body returns the JSON of one record of collection.
func (g *Generator) body(collection string) []byte {
	rec := map[string]any{"$type": collection, "createdAt": g.clock.Format(time.RFC3339Nano)}
	switch collection {
	case LikeCollection, RepostCollection:
		target := fmt.Sprintf("at://%s/app.bsky.feed.post/%s", g.authors[g.rng.IntN(len(g.authors))], tid(g.clock.Add(-time.Hour), 1))
		rec["subject"] = strongRef{URI: target, CID: "bafyreisubject"}
	case FollowCollection, BlockCollection:
		rec["subject"] = g.authors[g.rng.IntN(len(g.authors))]
	case ProfileCollection:
		delete(rec, "createdAt")
		rec["displayName"] = g.text(5 + g.rng.IntN(20))
		rec["description"] = g.text(20 + g.rng.IntN(200))
	}
	out, _ := json.Marshal(rec)
	return out
}
