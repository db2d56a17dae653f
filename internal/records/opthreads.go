package records

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/opthread"
	"github.com/sluice-dev/sluice/internal/store"
)

// MaxIndexBytes bounds one thread's stored OP-reply index (a few hundred
// replies), with room kept to mark each of its replies deleted
// (opthread.Index.Size); OP replies past it are not indexed, and the
// thread's OP thread is resolved from those that are.
const MaxIndexBytes = 64 << 10

// indexOPReplies adds the OP replies among the written posts to the
// indexes of their threads, in one read-modify-write of all of them.
func (w *Writer) indexOPReplies(ctx context.Context, parsed []aturi.URI, recs []store.Record) error {
	byIndex := map[string][]opthread.Reply{}
	var order []string
	for i, u := range parsed {
		if u.Collection != PostCollection {
			continue
		}
		idx, r, ok := opthread.OPReply(u, recs[i].JSON)
		if !ok {
			continue
		}
		if _, seen := byIndex[idx]; !seen {
			order = append(order, idx)
		}
		byIndex[idx] = append(byIndex[idx], r)
	}
	err := w.threads.UpsertMany(ctx, order, func(r *store.Record, _ bool) bool {
		idx := opthread.Decode(r.JSON)
		if !idx.AddWithin(byIndex[r.URI], MaxIndexBytes) {
			return false
		}
		r.JSON = idx.Encode()
		return true
	})
	if err != nil {
		return fmt.Errorf("index the OP replies of %d threads: %w", len(order), err)
	}
	return nil
}

// storedOPReplies reads the stored posts among uris that are OP replies,
// before they are deleted: index URI → reply URIs.
func (w *Writer) storedOPReplies(ctx context.Context, parsed []aturi.URI) (map[string][]string, error) {
	stored, err := w.storedOf(ctx, parsed, PostCollection)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, u := range parsed {
		rec, found := stored[u.String()]
		if idx, r, ok := opthread.OPReply(u, rec.JSON); found && ok {
			out[idx] = append(out[idx], r.URI)
		}
	}
	return out, nil
}

// markOPRepliesDeleted marks deleted OP replies in their threads' indexes.
func (w *Writer) markOPRepliesDeleted(ctx context.Context, byIndex map[string][]string, at time.Time) error {
	if len(byIndex) == 0 {
		return nil
	}
	indexes := slices.Sorted(maps.Keys(byIndex))
	err := w.threads.UpsertMany(ctx, indexes, func(r *store.Record, existed bool) bool {
		if !existed {
			return false
		}
		idx := opthread.Decode(r.JSON)
		changed := false
		for _, reply := range byIndex[r.URI] {
			changed = idx.MarkDeleted(reply, at) || changed
		}
		body := idx.Encode()
		if len(body) > MaxIndexBytes {
			return false // an index stored without room kept for marks
		}
		r.JSON = body
		return changed
	})
	if err != nil {
		return fmt.Errorf("mark deleted OP replies in %d threads: %w", len(indexes), err)
	}
	return nil
}
