// Package telemetry turns what sluice does into metrics: per client and
// method request counts, latencies, batch sizes, rejections and item
// sources; memcached pool and cache figures, and the process's sockets to
// each memcached server by TCP state; and the process's vital signs
// (goroutines, OS threads, memory, GC). It also owns the trace pipeline
// (a span per RPC, OTLP export, a ratio sampler), the storm-proof log
// handler (rate-limited per component and kind, written through a
// bounded, non-blocking buffer) and the in-process per-client aggregator
// behind the admin /clients page.
//
// Metrics are OpenTelemetry instruments exported in the Prometheus format
// on the admin /metrics endpoint, beside a few Prometheus collectors of
// its own: the runtime's, and the four measurements every request makes
// (Requests), kept there for their cost per request. Client names become labels only if they
// are in the configured list (plus "unknown"); any other caller is counted
// as "other", so no caller can blow up label cardinality. Nothing here
// blocks a request: instruments are lock-free counters and histograms.
package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
)

// Config selects which client names become metric labels, and where
// traces go.
type Config struct {
	// Clients are the caller names reported as themselves; any other name
	// is reported as "other".
	Clients []string `yaml:"clients"`
	// OTLPEndpoint is the OTLP/gRPC collector traces are sent to
	// (host:port, or a URL); empty turns tracing off.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// TraceSampleRatio is the share of new traces sampled, 0 to 1.
	// DefaultConfig sets DefaultTraceSampleRatio.
	TraceSampleRatio float64 `yaml:"trace_sample_ratio"`
}

// DefaultConfig returns the defaults: no client list, tracing off, 1% of
// traces sampled once it is on.
func DefaultConfig() Config { return Config{TraceSampleRatio: DefaultTraceSampleRatio} }

// Validate checks the sample ratio.
func (c Config) Validate() error {
	if !(c.TraceSampleRatio >= 0 && c.TraceSampleRatio <= 1) { // NaN too
		return fmt.Errorf("telemetry: trace_sample_ratio must be between 0 and 1, got %v", c.TraceSampleRatio)
	}
	return nil
}

// Other is the label of every caller not in Config.Clients.
const Other = "other"

// Telemetry owns the meter provider and the Prometheus registry behind
// /metrics.
type Telemetry struct {
	registry *prometheus.Registry
	provider *sdkmetric.MeterProvider
	meter    metric.Meter
	clients  *clientLabels
	stats    *ClientStats
}

// New builds the metrics pipeline. Shutdown releases it.
func New(cfg Config) (*Telemetry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newSchedLatency(),
	)
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	// No exemplars: /metrics is served in Prometheus' text format, which
	// has none to show, and offering each measurement to a reservoir
	// costs every request a walk of its context for a span.
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	t := &Telemetry{
		registry: reg,
		provider: provider,
		meter:    provider.Meter("github.com/sluice-dev/sluice"),
		clients:  newClientLabels(cfg.Clients),
	}
	t.stats = newClientStats(t.ClientLabel)
	if err := t.registerClientCardinality(); err != nil {
		return nil, err
	}
	return t, nil
}

// Clients is the in-process per-client aggregator that the request hooks
// feed; the admin /clients page reads it.
func (t *Telemetry) Clients() *ClientStats { return t.stats }

// Meter is the meter every sluice instrument is created from.
func (t *Telemetry) Meter() metric.Meter { return t.meter }

// Handler serves /metrics.
func (t *Telemetry) Handler() http.Handler {
	return promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{Registry: t.registry})
}

// ClientLabel maps a caller's name to its bounded metric label.
func (t *Telemetry) ClientLabel(name string) string { return t.clients.label(name) }

// Shutdown flushes and stops the meter provider.
func (t *Telemetry) Shutdown(ctx context.Context) error { return t.provider.Shutdown(ctx) }

func (t *Telemetry) registerClientCardinality() error {
	_, err := t.meter.Int64ObservableGauge("sluice.clients.unknown_names",
		metric.WithDescription("Distinct caller names not in the configured client list (reported as client=\"other\")."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(t.clients.unknownCount()))
			return nil
		}))
	return err
}

// clientLabels bounds client label values to the configured names.
type clientLabels struct {
	known map[string]bool

	mu      sync.Mutex
	unknown map[string]struct{} // distinct unlisted names, capped
}

const maxTrackedUnknown = 10_000

func newClientLabels(names []string) *clientLabels {
	known := map[string]bool{"unknown": true}
	for _, n := range names {
		known[n] = true
	}
	return &clientLabels{known: known, unknown: map[string]struct{}{}}
}

func (c *clientLabels) label(name string) string {
	if c.known[name] {
		return name
	}
	c.mu.Lock()
	if len(c.unknown) < maxTrackedUnknown {
		c.unknown[name] = struct{}{}
	}
	c.mu.Unlock()
	return Other
}

func (c *clientLabels) unknownCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.unknown)
}
