package rpc

import (
	"context"
	"errors"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/records"
	"github.com/sluice-dev/sluice/internal/store"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Records serves sluice.v1.Records, the write path of every collection
// bsky.Service reads.
type Records struct {
	sluicev1.UnimplementedRecordsServer
	w *records.Writer
}

// NewRecords returns the service over w.
func NewRecords(w *records.Writer) *Records { return &Records{w: w} }

// RecordsPolicies returns the policy of every sluice.v1.Records method:
// the batch policy of the post writes.
func RecordsPolicies() map[string]guard.Policy {
	batch := guard.DefaultPolicy()
	svc := sluicev1.Records_ServiceDesc.ServiceName
	return map[string]guard.Policy{
		svc + "/PutRecords":      batch,
		svc + "/DeleteRecords":   batch,
		svc + "/UpdateTakedowns": batch,
	}
}

// PutRecords writes a batch; an invalid record fails it before any write.
func (s *Records) PutRecords(ctx context.Context, req *sluicev1.PutRecordsRequest) (*sluicev1.PutRecordsResponse, error) {
	recs := make([]store.Record, len(req.GetRecords()))
	for i, r := range req.GetRecords() {
		recs[i] = store.Record{
			URI: r.GetUri(), CID: r.GetCid(), JSON: r.GetRecord(),
			CreatedAt: asTime(r.GetCreatedAt()), IndexedAt: asTime(r.GetIndexedAt()),
			TakedownRef: r.GetTakedownRef(), Tags: r.GetTags(),
		}
	}
	n, err := s.w.Put(ctx, recs)
	if err != nil {
		return nil, toStatus("PutRecords", err)
	}
	return &sluicev1.PutRecordsResponse{Written: uint32(n)}, nil
}

// DeleteRecords deletes a batch; missing URIs are not an error.
func (s *Records) DeleteRecords(ctx context.Context, req *sluicev1.DeleteRecordsRequest) (*sluicev1.DeleteRecordsResponse, error) {
	n, err := s.w.Delete(ctx, req.GetUris())
	if err != nil {
		return nil, toStatus("DeleteRecords", err)
	}
	return &sluicev1.DeleteRecordsResponse{Deleted: uint32(n)}, nil
}

// UpdateTakedowns sets or lifts takedowns of stored records.
func (s *Records) UpdateTakedowns(ctx context.Context, req *sluicev1.UpdateTakedownsRequest) (*sluicev1.UpdateTakedownsResponse, error) {
	tds := make([]records.Takedown, len(req.GetTakedowns()))
	for i, td := range req.GetTakedowns() {
		tds[i] = records.Takedown{URI: td.GetUri(), TakedownRef: td.GetTakedownRef()}
	}
	n, err := s.w.UpdateTakedowns(ctx, tds)
	var bad *records.InvalidTakedownError
	switch {
	case errors.As(err, &bad):
		return nil, guard.InvalidArgument(fieldIndex("takedowns", bad.Index), "UpdateTakedowns: "+bad.Error()+"; none of this request's takedowns was applied")
	case err != nil:
		return nil, toStatus("UpdateTakedowns", err)
	}
	return &sluicev1.UpdateTakedownsResponse{Updated: uint32(n)}, nil
}

func asTime(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}
