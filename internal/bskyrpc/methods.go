package bskyrpc

import (
	"context"

	"github.com/sluice-dev/sluice/api/bsky"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/opthread"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/rpc"
)

// The served methods, one line of translation each over records.

// GetPostRecords answers posts with their meta, both aligned with the
// request.
func (s *Service) GetPostRecords(ctx context.Context, req *bsky.GetPostRecordsRequest) (*bsky.GetPostRecordsResponse, error) {
	found, err := s.read(ctx, "GetPostRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	recs := make([]*bsky.Record, len(found))
	meta := make([]*bsky.PostRecordMeta, len(found))
	for i, r := range found {
		recs[i] = toRecord(r)
		meta[i] = PostMeta(r.Record.JSON)
		g := r.Record.Gates
		meta[i].HasThreadGate, meta[i].HasPostGate = g.HasThreadGate, g.HasPostGate
		meta[i].ViolatesThreadGate, meta[i].ViolatesEmbeddingRules = g.ViolatesThreadGate, g.ViolatesEmbeddingRules
	}
	resp := &bsky.GetPostRecordsResponse{Records: recs, Meta: meta}
	if req.GetIncludeOpThreadMetadata() {
		if resp.OpThreads, err = s.opThreads(ctx, found); err != nil {
			return nil, rpc.Status("GetPostRecords", err)
		}
	}
	return resp, nil
}

// opThreads resolves the OP thread of the thread of every found post (its
// reply root, or itself), from the threads' OP-reply indexes.
func (s *Service) opThreads(ctx context.Context, found []posts.Result) ([]*bsky.OpThread, error) {
	var roots, indexes []string
	seen := map[string]bool{}
	for _, r := range found {
		if !r.Found {
			continue
		}
		root := opthread.RootOf(r.Record.URI, r.Record.JSON)
		u, err := aturi.ParseIn(root, aturi.PostCollection)
		if err != nil || seen[root] {
			continue
		}
		seen[root] = true
		roots, indexes = append(roots, root), append(indexes, opthread.IndexOf(u))
	}
	if s.threads == nil || len(indexes) == 0 {
		return nil, nil
	}
	results, _, err := s.threads.Get(ctx, indexes)
	if err != nil {
		return nil, err
	}
	var out []*bsky.OpThread
	for i, r := range results {
		if !r.Found {
			continue
		}
		if chain := opthread.Resolve(roots[i], opthread.Decode(r.Record.JSON).Replies); chain != nil {
			out = append(out, &bsky.OpThread{RootUri: roots[i], Uris: chain})
		}
	}
	return out, nil
}

// GetBlockRecords answers app.bsky.graph.block records.
func (s *Service) GetBlockRecords(ctx context.Context, req *bsky.GetBlockRecordsRequest) (*bsky.GetBlockRecordsResponse, error) {
	recs, err := s.records(ctx, "GetBlockRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetBlockRecordsResponse{Records: recs}, nil
}

// GetFeedGeneratorRecords answers app.bsky.feed.generator records.
func (s *Service) GetFeedGeneratorRecords(ctx context.Context, req *bsky.GetFeedGeneratorRecordsRequest) (*bsky.GetFeedGeneratorRecordsResponse, error) {
	recs, err := s.records(ctx, "GetFeedGeneratorRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetFeedGeneratorRecordsResponse{Records: recs}, nil
}

// GetFollowRecords answers app.bsky.graph.follow records.
func (s *Service) GetFollowRecords(ctx context.Context, req *bsky.GetFollowRecordsRequest) (*bsky.GetFollowRecordsResponse, error) {
	recs, err := s.records(ctx, "GetFollowRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetFollowRecordsResponse{Records: recs}, nil
}

// GetLikeRecords answers app.bsky.feed.like records.
func (s *Service) GetLikeRecords(ctx context.Context, req *bsky.GetLikeRecordsRequest) (*bsky.GetLikeRecordsResponse, error) {
	recs, err := s.records(ctx, "GetLikeRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetLikeRecordsResponse{Records: recs}, nil
}

// GetListBlockRecords answers app.bsky.graph.listblock records.
func (s *Service) GetListBlockRecords(ctx context.Context, req *bsky.GetListBlockRecordsRequest) (*bsky.GetListBlockRecordsResponse, error) {
	recs, err := s.records(ctx, "GetListBlockRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetListBlockRecordsResponse{Records: recs}, nil
}

// GetListItemRecords answers app.bsky.graph.listitem records.
func (s *Service) GetListItemRecords(ctx context.Context, req *bsky.GetListItemRecordsRequest) (*bsky.GetListItemRecordsResponse, error) {
	recs, err := s.records(ctx, "GetListItemRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetListItemRecordsResponse{Records: recs}, nil
}

// GetListRecords answers app.bsky.graph.list records.
func (s *Service) GetListRecords(ctx context.Context, req *bsky.GetListRecordsRequest) (*bsky.GetListRecordsResponse, error) {
	recs, err := s.records(ctx, "GetListRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetListRecordsResponse{Records: recs}, nil
}

// GetProfileRecords answers app.bsky.actor.profile records.
func (s *Service) GetProfileRecords(ctx context.Context, req *bsky.GetProfileRecordsRequest) (*bsky.GetProfileRecordsResponse, error) {
	recs, err := s.records(ctx, "GetProfileRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetProfileRecordsResponse{Records: recs}, nil
}

// GetRepostRecords answers app.bsky.feed.repost records.
func (s *Service) GetRepostRecords(ctx context.Context, req *bsky.GetRepostRecordsRequest) (*bsky.GetRepostRecordsResponse, error) {
	recs, err := s.records(ctx, "GetRepostRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetRepostRecordsResponse{Records: recs}, nil
}

// GetThreadGateRecords answers app.bsky.feed.threadgate records.
func (s *Service) GetThreadGateRecords(ctx context.Context, req *bsky.GetThreadGateRecordsRequest) (*bsky.GetThreadGateRecordsResponse, error) {
	recs, err := s.records(ctx, "GetThreadGateRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetThreadGateRecordsResponse{Records: recs}, nil
}

// GetPostgateRecords answers app.bsky.feed.postgate records.
func (s *Service) GetPostgateRecords(ctx context.Context, req *bsky.GetPostgateRecordsRequest) (*bsky.GetPostgateRecordsResponse, error) {
	recs, err := s.records(ctx, "GetPostgateRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetPostgateRecordsResponse{Records: recs}, nil
}

// GetLabelerRecords answers app.bsky.labeler.service records.
func (s *Service) GetLabelerRecords(ctx context.Context, req *bsky.GetLabelerRecordsRequest) (*bsky.GetLabelerRecordsResponse, error) {
	recs, err := s.records(ctx, "GetLabelerRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetLabelerRecordsResponse{Records: recs}, nil
}

// GetActorChatDeclarationRecords answers chat.bsky.actor.declaration
// records.
func (s *Service) GetActorChatDeclarationRecords(ctx context.Context, req *bsky.GetActorChatDeclarationRecordsRequest) (*bsky.GetActorChatDeclarationRecordsResponse, error) {
	recs, err := s.records(ctx, "GetActorChatDeclarationRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetActorChatDeclarationRecordsResponse{Records: recs}, nil
}

// GetStarterPackRecords answers app.bsky.graph.starterpack records.
func (s *Service) GetStarterPackRecords(ctx context.Context, req *bsky.GetStarterPackRecordsRequest) (*bsky.GetStarterPackRecordsResponse, error) {
	recs, err := s.records(ctx, "GetStarterPackRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetStarterPackRecordsResponse{Records: recs}, nil
}

// GetNotificationDeclarationRecords answers app.bsky.notification.declaration records.
func (s *Service) GetNotificationDeclarationRecords(ctx context.Context, req *bsky.GetNotificationDeclarationRecordsRequest) (*bsky.GetNotificationDeclarationRecordsResponse, error) {
	recs, err := s.records(ctx, "GetNotificationDeclarationRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetNotificationDeclarationRecordsResponse{Records: recs}, nil
}

// GetGermDeclarationRecords answers com.germnetwork.declaration records.
func (s *Service) GetGermDeclarationRecords(ctx context.Context, req *bsky.GetGermDeclarationRecordsRequest) (*bsky.GetGermDeclarationRecordsResponse, error) {
	recs, err := s.records(ctx, "GetGermDeclarationRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetGermDeclarationRecordsResponse{Records: recs}, nil
}

// GetStatusRecords answers app.bsky.actor.status records.
func (s *Service) GetStatusRecords(ctx context.Context, req *bsky.GetStatusRecordsRequest) (*bsky.GetStatusRecordsResponse, error) {
	recs, err := s.records(ctx, "GetStatusRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetStatusRecordsResponse{Records: recs}, nil
}

// GetVerificationRecords answers app.bsky.graph.verification records.
func (s *Service) GetVerificationRecords(ctx context.Context, req *bsky.GetVerificationRecordsRequest) (*bsky.GetVerificationRecordsResponse, error) {
	recs, err := s.records(ctx, "GetVerificationRecords", req.GetUris())
	if err != nil {
		return nil, err
	}
	return &bsky.GetVerificationRecordsResponse{Records: recs}, nil
}
