package cache

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// maxRelativeTTL is the longest expiration memcached reads as relative to
// now; larger values are taken as Unix timestamps.
const maxRelativeTTL = 30 * 24 * time.Hour

// Config configures a Cache. Start from DefaultConfig: a zero field is
// invalid, not "use the default", so a typo in a config file fails at
// start-up instead of silently removing a limit.
type Config struct {
	// Servers are the memcached servers, host:port, at least one.
	Servers []string `yaml:"servers"`
	// MaxConnsPerServer is the hard cap on connections per server, in use
	// plus idle. Default 64.
	MaxConnsPerServer int `yaml:"max_conns_per_server"`
	// Timeout is the socket read/write and dial timeout. Default 250ms.
	Timeout time.Duration `yaml:"timeout"`
	// TTL is the lifetime of positive entries. Default 10m.
	TTL time.Duration `yaml:"ttl"`
	// NegativeTTL is the lifetime of "not found" entries. Default 30s.
	NegativeTTL time.Duration `yaml:"negative_ttl"`
	// TombstoneTTL is how long a write or delete blocks refills of a key.
	// It must be at least the longest request timeout plus Timeout plus
	// a second (memcached counts expiry in whole seconds), so that a read
	// that started before the write cannot refill the old value; the
	// app's config check enforces it. Default 5s.
	TombstoneTTL time.Duration `yaml:"tombstone_ttl"`
	// MaxKeysPerGet is the most keys sent in one memcached get. Default 100.
	MaxKeysPerGet int `yaml:"max_keys_per_get"`
	// SingleGetsInFlight is the most single-key gets one server has out
	// at once. Single-key reads that arrive while that many are out wait
	// for the first to return, then go out together as one multi-get
	// (each key once). Default 1: under load every single-key read but
	// the first waits at most one round trip and shares the next one; at
	// max_conns_per_server or more, reads wait for a connection instead
	// of for one another.
	SingleGetsInFlight int `yaml:"single_gets_in_flight"`
	// BreakerFailures is how many consecutive failures open a server's
	// breaker. Default 5.
	BreakerFailures uint32 `yaml:"breaker_failures"`
	// BreakerCoolDown is how long a breaker stays open before it lets one
	// probe call through. Default 1s.
	BreakerCoolDown time.Duration `yaml:"breaker_cool_down"`
}

// DefaultConfig returns the defaults, with one server on 127.0.0.1:11211.
func DefaultConfig() Config {
	return Config{
		Servers:            []string{"127.0.0.1:11211"},
		MaxConnsPerServer:  64,
		Timeout:            250 * time.Millisecond,
		TTL:                10 * time.Minute,
		NegativeTTL:        30 * time.Second,
		TombstoneTTL:       5 * time.Second,
		MaxKeysPerGet:      100,
		SingleGetsInFlight: 1,
		BreakerFailures:    5,
		BreakerCoolDown:    time.Second,
	}
}

// Validate reports every invalid field, each in a message that names the
// field, the rule and the value found.
func (c Config) Validate() error {
	errs := c.validateServers()
	if c.MaxConnsPerServer < 1 {
		errs = append(errs, fmt.Errorf("cache: max_conns_per_server must be ≥ 1, got %d", c.MaxConnsPerServer))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("cache: timeout must be > 0, got %v", c.Timeout))
	}
	errs = appendTTLError(errs, "ttl", c.TTL)
	errs = appendTTLError(errs, "negative_ttl", c.NegativeTTL)
	errs = appendTTLError(errs, "tombstone_ttl", c.TombstoneTTL)
	if c.MaxKeysPerGet < 1 {
		errs = append(errs, fmt.Errorf("cache: max_keys_per_get must be ≥ 1, got %d", c.MaxKeysPerGet))
	}
	if c.SingleGetsInFlight < 1 {
		errs = append(errs, fmt.Errorf("cache: single_gets_in_flight must be ≥ 1, got %d", c.SingleGetsInFlight))
	}
	if c.BreakerFailures < 1 {
		errs = append(errs, fmt.Errorf("cache: breaker_failures must be ≥ 1, got %d", c.BreakerFailures))
	}
	if c.BreakerCoolDown <= 0 {
		errs = append(errs, fmt.Errorf("cache: breaker_cool_down must be > 0, got %v", c.BreakerCoolDown))
	}
	return errors.Join(errs...)
}

func (c Config) validateServers() []error {
	if len(c.Servers) == 0 {
		return []error{errors.New("cache: servers must list at least one host:port, got none")}
	}
	var errs []error
	seen := make(map[string]bool, len(c.Servers))
	for _, s := range c.Servers {
		if _, _, err := net.SplitHostPort(s); err != nil {
			errs = append(errs, fmt.Errorf("cache: server %q must be host:port: %w", s, err))
		}
		if seen[s] {
			errs = append(errs, fmt.Errorf("cache: server %q is listed twice", s))
		}
		seen[s] = true
	}
	return errs
}

// appendTTLError checks a TTL: memcached counts whole seconds, and reads
// anything over 30 days as an absolute time.
func appendTTLError(errs []error, name string, d time.Duration) []error {
	if d < time.Second || d > maxRelativeTTL {
		return append(errs, fmt.Errorf("cache: %s must be between 1s and 720h, got %v", name, d))
	}
	return errs
}

// seconds converts a validated TTL to a memcached expiration, rounding up.
func seconds(d time.Duration) int32 {
	return int32((d + time.Second - 1) / time.Second)
}

// longestEntry is the longest an entry can outlive the write that made it
// stale: its lifetime, plus the tombstone's, which covers a read begun
// before the write that refilled it just after.
func (c Config) longestEntry() time.Duration { return max(c.TTL, c.NegativeTTL) + c.TombstoneTTL }
