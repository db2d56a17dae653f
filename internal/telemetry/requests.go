package telemetry

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/identity"
	"github.com/sluice-dev/sluice/internal/posts"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// RejectionReasons is the fixed set of values of the reason label; a
// reason outside it is counted as "other". Every reason gets a series (at
// zero) as soon as a client calls a method, so dashboards and alerts see
// a flat line instead of no data.
var RejectionReasons = []string{guard.ReasonShape, guard.ReasonQuota, guard.ReasonOverload, guard.ReasonDeadline, guard.ReasonIdentity}

// rejectionCodes is the gRPC code a rejection is answered with, by reason.
var rejectionCodes = map[string]codes.Code{
	guard.ReasonShape:    codes.InvalidArgument,
	guard.ReasonQuota:    codes.ResourceExhausted,
	guard.ReasonOverload: codes.Unavailable,
	guard.ReasonDeadline: codes.DeadlineExceeded,
	guard.ReasonIdentity: codes.PermissionDenied,
}

// Requests records per-client request metrics and feeds the per-client
// aggregator (Telemetry.Clients). It implements guard.Observer and
// rpc.ItemRecorder.
type Requests struct {
	t          *Telemetry
	seen       sync.Map // attribute.Set of client and method → struct{}: reasons initialised
	requests   metric.Int64Counter
	duration   metric.Float64Histogram
	batchSize  metric.Int64Histogram
	rejections metric.Int64Counter
	items      metric.Int64Counter
}

// NewRequests creates the request instruments.
func (t *Telemetry) NewRequests() (*Requests, error) {
	m := t.meter
	r := &Requests{t: t}
	var err error
	if r.requests, err = m.Int64Counter("sluice.requests",
		metric.WithDescription("Requests finished, by client, method and gRPC code.")); err != nil {
		return nil, err
	}
	if r.duration, err = m.Float64Histogram("sluice.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Request latency from admission check to response, by client and method."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)); err != nil {
		return nil, err
	}
	if r.batchSize, err = m.Int64Histogram("sluice.request.items",
		metric.WithDescription("Items (URIs) per request, including rejected ones, by client and method."),
		metric.WithExplicitBucketBoundaries(1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 20000)); err != nil {
		return nil, err
	}
	if r.rejections, err = m.Int64Counter("sluice.rejections",
		metric.WithDescription("Requests refused before work started, by client, method and reason (shape, quota, overload, deadline, identity).")); err != nil {
		return nil, err
	}
	if r.items, err = m.Int64Counter("sluice.items",
		metric.WithDescription("Items answered, by client, method and source (cache, store, not_found, invalid).")); err != nil {
		return nil, err
	}
	return r, nil
}

// attrs labels a request by client, service ("sluice.v1.PostRecords",
// "bsky.Service") and bare method name, from its full method
// "/pkg.Svc/M" (two services may both have a GetPostRecords), creating
// the zero series of every rejection reason the first time it is seen.
func (r *Requests) attrs(ctx context.Context, client, fullMethod string) attribute.Set {
	set := attribute.NewSet(
		attribute.String("client", r.t.ClientLabel(client)),
		attribute.String("service", serviceOf(fullMethod)),
		attribute.String("method", shortMethod(fullMethod)),
	)
	if _, loaded := r.seen.LoadOrStore(set, struct{}{}); !loaded {
		for _, reason := range RejectionReasons {
			r.rejections.Add(ctx, 0, metric.WithAttributeSet(set), metric.WithAttributes(attribute.String("reason", reason)))
		}
	}
	return set
}

// Rejected implements guard.Observer.
func (r *Requests) Rejected(ctx context.Context, req guard.Request, reason string) {
	set := r.attrs(ctx, req.Client, req.Method)
	code, ok := rejectionCodes[reason]
	if !ok {
		reason, code = Other, codes.Unavailable
	}
	r.batchSize.Record(ctx, int64(req.Items), metric.WithAttributeSet(set))
	r.rejections.Add(ctx, 1, metric.WithAttributeSet(set), metric.WithAttributes(attribute.String("reason", reason)))
	r.requests.Add(ctx, 1, metric.WithAttributeSet(set), metric.WithAttributes(attribute.String("code", code.String())))
	r.t.stats.rejected(req.Client, req.Items)
}

// Finished implements guard.Observer.
func (r *Requests) Finished(ctx context.Context, req guard.Request, code codes.Code, elapsed time.Duration) {
	set := r.attrs(ctx, req.Client, req.Method)
	r.batchSize.Record(ctx, int64(req.Items), metric.WithAttributeSet(set))
	r.duration.Record(ctx, elapsed.Seconds(), metric.WithAttributeSet(set))
	r.requests.Add(ctx, 1, metric.WithAttributeSet(set), metric.WithAttributes(attribute.String("code", code.String())))
	r.t.stats.finished(req.Client, req.Items, code != codes.OK, elapsed)
}

// RecordItems implements rpc.ItemRecorder.
func (r *Requests) RecordItems(ctx context.Context, method string, c posts.Counts) {
	client := identity.Client(ctx)
	full, ok := grpc.Method(ctx)
	if !ok || shortMethod(full) != method {
		full = method
	}
	set := r.attrs(ctx, client, full)
	r.t.stats.served(client, c.FromCache, c.FromStore, c.NotFound+c.Invalid)
	for source, n := range map[string]int{"cache": c.FromCache, "store": c.FromStore, "not_found": c.NotFound, "invalid": c.Invalid} {
		if n > 0 {
			r.items.Add(ctx, int64(n), metric.WithAttributeSet(set), metric.WithAttributes(attribute.String("source", source)))
		}
	}
}

func shortMethod(full string) string { return full[strings.LastIndexByte(full, '/')+1:] }

// serviceOf is the service of a full method, "" when it names none.
func serviceOf(full string) string {
	svc, _, ok := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	if !ok {
		return ""
	}
	return svc
}
