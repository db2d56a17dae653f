package posts

import (
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/spans"
)

// Option adjusts a Service's instrumentation; it changes no behaviour.
type Option func(*options)

type options struct {
	tracer          spans.Tracer
	log             *slog.Logger
	afterStoreWrite func(uris []string)
	refused         func(collection string, n int)
}

const tracerName = "github.com/sluice-dev/sluice/internal/posts"

func defaultOptions() options {
	return options{log: slog.New(slog.DiscardHandler), afterStoreWrite: func([]string) {}, refused: func(string, int) {}}
}

// WithTracerProvider gives each read a span (posts.Get: client, batch
// size, unique URIs, cache hits) with a child span for its store reads
// (store.read: URIs read, found, failed). Default: no spans.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracer = spans.New(tp, tracerName) }
}

// WithLogger logs failed store reads and writes (component=store) and
// failed cache invalidations (component=cache, kind=invalidate) at error
// level. They can happen on every request during an outage, so the
// logger must rate-limit (telemetry.LogHandler does). Default: no logs.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.log = l }
}

// WithAfterStoreWrite calls fn with a write's URIs after the store
// acknowledged it and before its cache entries are invalidated: a test
// hook for the crash between the two. Default: nothing.
func WithAfterStoreWrite(fn func(uris []string)) Option {
	return func(o *options) { o.afterStoreWrite = fn }
}

// WithRefusedValues calls count with the number of cached values a read
// refused (checkWire: malformed, or naming another URI), by collection,
// for a metric; New calls it once with 0. Default: nothing.
func WithRefusedValues(count func(collection string, n int)) Option {
	return func(o *options) { o.refused = count }
}
