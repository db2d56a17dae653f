package records

import (
	"context"
	"encoding/json"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/store"
)

// Lexicon types the gate rules name.
const (
	mentionRule   = "app.bsky.feed.threadgate#mentionRule"
	followerRule  = "app.bsky.feed.threadgate#followerRule"
	followingRule = "app.bsky.feed.threadgate#followingRule"
	listRule      = "app.bsky.feed.threadgate#listRule"
	disableRule   = "app.bsky.feed.postgate#disableRule"
	mentionFacet  = "app.bsky.richtext.facet#mention"
	embedRecord   = "app.bsky.embed.record"
	embedWithMed  = "app.bsky.embed.recordWithMedia"
)

// postBody is the part of a post its gate state depends on.
type postBody struct {
	Reply *struct {
		Root struct {
			URI string `json:"uri"`
		} `json:"root"`
	} `json:"reply"`
	Embed *struct {
		Type   string          `json:"$type"`
		Record json.RawMessage `json:"record"`
	} `json:"embed"`
	Facets []struct {
		Features []struct {
			Type string `json:"$type"`
			DID  string `json:"did"`
		} `json:"features"`
	} `json:"facets"`
}

type typed struct {
	Type string `json:"$type"`
}

// threadgateBody: a nil Allow (absent or null) allows every reply, an
// empty one none.
type threadgateBody struct {
	Allow *[]typed `json:"allow"`
}

type postgateBody struct {
	EmbeddingRules []typed `json:"embeddingRules"`
}

// gatesOf computes the gate state of post u with body, reading gates and
// root posts from batch first, then through the read path.
func (w *Writer) gatesOf(ctx context.Context, u aturi.URI, body []byte, batch map[string]*store.Record) (store.Gates, error) {
	var g store.Gates
	var err error
	if _, g.HasThreadGate, err = w.lookup(ctx, gateOf(u, ThreadgateCollection), batch); err != nil {
		return g, err
	}
	if _, g.HasPostGate, err = w.lookup(ctx, gateOf(u, PostgateCollection), batch); err != nil {
		return g, err
	}
	var p postBody
	_ = json.Unmarshal(body, &p)
	if p.Reply != nil {
		if g.ViolatesThreadGate, err = w.violatesThreadGate(ctx, u.DID, p.Reply.Root.URI, batch); err != nil {
			return g, err
		}
	}
	if quoted := quotedURI(p); quoted != "" {
		if g.ViolatesEmbeddingRules, err = w.violatesEmbedding(ctx, u.DID, quoted, batch); err != nil {
			return g, err
		}
	}
	return g, nil
}

func (w *Writer) violatesThreadGate(ctx context.Context, replier, rootURI string, batch map[string]*store.Record) (bool, error) {
	root, err := aturi.ParseIn(rootURI, PostCollection)
	if err != nil {
		return false, nil // the reference indexer finds no gate for it either
	}
	gate, ok, err := w.lookup(ctx, gateOf(root, ThreadgateCollection), batch)
	if err != nil || !ok {
		return false, err
	}
	rootPost, _, err := w.lookup(ctx, rootURI, batch)
	if err != nil {
		return false, err
	}
	return !CanReply(replier, root.DID, rootPost.JSON, gate.JSON), nil
}

func (w *Writer) violatesEmbedding(ctx context.Context, quoter, quotedURI string, batch map[string]*store.Record) (bool, error) {
	quoted, err := aturi.ParseIn(quotedURI, PostCollection)
	if err != nil || quoted.DID == quoter {
		return false, nil
	}
	gate, ok, err := w.lookup(ctx, gateOf(quoted, PostgateCollection), batch)
	if err != nil || !ok {
		return false, err
	}
	return EmbeddingDisabled(gate.JSON), nil
}

// CanReply decides whether replier may reply in a thread whose root post
// (rootJSON, by owner) has the thread-gate gateJSON, as the reference's
// parseThreadGate and violatesThreadGate do: the owner always may; a gate
// without allow lets anyone, allow: [] nobody; a mention rule lets the
// users the root post mentions. The follower, following and list rules
// need the follow graph and list members, which a store keyed by record
// URI cannot query: a gate with any of them lets the reply through (it is
// not marked as violating), so sluice never hides a reply the reference
// would show.
func CanReply(replier, owner string, rootJSON, gateJSON []byte) bool {
	if replier == owner {
		return true
	}
	var gate threadgateBody
	if json.Unmarshal(gateJSON, &gate) != nil || gate.Allow == nil {
		return true
	}
	var root postBody
	_ = json.Unmarshal(rootJSON, &root)
	for _, rule := range *gate.Allow {
		switch rule.Type {
		case mentionRule:
			if mentions(root, replier) {
				return true
			}
		case followerRule, followingRule, listRule:
			return true
		}
	}
	return false
}

// EmbeddingDisabled reports whether a post-gate disables embedding (a
// disableRule among its embeddingRules), as the reference's parsePostgate
// does. Detached quotes (detachedEmbeddingUris) are not a violation; the
// AppView applies them itself from the post-gate record.
func EmbeddingDisabled(gateJSON []byte) bool {
	var gate postgateBody
	if json.Unmarshal(gateJSON, &gate) != nil {
		return false
	}
	for _, rule := range gate.EmbeddingRules {
		if rule.Type == disableRule {
			return true
		}
	}
	return false
}

func mentions(p postBody, did string) bool {
	for _, f := range p.Facets {
		for _, feat := range f.Features {
			if feat.Type == mentionFacet && feat.DID == did {
				return true
			}
		}
	}
	return false
}

// quotedURI is the URI a post quotes: its record embed's, or the record
// of its recordWithMedia embed.
func quotedURI(p postBody) string {
	if p.Embed == nil || len(p.Embed.Record) == 0 {
		return ""
	}
	var ref struct {
		URI    string `json:"uri"`
		Record *struct {
			URI string `json:"uri"`
		} `json:"record"`
	}
	if json.Unmarshal(p.Embed.Record, &ref) != nil {
		return ""
	}
	switch p.Embed.Type {
	case embedRecord:
		return ref.URI
	case embedWithMed:
		if ref.Record != nil {
			return ref.Record.URI
		}
	}
	return ""
}

// lookup finds a record in batch or through its collection's read path.
func (w *Writer) lookup(ctx context.Context, uri string, batch map[string]*store.Record) (store.Record, bool, error) {
	if r, ok := batch[uri]; ok {
		return *r, true, nil
	}
	u, err := aturi.Parse(uri)
	if err != nil || w.services[u.Collection] == nil {
		return store.Record{}, false, nil
	}
	res, _, err := w.services[u.Collection].Get(ctx, []string{uri})
	if err != nil {
		return store.Record{}, false, err
	}
	return res[0].Record, res[0].Found, nil
}
