// Package peer is the benchmarks' bare peer: the minimal correct server of
// the sluice.v1.PostRecords read methods that a team would write without
// sluice. grpc-go and gomemcache, GetMulti in chunks of 100 keys under an
// errgroup of constant limit, the cached bytes copied straight into the
// response, and nothing else: no guard, no admission, no limits, no
// metrics, no traces, no store.
//
// It exists so that `make bench` can show what sluice's guard, metrics
// and near cache cost (or save) against the fastest honest alternative,
// side by side on one memcached. It shares no code with sluice's read
// path except the key format (cache.Key), so that both read the items
// sluice filled. A key memcached does not hold is answered found=false:
// the peer measures the hit path only, and the bench checks that every
// item it asked for was found.
//
// Nothing in cmd/sluice or internal/ imports it. Because it registers its
// service without a policy, it is the one package outside internal/guard
// that the structure rules let register one.
package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/cache"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// ChunkKeys is the number of keys per memcached get.
const ChunkKeys = 100

// ParallelGets bounds the gets one request runs at once.
const ParallelGets = 8

// Service serves GetPostRecords and GetPostRecord from memcached.
type Service struct {
	sluicev1.UnimplementedPostRecordsServer
	mc *memcache.Client
}

// New returns a Service reading the memcached at addr through a
// gomemcache client whose idle pool holds maxIdle connections.
func New(addr string, maxIdle int) *Service {
	mc := memcache.New(addr)
	mc.MaxIdleConns = maxIdle
	mc.Timeout = time.Second
	return &Service{mc: mc}
}

// NewServer returns a plain gRPC server serving svc.
func NewServer(svc *Service) *grpc.Server {
	srv := grpc.NewServer()
	sluicev1.RegisterPostRecordsServer(srv, svc)
	return srv
}

// GetPostRecords answers a batch, aligned with the request. The response
// is the cached PostRecord encodings framed as its records field, carried
// as the message's unknown fields so that protobuf writes them verbatim.
func (s *Service) GetPostRecords(ctx context.Context, req *sluicev1.GetPostRecordsRequest) (*sluicev1.GetPostRecordsResponse, error) {
	uris := req.GetUris()
	items, err := s.getMulti(ctx, uris)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "GetPostRecords: memcached: %v", err)
	}
	size := 0
	for _, it := range items {
		size += len(it.Value) + 8
	}
	buf := make([]byte, 0, size+len(uris)*64)
	for _, uri := range uris {
		if it, ok := items[cache.Key(uri)]; ok {
			buf = protowire.AppendTag(buf, 1, protowire.BytesType)
			buf = protowire.AppendBytes(buf, it.Value)
			continue
		}
		buf = protowire.AppendTag(buf, 1, protowire.BytesType)
		buf = protowire.AppendBytes(buf, notFound(uri))
	}
	resp := &sluicev1.GetPostRecordsResponse{}
	resp.ProtoReflect().SetUnknown(buf)
	return resp, nil
}

// GetPostRecord answers one URI.
func (s *Service) GetPostRecord(_ context.Context, req *sluicev1.GetPostRecordRequest) (*sluicev1.PostRecord, error) {
	it, err := s.mc.Get(cache.Key(req.GetUri()))
	rec := &sluicev1.PostRecord{}
	switch {
	case err == memcache.ErrCacheMiss:
		rec.Uri = req.GetUri()
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "GetPostRecord: memcached: %v", err)
	default:
		rec.ProtoReflect().SetUnknown(it.Value)
	}
	return rec, nil
}

// getMulti reads the keys of uris in chunks of ChunkKeys, ParallelGets at
// a time.
func (s *Service) getMulti(ctx context.Context, uris []string) (map[string]*memcache.Item, error) {
	keys := make([]string, len(uris))
	for i, u := range uris {
		keys[i] = cache.Key(u)
	}
	chunks := (len(keys) + ChunkKeys - 1) / ChunkKeys
	found := make([]map[string]*memcache.Item, chunks)
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(ParallelGets)
	for c := range chunks {
		g.Go(func() error {
			var err error
			found[c], err = s.mc.GetMulti(keys[c*ChunkKeys : min((c+1)*ChunkKeys, len(keys))])
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("get %d keys: %w", len(keys), err)
	}
	if chunks == 1 {
		return found[0], nil
	}
	out := make(map[string]*memcache.Item, len(keys))
	for _, m := range found {
		for k, it := range m {
			out[k] = it
		}
	}
	return out, nil
}

// notFound is the encoding of a PostRecord with only its URI set.
func notFound(uri string) []byte {
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendString(b, uri)
}
