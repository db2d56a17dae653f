package records

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/socialgraph"
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

// parsedPost is a post's body as the gate computation reads it, decoded
// once per write: by prefetchGates, to read ahead what the gates depend
// on, and by gatesOf, to compute them.
type parsedPost struct {
	body   postBody
	quoted string // the URI of the post it quotes (quotedURI), or ""
}

// parsePost decodes a post's body; a body that does not decode reads as
// a post with no reply, embed or facets.
func parsePost(body []byte) parsedPost {
	var p postBody
	_ = json.Unmarshal(body, &p)
	return parsedPost{body: p, quoted: quotedURI(p)}
}

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

// allowRule is one rule of a thread-gate's allow list; List is set for a
// list rule.
type allowRule struct {
	Type string `json:"$type"`
	List string `json:"list"`
}

// threadgateBody: a nil Allow (absent or null) allows every reply, an
// empty one none.
type threadgateBody struct {
	Allow *[]allowRule `json:"allow"`
}

type postgateBody struct {
	EmbeddingRules []typed `json:"embeddingRules"`
}

// gatesOf computes the gate state of post u, whose body is p, reading gates and
// root posts from those known first (prefetchGates), then through the
// read path.
func (w *Writer) gatesOf(ctx context.Context, u aturi.URI, p parsedPost, batch known) (store.Gates, error) {
	var g store.Gates
	var err error
	if _, g.HasThreadGate, err = w.lookup(ctx, gateOf(u, ThreadgateCollection), batch); err != nil {
		return g, err
	}
	if _, g.HasPostGate, err = w.lookup(ctx, gateOf(u, PostgateCollection), batch); err != nil {
		return g, err
	}
	if p.body.Reply != nil {
		if g.ViolatesThreadGate, err = w.violatesThreadGate(ctx, u.DID, p.body.Reply.Root.URI, batch); err != nil {
			return g, err
		}
	}
	if p.quoted != "" {
		if g.ViolatesEmbeddingRules, err = w.violatesEmbedding(ctx, u.DID, p.quoted, batch); err != nil {
			return g, err
		}
	}
	return g, nil
}

func (w *Writer) violatesThreadGate(ctx context.Context, replier, rootURI string, batch known) (bool, error) {
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
	allowed, ask := ParseThreadGate(replier, root.DID, rootPost.JSON, gate.JSON)
	if allowed {
		return false, nil
	}
	allowed, err = w.graphAllows(ctx, replier, root.DID, ask)
	return !allowed, err
}

// graphAllows asks the social graph the rules ParseThreadGate left open,
// as the reference's violatesThreadGate queries its follow and list-item
// tables: the owner follows the replier (following), the replier follows
// the owner (followers), or the replier is on one of the lists.
func (w *Writer) graphAllows(ctx context.Context, replier, owner string, ask GraphRules) (bool, error) {
	var edges []string
	if ask.Following {
		if e, ok := socialgraph.Follows(owner, replier); ok {
			edges = append(edges, e)
		}
	}
	if ask.Followers {
		if e, ok := socialgraph.Follows(replier, owner); ok {
			edges = append(edges, e)
		}
	}
	for _, list := range ask.Lists {
		if e, ok := socialgraph.OnList(list, replier); ok {
			edges = append(edges, e)
		}
	}
	if len(edges) == 0 {
		return false, nil
	}
	res, err := w.graph.StoredMany(ctx, edges)
	if err != nil {
		return false, fmt.Errorf("read the social graph: %w", err)
	}
	for _, r := range res {
		if r.Found && socialgraph.Decode(r.Record.JSON).Exists() {
			return true, nil
		}
	}
	return false, nil
}

func (w *Writer) violatesEmbedding(ctx context.Context, quoter, quotedURI string, batch known) (bool, error) {
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

// GraphRules are the rules of a thread-gate that the social graph
// decides.
type GraphRules struct {
	Followers bool     // the replier follows the root's author
	Following bool     // the root's author follows the replier
	Lists     []string // the replier is on one of these lists
}

// ParseThreadGate decides what it can of whether replier may reply in a
// thread whose root post (rootJSON, by owner) has the thread-gate
// gateJSON, as the reference's parseThreadGate does: the owner always
// may; a gate without allow lets anyone, allow: [] nobody; a mention rule
// lets the users the root post mentions. When none of those lets the
// reply through, ask holds the follower, following and list rules left
// to ask the social graph; with none the reply is refused.
func ParseThreadGate(replier, owner string, rootJSON, gateJSON []byte) (allowed bool, ask GraphRules) {
	if replier == owner {
		return true, ask
	}
	var gate threadgateBody
	if json.Unmarshal(gateJSON, &gate) != nil || gate.Allow == nil {
		return true, ask
	}
	var root postBody
	_ = json.Unmarshal(rootJSON, &root)
	for _, rule := range *gate.Allow {
		switch rule.Type {
		case mentionRule:
			if mentions(root, replier) {
				return true, GraphRules{}
			}
		case followerRule:
			ask.Followers = true
		case followingRule:
			ask.Following = true
		case listRule:
			if rule.List != "" {
				ask.Lists = append(ask.Lists, rule.List)
			}
		}
	}
	return false, ask
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

// lookup finds a record among those known, or through its collection's
// read path.
func (w *Writer) lookup(ctx context.Context, uri string, batch known) (store.Record, bool, error) {
	if r, ok := batch[uri]; ok {
		if r == nil {
			return store.Record{}, false, nil
		}
		return *r, true, nil
	}
	u, err := aturi.Parse(uri)
	if err != nil || w.services[u.Collection] == nil {
		return store.Record{}, false, nil
	}
	res, err := w.services[u.Collection].StoredMany(ctx, []string{uri})
	if err != nil {
		return store.Record{}, false, err
	}
	return res[0].Record, res[0].Found, nil
}
