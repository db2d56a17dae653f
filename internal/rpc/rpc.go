// Package rpc implements the sluice.v1.PostRecords gRPC service over the
// posts read path, and is the one place where errors become gRPC status
// codes.
//
// Handlers here translate messages and errors, nothing more: limits,
// identity and admission belong to the guard that serves them, and
// caching to package posts. The package declares the default policy of
// each of its methods (DefaultPolicies); a method added to the proto
// without one cannot be registered.
package rpc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/identity"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/records"
	"github.com/sluice-dev/sluice/internal/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ItemRecorder learns where each batch's answers came from (for metrics).
// Implementations must not block.
type ItemRecorder interface {
	RecordItems(ctx context.Context, method string, c posts.Counts)
}

type nopRecorder struct{}

func (nopRecorder) RecordItems(context.Context, string, posts.Counts) {}

// Limits is what GetLimits reports; *guard.Server has it.
type Limits interface {
	Policies() map[string]guard.Policy
	Budget(client string) budget.Budget
}

// PostRecords serves sluice.v1.PostRecords.
type PostRecords struct {
	sluicev1.UnimplementedPostRecordsServer
	posts    *posts.Service
	writer   *records.Writer
	recorder ItemRecorder
	limits   Limits
}

// NewPostRecords returns the service: reads from p, writes through w
// (whose post collection p must be), as sluice.v1.Records writes, so a
// post written here gets the same gate state, OP-thread index and
// takedown settling as one written there; rec may be nil.
func NewPostRecords(p *posts.Service, w *records.Writer, rec ItemRecorder) *PostRecords {
	if rec == nil {
		rec = nopRecorder{}
	}
	return &PostRecords{posts: p, writer: w, recorder: rec}
}

// DefaultPolicies returns the policy of every sluice.v1.PostRecords method
// unless the config file overrides it.
func DefaultPolicies() map[string]guard.Policy {
	batch := guard.DefaultPolicy()
	single := guard.Policy{MaxItems: 1, MaxURILength: batch.MaxURILength, Concurrency: 1, Timeout: time.Second}
	svc := sluicev1.PostRecords_ServiceDesc.ServiceName
	return map[string]guard.Policy{
		svc + "/GetPostRecords":    batch,
		svc + "/GetPostRecord":     single,
		svc + "/PutPostRecords":    batch,
		svc + "/DeletePostRecords": batch,
		// GetLimits carries no URIs: it costs one item and has no shape.
		svc + "/GetLimits": {MaxItems: 1, MaxURILength: batch.MaxURILength, Concurrency: 1, Timeout: time.Second},
	}
}

// WithLimits makes GetLimits answer from l; without it GetLimits is
// Unimplemented.
func (s *PostRecords) WithLimits(l Limits) *PostRecords {
	s.limits = l
	return s
}

// GetLimits reports every method's shape limits and the caller's budget.
func (s *PostRecords) GetLimits(ctx context.Context, _ *sluicev1.GetLimitsRequest) (*sluicev1.GetLimitsResponse, error) {
	if s.limits == nil {
		return nil, status.Error(codes.Unimplemented, "GetLimits: this server does not report its limits")
	}
	policies := s.limits.Policies()
	resp := &sluicev1.GetLimitsResponse{}
	for _, name := range slices.Sorted(maps.Keys(policies)) {
		p := policies[name]
		resp.Methods = append(resp.Methods, &sluicev1.MethodLimits{
			Method:       name,
			MaxItems:     uint32(p.MaxItems),
			MaxUriLength: uint32(p.MaxURILength),
			Timeout:      durationpb.New(p.Timeout),
		})
	}
	client := identity.Client(ctx)
	b := s.limits.Budget(client)
	resp.Budget = &sluicev1.ClientBudget{
		Client:           client,
		ItemsPerSecond:   b.ItemsPerSecond,
		Burst:            uint32(b.Burst),
		MaxInflightItems: uint32(min(b.MaxInflightItems, math.MaxUint32)),
	}
	return resp, nil
}

// GetPostRecords answers a batch, aligned with the request. Records found
// in the cache are copied into the response in the encoding the cache
// holds (see spliced), not decoded and encoded again.
func (s *PostRecords) GetPostRecords(ctx context.Context, req *sluicev1.GetPostRecordsRequest) (*sluicev1.GetPostRecordsResponse, error) {
	answers, counts, err := s.posts.GetEncoded(ctx, req.GetUris())
	if err != nil {
		return nil, toStatus("GetPostRecords", err)
	}
	s.recorder.RecordItems(ctx, "GetPostRecords", counts)
	resp := &sluicev1.GetPostRecordsResponse{}
	resp.ProtoReflect().SetUnknown(spliced(ctx, answers))
	return resp, nil
}

// GetPostRecord answers one URI; a missing post has found=false.
func (s *PostRecords) GetPostRecord(ctx context.Context, req *sluicev1.GetPostRecordRequest) (*sluicev1.PostRecord, error) {
	answers, counts, err := s.posts.GetEncoded(ctx, []string{req.GetUri()})
	if err != nil {
		return nil, toStatus("GetPostRecord", err)
	}
	s.recorder.RecordItems(ctx, "GetPostRecord", counts)
	r := answers.At(0)
	if r.Wire == nil {
		return posts.ToProto(r.Record, r.Found), nil
	}
	rec := &sluicev1.PostRecord{}
	rec.ProtoReflect().SetUnknown(r.Wire)
	return rec, nil
}

// spliced is the records field (1) of a GetPostRecordsResponse holding
// results in order, in wire form. A message's unknown fields are written
// verbatim when it is marshalled, so a response whose only content is
// these bytes reaches the client as the records they encode: cached
// encodings (Result.Wire, checked by package posts) are copied as they
// are, and only records read from the store are encoded. The bytes are
// written into the call's answer buffer (guard.AnswerBuffer), which the
// guard takes back once the transport has written them.
func spliced(ctx context.Context, answers posts.Answers) []byte {
	size := 0
	for i := range answers.Len() {
		r := answers.At(i)
		size += len(r.Wire) + len(r.Record.URI) + 8
	}
	buf := guard.AnswerBuffer(ctx, size)
	for i := range answers.Len() {
		r := answers.At(i)
		buf = protowire.AppendTag(buf, 1, protowire.BytesType)
		if r.Wire != nil {
			buf = protowire.AppendBytes(buf, r.Wire)
			continue
		}
		pr := posts.ToProto(r.Record, r.Found)
		buf = protowire.AppendVarint(buf, uint64(proto.Size(pr)))
		buf, _ = proto.MarshalOptions{}.MarshalAppend(buf, pr)
	}
	return buf
}

// PutPostRecords writes a batch of posts, all or nothing: every record
// must be a post, or nothing is written. It writes through the records
// writer, which computes each post's gates (the request's are ignored),
// indexes OP replies, and answers a batch that takes a record down only
// once no replica's near cache answers it as it was
// (records.SettleTakedowns).
func (s *PostRecords) PutPostRecords(ctx context.Context, req *sluicev1.PutPostRecordsRequest) (*sluicev1.PutPostRecordsResponse, error) {
	recs := make([]store.Record, len(req.GetRecords()))
	for i, pr := range req.GetRecords() {
		recs[i] = posts.FromProto(pr)
		if err := s.posts.Check(i, &recs[i]); err != nil {
			return nil, toStatus("PutPostRecords", err)
		}
	}
	n, err := s.writer.Put(ctx, recs)
	if err != nil {
		return nil, toStatus("PutPostRecords", err)
	}
	return &sluicev1.PutPostRecordsResponse{Written: uint32(n)}, nil
}

// DeletePostRecords deletes a batch of posts through the records writer
// (which marks a deleted OP reply in its thread's index); missing URIs
// are not an error, a URI that is not a post fails the batch before
// anything is deleted.
func (s *PostRecords) DeletePostRecords(ctx context.Context, req *sluicev1.DeletePostRecordsRequest) (*sluicev1.DeletePostRecordsResponse, error) {
	for i, uri := range req.GetUris() {
		if _, err := aturi.ParseIn(uri, s.posts.Collection()); err != nil {
			return nil, toStatus("DeletePostRecords", &posts.InvalidURIError{Index: i, URI: uri, Err: err})
		}
	}
	n, err := s.writer.Delete(ctx, req.GetUris())
	if err != nil {
		return nil, toStatus("DeletePostRecords", err)
	}
	return &sluicev1.DeletePostRecordsResponse{Deleted: uint32(n)}, nil
}

// Status maps an error of the read path (package posts) to the gRPC
// status method answers with. Other services over the same read path
// (package bskyrpc) use it, so the mapping stays in one place.
func Status(method string, err error) error { return toStatus(method, err) }

// toStatus maps the read path's errors to gRPC status codes. It is the
// only such mapping in sluice besides the guard's own refusals.
func toStatus(method string, err error) error {
	var badURI *posts.InvalidURIError
	var badRecord *posts.InvalidRecordError
	switch {
	case errors.As(err, &badURI):
		return guard.InvalidArgument(fieldIndex("uris", badURI.Index), method+": "+badURI.Error())
	case errors.As(err, &badRecord):
		return guard.InvalidArgument(fieldIndex("records", badRecord.Index), method+": "+badRecord.Error()+"; nothing in this batch was written")
	case errors.Is(err, store.ErrInvalid):
		return status.Errorf(codes.InvalidArgument, "%s: %v; nothing in this batch was written", method, err)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "%s: deadline exceeded: %v", method, err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "%s: canceled: %v", method, err)
	case errors.Is(err, store.ErrUnavailable):
		return status.Errorf(codes.Unavailable, "%s: the record store is unavailable: %v; cached records are still served, retry the rest with backoff", method, err)
	}
	return status.Errorf(codes.Internal, "%s: %v", method, err)
}

func fieldIndex(field string, i int) string {
	return fmt.Sprintf("%s[%d]", field, i)
}
