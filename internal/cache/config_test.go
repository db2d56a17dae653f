package cache

import (
	"strings"
	"testing"
	"time"
)

// Tests that Validate accepts the defaults and names each bad field.
func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		want   string // substring of the error; empty means valid
	}{
		{name: "defaults", change: func(*Config) {}},
		{name: "no servers", change: func(c *Config) { c.Servers = nil }, want: "servers must list at least one"},
		{name: "server without port", change: func(c *Config) { c.Servers = []string{"localhost"} }, want: `server "localhost" must be host:port`},
		{name: "duplicate server", change: func(c *Config) { c.Servers = []string{"a:1", "a:1"} }, want: "listed twice"},
		{name: "zero conns", change: func(c *Config) { c.MaxConnsPerServer = 0 }, want: "max_conns_per_server must be ≥ 1, got 0"},
		{name: "zero timeout", change: func(c *Config) { c.Timeout = 0 }, want: "timeout must be > 0"},
		{name: "sub-second ttl", change: func(c *Config) { c.TTL = time.Millisecond }, want: "ttl must be between 1s and 720h"},
		{name: "ttl over 30 days", change: func(c *Config) { c.NegativeTTL = 31 * 24 * time.Hour }, want: "negative_ttl must be between"},
		{name: "zero tombstone", change: func(c *Config) { c.TombstoneTTL = 0 }, want: "tombstone_ttl must be between"},
		{name: "zero keys per get", change: func(c *Config) { c.MaxKeysPerGet = 0 }, want: "max_keys_per_get must be ≥ 1, got 0"},
		{name: "zero breaker failures", change: func(c *Config) { c.BreakerFailures = 0 }, want: "breaker_failures must be ≥ 1"},
		{name: "zero cool-down", change: func(c *Config) { c.BreakerCoolDown = 0 }, want: "breaker_cool_down must be > 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.change(&cfg)
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
			if _, err := New(cfg); (err == nil) != (tc.want == "") {
				t.Fatalf("New() error = %v, want error: %v", err, tc.want != "")
			}
		})
	}
}
