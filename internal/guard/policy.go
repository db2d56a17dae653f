package guard

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/adaptive"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/queue"
	"github.com/sluice-dev/sluice/internal/procs"
)

// Policy bounds one gRPC method. Every field must be positive: a zero
// value is not a valid policy, so a method cannot be served by accident
// without limits.
type Policy struct {
	// MaxItems is the most URIs one request may carry.
	MaxItems int `yaml:"max_items"`
	// MaxURILength is the longest URI accepted, in bytes.
	MaxURILength int `yaml:"max_uri_length"`
	// Concurrency is how many parallel tasks one request may run
	// (the errgroup limit of its fan-outs).
	Concurrency int `yaml:"concurrency"`
	// Timeout bounds the whole request; a shorter client deadline wins.
	Timeout time.Duration `yaml:"timeout"`
	// Oversize says, by client name, what happens to that client's
	// batches over MaxItems: refused (every caller's default) or split
	// into pieces of MaxItems, at most PieceItems (see split.go).
	Oversize map[string]Oversize `yaml:"oversize,omitempty"`
}

// Validate reports the first field that is not usable.
func (p Policy) Validate() error {
	switch {
	case p.MaxItems < 1:
		return fmt.Errorf("max_items must be at least 1, got %d", p.MaxItems)
	case p.MaxURILength < 1:
		return fmt.Errorf("max_uri_length must be at least 1, got %d", p.MaxURILength)
	case p.Concurrency < 1:
		return fmt.Errorf("concurrency must be at least 1, got %d", p.Concurrency)
	case p.Timeout <= 0:
		return fmt.Errorf("timeout must be positive, got %v", p.Timeout)
	}
	return nil
}

// Config is the guard's configuration: a policy per method and the
// process-wide caps that bound all requests together.
type Config struct {
	// Methods maps a method name, "package.Service/Method"
	// (e.g. "sluice.v1.PostRecords/GetPostRecords"), to its policy.
	Methods map[string]Policy `yaml:"methods"`
	// MaxInflightItems bounds the items being worked on across all
	// requests: the upper bound of the adaptive item limit. A request
	// waits for its item count in the queue, or is shed.
	MaxInflightItems int64 `yaml:"max_inflight_items"`
	// MinInflightItems is the lower bound of the adaptive item limit
	// (package adaptive); equal to MaxInflightItems it fixes the limit.
	// 0 means four pieces (4 × PieceItems), within MaxInflightItems. A
	// request larger than the limit in force, which only a batch that
	// is not served in pieces can be, runs alone rather than never.
	MinInflightItems int64 `yaml:"min_inflight_items"`
	// PieceItems is the most items of one read batch admitted at once: a
	// larger batch of a method whose answer is one list aligned with
	// the request is charged to its caller's budget whole, then served
	// in pieces of this many items, each waiting for its own items in
	// the fair queue (pieces.go).
	PieceItems int `yaml:"piece_items"`
	// LightReserveItems is how far over the item limit in force the
	// requests of callers under their fair share may go, past the
	// queue or next in line, while heavier callers wait (package queue's
	// reserve), at most a quarter of that limit. 0 means one piece
	// (PieceItems).
	LightReserveItems int64 `yaml:"light_reserve_items"`
	// AdaptiveTolerance is how far above its no-load floor the mean
	// service time may rise before the item limit shrinks.
	AdaptiveTolerance float64 `yaml:"adaptive_tolerance"`
	// AdaptiveInterval is how often the item limit is recomputed.
	AdaptiveInterval time.Duration `yaml:"adaptive_interval"`
	// MaxInflightRequests bounds the requests being worked on at once.
	MaxInflightRequests int64 `yaml:"max_inflight_requests"`
	// SaturatedProcsPerCPU is how many Go processors per CPU `sluice
	// serve` runs while the guard queues or sheds (package procs); 1
	// keeps Go's own number throughout, 0 means the default, procs.DefaultPerCPU.
	SaturatedProcsPerCPU int `yaml:"saturated_procs_per_cpu"`
	// MaxRecvMsgBytes is the largest request message the transport
	// decodes; larger ones are refused before they reach memory.
	MaxRecvMsgBytes int `yaml:"max_recv_msg_bytes"`
	// MaxQueuedRequests bounds the requests waiting for item capacity
	// (later pieces of a batch aside, two at most per request) and those
	// waiting for a request slot; an arrival that finds its queue full
	// is shed at once.
	MaxQueuedRequests int `yaml:"max_queued_requests"`
	// QueueTarget is the longest wait for item capacity once the queue
	// has stood (not emptied) for QueueInterval: CoDel's M.
	QueueTarget time.Duration `yaml:"queue_target"`
	// QueueInterval is CoDel's N: how long the queue must stay non-empty
	// to count as standing, and the longest wait otherwise.
	QueueInterval time.Duration `yaml:"queue_interval"`
	// Admission holds the per-client budgets. It is not read from the
	// guard section of the config file but from its own admission
	// section, and can be replaced while serving (Server.SetBudgets).
	Admission budget.Config `yaml:"-"`
	// MemoryConfig holds the memory budget and the caps derived from it
	// (memory.go); its keys sit in the guard section.
	MemoryConfig `yaml:",inline"`
}

// DefaultPieceItems is piece_items unless the config says otherwise: one
// memcached GetMulti's worth of keys.
const DefaultPieceItems = 100

// minPieces is how many pieces the automatic min_inflight_items holds.
const minPieces = 4

// DefaultPolicy is the policy of a batch read or write method unless the
// config file says otherwise.
func DefaultPolicy() Policy {
	return Policy{MaxItems: 1000, MaxURILength: 512, Concurrency: 50, Timeout: 2 * time.Second}
}

// DefaultConfig returns the process-wide defaults with no method policies;
// the packages that implement services add theirs.
func DefaultConfig() Config {
	return Config{
		Methods:              map[string]Policy{},
		MaxInflightItems:     20_000,
		PieceItems:           DefaultPieceItems,
		AdaptiveTolerance:    adaptive.DefaultTolerance,
		AdaptiveInterval:     adaptive.DefaultInterval,
		MaxInflightRequests:  1_024,
		SaturatedProcsPerCPU: procs.DefaultPerCPU,
		MaxRecvMsgBytes:      16 << 20,
		MaxQueuedRequests:    1_024,
		QueueTarget:          5 * time.Millisecond,
		QueueInterval:        100 * time.Millisecond,
		Admission:            budget.DefaultConfig(),
	}
}

// Validate checks the process-wide caps and every policy, naming the
// first bad method.
func (c Config) Validate() error {
	var errs []error
	if c.MaxInflightItems < 1 || c.MaxInflightItems > maxCount {
		errs = append(errs, fmt.Errorf("guard: max_inflight_items must be between 1 and %d, got %d", int64(maxCount), c.MaxInflightItems))
	}
	if c.MaxInflightRequests < 1 || c.MaxInflightRequests > maxCount {
		errs = append(errs, fmt.Errorf("guard: max_inflight_requests must be between 1 and %d, got %d", int64(maxCount), c.MaxInflightRequests))
	}
	if c.SaturatedProcsPerCPU < 0 || c.SaturatedProcsPerCPU > procs.MaxPerCPU {
		errs = append(errs, fmt.Errorf("guard: saturated_procs_per_cpu must be between 1 (Go's own number) and %d, or 0 for the default %d, got %d", procs.MaxPerCPU, procs.DefaultPerCPU, c.SaturatedProcsPerCPU))
	}
	if c.MaxRecvMsgBytes < 1024 {
		errs = append(errs, fmt.Errorf("guard: max_recv_msg_bytes must be at least 1024, got %d", c.MaxRecvMsgBytes))
	}
	if c.PieceItems < 1 || int64(c.PieceItems) > c.MaxInflightItems {
		errs = append(errs, fmt.Errorf("guard: piece_items must be between 1 and max_inflight_items %d, got %d", c.MaxInflightItems, c.PieceItems))
	}
	if c.LightReserveItems < 0 || c.LightReserveItems > c.MaxInflightItems {
		errs = append(errs, fmt.Errorf("guard: light_reserve_items must be between 0 (one piece) and max_inflight_items %d, got %d", c.MaxInflightItems, c.LightReserveItems))
	}
	if c.MinInflightItems < 0 || c.MinInflightItems > c.MaxInflightItems {
		errs = append(errs, fmt.Errorf("guard: min_inflight_items must be between 0 (automatic) and max_inflight_items %d, got %d", c.MaxInflightItems, c.MinInflightItems))
	} else if err := c.adaptiveConfig().Validate(); err != nil && c.MaxInflightItems >= 1 {
		errs = append(errs, fmt.Errorf("guard: adaptive_tolerance, adaptive_interval: %w", err))
	}
	if c.MaxQueuedRequests < 1 {
		errs = append(errs, fmt.Errorf("guard: max_queued_requests must be at least 1, got %d", c.MaxQueuedRequests))
	} else if err := c.queueConfig().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("guard: queue_target, queue_interval: %w", err))
	}
	if err := c.Admission.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("guard: %w", err))
	}
	if err := c.Memory().validate(c); err != nil {
		errs = append(errs, err)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Methods)) {
		p := c.Methods[name]
		if err := p.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("guard: method %s: %w", name, err))
		}
		errs = append(errs, c.validateOversize(name, p)...)
		if int64(p.MaxItems) > c.MaxInflightItems {
			errs = append(errs, fmt.Errorf("guard: method %s: max_items %d exceeds max_inflight_items %d, so a full batch could never be admitted", name, p.MaxItems, c.MaxInflightItems))
		}
	}
	return errors.Join(errs...)
}

// Merge overlays the non-zero fields of override on c, method by method.
// A method named only in override is taken whole.
func (c Config) Merge(override Config) Config {
	out := c
	out.Methods = make(map[string]Policy, len(c.Methods))
	for name, p := range c.Methods {
		out.Methods[name] = p
	}
	for name, o := range override.Methods {
		out.Methods[name] = overlayPolicy(out.Methods[name], o)
	}
	out.MaxInflightItems = cmp.Or(override.MaxInflightItems, c.MaxInflightItems)
	out.MinInflightItems = cmp.Or(override.MinInflightItems, c.MinInflightItems)
	out.PieceItems = cmp.Or(override.PieceItems, c.PieceItems)
	out.LightReserveItems = cmp.Or(override.LightReserveItems, c.LightReserveItems)
	out.AdaptiveTolerance = cmp.Or(override.AdaptiveTolerance, c.AdaptiveTolerance)
	out.AdaptiveInterval = cmp.Or(override.AdaptiveInterval, c.AdaptiveInterval)
	out.MaxInflightRequests = cmp.Or(override.MaxInflightRequests, c.MaxInflightRequests)
	out.SaturatedProcsPerCPU = cmp.Or(override.SaturatedProcsPerCPU, c.SaturatedProcsPerCPU)
	out.MaxRecvMsgBytes = cmp.Or(override.MaxRecvMsgBytes, c.MaxRecvMsgBytes)
	out.MaxQueuedRequests = cmp.Or(override.MaxQueuedRequests, c.MaxQueuedRequests)
	out.QueueTarget = cmp.Or(override.QueueTarget, c.QueueTarget)
	out.QueueInterval = cmp.Or(override.QueueInterval, c.QueueInterval)
	out.MemoryConfig = c.MemoryConfig.merge(override.MemoryConfig)
	return out
}

// queueConfig is the item queue's share of the config.
func (c Config) queueConfig() queue.Config {
	reserve := c.LightReserveItems
	if reserve == 0 {
		reserve = min(int64(max(c.PieceItems, 1)), c.MaxInflightItems)
	}
	return queue.Config{Capacity: c.MaxInflightItems, MaxWaiters: c.MaxQueuedRequests, Target: c.QueueTarget, Interval: c.QueueInterval,
		Reserve: min(max(reserve, 0), c.MaxInflightItems)}
}

// requestQueueConfig is the request slots' share of the config: a
// queue of max_inflight_requests slots, each request costing one, so
// that when every slot is taken the next goes to the caller furthest
// under its fair share, not to the longest waiter, under the same
// controlled-delay rule as items. No request passes the queue (no
// reserve): a slot is a goroutine and a request's memory.
func (c Config) requestQueueConfig() queue.Config {
	return queue.Config{Capacity: c.MaxInflightRequests, MaxWaiters: c.MaxQueuedRequests, Target: c.QueueTarget, Interval: c.QueueInterval}
}

// adaptiveConfig is the item limit controller's share of the config.
func (c Config) adaptiveConfig() adaptive.Config {
	lo := c.MinInflightItems
	if lo == 0 {
		lo = min(minPieces*int64(max(c.PieceItems, 1)), c.MaxInflightItems)
	}
	return adaptive.Config{Min: lo, Max: c.MaxInflightItems, Tolerance: c.AdaptiveTolerance, Interval: c.AdaptiveInterval}
}

func overlayPolicy(base, o Policy) Policy {
	base.MaxItems = cmp.Or(o.MaxItems, base.MaxItems)
	base.MaxURILength = cmp.Or(o.MaxURILength, base.MaxURILength)
	base.Concurrency = cmp.Or(o.Concurrency, base.Concurrency)
	base.Timeout = cmp.Or(o.Timeout, base.Timeout)
	if o.Oversize != nil {
		base.Oversize = o.Oversize
	}
	return base
}

// methodName turns a gRPC full method "/pkg.Svc/M" into "pkg.Svc/M".
func methodName(fullMethod string) string { return strings.TrimPrefix(fullMethod, "/") }

// shortName is the bare method name used in messages to callers.
func shortName(fullMethod string) string {
	return fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
}
