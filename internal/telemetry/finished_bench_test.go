package telemetry

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/posts"
	"google.golang.org/grpc/codes"
)

// BenchmarkRecordRequest is what one served request costs the request
// metrics: Finished (count, latency, batch size) and RecordItems.
func BenchmarkRecordRequest(b *testing.B) {
	_, r := newRequests(b, "feed")
	ctx := context.Background()
	req := guard.Request{Client: "feed", Method: "/sluice.v1.PostRecords/GetPostRecord", Items: 1}
	for b.Loop() {
		r.Finished(ctx, req, codes.OK, time.Millisecond)
		r.RecordItems(ctx, "GetPostRecord", posts.Counts{FromCache: 1})
	}
}
