// Package budget charges each client for the items it asks sluice to work
// on, so that no caller can take more than its share however few
// requests it sends.
//
// A Budget is a token bucket of items per second with a burst, plus a cap
// on the client's items in flight. Named clients get the budget the
// config gives them; every other caller, "unknown" included, gets the
// default budget, each name in its own bucket. Spend either
// admits a request at once or refuses it at once with the reason and how
// long to wait: it never queues. Budgets can be replaced while serving (SetConfig)
// without losing the tokens or in-flight counts of the clients already
// seen.
//
// The package decides nothing about gRPC codes, process-wide capacity or
// who a caller is; the guard does.
package budget

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"
)

// Budget is what one client may spend.
type Budget struct {
	// ItemsPerSecond is the sustained rate of items (URIs) admitted.
	ItemsPerSecond float64 `yaml:"items_per_second"`
	// Burst is the most items admitted at once after a quiet spell, and
	// so the largest request the client can ever send.
	Burst int `yaml:"burst"`
	// MaxInflightItems bounds the client's items being worked on at once.
	MaxInflightItems int64 `yaml:"max_inflight_items"`
	// Weight is the client's share of the process's item capacity, relative
	// to other clients, when callers together ask for more than it holds
	// (fair queuing in package queue; this package only carries it).
	// 0 means 1.
	Weight float64 `yaml:"weight,omitempty"`
}

// FairWeight is the weight fair queuing uses: Weight, or 1 when unset.
func (b Budget) FairWeight() float64 {
	if b.Weight == 0 {
		return 1
	}
	return b.Weight
}

// Validate reports the first field that is not usable.
func (b Budget) Validate() error {
	switch {
	case b.ItemsPerSecond <= 0 || math.IsInf(b.ItemsPerSecond, 0) || math.IsNaN(b.ItemsPerSecond):
		return fmt.Errorf("items_per_second must be a positive number, got %v", b.ItemsPerSecond)
	case b.Burst < 1:
		return fmt.Errorf("burst must be at least 1, got %d", b.Burst)
	case b.MaxInflightItems < 1:
		return fmt.Errorf("max_inflight_items must be at least 1, got %d", b.MaxInflightItems)
	case b.Weight < 0 || b.Weight > MaxWeight || math.IsNaN(b.Weight):
		return fmt.Errorf("weight must be between 0 (meaning 1) and %d, got %v", MaxWeight, b.Weight)
	}
	return nil
}

// MaxWeight bounds Weight, so that no client's share can round the
// others' to nothing.
const MaxWeight = 1000

// String describes the budget for messages to callers.
func (b Budget) String() string {
	return fmt.Sprintf("%g items/s, burst %d, %d items in flight", b.ItemsPerSecond, b.Burst, b.MaxInflightItems)
}

// Config is the admission section of the config file.
type Config struct {
	// Default applies to every client not named in Clients, "unknown"
	// included; each such client has its own bucket.
	Default Budget `yaml:"default"`
	// Clients gives named clients their own budgets. Each also has its
	// own flow in fair queuing; a named client's entry is a whole budget.
	Clients map[string]Budget `yaml:"clients"`
	// UnlistedFlows is how many fair-queuing flows all callers not named
	// in Clients share (a name gets a free one while any is, else the one
	// it hashes to; guard's unlistedFlows): so callers that invent names
	// get at most this many shares together, and the state kept for them
	// stays bounded. 0 means DefaultUnlistedFlows.
	UnlistedFlows int `yaml:"unlisted_flows"`
	// UnlistedWeight is the most weight the unlisted flows hold together.
	// Each in use has the default budget's weight while that keeps their
	// sum within it; beyond, they share it evenly, so names invented by
	// the thousand get at most this many shares between them, however
	// many flows they hold. 0 means DefaultUnlistedWeight.
	UnlistedWeight float64 `yaml:"unlisted_weight,omitempty"`
}

// Flows returns UnlistedFlows, or its default when unset.
func (c Config) Flows() int {
	if c.UnlistedFlows == 0 {
		return DefaultUnlistedFlows
	}
	return c.UnlistedFlows
}

// UnlistedShare returns UnlistedWeight, or its default when unset.
func (c Config) UnlistedShare() float64 {
	if c.UnlistedWeight == 0 {
		return DefaultUnlistedWeight
	}
	return c.UnlistedWeight
}

// DefaultUnlistedWeight is UnlistedWeight unless the config says
// otherwise: eight unlisted callers at the default weight each, as many
// as a small fleet of services that do not name themselves, while a
// flood of invented names gets eight shares, not one per flow.
const DefaultUnlistedWeight = 8

// DefaultUnlistedFlows is UnlistedFlows unless the config says otherwise:
// as many queues as Kubernetes' API Priority and Fairness gives a
// priority level, so a fleet of a few dozen unnamed services rarely has
// two callers on one flow (a light caller sharing a heavy one's flow
// inherits its queue); invented names get at most UnlistedWeight shares
// however many flows they hold.
const DefaultUnlistedFlows = 64

// MaxUnlistedFlows bounds UnlistedFlows.
const MaxUnlistedFlows = 1024

// DefaultConfig is generous enough for any normal caller: 20,000 items/s
// with a burst of 5,000, and 5,000 items in flight.
func DefaultConfig() Config {
	return Config{Default: Budget{ItemsPerSecond: 20_000, Burst: 5_000, MaxInflightItems: 5_000}, Clients: map[string]Budget{}, UnlistedFlows: DefaultUnlistedFlows}
}

// Validate checks the default and every named budget.
func (c Config) Validate() error {
	errs := []error{}
	if err := c.Default.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("admission: default: %w", err))
	}
	if c.UnlistedFlows < 0 || c.UnlistedFlows > MaxUnlistedFlows {
		errs = append(errs, fmt.Errorf("admission: unlisted_flows must be between 1 and %d (0 means %d), got %d", MaxUnlistedFlows, DefaultUnlistedFlows, c.UnlistedFlows))
	}
	if c.UnlistedWeight < 0 || c.UnlistedWeight > MaxWeight || math.IsNaN(c.UnlistedWeight) {
		errs = append(errs, fmt.Errorf("admission: unlisted_weight must be between 0 (meaning %d) and %d, got %v", DefaultUnlistedWeight, MaxWeight, c.UnlistedWeight))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Clients)) {
		if err := c.Clients[name].Validate(); err != nil {
			errs = append(errs, fmt.Errorf("admission: client %q: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// For returns the budget of client.
func (c Config) For(client string) Budget {
	if b, ok := c.Clients[client]; ok {
		return b
	}
	return c.Default
}

// Reasons a charge is refused.
const (
	OverRate     = "rate"     // the token bucket lacks the items for now
	OverBurst    = "burst"    // the request is larger than the bucket
	OverInflight = "inflight" // the client already has too many items in flight
)

// Refusal says why a charge was refused and when to try again.
type Refusal struct {
	Client     string
	Budget     Budget
	Cost       int64
	Reason     string        // OverRate, OverBurst or OverInflight
	RetryAfter time.Duration // 0 for OverBurst: retrying cannot help
	Inflight   int64         // the client's items in flight, for OverInflight
}

// Error describes the refusal, naming the client and its budget.
func (r *Refusal) Error() string {
	switch r.Reason {
	case OverBurst:
		return fmt.Sprintf("client %q: a request of %d items exceeds its burst of %d (budget %v); send requests of at most %d items", r.Client, r.Cost, r.Budget.Burst, r.Budget, r.Budget.Burst)
	case OverInflight:
		return fmt.Sprintf("client %q: %d items in flight plus %d exceeds its cap of %d (budget %v); wait for responses before sending more", r.Client, r.Inflight, r.Cost, r.Budget.MaxInflightItems, r.Budget)
	}
	return fmt.Sprintf("client %q: %d items over its rate (budget %v); retry in %v", r.Client, r.Cost, r.Budget, r.RetryAfter.Round(time.Millisecond))
}

// MaxTracked bounds how many client names have their own state, beside
// the clients the config names (which always have theirs); beyond it,
// idle clients are forgotten, and if none is idle an unnamed newcomer
// shares one overflow bucket with the default budget.
const MaxTracked = 10_000

// overflowName keys the shared state of untracked names.
const overflowName = "\x00overflow"

// Budgets holds the state of every client seen. It is safe for
// concurrent use.
type Budgets struct {
	mu      sync.Mutex
	cfg     Config
	clients map[string]*client
}

type client struct {
	budget   Budget
	bucket   bucket
	inflight int64
}

// New returns Budgets for cfg.
func New(cfg Config) (*Budgets, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Budgets{cfg: cfg, clients: map[string]*client{}}, nil
}

// Config returns the budgets in force.
func (b *Budgets) Config() Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg
}

// For returns the budget in force for name.
func (b *Budgets) For(name string) Budget { return b.Config().For(name) }

// SetConfig replaces the budgets. Clients already seen keep their tokens
// (up to the new burst) and their in-flight items; an invalid cfg changes
// nothing.
func (b *Budgets) SetConfig(cfg Config, now time.Time) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cfg = cfg
	for name, c := range b.clients {
		bud := cfg.For(name)
		if name == overflowName {
			bud = cfg.Default
		}
		c.setBudget(bud, now)
	}
	return nil
}

func (c *client) setBudget(bud Budget, now time.Time) {
	c.budget = bud
	c.bucket.set(bud.ItemsPerSecond, bud.Burst, now)
}

// Spend admits cost items for name at now, or refuses them. On success
// the caller must call the charge's Release exactly once when the
// request is done.
func (b *Budgets) Spend(name string, cost int64, now time.Time) (Spent, *Refusal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.state(name, now)
	bud := c.budget
	refuse := func(reason string, after time.Duration) *Refusal {
		return &Refusal{Client: name, Budget: bud, Cost: cost, Reason: reason, RetryAfter: after, Inflight: c.inflight}
	}
	if cost > int64(bud.Burst) || cost > bud.MaxInflightItems {
		return Spent{}, refuse(OverBurst, 0)
	}
	if c.inflight+cost > bud.MaxInflightItems {
		return Spent{}, refuse(OverInflight, 0)
	}
	// A refusal leaves the bucket as it was.
	short := float64(cost) - c.bucket.at(now)
	if d := time.Duration(short / bud.ItemsPerSecond * float64(time.Second)); d > 0 {
		return Spent{}, refuse(OverRate, d)
	}
	c.bucket.take(float64(cost), now)
	c.inflight += cost
	return Spent{b: b, c: c, cost: cost, left: c.bucket.tokens, at: now}, nil
}

// Spent is a charge Spend admitted: cost items in flight for a client
// until Release. It is a value, so that admitting a request allocates
// nothing for its release.
type Spent struct {
	b    *Budgets
	c    *client
	cost int64
	left float64   // the tokens the charge left in the client's bucket
	at   time.Time // when they were taken
}

// Release takes the charge's items out of flight. It must be called
// exactly once; the zero Spent's Release does nothing.
func (s Spent) Release() {
	if s.b == nil {
		return
	}
	s.b.mu.Lock()
	s.c.inflight -= s.cost
	s.b.mu.Unlock()
}

// Refund is Release for a request shed before any work, at now: it also
// gives the charge's items back to the client's bucket, as many as it
// would hold now had they never been taken (bucket.refund), so that a
// caller is charged only for work done and a shed retried after its
// RetryInfo is not paid for twice, and never gets more than its burst at
// once. It must be called exactly once, instead of Release.
func (s Spent) Refund(now time.Time) {
	if s.b == nil {
		return
	}
	s.b.mu.Lock()
	s.c.inflight -= s.cost
	s.c.bucket.give(s.c.bucket.refund(float64(s.cost), s.left, s.at, now), now)
	s.b.mu.Unlock()
}

// state returns name's state, creating it with a full bucket. A client
// named in the config always has its own; an unnamed one shares the
// overflow bucket, with the default budget, while MaxTracked others are
// busy.
func (b *Budgets) state(name string, now time.Time) *client {
	if c, ok := b.clients[name]; ok {
		return c
	}
	_, listed := b.cfg.Clients[name]
	if !listed && len(b.clients) >= MaxTracked {
		b.forgetIdle(now)
	}
	key, bud := name, b.cfg.For(name)
	if !listed && len(b.clients) >= MaxTracked {
		key, bud = overflowName, b.cfg.Default
		if c, ok := b.clients[key]; ok {
			return c
		}
	}
	c := &client{budget: bud, bucket: newBucket(bud.ItemsPerSecond, bud.Burst, now)}
	b.clients[key] = c
	return c
}

// forgetIdle drops clients with nothing in flight and a full bucket:
// forgetting them changes nothing they could observe.
func (b *Budgets) forgetIdle(now time.Time) {
	for name, c := range b.clients {
		if c.inflight == 0 && c.bucket.at(now) >= float64(c.budget.Burst) && name != overflowName {
			delete(b.clients, name)
		}
	}
}

// Tracked reports how many client states are held.
func (b *Budgets) Tracked() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.clients)
}
