package app

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/bskyrpc"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"github.com/sluice-dev/sluice/internal/identity"
	"github.com/sluice-dev/sluice/internal/journal"
	"github.com/sluice-dev/sluice/internal/nearcache"
	"github.com/sluice-dev/sluice/internal/rpc"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"gopkg.in/yaml.v3"
)

// fileConfig is the shape of the YAML file given with --config. Every
// section is optional; what it leaves out keeps its default.
type fileConfig struct {
	Guard     guard.Config       `yaml:"guard"`
	Cache     cacheFile          `yaml:"cache"`
	Telemetry telemetryFile      `yaml:"telemetry"`
	Admission *budget.Config     `yaml:"admission"`
	TLS       identity.TLSConfig `yaml:"tls"`
	Journal   journal.Config     `yaml:"journal"`
	SLO       telemetry.SLO      `yaml:"slo"`
	NearCache nearFile           `yaml:"near_cache"`
}

// nearFile holds the near cache settings a file may change; a field left
// out keeps its default, and ttl: 0 turns the near cache off.
type nearFile struct {
	TTL      *time.Duration   `yaml:"ttl"`
	MaxBytes *membudget.Bytes `yaml:"max_bytes"`
}

// cacheFile holds the cache settings a file may change; servers and the
// connection cap come from flags. A field left out keeps its default; a
// zero written is checked as written (and refused where invalid).
type cacheFile struct {
	Timeout            *time.Duration `yaml:"timeout"`
	TTL                *time.Duration `yaml:"ttl"`
	NegativeTTL        *time.Duration `yaml:"negative_ttl"`
	TombstoneTTL       *time.Duration `yaml:"tombstone_ttl"`
	MaxKeysPerGet      *int           `yaml:"max_keys_per_get"`
	SingleGetsInFlight *int           `yaml:"single_gets_in_flight"`
	BreakerFailures    *uint32        `yaml:"breaker_failures"`
	BreakerCoolDown    *time.Duration `yaml:"breaker_cool_down"`
}

// telemetryFile holds the telemetry settings a file may change; a field
// left out keeps its default, and trace_sample_ratio: 0 samples no new
// trace.
type telemetryFile struct {
	Clients          []string `yaml:"clients"`
	OTLPEndpoint     *string  `yaml:"otlp_endpoint"`
	TraceSampleRatio *float64 `yaml:"trace_sample_ratio"`
}

// setIfGiven sets *dst to *v when the file gave v.
func setIfGiven[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// maxDrainTimeout bounds how long SIGTERM may wait for in-flight
// requests: no request outlives its method's timeout (at most minutes),
// and an orchestrator kills a pod that takes longer.
const maxDrainTimeout = 10 * time.Minute

// Config is everything a sluice server needs, assembled from defaults,
// the config file and flags (in that order of precedence, lowest first).
type Config struct {
	DataDir      string
	GRPCAddr     string
	HTTPAddr     string
	DrainTimeout time.Duration
	// StoreReadDelay, when positive, is added to every store read to
	// rehearse a remote store's latency with the embedded one.
	StoreReadDelay time.Duration
	Guard          guard.Config
	Cache          cache.Config
	Telemetry      telemetry.Config
	// CQL selects the CQL store when its Hosts are set; DataDir is then
	// unused.
	CQL cqlstore.Config
	// TLS turns on mutual TLS and client allow-listing; off by default.
	TLS identity.TLSConfig
	// Journal tunes the store's invalidation journal and its follower.
	Journal journal.Config
	// SLO states the availability and latency objectives the burn-rate
	// alerts of deploy/prometheus hold sluice to.
	SLO telemetry.SLO
	// Near is the in-process near cache in front of memcached.
	Near nearcache.Config

	// AfterStoreWrite, when set, is called with a write's URIs between
	// the store write and the cache invalidation: a test hook for a crash
	// between the two. Not settable by the file or flags.
	AfterStoreWrite func(uris []string)

	// journalOrigin names this process in the journal; New sets it.
	journalOrigin string
}

// DefaultConfig returns the defaults of every component, with the
// default policy of every served method.
func DefaultConfig() Config {
	cfg := Config{
		DataDir:      ".data",
		GRPCAddr:     "127.0.0.1:50051",
		HTTPAddr:     "127.0.0.1:8080",
		DrainTimeout: 10 * time.Second,
		Guard:        guard.DefaultConfig(),
		Cache:        cache.DefaultConfig(),
		Telemetry:    telemetry.DefaultConfig(),
		CQL:          cqlstore.DefaultConfig(),
		SLO:          telemetry.DefaultSLO(),
		Near:         nearcache.DefaultConfig(),
	}
	for name, p := range rpc.DefaultPolicies() {
		cfg.Guard.Methods[name] = p
	}
	for name, p := range rpc.RecordsPolicies() {
		cfg.Guard.Methods[name] = p
	}
	for name, p := range bskyrpc.DefaultPolicies() {
		cfg.Guard.Methods[name] = p
	}
	return cfg
}

// LoadFile overlays the YAML file at path on c.
func (c *Config) LoadFile(path string) error {
	f, err := parseFile(path)
	if err != nil {
		return err
	}
	if err := c.checkMethodNames(f.Guard.Methods); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	c.Guard = c.Guard.Merge(f.Guard)
	c.Guard.Admission = f.admission()
	c.Cache = overlayCache(c.Cache, f.Cache)
	c.Telemetry = overlayTelemetry(c.Telemetry, f.Telemetry)
	c.TLS = f.TLS
	c.Journal = overlayJournal(c.Journal, f.Journal)
	c.SLO = c.SLO.Merge(f.SLO)
	setIfGiven(&c.Near.TTL, f.NearCache.TTL)
	if f.NearCache.MaxBytes != nil {
		c.Near.MaxBytes = int64(*f.NearCache.MaxBytes)
	}
	return nil
}

// checkMethodNames refuses a policy under a name no served method has: a
// misspelled name would otherwise leave the method it meant on its
// defaults without a word.
func (c Config) checkMethodNames(policies map[string]guard.Policy) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(policies)) {
		if _, ok := c.Guard.Methods[name]; ok {
			continue
		}
		service, _, _ := strings.Cut(name, "/")
		var same []string
		for _, known := range slices.Sorted(maps.Keys(c.Guard.Methods)) {
			if strings.HasPrefix(known, service+"/") {
				same = append(same, known)
			}
		}
		hint := "methods are named service/Method, as sluice.v1.PostRecords/GetPostRecords"
		if len(same) > 0 {
			hint = "the methods of " + service + " are " + strings.Join(same, ", ")
		}
		errs = append(errs, fmt.Errorf("guard.methods: %q is not a method sluice serves (%s)", name, hint))
	}
	return errors.Join(errs...)
}

func overlayJournal(c, f journal.Config) journal.Config {
	c.Disabled = c.Disabled || f.Disabled
	c.MaxLag = cmp.Or(f.MaxLag, c.MaxLag)
	c.Overlap = cmp.Or(f.Overlap, c.Overlap)
	c.StartReplay = cmp.Or(f.StartReplay, c.StartReplay)
	c.Parallelism = cmp.Or(f.Parallelism, c.Parallelism)
	c.Retention = cmp.Or(f.Retention, c.Retention)
	return c
}

// parseFile reads the YAML file at path, refusing unknown keys.
func parseFile(path string) (fileConfig, error) {
	var f fileConfig
	raw, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return f, fmt.Errorf("config %s: %w", path, err)
	}
	return f, nil
}

// admission returns the file's budgets: the built-in default budget
// where the file names none, plus the file's named clients.
func (f fileConfig) admission() budget.Config {
	cfg := budget.DefaultConfig()
	if f.Admission == nil {
		return cfg
	}
	if f.Admission.Default != (budget.Budget{}) {
		cfg.Default = f.Admission.Default
	}
	maps.Copy(cfg.Clients, f.Admission.Clients)
	cfg.UnlistedFlows = cmp.Or(f.Admission.UnlistedFlows, cfg.UnlistedFlows)
	cfg.UnlistedWeight = f.Admission.UnlistedWeight
	return cfg
}

func overlayCache(c cache.Config, f cacheFile) cache.Config {
	setIfGiven(&c.Timeout, f.Timeout)
	setIfGiven(&c.TTL, f.TTL)
	setIfGiven(&c.NegativeTTL, f.NegativeTTL)
	setIfGiven(&c.TombstoneTTL, f.TombstoneTTL)
	setIfGiven(&c.BreakerCoolDown, f.BreakerCoolDown)
	setIfGiven(&c.MaxKeysPerGet, f.MaxKeysPerGet)
	setIfGiven(&c.SingleGetsInFlight, f.SingleGetsInFlight)
	setIfGiven(&c.BreakerFailures, f.BreakerFailures)
	return c
}

func overlayTelemetry(c telemetry.Config, f telemetryFile) telemetry.Config {
	if f.Clients != nil {
		c.Clients = f.Clients
	}
	setIfGiven(&c.OTLPEndpoint, f.OTLPEndpoint)
	setIfGiven(&c.TraceSampleRatio, f.TraceSampleRatio)
	return c
}

// Validate checks every component's config and how they fit together.
func (c Config) Validate() error {
	var errs []error
	if err := c.guardConfig().Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Cache.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Telemetry.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.TLS.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.CQL.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Journal.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Near.Validate(); err != nil {
		errs = append(errs, err)
	}
	if need := c.longestEntry() + c.Cache.TombstoneTTL + journal.ReplayMargin; !c.Journal.Disabled && c.Journal.WithDefaults().Retention < need {
		errs = append(errs, fmt.Errorf("config: journal retention %v must be at least the cache's longest entry lifetime plus its tombstone lifetime plus %v (%v): a replay onto a memcached server that was away longer than the retention, and the start-up replay, which leaves the last %v of the retention unread, must still reach every change that can have left a stale entry", c.Journal.WithDefaults().Retention, journal.ReplayMargin, need, journal.ReplayMargin))
	}
	if err := c.SLO.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.DrainTimeout < 0 || c.DrainTimeout > maxDrainTimeout {
		errs = append(errs, fmt.Errorf("config: drain timeout %v must be between 0 (stop at once) and %v", c.DrainTimeout, maxDrainTimeout))
	}
	errs = append(errs, c.checkClientNames()...)
	errs = append(errs, c.checkTakedownTimeouts()...)
	if err := c.checkTombstoneTTL(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkClientNames refuses a client name in admission.clients,
// telemetry.clients or a method's oversize that no caller could be
// named (identity.CheckName): a name cut or cleaned on the way in would
// never match it, or would match another caller's.
func (c Config) checkClientNames() []error {
	var errs []error
	check := func(where, name string) {
		if err := identity.CheckName(name); err != nil {
			errs = append(errs, fmt.Errorf("config: %s: %w", where, err))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Guard.Admission.Clients)) {
		check("admission.clients", name)
	}
	for i, name := range c.Telemetry.Clients {
		check(fmt.Sprintf("telemetry.clients[%d]", i), name)
	}
	for _, method := range slices.Sorted(maps.Keys(c.Guard.Methods)) {
		for _, name := range slices.Sorted(maps.Keys(c.Guard.Methods[method].Oversize)) {
			check(fmt.Sprintf("guard.methods[%q].oversize", method), name)
		}
	}
	return errs
}

// guardConfig is the guard's config with the near cache's cap counted
// in its memory budget.
func (c Config) guardConfig() guard.Config {
	g := c.Guard
	if c.Near.Enabled() {
		g.CacheBytes = membudget.Bytes(c.Near.MaxBytes)
	}
	return g
}

// MemoryPlan is the memory budget the server will run with.
func (c Config) MemoryPlan() guard.MemoryPlan { return c.guardConfig().Memory() }

// checkTombstoneTTL refuses a tombstone that could expire before a read
// that fetched the record before the write has refilled it: such a read
// waits for a refill connection at most until its request's timeout (a
// split batch's own, when a method gives one), then may dial one and
// write its refill, each within the cache's timeout; and memcached counts
// expiry in whole seconds, so a tombstone of tombstone_ttl can be gone a
// second early.
func (c Config) checkTombstoneTTL() error {
	longest, which := c.longestTimeout()
	need := longest + 2*c.Cache.Timeout + time.Second
	if c.Cache.TombstoneTTL >= need {
		return nil
	}
	return fmt.Errorf("config: cache tombstone_ttl %v must be at least %v: the longest request timeout (%v, %s) plus twice the cache timeout (%v: a refill's dial and its write) plus 1s (memcached counts expiry in whole seconds), or a slow read could refill a stale record after the tombstone expired", c.Cache.TombstoneTTL, need, longest, which, c.Cache.Timeout)
}

// checkTakedownTimeouts refuses write methods that cannot wait out the
// near cache's horizon: a takedown or lift is answered only near_cache.ttl
// after its invalidation (so that no replica still answers the old
// state), and a method timeout no longer than that would fail every one.
func (c Config) checkTakedownTimeouts() []error {
	if !c.Near.Enabled() {
		return nil
	}
	var errs []error
	for _, name := range []string{
		sluicev1.Records_ServiceDesc.ServiceName + "/PutRecords",
		sluicev1.Records_ServiceDesc.ServiceName + "/UpdateTakedowns",
		sluicev1.PostRecords_ServiceDesc.ServiceName + "/PutPostRecords",
	} {
		if p, ok := c.Guard.Methods[name]; ok && p.Timeout <= c.Near.TTL {
			errs = append(errs, fmt.Errorf("config: method %s timeout %v must exceed near_cache.ttl %v: a takedown is answered only once no replica's near cache can still answer the old state, near_cache.ttl after it was invalidated", name, p.Timeout, c.Near.TTL))
		}
	}
	return errs
}

// longestEntry is the longest a cache entry lives.
func (c Config) longestEntry() time.Duration { return max(c.Cache.TTL, c.Cache.NegativeTTL) }

// longestTimeout is the longest a request can take: the longest method
// timeout or split batch timeout, and which one it is.
func (c Config) longestTimeout() (time.Duration, string) {
	var longest time.Duration
	var which string
	for _, name := range slices.Sorted(maps.Keys(c.Guard.Methods)) {
		p := c.Guard.Methods[name]
		if p.Timeout > longest {
			longest, which = p.Timeout, "method "+name
		}
		for _, client := range slices.Sorted(maps.Keys(p.Oversize)) {
			if t := p.Oversize[client].Timeout; t > longest {
				longest, which = t, fmt.Sprintf("the split timeout of client %q on %s", client, name)
			}
		}
	}
	return longest, which
}
