// Package bskyrpc serves the record reads of bsky.Service, the data-plane
// contract the AT Protocol AppView calls, over the same read path as
// sluice.v1 (package posts: cache, then store, then refill).
//
// Every Get…Records method it serves is one generic read keyed by the
// collection the method reads (GetLikeRecords reads app.bsky.feed.like):
// answers are aligned with the request, a record that does not exist — or
// a URI of another collection, as the AppView's reference data plane
// treats it — is a Record with empty record bytes, and GetPostRecords adds
// a PostRecordMeta derived from each post's JSON. A URI that is not an
// AT-URI at all is InvalidArgument.
//
// The package declares a default policy for every method of the service
// descriptor (DefaultPolicies), served or not, because the guard registers
// nothing without one; the declared methods it does not serve are answered
// UNIMPLEMENTED by the generated base server. Limits, identity and
// admission belong to the guard, caching to package posts, and the error
// to status mapping to package rpc.
package bskyrpc

import (
	"context"
	"maps"
	"slices"

	"github.com/sluice-dev/sluice/api/bsky"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/rpc"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// collections maps each served method to the collection it reads. These
// are the record reads the AppView's reference data plane serves from its
// record table; the other declared Get…Records methods answer
// UNIMPLEMENTED.
var collections = map[string]string{
	"GetBlockRecords":                "app.bsky.graph.block",
	"GetFeedGeneratorRecords":        "app.bsky.feed.generator",
	"GetFollowRecords":               "app.bsky.graph.follow",
	"GetLikeRecords":                 "app.bsky.feed.like",
	"GetListBlockRecords":            "app.bsky.graph.listblock",
	"GetListItemRecords":             "app.bsky.graph.listitem",
	"GetListRecords":                 "app.bsky.graph.list",
	"GetPostRecords":                 aturi.PostCollection,
	"GetProfileRecords":              "app.bsky.actor.profile",
	"GetRepostRecords":               "app.bsky.feed.repost",
	"GetThreadGateRecords":           "app.bsky.feed.threadgate",
	"GetPostgateRecords":             "app.bsky.feed.postgate",
	"GetLabelerRecords":              "app.bsky.labeler.service",
	"GetActorChatDeclarationRecords": "chat.bsky.actor.declaration",
	"GetStarterPackRecords":          "app.bsky.graph.starterpack",
}

// Served maps each served method name to the collection it reads.
func Served() map[string]string { return maps.Clone(collections) }

// Collections returns the collections the served methods read, sorted.
func Collections() []string {
	return slices.Sorted(maps.Values(collections))
}

// DefaultPolicies returns a policy for every method of bsky.Service as
// declared in proto/bsky: the guard's default batch policy, which the
// config file may override per method ("bsky.Service/GetPostRecords").
func DefaultPolicies() map[string]guard.Policy {
	out := make(map[string]guard.Policy, len(bsky.Service_ServiceDesc.Methods))
	for _, m := range bsky.Service_ServiceDesc.Methods {
		out[bsky.Service_ServiceDesc.ServiceName+"/"+m.MethodName] = guard.DefaultPolicy()
	}
	return out
}

// Service serves bsky.Service. Methods it does not define are answered
// UNIMPLEMENTED by the embedded base server.
type Service struct {
	bsky.UnimplementedServiceServer
	readers  map[string]*posts.Service // by collection
	recorder rpc.ItemRecorder
}

// New returns the service; readerFor is called once per served collection
// and returns the read path for it (so one collection can share a
// posts.Service with other services). rec may be nil.
func New(readerFor func(collection string) *posts.Service, rec rpc.ItemRecorder) *Service {
	if rec == nil {
		rec = nopRecorder{}
	}
	s := &Service{readers: map[string]*posts.Service{}, recorder: rec}
	for _, c := range Collections() {
		s.readers[c] = readerFor(c)
	}
	return s
}

type nopRecorder struct{}

func (nopRecorder) RecordItems(context.Context, string, posts.Counts) {}

// records answers a Get…Records call for method's collection.
func (s *Service) records(ctx context.Context, method string, uris []string) ([]*bsky.Record, error) {
	found, err := s.read(ctx, method, uris)
	if err != nil {
		return nil, err
	}
	out := make([]*bsky.Record, len(found))
	for i, r := range found {
		out[i] = toRecord(r)
	}
	return out, nil
}

// read returns one result per URI, in order; URIs of another collection
// are answered as not found without touching the cache or the store.
func (s *Service) read(ctx context.Context, method string, uris []string) ([]posts.Result, error) {
	collection := collections[method]
	var want []string
	var at []int // at[j] is the request position of want[j]
	for i, uri := range uris {
		u, err := aturi.Parse(uri)
		if err != nil {
			return nil, rpc.Status(method, &posts.InvalidURIError{Index: i, URI: uri, Err: err})
		}
		if u.Collection == collection {
			want, at = append(want, uri), append(at, i)
		}
	}
	out := make([]posts.Result, len(uris))
	if len(want) == 0 {
		return out, nil
	}
	results, counts, err := s.readers[collection].Get(ctx, want)
	if err != nil {
		return nil, rpc.Status(method, err)
	}
	counts.NotFound += len(uris) - len(want)
	s.recorder.RecordItems(ctx, method, counts)
	for j, r := range results {
		out[at[j]] = r
	}
	return out, nil
}

// toRecord is the wire form of one result: empty when not found.
func toRecord(r posts.Result) *bsky.Record {
	if !r.Found {
		return &bsky.Record{}
	}
	rec := &bsky.Record{Record: r.Record.JSON, Cid: r.Record.CID}
	if !r.Record.CreatedAt.IsZero() {
		rec.CreatedAt = timestamppb.New(r.Record.CreatedAt)
	}
	if !r.Record.IndexedAt.IsZero() {
		rec.IndexedAt = timestamppb.New(r.Record.IndexedAt)
	}
	rec.SortedAt = sortedAt(rec.GetCreatedAt(), rec.GetIndexedAt())
	return rec
}

// sortedAt is the earlier of the two times, as the AppView's reference
// data plane computes it: a record its author dated in the future sorts by
// when it was indexed.
func sortedAt(created, indexed *timestamppb.Timestamp) *timestamppb.Timestamp {
	switch {
	case created == nil:
		return indexed
	case indexed == nil || created.AsTime().Before(indexed.AsTime()):
		return created
	}
	return indexed
}
