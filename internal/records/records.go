// Package records writes records of every collection bsky.Service reads,
// with their moderation state, and keeps the gate state of posts in step
// with them the way the AppView's reference indexer does, at write time:
//
//   - a post has has_thread_gate / has_post_gate when a thread-gate /
//     post-gate record exists with the same author and record key;
//     writing or deleting such a gate sets or clears the flag on its post;
//   - a reply violates_thread_gate when its root's thread-gate disallows
//     the replier (ParseThreadGate, then the social graph: every rule of
//     the lexicon is decided);
//   - a quote violates_embedding_rules when the quoted post's post-gate
//     disables embedding and the quoter is not its author;
//   - a post that replies in a thread its author started is added to the
//     thread's OP-reply index (package opthread), and marked deleted there
//     when it is deleted, so GetPostRecords can answer op_threads;
//   - a follow or list-item record is added to the social graph's edges
//     (package socialgraph), and removed when it is deleted, so that the
//     follower, following and list rules of thread-gates can be decided
//     for replies written afterwards.
//
// Each collection's writes go through its posts.Service (validation,
// store write, then cache invalidation), so the next read from any
// replica sees them — but for replicas' near caches, which may answer an
// entry read before the invalidation for up to their horizon. A takedown
// or lift is not acknowledged until that horizon has passed, so that once
// it is, no replica answers the old moderation state (see WithHorizon).
// What the gate state is computed from (gates, roots, the social graph)
// is read from the store, not the caches: a gate written through another
// replica a moment ago counts, and a memcached outage does not stall
// writes on cache timeouts. Records does not decide what a batch may
// hold (the guard does) nor map errors to status codes (package rpc
// does).
package records

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/opthread"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/socialgraph"
	"github.com/sluice-dev/sluice/internal/store"
)

// The collections whose records carry or affect gate state.
const (
	PostCollection       = aturi.PostCollection
	ThreadgateCollection = "app.bsky.feed.threadgate"
	PostgateCollection   = "app.bsky.feed.postgate"
)

// Writer writes records of the collections it has a posts.Service for.
type Writer struct {
	services map[string]*posts.Service
	threads  *posts.Service // the OP-thread indexes (package opthread)
	graph    *posts.Service // the social graph's edges (package socialgraph)
	horizon  time.Duration
	// versioned are the collections whose readers address a record by URI
	// and CID: their records must carry a CID.
	versioned map[string]bool
}

// Option configures a Writer.
type Option func(*Writer)

// WithHorizon makes takedowns and lifts wait d after their cache entries
// were invalidated before they are answered: the longest any replica's
// near cache may still answer an entry it read before (nearcache's
// Horizon, the same on every replica that shares the config).
func WithHorizon(d time.Duration) Option {
	return func(w *Writer) { w.horizon = d }
}

// WithVersioned requires a CID of every record written in collections:
// those whose readers address a record by URI and CID (a record without
// one could be stored but never answered).
func WithVersioned(collections ...string) Option {
	return func(w *Writer) {
		w.versioned = map[string]bool{}
		for _, c := range collections {
			w.versioned[c] = true
		}
	}
}

// New returns a writer over services, keyed by collection, keeping the
// OP-thread indexes of posts through threads and the social graph through
// graph. services must hold the post, thread-gate, post-gate, follow and
// list-item collections, threads serve opthread.Collection and graph
// socialgraph.Collection.
func New(services map[string]*posts.Service, threads, graph *posts.Service, opts ...Option) (*Writer, error) {
	for _, c := range []string{PostCollection, ThreadgateCollection, PostgateCollection, socialgraph.FollowCollection, socialgraph.ListItemCollection} {
		if services[c] == nil {
			return nil, fmt.Errorf("records: no service for %s", c)
		}
	}
	if threads == nil || threads.Collection() != opthread.Collection {
		return nil, fmt.Errorf("records: no service for the OP-thread indexes (%s)", opthread.Collection)
	}
	if graph == nil || graph.Collection() != socialgraph.Collection {
		return nil, fmt.Errorf("records: no service for the social graph (%s)", socialgraph.Collection)
	}
	w := &Writer{services: services, threads: threads, graph: graph}
	for _, o := range opts {
		o(w)
	}
	return w, nil
}

// Takedown sets (TakedownRef non-empty) or lifts one record's takedown.
type Takedown struct {
	URI         string
	TakedownRef string
}

// Put validates every record, computes the gate state of its posts, writes
// them collection by collection, then updates the gate state of the posts
// whose gates it wrote. A record that fails validation fails the batch
// before anything is written. The writes of different collections are not
// one transaction: a store failure part-way leaves the earlier
// collections written (a retry of the batch is safe).
func (w *Writer) Put(ctx context.Context, recs []store.Record) (int, error) {
	parsed := make([]aturi.URI, len(recs))
	batch := make(map[string]*store.Record, len(recs))
	for i := range recs {
		u, err := w.check(i, &recs[i])
		if err != nil {
			return 0, err
		}
		parsed[i] = u
		batch[recs[i].URI] = &recs[i]
	}
	posts := make([]parsedPost, len(recs))
	for i := range recs {
		if parsed[i].Collection == PostCollection {
			posts[i] = parsePost(recs[i].JSON)
		}
	}
	k, err := w.prefetchGates(ctx, parsed, posts, batch)
	if err != nil {
		return 0, err
	}
	edges, err := w.storedEdges(ctx, parsed)
	if err != nil {
		return 0, err
	}
	for i := range recs {
		if parsed[i].Collection != PostCollection {
			continue
		}
		g, err := w.gatesOf(ctx, parsed[i], posts[i], k)
		if err != nil {
			return 0, err
		}
		recs[i].Gates = g
	}
	groups := map[string][]store.Record{}
	var order []string
	for i, r := range recs {
		c := parsed[i].Collection
		if _, ok := groups[c]; !ok {
			order = append(order, c)
		}
		groups[c] = append(groups[c], r)
	}
	written := 0
	for _, c := range order {
		n, err := w.services[c].Put(ctx, groups[c])
		if err != nil {
			return written, err
		}
		written += n
	}
	for i, u := range parsed {
		if u.Collection != ThreadgateCollection && u.Collection != PostgateCollection {
			continue
		}
		post := postOf(u)
		if _, inBatch := batch[post]; inBatch {
			continue // its gates were computed with this gate in view
		}
		if err := w.setGateFlag(ctx, post, u.Collection, true); err != nil {
			return written, fmt.Errorf("records[%d]: update the gate state of %s: %w", i, post, err)
		}
	}
	if err := w.indexOPReplies(ctx, parsed, recs); err != nil {
		return written, err
	}
	if err := w.indexEdges(ctx, parsed, recs, edges); err != nil {
		return written, err
	}
	return written, SettleTakedowns(ctx, w.horizon, recs)
}

func anyTakenDown(recs []store.Record) bool {
	for _, r := range recs {
		if r.TakedownRef != "" {
			return true
		}
	}
	return false
}

// SettleTakedowns is Settle after a write of recs that takes any of them
// down, and nothing otherwise: every writer of records that may carry a
// takedown (this package's Writer, sluice.v1.PostRecords' plain puts)
// answers it only once no replica's near cache can answer the record as
// it was before.
func SettleTakedowns(ctx context.Context, horizon time.Duration, recs []store.Record) error {
	if !anyTakenDown(recs) {
		return nil
	}
	return Settle(ctx, horizon)
}

// Settle waits out horizon (a near cache's, nearcache.Cache.Horizon):
// until no replica's near cache answers a value read before the
// invalidations just made. The change is stored and invalidated either
// way; an error says only that the caller left first.
func Settle(ctx context.Context, horizon time.Duration) error {
	if horizon <= 0 {
		return nil
	}
	t := time.NewTimer(horizon)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the change is stored, but other replicas may answer the old state for up to %v more: %w", horizon, ctx.Err())
	}
}

// Delete deletes records of any served collection and reports how many
// existed; deleting a thread-gate or post-gate clears the flag on its post.
func (w *Writer) Delete(ctx context.Context, uris []string) (int, error) {
	parsed := make([]aturi.URI, len(uris))
	groups := map[string][]string{}
	var order []string
	for i, uri := range uris {
		u, err := w.parse(uri)
		if err != nil {
			return 0, &posts.InvalidURIError{Index: i, URI: uri, Err: err}
		}
		parsed[i] = u
		if _, ok := groups[u.Collection]; !ok {
			order = append(order, u.Collection)
		}
		groups[u.Collection] = append(groups[u.Collection], uri)
	}
	opReplies, err := w.storedOPReplies(ctx, parsed)
	if err != nil {
		return 0, err
	}
	edges, err := w.storedEdges(ctx, parsed)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, c := range order {
		n, err := w.services[c].Delete(ctx, groups[c])
		if err != nil {
			return deleted, err
		}
		deleted += n
	}
	for _, u := range parsed {
		if u.Collection == ThreadgateCollection || u.Collection == PostgateCollection {
			if err := w.setGateFlag(ctx, postOf(u), u.Collection, false); err != nil {
				return deleted, fmt.Errorf("update the gate state of %s: %w", postOf(u), err)
			}
		}
	}
	if err := w.markOPRepliesDeleted(ctx, opReplies, time.Now()); err != nil {
		return deleted, err
	}
	if err := w.unindexEdges(ctx, edges); err != nil {
		return deleted, err
	}
	return deleted, nil
}

// InvalidTakedownError reports the takedown at Index of a request that
// cannot be applied (a URI of no served collection, a takedown_ref over its
// limit); none of the request's takedowns is applied.
type InvalidTakedownError struct {
	Index  int
	URI    string
	Reason string
}

func (e *InvalidTakedownError) Error() string {
	return fmt.Sprintf("takedowns[%d] (%.200q): %s", e.Index, e.URI, e.Reason)
}

// UpdateTakedowns sets or lifts the takedown of each stored record and
// reports how many exist. URIs with no record are skipped. The takedowns
// apply in order: a record named more than once ends with the last.
func (w *Writer) UpdateTakedowns(ctx context.Context, takedowns []Takedown) (int, error) {
	for i, td := range takedowns {
		if _, err := w.parse(td.URI); err != nil {
			return 0, &InvalidTakedownError{Index: i, URI: td.URI, Reason: err.Error()}
		}
		if err := store.CheckModeration(td.TakedownRef, nil); err != nil {
			return 0, &InvalidTakedownError{Index: i, URI: td.URI, Reason: err.Error()}
		}
	}
	// One update per record, to the last state asked for it; updates of
	// different records run in parallel.
	last := map[string]int{} // URI → position of its last takedown
	times := map[string]int64{}
	var uris []string
	for i, td := range takedowns {
		if _, ok := last[td.URI]; !ok {
			uris = append(uris, td.URI)
		}
		last[td.URI] = i
		times[td.URI]++
	}
	var updated atomic.Int64
	err := fanout.Each(ctx, len(uris), func(ctx context.Context, k int) error {
		td := takedowns[last[uris[k]]]
		u, _ := aturi.Parse(td.URI)
		existed, err := w.services[u.Collection].Update(ctx, td.URI, func(r *store.Record) bool {
			if r.TakedownRef == td.TakedownRef {
				return false
			}
			r.TakedownRef = td.TakedownRef
			return true
		})
		if existed {
			updated.Add(times[td.URI])
		}
		return err
	})
	if err != nil || updated.Load() == 0 {
		return int(updated.Load()), err
	}
	return int(updated.Load()), Settle(ctx, w.horizon)
}

// check validates the record at position i and returns its parsed URI.
func (w *Writer) check(i int, r *store.Record) (aturi.URI, error) {
	u, err := w.parse(r.URI)
	if err != nil {
		return u, &posts.InvalidRecordError{Index: i, URI: r.URI, Reason: err.Error()}
	}
	if len(r.URI) > aturi.MaxStoredLength {
		return u, &posts.InvalidRecordError{Index: i, URI: r.URI, Reason: fmt.Sprintf("URI is %d bytes, over the limit of %d", len(r.URI), aturi.MaxStoredLength)}
	}
	if err := w.services[u.Collection].Check(i, r); err != nil {
		return u, err
	}
	if w.versioned[u.Collection] && r.CID == "" {
		return u, &posts.InvalidRecordError{Index: i, URI: r.URI, Reason: fmt.Sprintf("a %s record needs a cid: it is read by URI and CID", u.Collection)}
	}
	if u.Collection == ThreadgateCollection || u.Collection == PostgateCollection {
		if err := checkGateSubject(u, r.JSON); err != nil {
			return u, &posts.InvalidRecordError{Index: i, URI: r.URI, Reason: err.Error()}
		}
	}
	return u, nil
}

// parse accepts a record AT-URI of a collection the writer serves.
func (w *Writer) parse(uri string) (aturi.URI, error) {
	u, err := aturi.Parse(uri)
	if err != nil {
		return u, err
	}
	if w.services[u.Collection] == nil {
		return u, fmt.Errorf("collection %q is not one bsky.Service reads", u.Collection)
	}
	return u, nil
}

// checkGateSubject requires a gate's post to be the post with the gate's
// author and record key, as the reference indexer does.
func checkGateSubject(gate aturi.URI, body []byte) error {
	var g struct {
		Post string `json:"post"`
	}
	_ = json.Unmarshal(body, &g)
	p, err := aturi.ParseIn(g.Post, PostCollection)
	if err != nil || p.DID != gate.DID || p.RKey != gate.RKey {
		return fmt.Errorf("the gate's post %q is not the post of the same author and record key (%s)", g.Post, postOf(gate))
	}
	return nil
}

// setGateFlag sets has_thread_gate or has_post_gate on a stored post.
func (w *Writer) setGateFlag(ctx context.Context, post, gateCollection string, on bool) error {
	_, err := w.services[PostCollection].Update(ctx, post, func(r *store.Record) bool {
		flag := &r.Gates.HasThreadGate
		if gateCollection == PostgateCollection {
			flag = &r.Gates.HasPostGate
		}
		if *flag == on {
			return false
		}
		*flag = on
		return true
	})
	return err
}

// storedOf reads from the store, in one batched read, the records of
// collection among parsed, and returns those that exist by URI.
func (w *Writer) storedOf(ctx context.Context, parsed []aturi.URI, collection string) (map[string]store.Record, error) {
	var uris []string
	for _, u := range parsed {
		if u.Collection == collection {
			uris = append(uris, u.String())
		}
	}
	if len(uris) == 0 {
		return nil, nil
	}
	res, err := w.services[collection].StoredMany(ctx, uris)
	if err != nil {
		return nil, err
	}
	out := make(map[string]store.Record, len(res))
	for i, r := range res {
		if r.Found {
			out[uris[i]] = r.Record
		}
	}
	return out, nil
}

// postOf is the post a gate URI belongs to: same author and record key.
func postOf(gate aturi.URI) string {
	return aturi.URI{DID: gate.DID, Collection: PostCollection, RKey: gate.RKey}.String()
}

// gateOf is the URI of a post's gate record of collection.
func gateOf(post aturi.URI, collection string) string {
	return aturi.URI{DID: post.DID, Collection: collection, RKey: post.RKey}.String()
}
