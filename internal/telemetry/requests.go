package telemetry

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
var RejectionReasons = rejectionReasons[:]

// rejectionReasons is RejectionReasons as an array, whose length sizes the
// per-reason counters.
var rejectionReasons = [...]string{guard.ReasonShape, guard.ReasonQuota, guard.ReasonOverload, guard.ReasonDeadline, guard.ReasonIdentity, guard.ReasonMemory, guard.ReasonMemoryShare}

// rejectionCodes is the gRPC code a rejection is answered with, by reason.
var rejectionCodes = map[string]codes.Code{
	guard.ReasonShape:    codes.InvalidArgument,
	guard.ReasonQuota:    codes.ResourceExhausted,
	guard.ReasonOverload: codes.Unavailable,
	guard.ReasonDeadline: codes.DeadlineExceeded,
	guard.ReasonIdentity: codes.PermissionDenied,
	// Refused at the stream's start, before the body was read.
	guard.ReasonMemory:      codes.Unavailable,
	guard.ReasonMemoryShare: codes.ResourceExhausted,
}

// Requests records per-client request metrics and feeds the per-client
// aggregator (Telemetry.Clients). It implements guard.Observer and
// rpc.ItemRecorder.
//
// The attribute sets of a (client label, method) pair are built once, the
// first time the pair is seen, with one set per gRPC code, rejection
// reason and item source; a request then records with sets it looks up,
// and builds none. The pairs are bounded: client labels by the configured
// client list (Telemetry.ClientLabel), methods by the registered services.
type Requests struct {
	t             *Telemetry
	slowAfter     time.Duration // the latency objective's threshold
	series        sync.Map      // seriesKey → *series
	requests      metric.Int64Counter
	slow          metric.Int64Counter
	duration      metric.Float64Histogram
	batchSize     metric.Int64Histogram
	rejections    metric.Int64Counter
	rejectedItems metric.Int64Counter
	items         metric.Int64Counter
}

// seriesKey names one (client label, method) pair.
type seriesKey struct{ client, method string }

// series holds the precomputed measurement options of one pair.
type series struct {
	base    options                   // client, service, method
	reasons map[string]options        // + reason, for every RejectionReasons and Other
	sources [len(sourceNames)]options // + source: cache, store, not_found, invalid
	codes   [codeCount]atomic.Pointer[options]
	attrs   []attribute.KeyValue
}

// options is one attribute set as the option lists that Add and Record
// take. Passing a list built once, rather than one option, spares each
// measurement the allocation of its variadic list.
type options struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

func optionsOf(attrs ...attribute.KeyValue) options {
	o := metric.WithAttributeSet(attribute.NewSet(attrs...))
	return options{add: []metric.AddOption{o}, record: []metric.RecordOption{o}}
}

// codeCount bounds the gRPC codes kept precomputed (codes.Unauthenticated
// is the last, 16); any other code builds its set per request.
const codeCount = 17

var sourceNames = [...]string{"cache", "store", "not_found", "invalid"}

// NewRequests creates the request instruments; successful requests
// slower than slo.Latency.Threshold are also counted as slow.
func (t *Telemetry) NewRequests(slo SLO) (*Requests, error) {
	m := t.meter
	r := &Requests{t: t, slowAfter: slo.Latency.Threshold}
	var err error
	if r.requests, err = m.Int64Counter("sluice.requests",
		metric.WithDescription("Requests finished, by client, method and gRPC code.")); err != nil {
		return nil, err
	}
	if r.slow, err = m.Int64Counter("sluice.requests.slow",
		metric.WithDescription("Successful requests slower than the latency objective's threshold (slo.latency.threshold), by client and method.")); err != nil {
		return nil, err
	}
	if r.duration, err = m.Float64Histogram("sluice.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Request latency from admission check to response, by client and method."),
		metric.WithExplicitBucketBoundaries(latencyBounds[:]...)); err != nil {
		return nil, err
	}
	if r.batchSize, err = m.Int64Histogram("sluice.request.items",
		metric.WithDescription("Items (URIs) per request, including rejected ones, by client and method."),
		metric.WithExplicitBucketBoundaries(1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 20000)); err != nil {
		return nil, err
	}
	if r.rejections, err = m.Int64Counter("sluice.rejections",
		metric.WithDescription("Requests refused before work started, by client, method and reason (shape, quota, overload, deadline, identity, memory, memory_share).")); err != nil {
		return nil, err
	}
	if r.rejectedItems, err = m.Int64Counter("sluice.rejected.items",
		metric.WithDescription("Items (URIs) of the requests refused before work started, by client, method and reason.")); err != nil {
		return nil, err
	}
	if r.items, err = m.Int64Counter("sluice.items",
		metric.WithDescription("Items answered, by client, method and source (cache, store, not_found, invalid).")); err != nil {
		return nil, err
	}
	return r, nil
}

// seriesOf returns the pair's series for a request by client, service
// ("sluice.v1.PostRecords", "bsky.Service") and bare method name, from its
// full method "/pkg.Svc/M" (two services may both have a GetPostRecords),
// creating the zero series of every rejection reason the first time the
// pair is seen.
func (r *Requests) seriesOf(ctx context.Context, client, fullMethod string) *series {
	key := seriesKey{r.t.ClientLabel(client), fullMethod}
	if v, ok := r.series.Load(key); ok {
		return v.(*series)
	}
	se := newSeries(key)
	v, loaded := r.series.LoadOrStore(key, se)
	if !loaded {
		for _, reason := range RejectionReasons {
			r.rejections.Add(ctx, 0, se.reasons[reason].add...)
			r.rejectedItems.Add(ctx, 0, se.reasons[reason].add...)
		}
		r.slow.Add(ctx, 0, se.base.add...)
	}
	return v.(*series)
}

func newSeries(key seriesKey) *series {
	attrs := []attribute.KeyValue{
		attribute.String("client", key.client),
		attribute.String("service", serviceOf(key.method)),
		attribute.String("method", shortMethod(key.method)),
	}
	with := func(kv attribute.KeyValue) options {
		return optionsOf(append(slices.Clip(attrs), kv)...)
	}
	se := &series{base: optionsOf(attrs...), reasons: map[string]options{}, attrs: attrs}
	for _, reason := range append(slices.Clip(RejectionReasons), Other) {
		se.reasons[reason] = with(attribute.String("reason", reason))
	}
	for i, src := range sourceNames {
		se.sources[i] = with(attribute.String("source", src))
	}
	return se
}

// code returns the option of the pair with code c, building it once.
func (se *series) code(c codes.Code) options {
	if int(c) >= codeCount {
		return optionsOf(append(slices.Clip(se.attrs), attribute.String("code", c.String()))...)
	}
	if p := se.codes[c].Load(); p != nil {
		return *p
	}
	opt := optionsOf(append(slices.Clip(se.attrs), attribute.String("code", c.String()))...)
	se.codes[c].Store(&opt)
	return opt
}

// Rejected implements guard.Observer.
func (r *Requests) Rejected(ctx context.Context, req guard.Request, reason string) {
	se := r.seriesOf(ctx, req.Client, req.Method)
	code, ok := rejectionCodes[reason]
	if !ok {
		reason, code = Other, codes.Unavailable
	}
	r.batchSize.Record(ctx, int64(req.Items), se.base.record...)
	r.rejections.Add(ctx, 1, se.reasons[reason].add...)
	r.rejectedItems.Add(ctx, int64(req.Items), se.reasons[reason].add...)
	r.requests.Add(ctx, 1, se.code(code).add...)
	r.t.stats.rejected(req.Client, req.Items, reason)
}

// Finished implements guard.Observer.
func (r *Requests) Finished(ctx context.Context, req guard.Request, code codes.Code, elapsed time.Duration) {
	se := r.seriesOf(ctx, req.Client, req.Method)
	r.batchSize.Record(ctx, int64(req.Items), se.base.record...)
	r.duration.Record(ctx, elapsed.Seconds(), se.base.record...)
	r.requests.Add(ctx, 1, se.code(code).add...)
	if code == codes.OK && r.slowAfter > 0 && elapsed > r.slowAfter {
		r.slow.Add(ctx, 1, se.base.add...)
	}
	r.t.stats.finished(req.Client, req.Items, code != codes.OK, elapsed)
}

// RecordItems implements rpc.ItemRecorder.
func (r *Requests) RecordItems(ctx context.Context, method string, c posts.Counts) {
	client := identity.Client(ctx)
	full, ok := grpc.Method(ctx)
	if !ok || shortMethod(full) != method {
		full = method
	}
	se := r.seriesOf(ctx, client, full)
	r.t.stats.served(client, c.FromCache, c.FromStore, c.NotFound+c.Invalid)
	for i, n := range [len(sourceNames)]int{c.FromCache, c.FromStore, c.NotFound, c.Invalid} {
		if n > 0 {
			r.items.Add(ctx, int64(n), se.sources[i].add...)
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
