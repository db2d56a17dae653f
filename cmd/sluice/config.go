package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/rpc"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"gopkg.in/yaml.v3"
)

// fileConfig is the shape of the YAML file given with --config. Every
// section is optional; what it leaves out keeps its default.
type fileConfig struct {
	Guard     guard.Config     `yaml:"guard"`
	Cache     cacheFile        `yaml:"cache"`
	Telemetry telemetry.Config `yaml:"telemetry"`
}

// cacheFile holds the cache settings a file may change; servers and the
// connection cap come from flags.
type cacheFile struct {
	Timeout         time.Duration `yaml:"timeout"`
	TTL             time.Duration `yaml:"ttl"`
	NegativeTTL     time.Duration `yaml:"negative_ttl"`
	TombstoneTTL    time.Duration `yaml:"tombstone_ttl"`
	MaxKeysPerGet   int           `yaml:"max_keys_per_get"`
	BreakerFailures uint32        `yaml:"breaker_failures"`
	BreakerCoolDown time.Duration `yaml:"breaker_cool_down"`
}

// serveConfig is everything `sluice serve` needs, assembled from defaults,
// the config file and flags (in that order of precedence, lowest first).
type serveConfig struct {
	DataDir      string
	GRPCAddr     string
	HTTPAddr     string
	DrainTimeout time.Duration
	Guard        guard.Config
	Cache        cache.Config
	Telemetry    telemetry.Config
}

func parseServeFlags(args []string) (serveConfig, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	dataDir := fs.String("data-dir", ".data", "directory of the embedded store")
	grpcAddr := fs.String("grpc-addr", "127.0.0.1:50051", "gRPC listen address")
	httpAddr := fs.String("http-addr", "127.0.0.1:8080", "admin HTTP listen address (/healthz, /readyz, /metrics, /debug/pprof/)")
	memcached := fs.String("memcached", "127.0.0.1:11211", "memcached servers, comma-separated host:port")
	maxConns := fs.Int("memcached-max-conns", 64, "hard cap on connections (in use + idle) per memcached server")
	configPath := fs.String("config", "", "YAML config file (policies per method, cache TTLs, client list)")
	drain := fs.Duration("drain-timeout", 10*time.Second, "how long SIGTERM waits for in-flight requests")
	if err := fs.Parse(args); err != nil {
		return serveConfig{}, err
	}
	cfg := serveConfig{
		DataDir: *dataDir, GRPCAddr: *grpcAddr, HTTPAddr: *httpAddr, DrainTimeout: *drain,
		Guard: guard.DefaultConfig(),
		Cache: cache.DefaultConfig(),
	}
	for name, p := range rpc.DefaultPolicies() {
		cfg.Guard.Methods[name] = p
	}
	if *configPath != "" {
		if err := cfg.loadFile(*configPath); err != nil {
			return serveConfig{}, err
		}
	}
	cfg.Cache.Servers = splitList(*memcached)
	cfg.Cache.MaxConnsPerServer = *maxConns
	return cfg, cfg.validate()
}

func (c *serveConfig) loadFile(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var f fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, err)
	}
	c.Guard = c.Guard.Merge(f.Guard)
	c.Cache = overlayCache(c.Cache, f.Cache)
	c.Telemetry = f.Telemetry
	return nil
}

func overlayCache(c cache.Config, f cacheFile) cache.Config {
	setDur(&c.Timeout, f.Timeout)
	setDur(&c.TTL, f.TTL)
	setDur(&c.NegativeTTL, f.NegativeTTL)
	setDur(&c.TombstoneTTL, f.TombstoneTTL)
	setDur(&c.BreakerCoolDown, f.BreakerCoolDown)
	if f.MaxKeysPerGet != 0 {
		c.MaxKeysPerGet = f.MaxKeysPerGet
	}
	if f.BreakerFailures != 0 {
		c.BreakerFailures = f.BreakerFailures
	}
	return c
}

func setDur(dst *time.Duration, v time.Duration) {
	if v != 0 {
		*dst = v
	}
}

func (c serveConfig) validate() error {
	var errs []error
	if err := c.Guard.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Cache.Validate(); err != nil {
		errs = append(errs, err)
	}
	if longest := c.longestTimeout(); c.Cache.TombstoneTTL <= longest {
		errs = append(errs, fmt.Errorf("config: cache tombstone_ttl %v must exceed the longest method timeout %v, or a slow read could refill a stale record", c.Cache.TombstoneTTL, longest))
	}
	return errors.Join(errs...)
}

func (c serveConfig) longestTimeout() time.Duration {
	var longest time.Duration
	for _, p := range c.Guard.Methods {
		longest = max(longest, p.Timeout)
	}
	return longest
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
