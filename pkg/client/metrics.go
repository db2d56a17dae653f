package client

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// meterName names the instrumentation scope of the Client's metrics.
const meterName = "github.com/sluice-dev/sluice/pkg/client"

// metrics are the Client's own instruments, each labelled with the
// caller's name.
type metrics struct {
	client   attribute.KeyValue
	requests metric.Int64Counter     // sluice.client.requests{client, code}
	items    metric.Int64Counter     // sluice.client.items{client}
	duration metric.Float64Histogram // sluice.client.request.duration{client}
	chunks   metric.Int64Counter     // sluice.client.chunks{client}
	retries  metric.Int64Counter     // sluice.client.retries{client, code}
	throttle metric.Float64Counter   // sluice.client.throttled{client}, seconds
}

func newMetrics(mp metric.MeterProvider, name string) (*metrics, error) {
	meter := mp.Meter(meterName)
	m := &metrics{client: attribute.String("client", name)}
	var err error
	if m.requests, err = meter.Int64Counter("sluice.client.requests",
		metric.WithDescription("GetPostRecords calls made through the client, by outcome code.")); err != nil {
		return nil, err
	}
	if m.items, err = meter.Int64Counter("sluice.client.items",
		metric.WithDescription("URIs asked for through the client.")); err != nil {
		return nil, err
	}
	if m.duration, err = meter.Float64Histogram("sluice.client.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Whole-call latency, all chunks and retries included.")); err != nil {
		return nil, err
	}
	if m.chunks, err = meter.Int64Counter("sluice.client.chunks",
		metric.WithDescription("Requests sent to the server, retries included.")); err != nil {
		return nil, err
	}
	if m.retries, err = meter.Int64Counter("sluice.client.retries",
		metric.WithDescription("Chunks sent again after a refusal, by the refusal's code.")); err != nil {
		return nil, err
	}
	if m.throttle, err = meter.Float64Counter("sluice.client.throttled", metric.WithUnit("s"),
		metric.WithDescription("Time spent waiting for the budget's pace or a retry delay.")); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) request(ctx context.Context, took time.Duration, items int, err error) {
	m.requests.Add(ctx, 1, metric.WithAttributes(m.client, attribute.String("code", status.Code(err).String())))
	m.items.Add(ctx, int64(items), metric.WithAttributes(m.client))
	m.duration.Record(ctx, took.Seconds(), metric.WithAttributes(m.client))
}

func (m *metrics) chunk(ctx context.Context) { m.chunks.Add(ctx, 1, metric.WithAttributes(m.client)) }

func (m *metrics) retry(ctx context.Context, code codes.Code) {
	m.retries.Add(ctx, 1, metric.WithAttributes(m.client, attribute.String("code", code.String())))
}

func (m *metrics) throttled(ctx context.Context, d time.Duration) {
	m.throttle.Add(ctx, d.Seconds(), metric.WithAttributes(m.client))
}
