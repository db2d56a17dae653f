package records

import (
	"context"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/store"
)

// known holds records the gate computation may look up: the batch's own
// and those read ahead of it. A URI mapped to nil is known to have no
// record.
type known map[string]*store.Record

// prefetchGates reads ahead, in one read per collection and round, the
// records the gate state of the batch's posts depends on and the batch
// does not hold: first each post's thread-gate and post-gate, its root's
// thread-gate and the post-gate of the post it quotes (posts holds the
// batch's posts' bodies, by position); then the roots
// of the replies whose root has a thread-gate. Without it a batch of
// 1,000 posts made a few thousand reads one after another, which a
// remote store's round trips could stretch past the method's timeout.
func (w *Writer) prefetchGates(ctx context.Context, parsed []aturi.URI, posts []parsedPost, batch map[string]*store.Record) (known, error) {
	k := make(known, len(batch))
	for uri, r := range batch {
		k[uri] = r
	}
	var first, roots []string
	for i, u := range parsed {
		if u.Collection != PostCollection {
			continue
		}
		first = append(first, gateOf(u, ThreadgateCollection), gateOf(u, PostgateCollection))
		p := posts[i].body
		if p.Reply != nil {
			if root, err := aturi.ParseIn(p.Reply.Root.URI, PostCollection); err == nil {
				first = append(first, gateOf(root, ThreadgateCollection))
				roots = append(roots, p.Reply.Root.URI)
			}
		}
		if quoted, err := aturi.ParseIn(posts[i].quoted, PostCollection); err == nil && quoted.DID != u.DID {
			first = append(first, gateOf(quoted, PostgateCollection))
		}
	}
	if err := w.readAhead(ctx, k, first); err != nil {
		return nil, err
	}
	var gatedRoots []string
	for _, root := range roots {
		r, _ := aturi.Parse(root)
		if k[gateOf(r, ThreadgateCollection)] != nil {
			gatedRoots = append(gatedRoots, root)
		}
	}
	return k, w.readAhead(ctx, k, gatedRoots)
}

// readAhead reads the URIs k does not know yet, one read per collection,
// and records what it found, or that nothing is stored.
func (w *Writer) readAhead(ctx context.Context, k known, uris []string) error {
	byCollection := map[string][]string{}
	for _, uri := range uris {
		if _, ok := k[uri]; ok {
			continue
		}
		u, err := aturi.Parse(uri)
		if err != nil || w.services[u.Collection] == nil {
			continue
		}
		k[uri] = nil // asked once, whatever the answer
		byCollection[u.Collection] = append(byCollection[u.Collection], uri)
	}
	for c, uris := range byCollection {
		res, err := w.services[c].StoredMany(ctx, uris)
		if err != nil {
			return err
		}
		for i, r := range res {
			if r.Found {
				k[uris[i]] = &r.Record
			}
		}
	}
	return nil
}
