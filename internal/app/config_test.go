package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Tests that the shipped example config loads and validates, so the
// reference in docs/configuration.md cannot drift from the code.
func TestExampleConfigLoads(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.LoadFile(filepath.Join("..", "..", "config", "sluice.example.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p := cfg.Guard.Methods["sluice.v1.PostRecords/GetPostRecord"]
	if p.MaxItems != 1 || p.Timeout != time.Second || p.MaxURILength != 512 {
		t.Errorf("GetPostRecord policy = %+v", p)
	}
	if len(cfg.Telemetry.Clients) == 0 {
		t.Error("example lists no clients")
	}
	if b := cfg.Guard.Admission.For("bulk"); b.ItemsPerSecond != 2000 || b.Burst != 2000 {
		t.Errorf("bulk budget = %+v", b)
	}
	if b := cfg.Guard.Admission.For("unknown"); b.Burst != 5000 {
		t.Errorf("default budget = %+v", b)
	}
	if cfg.Guard.QueueTarget != 5*time.Millisecond || cfg.Guard.QueueInterval != 100*time.Millisecond {
		t.Errorf("queue target %v interval %v", cfg.Guard.QueueTarget, cfg.Guard.QueueInterval)
	}
	if cfg.SLO.Availability != 0.999 || cfg.SLO.Latency.Objective != 0.99 || cfg.SLO.Latency.Threshold != 250*time.Millisecond {
		t.Errorf("slo = %+v", cfg.SLO)
	}
}

// Tests that a zero the file writes is taken as written where it is
// valid: trace_sample_ratio 0 samples no new trace, near_cache ttl 0
// turns the near cache off; a key left out keeps its default.
func TestConfigZerosTakenAsWritten(t *testing.T) {
	cfg := validConfigFrom(t, "telemetry:\n  trace_sample_ratio: 0\nnear_cache:\n  ttl: 0s\n  max_bytes: 32MiB\n")
	if cfg.Telemetry.TraceSampleRatio != 0 {
		t.Errorf("trace_sample_ratio = %v, want 0 as written", cfg.Telemetry.TraceSampleRatio)
	}
	if cfg.Near.Enabled() {
		t.Errorf("near cache on after ttl: 0")
	}
	if cfg.Near.MaxBytes != 32<<20 {
		t.Errorf("near_cache.max_bytes 32MiB read as %d", cfg.Near.MaxBytes)
	}
	if def := DefaultConfig(); cfg.Cache.TTL != def.Cache.TTL || cfg.Telemetry.OTLPEndpoint != def.Telemetry.OTLPEndpoint {
		t.Errorf("keys left out changed: cache ttl %v, otlp endpoint %q", cfg.Cache.TTL, cfg.Telemetry.OTLPEndpoint)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{name: "unknown key", yaml: "guard:\n  max_inflight_itemz: 5\n", want: "max_inflight_itemz"},
		{name: "zero concurrency", yaml: "guard:\n  methods:\n    sluice.v1.PostRecords/GetPostRecords:\n      concurrency: -1\n", want: "sluice.v1.PostRecords/GetPostRecords: concurrency must be at least 1"},
		{name: "batch over process cap", yaml: "guard:\n  max_inflight_items: 500\n", want: "max_items 1000 exceeds max_inflight_items 500"},
		{name: "bad budget", yaml: "admission:\n  clients:\n    bulk: {items_per_second: 0, burst: 1, max_inflight_items: 1}\n", want: `admission: client "bulk": items_per_second must be a positive number`},
		{name: "light reserve over the cap", yaml: "guard:\n  light_reserve_items: 30000\n", want: "light_reserve_items must be between 0 (one piece) and max_inflight_items 20000, got 30000"},
		{name: "negative queue", yaml: "guard:\n  max_queued_requests: -1\n", want: "guard: max_queued_requests must be at least 1, got -1"},
		{name: "processors per CPU over the most", yaml: "guard:\n  saturated_procs_per_cpu: 9\n", want: "guard: saturated_procs_per_cpu must be between 1 (Go's own number) and 8, or 0 for the default 2, got 9"},
		{name: "queue target over interval", yaml: "guard:\n  queue_target: 1s\n", want: "target 1s must not exceed interval 100ms"},
		{name: "tombstone shorter than a split batch", yaml: "guard:\n  methods:\n    sluice.v1.PostRecords/GetPostRecords:\n      oversize:\n        indexer: {mode: split, max_split_items: 25000, timeout: 10s}\n", want: `tombstone_ttl 5s must be at least 11.5s: the longest request timeout (10s, the split timeout of client "indexer" on sluice.v1.PostRecords/GetPostRecords)`},
		{name: "tombstone too short", yaml: "cache:\n  tombstone_ttl: 1s\n", want: "tombstone_ttl 1s must be at least 3.5s: the longest request timeout (2s, method "},
		{name: "takedown cannot wait out the near cache", yaml: "near_cache:\n  ttl: 2s\n", want: "method sluice.v1.Records/UpdateTakedowns timeout 2s must exceed near_cache.ttl 2s"},
		{name: "PutPostRecords cannot wait out the near cache", yaml: "near_cache:\n  ttl: 3s\ncache:\n  tombstone_ttl: 15s\nguard:\n  methods:\n    sluice.v1.Records/PutRecords: {timeout: 10s}\n    sluice.v1.Records/UpdateTakedowns: {timeout: 10s}\n", want: "method sluice.v1.PostRecords/PutPostRecords timeout 2s must exceed near_cache.ttl 3s"},
		{name: "availability objective too low", yaml: "slo:\n  availability: 0.9\n", want: "slo: availability must be between 0.95 and 0.99999, got 0.9"},
		{name: "latency objective of one", yaml: "slo:\n  latency: {objective: 1}\n", want: "slo: latency.objective must be between 0.95 and 0.99999, got 1"},
		{name: "negative latency threshold", yaml: "slo:\n  latency: {threshold: -5ms}\n", want: "slo: latency.threshold must be positive and at most 1m0s, got -5ms"},
		{name: "misspelled method", yaml: "guard:\n  methods:\n    sluice.v1.PostRecords/GetPostRecord5: {max_items: 1, max_uri_length: 512, concurrency: 1, timeout: 1s}\n", want: `guard.methods: "sluice.v1.PostRecords/GetPostRecord5" is not a method sluice serves (the methods of sluice.v1.PostRecords are sluice.v1.PostRecords/DeletePostRecords, sluice.v1.PostRecords/GetLimits, sluice.v1.PostRecords/GetPostRecord, sluice.v1.PostRecords/GetPostRecords, sluice.v1.PostRecords/PutPostRecords)`},
		{name: "method without its service", yaml: "guard:\n  methods:\n    GetPostRecords: {timeout: 1s}\n", want: `"GetPostRecords" is not a method sluice serves (methods are named service/Method, as sluice.v1.PostRecords/GetPostRecords)`},
		{name: "zero cache ttl", yaml: "cache:\n  ttl: 0s\n", want: "cache: ttl must be between 1s and 720h, got 0s"},
		{name: "zero breaker failures", yaml: "cache:\n  breaker_failures: 0\n", want: "cache: breaker_failures must be ≥ 1, got 0"},
		{name: "journal lag over a minute", yaml: "journal:\n  max_lag: 2m\n", want: "journal: max_lag must be between 40ms and 1m0s, got 2m0s"},
		{name: "NaN availability", yaml: "slo:\n  availability: .nan\n", want: "slo: availability must be between 0.95 and 0.99999, got NaN"},
		{name: "NaN trace ratio", yaml: "telemetry:\n  trace_sample_ratio: .nan\n", want: "NaN"},
		{name: "unknown slo key", yaml: "slo:\n  availabilty: 0.99\n", want: "availabilty"},
		{name: "negative unlisted weight", yaml: "admission:\n  unlisted_weight: -5\n", want: "unlisted_weight"},
		{name: "connections that overflow the memory plan", yaml: "guard:\n  max_connections: 9223372036854775807\n  memory_limit: 256MiB\n", want: "guard: max_connections must be between 1 and 1073741824, got 9223372036854775807"},
		{name: "items that overflow the memory plan", yaml: "guard:\n  max_inflight_items: 9223372036854775807\n  memory_limit: 1GiB\n", want: "guard: max_inflight_items must be between 1 and 1073741824"},
		{name: "byte caps that overflow the memory plan", yaml: "guard:\n  max_request_bytes: 8388607TiB\n  max_caller_request_bytes: 8388607TiB\n  max_response_bytes: 8388607TiB\n", want: "guard: max_request_bytes must be at most 1024TiB, got 8388607TiB"},
		{name: "journal retention over a day", yaml: "journal:\n  retention: 25h\n", want: "journal: retention must be between 1m0s and 24h0m0s, got 25h0m0s"},
		{name: "start-up replay past the retention", yaml: "journal:\n  start_replay: 40m\n", want: "journal: start_replay must be between 0"},
		{name: "retention leaves the start-up replay short", yaml: "journal:\n  retention: 10m5s\n", want: "config: journal retention 10m5s must be at least the cache's longest entry lifetime plus its tombstone lifetime plus 1m0s (11m5s)"},
		{name: "budget for a name no caller can have", yaml: "admission:\n  clients:\n    \"my feed\": {items_per_second: 10, burst: 10, max_inflight_items: 10}\n", want: `config: admission.clients: client name "my feed" holds a character other than printable ASCII`},
		{name: "telemetry name over the limit", yaml: "telemetry:\n  clients: [feed, aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]\n", want: "config: telemetry.clients[1]: client name"},
		{name: "split for a name no caller can have", yaml: "cache:\n  tombstone_ttl: 12s\nguard:\n  methods:\n    sluice.v1.PostRecords/GetPostRecords:\n      oversize:\n        \"index er\": {mode: split, max_split_items: 25000, timeout: 10s}\n", want: `config: guard.methods["sluice.v1.PostRecords/GetPostRecords"].oversize: client name "index er"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			err := cfg.LoadFile(path)
			if err == nil {
				err = cfg.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// Tests that the example config's bsky.Service override lands on that
// method only, and that every bsky.Service method keeps a policy.
func TestExampleConfigBskyPolicies(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.LoadFile(filepath.Join("..", "..", "config", "sluice.example.yaml")); err != nil {
		t.Fatal(err)
	}
	for name, p := range cfg.Guard.Methods {
		if strings.HasPrefix(name, "bsky.Service/") && (p.MaxItems != 1000 || p.Timeout != 2*time.Second) {
			t.Errorf("%s policy = %+v", name, p)
		}
	}
	if _, ok := cfg.Guard.Methods["bsky.Service/GetStatusRecords"]; !ok {
		t.Error("GetStatusRecords has no policy; the guard would refuse the service")
	}
}

// Tests that the near cache's cap counts in the memory budget: a cap
// that does not fit beside the caps is refused at start-up, naming it,
// and with the near cache off the same budget fits.
func TestNearCacheCountsInMemoryBudget(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := "guard:\n  memory_limit: 512MiB\n  max_request_bytes: 200MiB\n  max_response_bytes: 100MiB\nnear_cache:\n  max_bytes: 1073741824\n"
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	if err := cfg.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "near_cache.max_bytes 1GiB") {
		t.Errorf("a 1GiB near cache under a 512MiB budget: error %v, want it refused, naming near_cache.max_bytes", err)
	}
	cfg.Near.TTL = 0
	if err := cfg.Validate(); err != nil {
		t.Errorf("the same budget with the near cache off: %v", err)
	}
}

// Tests that every admission key of the file reaches the budgets: the
// shared weight of unlisted callers among them.
func TestAdmissionKeysReachTheBudgets(t *testing.T) {
	cfg := validConfigFrom(t, "admission:\n  unlisted_flows: 16\n  unlisted_weight: 2\n")
	if a := cfg.Guard.Admission; a.UnlistedFlows != 16 || a.UnlistedShare() != 2 {
		t.Errorf("admission from the file: unlisted_flows %d, unlisted weight %v; want 16 and 2", a.UnlistedFlows, a.UnlistedShare())
	}
}

// validConfigFrom is the default config with the file yaml written over
// it, failing the test unless it loads and validates.
func validConfigFrom(t *testing.T, yaml string) Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	if err := cfg.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}
