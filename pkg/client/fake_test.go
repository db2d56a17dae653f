package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// fakeConn answers the Client's calls in process: GetLimits from limits,
// GetPostRecords from get (or found records for every URI).
type fakeConn struct {
	mu         sync.Mutex
	limits     *sluicev1.GetLimitsResponse
	limitCalls atomic.Int64
	get        func(ctx context.Context, uris []string) error
}

func fakeLimits(maxItems, burst, inflight uint32, perSecond float64) *sluicev1.GetLimitsResponse {
	return &sluicev1.GetLimitsResponse{
		Methods: []*sluicev1.MethodLimits{{Method: getPostRecords, MaxItems: maxItems, MaxUriLength: 512}},
		Budget:  &sluicev1.ClientBudget{Client: "fake", ItemsPerSecond: perSecond, Burst: burst, MaxInflightItems: inflight},
	}
}

func (f *fakeConn) setLimits(l *sluicev1.GetLimitsResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limits = l
}

func (f *fakeConn) Invoke(ctx context.Context, method string, args, reply any, _ ...grpc.CallOption) error {
	switch method {
	case sluicev1.PostRecords_GetLimits_FullMethodName:
		f.limitCalls.Add(1)
		f.mu.Lock()
		defer f.mu.Unlock()
		proto.Merge(reply.(proto.Message), f.limits)
		return nil
	case sluicev1.PostRecords_GetPostRecords_FullMethodName:
		uris := args.(*sluicev1.GetPostRecordsRequest).GetUris()
		if f.get != nil {
			if err := f.get(ctx, uris); err != nil {
				return err
			}
		}
		resp := reply.(*sluicev1.GetPostRecordsResponse)
		for _, u := range uris {
			resp.Records = append(resp.Records, &sluicev1.PostRecord{Uri: u, Found: true})
		}
		return nil
	}
	return status.Errorf(codes.Unimplemented, "fake: %s", method)
}

func (f *fakeConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("fake: no streams")
}

func fakeClient(t *testing.T, f *fakeConn, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, f, "fake", append([]Option{WithRandSeed(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func fakeURIs(n int) []string {
	uris := make([]string, n)
	for i := range uris {
		uris[i] = fmt.Sprintf("at://did:plc:fake/app.bsky.feed.post/%d", i)
	}
	return uris
}

func checkAligned(t *testing.T, records []*sluicev1.PostRecord, uris []string) {
	t.Helper()
	if len(records) != len(uris) {
		t.Errorf("%d records for %d uris", len(records), len(uris))
		return
	}
	for i, r := range records {
		if r.GetUri() != uris[i] {
			t.Errorf("records[%d] = %s, want %s", i, r.GetUri(), uris[i])
			return
		}
	}
}

// ageLimits makes the limits in force look fetched d earlier.
func (c *Client) ageLimits(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fetched = c.fetched.Add(-d)
}
