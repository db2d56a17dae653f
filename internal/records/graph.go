package records

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/socialgraph"
	"github.com/sluice-dev/sluice/internal/store"
)

// MaxEdgeBytes bounds one edge's stored form (the store's record limit,
// several hundred record URIs). A record past it is not listed: the edge
// exists already, through the records it does list.
const MaxEdgeBytes = 64 << 10

// indexEdges adds the follow and list-item records among recs to the
// social graph's edges, one read-modify-write per edge.
func (w *Writer) indexEdges(ctx context.Context, parsed []aturi.URI, recs []store.Record) error {
	for i, u := range parsed {
		edge, ok := socialgraph.EdgeOf(u, recs[i].JSON)
		if !ok {
			continue
		}
		if err := w.changeEdge(ctx, edge, func(e *socialgraph.Edge) bool { return e.Add(recs[i].URI) }); err != nil {
			return err
		}
	}
	return nil
}

// storedEdges reads the stored follow and list-item records among uris,
// before they are deleted: record URI → the edge it makes.
func (w *Writer) storedEdges(ctx context.Context, parsed []aturi.URI) (map[string]string, error) {
	out := map[string]string{}
	for _, c := range []string{socialgraph.FollowCollection, socialgraph.ListItemCollection} {
		stored, err := w.storedOf(ctx, parsed, c)
		if err != nil {
			return nil, err
		}
		for uri, rec := range stored {
			u, _ := aturi.Parse(uri)
			if edge, ok := socialgraph.EdgeOf(u, rec.JSON); ok {
				out[uri] = edge
			}
		}
	}
	return out, nil
}

// unindexEdges removes deleted records from the edges they made.
func (w *Writer) unindexEdges(ctx context.Context, edges map[string]string) error {
	for rec, edge := range edges {
		if err := w.changeEdge(ctx, edge, func(e *socialgraph.Edge) bool { return e.Remove(rec) }); err != nil {
			return err
		}
	}
	return nil
}

func (w *Writer) changeEdge(ctx context.Context, edge string, change func(*socialgraph.Edge) bool) error {
	err := w.graph.Upsert(ctx, edge, func(r *store.Record, _ bool) bool {
		e := socialgraph.Decode(r.JSON)
		if !change(&e) {
			return false
		}
		body := e.Encode()
		if len(body) > MaxEdgeBytes {
			return false
		}
		r.JSON = body
		return true
	})
	if err != nil {
		return fmt.Errorf("update the social graph edge %s: %w", edge, err)
	}
	return nil
}
