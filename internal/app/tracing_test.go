package app

import (
	"context"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Tests that a real gRPC call makes a server span (otelgrpc) with child
// spans for the read (client, batch size, cache hits), each memcached
// GetMulti chunk (server, keys, hits) and the store reads (URIs, found),
// and that the ratio sampler at 0 records nothing.
func TestTracesThroughRealGRPCCall(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := telemetry.NewTracerProvider(1, sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ts := startServer(t, 300, func(c *Config) {
		c.Telemetry.Clients = []string{"feed"}
		// The refill after the cold read is best effort within one cache
		// timeout; a busy machine must not cut it short, or the warm read
		// would miss.
		c.Cache.Timeout = 10 * time.Second
		c.Cache.TombstoneTTL = 25 * time.Second // outlives a request and its refill
		// One handler call per RPC (no pieces), so one posts.Get span
		// under each server span.
		c.Guard.PieceItems = 1000
	}, withAppOptions(WithTracerProvider(tp)))

	uris := ts.uris(0, 250)
	for range 2 { // cold (store), then warm (cache)
		if _, err := ts.client.GetPostRecords(ts.ctx("feed"), &sluicev1.GetPostRecordsRequest{Uris: uris}); err != nil {
			t.Fatalf("GetPostRecords: %v", err)
		}
	}
	spans := waitSpans(t, rec, 2)
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	servers := byName["sluice.v1.PostRecords/GetPostRecords"]
	reads := byName["posts.Get"]
	if len(servers) != 2 || len(reads) != 2 {
		t.Fatalf("want 2 server spans and 2 posts.Get spans, got %d and %d (all: %v)", len(servers), len(reads), names(spans))
	}
	for i, read := range reads {
		if read.Parent().SpanID() != servers[i].SpanContext().SpanID() || servers[i].SpanKind() != trace.SpanKindServer {
			t.Errorf("posts.Get %d is not a child of the RPC's server span", i)
		}
		a := attrs(read)
		if a["sluice.client"].AsString() != "feed" || a["sluice.batch.size"].AsInt64() != 250 {
			t.Errorf("posts.Get %d attributes %v; want client feed, batch size 250", i, a)
		}
	}
	if cold, warm := attrs(reads[0])["sluice.cache.hits"].AsInt64(), attrs(reads[1])["sluice.cache.hits"].AsInt64(); cold != 0 || warm != 250 {
		t.Errorf("cache hits cold=%d warm=%d; want 0 then 250", cold, warm)
	}
	chunks := byName["memcached.GetMulti"]
	var keys, hits int64
	for _, c := range chunks {
		a := attrs(c)
		keys += a["sluice.batch.size"].AsInt64()
		hits += a["sluice.cache.hits"].AsInt64()
		if a["sluice.memcached.server"].AsString() != ts.memcached.Addr() {
			t.Errorf("chunk span server %q; want %s", a["sluice.memcached.server"].AsString(), ts.memcached.Addr())
		}
		if c.Parent().SpanID() != reads[0].SpanContext().SpanID() && c.Parent().SpanID() != reads[1].SpanContext().SpanID() {
			t.Errorf("memcached.GetMulti span is not a child of a posts.Get span")
		}
	}
	if len(chunks) != 6 || keys != 500 || hits != 250 {
		t.Errorf("memcached.GetMulti spans=%d keys=%d hits=%d; want 6 chunks (250 keys in gets of ≤100, twice), 500 keys, 250 hits", len(chunks), keys, hits)
	}
	stores := byName["store.read"]
	if len(stores) != 1 || attrs(stores[0])["sluice.batch.size"].AsInt64() != 250 || attrs(stores[0])["sluice.store.found"].AsInt64() != 250 {
		t.Errorf("store.read spans %d (%v); want one for the cold read with 250 URIs, 250 found", len(stores), spanAttrs(stores))
	} else if stores[0].Parent().SpanID() != reads[0].SpanContext().SpanID() {
		t.Errorf("store.read is not a child of the cold posts.Get")
	}
	t.Logf("spans: %v", names(spans))

	// The same provider with a ratio of 0 samples no new trace.
	rec0 := tracetest.NewSpanRecorder()
	tp0 := telemetry.NewTracerProvider(0, sdktrace.WithSpanProcessor(rec0))
	t.Cleanup(func() { _ = tp0.Shutdown(context.Background()) })
	ts0 := startServer(t, 50, nil, withAppOptions(WithTracerProvider(tp0)))
	if _, err := ts0.client.GetPostRecords(ts0.ctx("feed"), &sluicev1.GetPostRecordsRequest{Uris: ts0.uris(0, 50)}); err != nil {
		t.Fatalf("GetPostRecords: %v", err)
	}
	// Started, not Ended: the server span may end after the response
	// has reached the client, but every span of the call has started by
	// then, and a sampled span reaches the recorder when it starts.
	if started := rec0.Started(); len(started) != 0 {
		t.Errorf("ratio 0 recorded %d spans (the first %q); want none", len(started), started[0].Name())
	}
}

// waitSpans waits until the recorder holds n server spans (the server
// span ends just after the response is sent).
func waitSpans(t *testing.T, rec *tracetest.SpanRecorder, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // only a broken server waits this long
	for {
		spans := rec.Ended()
		servers := 0
		for _, s := range spans {
			if s.SpanKind() == trace.SpanKindServer {
				servers++
			}
		}
		if servers >= n || time.Now().After(deadline) {
			return spans
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func spanAttrs(spans []sdktrace.ReadOnlySpan) []map[attribute.Key]attribute.Value {
	var out []map[attribute.Key]attribute.Value
	for _, s := range spans {
		out = append(out, attrs(s))
	}
	return out
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}
