package telemetry

import (
	"context"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/identity"
	"github.com/sluice-dev/sluice/internal/posts"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
)

// Requests records per-client request metrics. It implements
// guard.Observer and rpc.ItemRecorder.
type Requests struct {
	t          *Telemetry
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
		metric.WithDescription("Requests refused before work started, by client, method and reason (shape, overload, deadline).")); err != nil {
		return nil, err
	}
	if r.items, err = m.Int64Counter("sluice.items",
		metric.WithDescription("Items answered, by client, method and source (cache, store, not_found).")); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Requests) attrs(client, method string) attribute.Set {
	return attribute.NewSet(
		attribute.String("client", r.t.ClientLabel(client)),
		attribute.String("method", method),
	)
}

// Rejected implements guard.Observer.
func (r *Requests) Rejected(ctx context.Context, req guard.Request, reason string) {
	m := shortMethod(req.Method)
	set := r.attrs(req.Client, m)
	r.batchSize.Record(ctx, int64(req.Items), metric.WithAttributeSet(set))
	r.rejections.Add(ctx, 1, metric.WithAttributeSet(set), metric.WithAttributes(attribute.String("reason", reason)))
	code := codes.Unavailable
	switch reason {
	case guard.ReasonShape:
		code = codes.InvalidArgument
	case guard.ReasonIdentity:
		code = codes.PermissionDenied
	}
	r.requests.Add(ctx, 1, metric.WithAttributeSet(set), metric.WithAttributes(attribute.String("code", code.String())))
}

// Finished implements guard.Observer.
func (r *Requests) Finished(ctx context.Context, req guard.Request, code codes.Code, elapsed time.Duration) {
	set := r.attrs(req.Client, shortMethod(req.Method))
	r.batchSize.Record(ctx, int64(req.Items), metric.WithAttributeSet(set))
	r.duration.Record(ctx, elapsed.Seconds(), metric.WithAttributeSet(set))
	r.requests.Add(ctx, 1, metric.WithAttributeSet(set), metric.WithAttributes(attribute.String("code", code.String())))
}

// RecordItems implements rpc.ItemRecorder.
func (r *Requests) RecordItems(ctx context.Context, method string, c posts.Counts) {
	set := r.attrs(identity.Client(ctx), method)
	for source, n := range map[string]int{"cache": c.FromCache, "store": c.FromStore, "not_found": c.NotFound} {
		if n > 0 {
			r.items.Add(ctx, int64(n), metric.WithAttributeSet(set), metric.WithAttributes(attribute.String("source", source)))
		}
	}
}

func shortMethod(full string) string { return full[strings.LastIndexByte(full, '/')+1:] }
