package spans_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-dev/sluice/internal/spans"
)

// callerKey marks the caller's context.
type callerKey struct{}

// Tests that with tracing off Start hands back the caller's context and
// never builds the attributes.
func TestOffStartsNothing(t *testing.T) {
	for name, tp := range map[string]trace.TracerProvider{"noop": noop.NewTracerProvider(), "nil": nil} {
		tr := spans.New(tp, "test")
		ctx := context.WithValue(context.Background(), callerKey{}, 1)
		got, span := tr.Start(ctx, "s", trace.SpanKindClient, func() []attribute.KeyValue {
			t.Errorf("%s: attributes built with tracing off", name)
			return nil
		})
		if got != ctx {
			t.Errorf("%s: Start returned a new context with tracing off", name)
		}
		if span.IsRecording() {
			t.Errorf("%s: the span records with tracing off", name)
		}
		span.End()
	}
}

// Tests that with tracing on Start records a span of the given kind with
// the attributes, as a child of the caller's span.
func TestOnRecordsTheSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	tr := spans.New(tp, "test")
	ctx, parent := tp.Tracer("parent").Start(context.Background(), "parent")
	_, span := tr.Start(ctx, "child", trace.SpanKindClient, func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.Int("n", 7)}
	})
	span.End()
	parent.End()
	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans ended, want 2", len(ended))
	}
	child := ended[0]
	if child.Name() != "child" || child.SpanKind() != trace.SpanKindClient {
		t.Errorf("span %q of kind %v, want child of kind client", child.Name(), child.SpanKind())
	}
	if child.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("the span's parent is %v, want the caller's span %v", child.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	if attrs := child.Attributes(); len(attrs) != 1 || attrs[0] != attribute.Int("n", 7) {
		t.Errorf("attributes %v, want n=7", attrs)
	}
}

// Tests that with tracing off the span Start returns is not the caller's:
// ending it, or setting its status, leaves a recording parent (a server
// span another package started) running and untouched.
func TestOffLeavesTheCallersSpanAlone(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	ctx, parent := tp.Tracer("server").Start(context.Background(), "server")
	_, span := spans.New(noop.NewTracerProvider(), "test").Start(ctx, "child", trace.SpanKindInternal, nil)
	if span.IsRecording() {
		t.Fatal("the span of tracing off records: it is the caller's span")
	}
	span.SetStatus(codes.Error, "failed")
	span.End()
	if !parent.IsRecording() {
		t.Fatal("ending the span of tracing off ended the caller's span")
	}
	parent.End()
	if got := rec.Ended(); len(got) != 1 || got[0].Status().Code != codes.Unset {
		t.Errorf("ended spans %v; want the caller's alone, its status unset", got)
	}
}
