package telemetry

import (
	"context"
	"runtime/metrics"

	"github.com/sluice-dev/sluice/internal/guard"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ObserveMemory exports the memory budget and what holds it: the limit,
// the Go heap, request and response bytes in flight against their caps,
// open streams and connections against theirs, and refusals at the
// stream's start and at accept.
func (t *Telemetry) ObserveMemory(stats func() guard.MemoryStats) error {
	snapshot := func() MemorySnapshot { return memorySnapshot(stats()) }
	t.stats.memory.Store(&snapshot)
	m := t.meter
	gauges := map[string]func(guard.MemoryStats) int64{
		"sluice.memory.limit_bytes":              func(s guard.MemoryStats) int64 { return int64(s.Plan.Limit) },
		"sluice.request_bytes.in_flight":         func(s guard.MemoryStats) int64 { return int64(s.Requests.Held) },
		"sluice.request_bytes.max_in_flight":     func(s guard.MemoryStats) int64 { return int64(s.Requests.Cap) },
		"sluice.request_bytes.caller_share":      func(s guard.MemoryStats) int64 { return int64(s.Requests.Share) },
		"sluice.request_bytes.peak":              func(s guard.MemoryStats) int64 { return int64(s.Requests.Peak) },
		"sluice.response_bytes.in_flight":        func(s guard.MemoryStats) int64 { return int64(s.Responses.Held) },
		"sluice.response_bytes.max_in_flight":    func(s guard.MemoryStats) int64 { return int64(s.Responses.Cap) },
		"sluice.grpc.streams.open":               func(s guard.MemoryStats) int64 { return s.Streams },
		"sluice.grpc.streams.max":                func(s guard.MemoryStats) int64 { return s.Plan.Streams },
		"sluice.grpc.streams.max_per_connection": func(s guard.MemoryStats) int64 { return int64(s.Plan.StreamsPerConnection) },
		"sluice.grpc.connections.open":           func(s guard.MemoryStats) int64 { return s.Connections.Open },
		"sluice.grpc.connections.max":            func(s guard.MemoryStats) int64 { return s.Connections.Max },
	}
	counters := map[string]func(guard.MemoryStats) int64{
		"sluice.grpc.streams.refused":     func(s guard.MemoryStats) int64 { return s.RefusedStreams },
		"sluice.grpc.connections.refused": func(s guard.MemoryStats) int64 { return s.Connections.Refused },
		"sluice.grpc.connections.accepted": func(s guard.MemoryStats) int64 {
			return s.Connections.Accepted
		},
	}
	insts, obs, err := observables(m, counters, gauges)
	if err != nil {
		return err
	}
	refused, err := m.Int64ObservableCounter("sluice.request_bytes.refused",
		metric.WithDescription("Streams refused at their start because the request bytes being received were at the process-wide cap (ledger=request, scope=process) or the caller's share (scope=caller), or a response at the response-bytes cap (ledger=response)."))
	if err != nil {
		return err
	}
	heap, err := m.Int64ObservableGauge("sluice.memory.heap_bytes",
		metric.WithDescription("Go heap in use (objects and the unused parts of spans in use), from runtime/metrics."))
	if err != nil {
		return err
	}
	held, err := m.Int64ObservableGauge("sluice.memory.runtime_bytes",
		metric.WithDescription("Memory the Go runtime holds from the OS and has not returned: what the soft memory limit bounds."))
	if err != nil {
		return err
	}
	// A float gauge: the policy may be a fraction of a second.
	keepalive, err := m.Float64ObservableGauge("sluice.grpc.keepalive_min_time_seconds",
		metric.WithDescription("The keepalive enforcement policy's minimum interval between a client's pings (keepalive_min_time)."))
	if err != nil {
		return err
	}
	insts = append(insts, refused, heap, held, keepalive)
	samples := runtimeSamples()
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		for inst, f := range obs {
			o.ObserveInt64(inst.(metric.Int64Observable), f(s))
		}
		for _, r := range []struct {
			ledger, scope string
			n             int64
		}{{"request", "process", s.Requests.RefusedTotal}, {"request", "caller", s.Requests.RefusedCaller},
			{"response", "process", s.Responses.RefusedTotal}, {"response", "caller", s.Responses.RefusedCaller}} {
			o.ObserveInt64(refused, r.n, metric.WithAttributes(attribute.String("ledger", r.ledger), attribute.String("scope", r.scope)))
		}
		o.ObserveFloat64(keepalive, s.Plan.KeepaliveMinTime.Seconds())
		h, r := readRuntime(samples)
		o.ObserveInt64(heap, h)
		o.ObserveInt64(held, r)
		return nil
	}, insts...)
	return err
}

func runtimeSamples() []metrics.Sample {
	return []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}
}

// readRuntime returns the heap in use and the memory the runtime holds.
func readRuntime(samples []metrics.Sample) (heap, held int64) {
	metrics.Read(samples)
	return int64(samples[0].Value.Uint64() + samples[1].Value.Uint64()), int64(samples[2].Value.Uint64() - samples[3].Value.Uint64())
}

// MemorySnapshot is the memory budget on the /clients page.
type MemorySnapshot struct {
	LimitBytes          int64 `json:"limit_bytes"`
	HeapBytes           int64 `json:"heap_bytes"`
	RuntimeBytes        int64 `json:"runtime_bytes"`
	RequestBytes        int64 `json:"request_bytes_in_flight"`
	MaxRequestBytes     int64 `json:"max_request_bytes"`
	ResponseBytes       int64 `json:"response_bytes_in_flight"`
	MaxResponseBytes    int64 `json:"max_response_bytes"`
	Streams             int64 `json:"streams"`
	MaxStreams          int64 `json:"max_streams"`
	Connections         int64 `json:"connections"`
	MaxConnections      int64 `json:"max_connections"`
	RefusedRequestBytes int64 `json:"refused_request_bytes"`
	RefusedConnections  int64 `json:"refused_connections"`
}

func memorySnapshot(s guard.MemoryStats) MemorySnapshot {
	heap, held := readRuntime(runtimeSamples())
	return MemorySnapshot{
		LimitBytes: int64(s.Plan.Limit), HeapBytes: heap, RuntimeBytes: held,
		RequestBytes: int64(s.Requests.Held), MaxRequestBytes: int64(s.Requests.Cap),
		ResponseBytes: int64(s.Responses.Held), MaxResponseBytes: int64(s.Responses.Cap),
		Streams: s.Streams, MaxStreams: s.Plan.Streams,
		Connections: s.Connections.Open, MaxConnections: s.Connections.Max,
		RefusedRequestBytes: s.Requests.RefusedTotal + s.Requests.RefusedCaller,
		RefusedConnections:  s.Connections.Refused,
	}
}
