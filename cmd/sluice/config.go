package main

import (
	"flag"
	"strings"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
)

// serveFlags is what `sluice serve` was started with.
type serveFlags struct {
	cfg        app.Config
	configPath string // "" when no --config was given
}

func parseServe(args []string) (serveFlags, error) {
	def := app.DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	dataDir := fs.String("data-dir", def.DataDir, "directory of the embedded store")
	grpcAddr := fs.String("grpc-addr", def.GRPCAddr, "gRPC listen address")
	httpAddr := fs.String("http-addr", def.HTTPAddr, "admin HTTP listen address (/healthz, /readyz, /metrics, /debug/pprof/)")
	memcached := fs.String("memcached", strings.Join(def.Cache.Servers, ","), "memcached servers, comma-separated host:port")
	maxConns := fs.Int("memcached-max-conns", def.Cache.MaxConnsPerServer, "hard cap on connections (in use + idle) per memcached server")
	configPath := fs.String("config", "", "YAML config file (policies per method, cache TTLs, client list, admission budgets; SIGHUP reloads the budgets)")
	storeDelay := fs.Duration("store-read-delay", 0, "add this latency to every store read, to rehearse a remote store's latency with the embedded one (load tests)")
	nearTTL := fs.Duration("near-cache-ttl", 0, "how long a hot record is answered from process memory after memcached returned it; the staleness bound after a write on another replica (0: off; default: the config file's, else 1s)")
	drain := fs.Duration("drain-timeout", def.DrainTimeout, "how long SIGTERM waits for in-flight requests")
	otlp := fs.String("otlp-endpoint", "", "OTLP/gRPC collector for traces (host:port, plaintext, or a URL); empty: tracing off")
	ratio := fs.Float64("trace-sample-ratio", 0, "share of new traces sampled, 0 to 1 (default: the config file's, else 0.01)")
	def.CQL.RegisterFlags(fs)
	tlsCert := fs.String("tls-cert", "", "server certificate (PEM); with --tls-key and --client-ca turns on mutual TLS")
	tlsKey := fs.String("tls-key", "", "server private key (PEM)")
	clientCA := fs.String("client-ca", "", "CA certificates (PEM) that client certificates must chain to")
	var memLimit membudget.Bytes
	fs.Var(&memLimit, "memory-limit", "memory budget and Go soft memory limit, IEC units (e.g. 512MiB); the byte, connection and stream caps are derived from it and checked against it (default: the config file's guard.memory_limit, else GOMEMLIMIT, else 90% of the cgroup limit, else a quarter of the machine's memory up to 4GiB)")
	if err := parseFlags(fs, args); err != nil {
		return serveFlags{}, err
	}
	cfg := def
	if *configPath != "" {
		if err := cfg.LoadFile(*configPath); err != nil {
			return serveFlags{}, err
		}
	}
	cfg.DataDir, cfg.GRPCAddr, cfg.HTTPAddr, cfg.DrainTimeout = *dataDir, *grpcAddr, *httpAddr, *drain
	cfg.Cache.Servers = splitList(*memcached)
	cfg.Cache.MaxConnsPerServer = *maxConns
	// A flag given overrides the file's value even when empty or zero
	// (an endpoint or TLS file cleared, the memory limit derived again).
	given := givenFlags(fs)
	overrideIfGiven(given, "otlp-endpoint", &cfg.Telemetry.OTLPEndpoint, *otlp)
	overrideIfGiven(given, "trace-sample-ratio", &cfg.Telemetry.TraceSampleRatio, *ratio)
	overrideIfGiven(given, "near-cache-ttl", &cfg.Near.TTL, *nearTTL)
	overrideIfGiven(given, "memory-limit", &cfg.Guard.MemoryLimit, memLimit)
	overrideIfGiven(given, "tls-cert", &cfg.TLS.CertFile, *tlsCert)
	overrideIfGiven(given, "tls-key", &cfg.TLS.KeyFile, *tlsKey)
	overrideIfGiven(given, "client-ca", &cfg.TLS.ClientCAFile, *clientCA)
	cfg.StoreReadDelay = *storeDelay
	return serveFlags{cfg: cfg, configPath: *configPath}, cfg.Validate()
}

// givenFlags names the flags set on the command line: a flag that the
// config file can also set overrides it only when given.
func givenFlags(fs *flag.FlagSet) map[string]bool {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given
}

// overrideIfGiven sets *dst to v when the flag name was given.
func overrideIfGiven[T any](given map[string]bool, name string, dst *T, v T) {
	if given[name] {
		*dst = v
	}
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
