package telemetry

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"

	"github.com/sluice-dev/sluice/internal/spans"
)

// DefaultTraceSampleRatio is the share of new traces sampled unless the
// config says otherwise.
const DefaultTraceSampleRatio = 0.01

// Tracing is the trace pipeline: a TracerProvider every instrumented
// package takes by injection, and its shutdown.
type Tracing struct {
	// Provider creates the tracers; a no-op one when tracing is off.
	Provider trace.TracerProvider
	shutdown func(context.Context) error
}

// NewTracing builds the trace pipeline from cfg: off (a no-op provider)
// without an OTLP endpoint; otherwise an SDK provider that samples
// cfg.TraceSampleRatio of new traces (and follows the caller's decision
// when the request carries one) and exports them over OTLP/gRPC in
// batches. An endpoint "host:port" is dialed without TLS; a URL
// ("https://host:4317") chooses for itself.
func NewTracing(ctx context.Context, cfg Config) (*Tracing, error) {
	if cfg.OTLPEndpoint == "" {
		return &Tracing{Provider: nooptrace.NewTracerProvider(), shutdown: func(context.Context) error { return nil }}, nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(cfg.OTLPEndpoint), otlptracegrpc.WithInsecure()}
	if strings.Contains(cfg.OTLPEndpoint, "://") {
		opts = []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(cfg.OTLPEndpoint)}
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter for %s: %w", cfg.OTLPEndpoint, err)
	}
	tp := NewTracerProvider(cfg.TraceSampleRatio, sdktrace.WithBatcher(exp))
	return &Tracing{Provider: tp, shutdown: tp.Shutdown}, nil
}

// NewTracerProvider returns an SDK provider for service "sluice" with the
// ratio sampler; opts add span processors or exporters (tests add an
// in-memory recorder).
func NewTracerProvider(ratio float64, opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	res := resource.NewSchemaless(attribute.String("service.name", "sluice"))
	base := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	}
	return sdktrace.NewTracerProvider(append(base, opts...)...)
}

// Shutdown flushes buffered spans and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error { return t.shutdown(ctx) }

// ServerOptions returns the gRPC server options that start a span per
// RPC, continuing a W3C trace context the caller sent; none when tp is
// the no-op provider of tracing turned off, so that an untraced server
// pays nothing per RPC for it. The handler's own RPC metrics are off:
// sluice's request metrics carry the client label.
func ServerOptions(tp trace.TracerProvider) []grpc.ServerOption {
	if !spans.On(tp) {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithMeterProvider(noopmetric.NewMeterProvider()),
		otelgrpc.WithPropagators(propagation.TraceContext{}),
	))}
}
