package telemetry

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
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
//
// The four measurements every request makes (its count by code, latency,
// batch size and items by source) are Prometheus collectors registered
// beside the OpenTelemetry exporter, each series resolved once per pair:
// an OpenTelemetry measurement, even with its attribute set built, has
// the SDK find the set's series again, and the four took 0.9 µs a request
// against 0.3 µs now (BenchmarkRecordRequest). They are exported under
// the names, labels and buckets the exporter gave them. The rarer ones
// (rejections, slow requests) stay OpenTelemetry instruments.
type Requests struct {
	t             *Telemetry
	slowAfter     time.Duration // the latency objective's threshold
	series        sync.Map      // seriesKey → *series
	requests      *prometheus.CounterVec
	slow          metric.Int64Counter
	duration      *prometheus.HistogramVec
	batchSize     *prometheus.HistogramVec
	rejections    metric.Int64Counter
	rejectedItems metric.Int64Counter
	items         *prometheus.CounterVec
}

// seriesKey names one (client label, method) pair.
type seriesKey struct{ client, method string }

// series holds the precomputed measurement options of one pair, and its
// Prometheus series, each resolved the first time it is recorded (so a
// series appears when it has something to show, as the exporter's do).
type series struct {
	base    options            // client, service, method
	reasons map[string]options // + reason, for every RejectionReasons and Other
	labels  []string           // client, service, method

	duration, batchSize lazy[prometheus.Observer]
	sources             [len(sourceNames)]lazy[prometheus.Counter] // cache, store, not_found, invalid
	codes               [codeCount]lazy[prometheus.Counter]
}

// lazy is a series resolved on first use. Two first uses at once may
// both resolve it; they get the same series from its vector.
type lazy[T any] struct{ p atomic.Pointer[T] }

func (l *lazy[T]) get(resolve func() T) T {
	if p := l.p.Load(); p != nil {
		return *p
	}
	v := resolve()
	l.p.Store(&v)
	return v
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

// codeCount bounds the gRPC codes kept resolved (codes.Unauthenticated
// is the last, 16); any other code looks its series up per request.
const codeCount = 17

var sourceNames = [...]string{"cache", "store", "not_found", "invalid"}

// NewRequests creates the request instruments; successful requests
// slower than slo.Latency.Threshold are also counted as slow. It may be
// called once per Telemetry: the collectors it registers are unique.
func (t *Telemetry) NewRequests(slo SLO) (*Requests, error) {
	m := t.meter
	r := &Requests{t: t, slowAfter: slo.Latency.Threshold}
	pair := []string{"client", "service", "method"}
	r.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_requests_total",
		Help: "Requests finished, by client, method and gRPC code."}, append(slices.Clip(pair), "code"))
	r.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_request_duration_seconds",
		Help:    "Request latency from admission check to response, by client and method.",
		Buckets: latencyBounds[:]}, pair)
	r.batchSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_request_items",
		Help:    "Items (URIs) per request, including rejected ones, by client and method.",
		Buckets: []float64{1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 20000}}, pair)
	r.items = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_items_total",
		Help: "Items answered, by client, method and source (cache, store, not_found, invalid)."}, append(slices.Clip(pair), "source"))
	for _, c := range []prometheus.Collector{r.requests, r.duration, r.batchSize, r.items} {
		if err := t.registry.Register(c); err != nil {
			return nil, fmt.Errorf("telemetry: request metrics: %w", err)
		}
	}
	var err error
	if r.slow, err = m.Int64Counter("sluice.requests.slow",
		metric.WithDescription("Successful requests slower than the latency objective's threshold (slo.latency.threshold), by client and method.")); err != nil {
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
	return r, nil
}

// seriesOf returns the pair's series for a request by client, service
// ("sluice.v1.PostRecords", "bsky.Service") and bare method name, from its
// full method "/pkg.Svc/M" (two services may both have a GetPostRecords),
// creating the zero series of every rejection reason the first time the
// pair is seen.
func (r *Requests) seriesOf(ctx context.Context, client, fullMethod string) *series {
	if !utf8.ValidString(fullMethod) {
		// Not a label value Prometheus accepts; the guard reports paths
		// it does not serve as guard.UnknownMethod, so none comes here.
		fullMethod = guard.UnknownMethod
	}
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
	labels := []string{key.client, serviceOf(key.method), shortMethod(key.method)}
	attrs := []attribute.KeyValue{
		attribute.String("client", labels[0]),
		attribute.String("service", labels[1]),
		attribute.String("method", labels[2]),
	}
	with := func(kv attribute.KeyValue) options {
		return optionsOf(append(slices.Clip(attrs), kv)...)
	}
	se := &series{base: optionsOf(attrs...), reasons: map[string]options{}, labels: labels}
	for _, reason := range append(slices.Clip(RejectionReasons), Other) {
		se.reasons[reason] = with(attribute.String("reason", reason))
	}
	return se
}

// code returns the pair's request counter for code c, resolving it once.
func (r *Requests) code(se *series, c codes.Code) prometheus.Counter {
	resolve := func() prometheus.Counter {
		return r.requests.WithLabelValues(append(slices.Clip(se.labels), c.String())...)
	}
	if int(c) >= codeCount {
		return resolve()
	}
	return se.codes[c].get(resolve)
}

// observeItems records a request's batch size on its pair.
func (r *Requests) observeItems(se *series, items int) {
	se.batchSize.get(func() prometheus.Observer { return r.batchSize.WithLabelValues(se.labels...) }).Observe(float64(items))
}

// source returns the pair's counter of items answered from source i of
// sourceNames.
func (r *Requests) source(se *series, i int) prometheus.Counter {
	return se.sources[i].get(func() prometheus.Counter {
		return r.items.WithLabelValues(append(slices.Clip(se.labels), sourceNames[i])...)
	})
}

// Rejected implements guard.Observer.
func (r *Requests) Rejected(ctx context.Context, req guard.Request, reason string) {
	se := r.seriesOf(ctx, req.Client, req.Method)
	code, ok := rejectionCodes[reason]
	if !ok {
		reason, code = Other, codes.Unavailable
	}
	if req.Items > 0 { // 0: refused before its request was read (memory, identity, receive timeout)
		r.observeItems(se, req.Items)
	}
	r.rejections.Add(ctx, 1, se.reasons[reason].add...)
	r.rejectedItems.Add(ctx, int64(req.Items), se.reasons[reason].add...)
	r.code(se, code).Inc()
	r.t.stats.rejected(req.Client, req.Items, reason)
}

// Finished implements guard.Observer.
func (r *Requests) Finished(ctx context.Context, req guard.Request, code codes.Code, elapsed time.Duration) {
	se := r.seriesOf(ctx, req.Client, req.Method)
	r.observeItems(se, req.Items)
	se.duration.get(func() prometheus.Observer { return r.duration.WithLabelValues(se.labels...) }).Observe(elapsed.Seconds())
	r.code(se, code).Inc()
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
			r.source(se, i).Add(float64(n))
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
