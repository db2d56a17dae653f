// Package spans owns starting trace spans on the read path only when
// tracing is on. With the no-op provider (tracing off), a span costs a
// context value and its attribute list on every request for nothing; a
// Tracer from here then returns the caller's context as it is and builds
// no attributes.
package spans

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracer starts spans of one instrumentation scope, or none when tracing
// is off. The zero value is off.
type Tracer struct {
	tracer trace.Tracer // nil: tracing is off
}

// New returns a Tracer of tp named name; off when tp is nil or the no-op
// provider.
func New(tp trace.TracerProvider, name string) Tracer {
	if !On(tp) {
		return Tracer{}
	}
	return Tracer{tracer: tp.Tracer(name)}
}

// On reports whether tp records anything: false for nil and for the no-op
// provider that tracing off gives.
func On(tp trace.TracerProvider) bool {
	if tp == nil {
		return false
	}
	_, off := tp.(noop.TracerProvider)
	return !off
}

// offSpan is the span Start returns with tracing off: the shared no-op
// span, which records nothing. It is never the caller's own span, which
// belongs to whoever started it and must not be ended here.
var offSpan = trace.SpanFromContext(context.Background())

// Start starts a span of kind named name with the attributes attrs
// returns, a child of ctx's span. With tracing off it calls nothing and
// returns ctx as it is and a no-op span, so End and SetStatus on it are
// free; guard SetAttributes with span.IsRecording, since building its
// arguments is not.
func (t Tracer) Start(ctx context.Context, name string, kind trace.SpanKind, attrs func() []attribute.KeyValue) (context.Context, trace.Span) {
	if t.tracer == nil {
		return ctx, offSpan
	}
	return t.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs()...))
}
