package main

import (
	"flag"
	"strings"

	"github.com/sluice-dev/sluice/internal/app"
)

func parseServeFlags(args []string) (app.Config, error) {
	def := app.DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	dataDir := fs.String("data-dir", def.DataDir, "directory of the embedded store")
	grpcAddr := fs.String("grpc-addr", def.GRPCAddr, "gRPC listen address")
	httpAddr := fs.String("http-addr", def.HTTPAddr, "admin HTTP listen address (/healthz, /readyz, /metrics, /debug/pprof/)")
	memcached := fs.String("memcached", strings.Join(def.Cache.Servers, ","), "memcached servers, comma-separated host:port")
	maxConns := fs.Int("memcached-max-conns", def.Cache.MaxConnsPerServer, "hard cap on connections (in use + idle) per memcached server")
	configPath := fs.String("config", "", "YAML config file (policies per method, cache TTLs, client list)")
	drain := fs.Duration("drain-timeout", def.DrainTimeout, "how long SIGTERM waits for in-flight requests")
	tlsCert := fs.String("tls-cert", "", "server certificate (PEM); with --tls-key and --client-ca turns on mutual TLS")
	tlsKey := fs.String("tls-key", "", "server private key (PEM)")
	clientCA := fs.String("client-ca", "", "CA certificates (PEM) that client certificates must chain to")
	if err := fs.Parse(args); err != nil {
		return app.Config{}, err
	}
	cfg := def
	if *configPath != "" {
		if err := cfg.LoadFile(*configPath); err != nil {
			return app.Config{}, err
		}
	}
	cfg.DataDir, cfg.GRPCAddr, cfg.HTTPAddr, cfg.DrainTimeout = *dataDir, *grpcAddr, *httpAddr, *drain
	cfg.Cache.Servers = splitList(*memcached)
	cfg.Cache.MaxConnsPerServer = *maxConns
	setIf(&cfg.TLS.CertFile, *tlsCert)
	setIf(&cfg.TLS.KeyFile, *tlsKey)
	setIf(&cfg.TLS.ClientCAFile, *clientCA)
	return cfg, cfg.Validate()
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

// setIf sets *dst to v when the flag was given.
func setIf(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}
