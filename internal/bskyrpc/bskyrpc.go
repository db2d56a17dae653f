// Package bskyrpc serves the record reads of bsky.Service, the data-plane
// contract the AT Protocol AppView calls, over the same read path as
// sluice.v1 (package posts: cache, then store, then refill).
//
// Every Get…Records method it serves is one generic read keyed by the
// collection the method reads (GetLikeRecords reads app.bsky.feed.like):
// answers are aligned with the request, and a record that does not exist
// is a Record with empty record bytes. URIs are judged one by one, as the
// AppView's reference data plane does: a URI that does not parse, names
// another collection, has a handle or an unusual DID for its authority,
// carries a query or fragment, or is longer than any stored URI can be,
// is answered as missing at its position (and counted as invalid), never
// failing the batch. GetPostRecords adds a PostRecordMeta per post and,
// when asked, the OP threads of the requested posts' roots. The two
// GetSiteStandardRecordsBy… methods read standard.site documents and
// publications and answer the records found, split by collection
// (sitestandard.go).
//
// The package declares a default policy for every method of the service
// descriptor (DefaultPolicies) because the guard registers nothing
// without one. Limits, identity and admission belong to the guard,
// caching to package posts, and the error to status mapping to package
// rpc.
package bskyrpc

import (
	"context"
	"maps"
	"slices"

	"github.com/sluice-dev/sluice/api/bsky"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/opthread"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/rpc"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// collections maps each served method to the collection it reads. These
// are the record reads the AppView's reference data plane serves from its
// record table: all 19 of the published contract. The standard.site
// reads are in sitestandard.go.
var collections = map[string]string{
	"GetBlockRecords":                   "app.bsky.graph.block",
	"GetFeedGeneratorRecords":           "app.bsky.feed.generator",
	"GetFollowRecords":                  "app.bsky.graph.follow",
	"GetLikeRecords":                    "app.bsky.feed.like",
	"GetListBlockRecords":               "app.bsky.graph.listblock",
	"GetListItemRecords":                "app.bsky.graph.listitem",
	"GetListRecords":                    "app.bsky.graph.list",
	"GetPostRecords":                    aturi.PostCollection,
	"GetProfileRecords":                 "app.bsky.actor.profile",
	"GetRepostRecords":                  "app.bsky.feed.repost",
	"GetThreadGateRecords":              "app.bsky.feed.threadgate",
	"GetPostgateRecords":                "app.bsky.feed.postgate",
	"GetLabelerRecords":                 "app.bsky.labeler.service",
	"GetActorChatDeclarationRecords":    "chat.bsky.actor.declaration",
	"GetStarterPackRecords":             "app.bsky.graph.starterpack",
	"GetNotificationDeclarationRecords": "app.bsky.notification.declaration",
	"GetGermDeclarationRecords":         "com.germnetwork.declaration",
	"GetStatusRecords":                  "app.bsky.actor.status",
	"GetVerificationRecords":            "app.bsky.graph.verification",
}

// MaxStoredURILength is the longest URI a record can be stored under (the
// store backends' and the write methods' limit). A longer URI names no
// record, so it is answered as missing without a cache or store read.
const MaxStoredURILength = aturi.MaxStoredLength

// Served maps each served method whose answer is aligned with its
// request (every one but the GetSiteStandardRecordsBy… pair) to the
// collection it reads.
func Served() map[string]string { return maps.Clone(collections) }

// SiteStandardMethods returns the served methods that read both
// standard.site collections and answer only the records found.
func SiteStandardMethods() []string { return slices.Clone(siteStandardMethods) }

// Collections returns the collections the served methods read, sorted.
func Collections() []string {
	all := append(slices.Collect(maps.Values(collections)), DocumentCollection, PublicationCollection)
	slices.Sort(all)
	return all
}

// DefaultPolicies returns a policy for every method of bsky.Service as
// declared in proto/bsky: the guard's default batch policy (1,000 URIs per
// request), except that URIs up to the protocol's maximum length pass the
// guard, so an over-long one is answered as missing rather than failing
// its batch. The config file may override any field per method
// ("bsky.Service/GetPostRecords"); an AppView that sends larger batches
// raises max_items there.
func DefaultPolicies() map[string]guard.Policy {
	p := guard.DefaultPolicy()
	p.MaxURILength = aturi.MaxLength
	out := make(map[string]guard.Policy, len(bsky.Service_ServiceDesc.Methods))
	for _, m := range bsky.Service_ServiceDesc.Methods {
		out[bsky.Service_ServiceDesc.ServiceName+"/"+m.MethodName] = p
	}
	return out
}

// Service serves bsky.Service. Methods of the published contract that
// this package does not define (none of the record reads) are answered
// UNIMPLEMENTED by the embedded base server.
type Service struct {
	bsky.UnimplementedServiceServer
	readers  map[string]*posts.Service // by collection
	threads  *posts.Service            // the OP-thread indexes
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
	s.threads = readerFor(opthread.Collection)
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

// read returns one result per URI, in order. A URI that cannot name a
// stored record of the method's collection (Readable) is answered as not
// found without touching the cache or the store, and counted as invalid.
func (s *Service) read(ctx context.Context, method string, uris []string) ([]posts.Result, error) {
	collection := collections[method]
	var want []string
	var at []int // at[j] is the request position of want[j]
	for i, uri := range uris {
		if Readable(uri, collection) {
			want, at = append(want, uri), append(at, i)
		}
	}
	out := make([]posts.Result, len(uris))
	counts := posts.Counts{Invalid: len(uris) - len(want)}
	if len(want) > 0 {
		results, c, err := s.readers[collection].Get(ctx, want)
		if err != nil {
			return nil, rpc.Status(method, err)
		}
		for j, r := range results {
			out[at[j]] = r
		}
		c.Invalid = counts.Invalid
		counts = c
	}
	s.recorder.RecordItems(ctx, method, counts)
	return out, nil
}

// Readable reports whether uri can name a stored record of collection: a
// record AT-URI sluice accepts (did:plc or did:web authority, no query or
// fragment), of that collection, no longer than MaxStoredURILength.
func Readable(uri, collection string) bool {
	if len(uri) > MaxStoredURILength {
		return false
	}
	_, err := aturi.ParseIn(uri, collection)
	return err == nil
}

// toRecord is the wire form of one result: empty when not found.
func toRecord(r posts.Result) *bsky.Record {
	if !r.Found {
		return &bsky.Record{}
	}
	rec := &bsky.Record{
		Record:      r.Record.JSON,
		Cid:         r.Record.CID,
		TakenDown:   r.Record.TakedownRef != "",
		TakedownRef: r.Record.TakedownRef,
		Tags:        r.Record.Tags,
	}
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
