package records

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/socialgraph"
	"github.com/sluice-dev/sluice/internal/store"
)

// MaxEdgeBytes bounds one edge's stored form (the store's record limit,
// several hundred record URIs). A record past it is not listed: the edge
// exists already, through the records it does list.
const MaxEdgeBytes = 64 << 10

// indexEdges lists the follow and list-item records among recs in the
// social graph's edges they make, and takes those rewritten with a new
// subject out of the edge their stored version made (stored, read before
// the write: record URI → edge), as the reference indexer deletes and
// re-inserts an updated record. A URI given twice counts as its last
// version, the one stored.
func (w *Writer) indexEdges(ctx context.Context, parsed []aturi.URI, recs []store.Record, stored map[string]string) error {
	last := make(map[string]int, len(recs))
	for i := range recs {
		last[recs[i].URI] = i
	}
	adds := map[string][]string{}  // edge → records to add
	moved := map[string][]string{} // edge → records that no longer make it
	for i, u := range parsed {
		uri := recs[i].URI
		if last[uri] != i {
			continue
		}
		edge, ok := socialgraph.EdgeOf(u, recs[i].JSON)
		if ok {
			adds[edge] = append(adds[edge], uri)
		}
		if old, was := stored[uri]; was && old != edge {
			moved[old] = append(moved[old], uri)
		}
	}
	if err := w.changeEdges(ctx, adds, (*socialgraph.Edge).Add); err != nil {
		return err
	}
	return w.changeEdges(ctx, moved, (*socialgraph.Edge).Remove)
}

// storedEdges reads the stored follow and list-item records among uris,
// before they are rewritten or deleted: record URI → the edge it makes.
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
	changes := map[string][]string{} // edge → records to remove
	for rec, edge := range edges {
		changes[edge] = append(changes[edge], rec)
	}
	return w.changeEdges(ctx, changes, (*socialgraph.Edge).Remove)
}

// changeEdges applies change with each of an edge's records to that edge,
// for every edge in changes, in one read-modify-write of them all. An
// edge takes no record past MaxEdgeBytes: it exists already, through the
// records it lists.
func (w *Writer) changeEdges(ctx context.Context, changes map[string][]string, change func(*socialgraph.Edge, string) bool) error {
	if len(changes) == 0 {
		return nil
	}
	edges := slices.Sorted(maps.Keys(changes))
	err := w.graph.UpsertMany(ctx, edges, func(r *store.Record, _ bool) bool {
		e := socialgraph.Decode(r.JSON)
		size, changed := len(e.Encode()), false
		for _, rec := range changes[r.URI] {
			before := len(e.Records)
			if !change(&e, rec) {
				continue
			}
			size += (len(e.Records) - before) * (len(rec) + len(`"",`))
			if size > MaxEdgeBytes {
				e.Remove(rec) // an addition past the limit: the edge exists already
				break
			}
			changed = true
		}
		if !changed {
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
		return fmt.Errorf("update %d social graph edges: %w", len(edges), err)
	}
	return nil
}
