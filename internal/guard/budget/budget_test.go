package budget

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func testConfig() Config {
	return Config{
		Default: Budget{ItemsPerSecond: 1000, Burst: 1000, MaxInflightItems: 1000},
		Clients: map[string]Budget{"bulk": {ItemsPerSecond: 100, Burst: 200, MaxInflightItems: 150}},
	}
}

func mustNew(t *testing.T, cfg Config) *Budgets {
	t.Helper()
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Tests the token bucket: a burst is admitted at once, the next request
// is refused with the delay the bucket needs, and admitted after it.
func TestRateRefusalSaysWhenToRetry(t *testing.T) {
	b := mustNew(t, testConfig())
	rel, ref := b.Charge("bulk", 100, t0)
	if ref != nil {
		t.Fatalf("first 100 items: %v", ref)
	}
	rel()
	if rel, ref = b.Charge("bulk", 100, t0); ref != nil {
		t.Fatalf("second 100 items within the burst of 200: %v", ref)
	}
	rel()
	_, ref = b.Charge("bulk", 50, t0)
	if ref == nil || ref.Reason != OverRate {
		t.Fatalf("50 items with an empty bucket: %+v, want a rate refusal", ref)
	}
	if ref.RetryAfter != 500*time.Millisecond {
		t.Errorf("RetryAfter %v, want 500ms (50 items at 100/s)", ref.RetryAfter)
	}
	for _, want := range []string{`client "bulk"`, "100 items/s", "burst 200", "retry in 500ms"} {
		if !strings.Contains(ref.Error(), want) {
			t.Errorf("message %q lacks %q", ref.Error(), want)
		}
	}
	// The refused reservation was given back: after the delay it fits.
	if _, ref := b.Charge("bulk", 50, t0.Add(500*time.Millisecond)); ref != nil {
		t.Errorf("after the advised delay: %v", ref)
	}
}

// Tests the in-flight cap and that releasing frees it.
func TestInflightCap(t *testing.T) {
	b := mustNew(t, testConfig())
	rel, ref := b.Charge("bulk", 100, t0)
	if ref != nil {
		t.Fatal(ref)
	}
	_, ref = b.Charge("bulk", 100, t0)
	if ref == nil || ref.Reason != OverInflight || ref.Inflight != 100 {
		t.Fatalf("200 in flight over a cap of 150: %+v, want an inflight refusal", ref)
	}
	rel()
	rel() // idempotent
	if _, ref := b.Charge("bulk", 100, t0); ref != nil {
		t.Errorf("after release: %v", ref)
	}
}

// Tests that a request larger than the burst is refused as such, since
// waiting cannot help.
func TestOverBurst(t *testing.T) {
	b := mustNew(t, testConfig())
	_, ref := b.Charge("bulk", 201, t0)
	if ref == nil || ref.Reason != OverBurst || ref.RetryAfter != 0 {
		t.Fatalf("201 items over a burst of 200: %+v", ref)
	}
	if !strings.Contains(ref.Error(), "at most 200 items") {
		t.Errorf("message %q does not say how to comply", ref.Error())
	}
}

// Tests that unnamed callers get the default budget, each its own bucket.
func TestDefaultBudgetPerClient(t *testing.T) {
	b := mustNew(t, testConfig())
	for _, name := range []string{"unknown", "feed"} {
		if got := b.For(name); got != testConfig().Default {
			t.Errorf("For(%q) = %v, want the default", name, got)
		}
		if _, ref := b.Charge(name, 1000, t0); ref != nil {
			t.Errorf("%s: a full default burst: %v", name, ref)
		}
	}
	if _, ref := b.Charge("unknown", 1, t0); ref == nil || ref.Client != "unknown" {
		t.Errorf("unknown after its burst: %+v, want a refusal naming unknown", ref)
	}
}

// Tests that new budgets apply to clients already seen, keeping their
// in-flight items, and that an invalid config changes nothing.
func TestSetConfig(t *testing.T) {
	b := mustNew(t, testConfig())
	rel, ref := b.Charge("bulk", 100, t0)
	if ref != nil {
		t.Fatal(ref)
	}
	defer rel()
	bad := testConfig()
	bad.Clients["bulk"] = Budget{ItemsPerSecond: 0, Burst: 1, MaxInflightItems: 1}
	if err := b.SetConfig(bad, t0); err == nil || !strings.Contains(err.Error(), `client "bulk"`) {
		t.Fatalf("invalid config: %v, want an error naming bulk", err)
	}
	if got := b.For("bulk").Burst; got != 200 {
		t.Fatalf("burst %d after a refused reload, want the old 200", got)
	}
	next := testConfig()
	next.Clients["bulk"] = Budget{ItemsPerSecond: 10_000, Burst: 5000, MaxInflightItems: 120}
	if err := b.SetConfig(next, t0); err != nil {
		t.Fatal(err)
	}
	_, ref = b.Charge("bulk", 30, t0)
	if ref == nil || ref.Reason != OverInflight || ref.Budget.MaxInflightItems != 120 {
		t.Fatalf("100 in flight + 30 over the new cap 120: %+v", ref)
	}
	if _, ref := b.Charge("bulk", 20, t0.Add(time.Second)); ref != nil {
		t.Errorf("within the new budget: %v", ref)
	}
}

// Tests that the number of client states stays bounded however many
// names callers invent.
func TestTrackedBounded(t *testing.T) {
	b := mustNew(t, testConfig())
	var held []func()
	for i := range MaxTracked + 50 {
		rel, ref := b.Charge(fmt.Sprintf("c%d", i), 1, t0)
		if ref != nil {
			t.Fatalf("client %d: %v", i, ref)
		}
		held = append(held, rel)
	}
	if n := b.Tracked(); n > MaxTracked+1 {
		t.Errorf("tracking %d clients, bound %d (+1 overflow)", n, MaxTracked)
	}
	for _, rel := range held {
		rel()
	}
	// Once idle and refilled, old names are forgotten to make room.
	if _, ref := b.Charge("late", 1, t0.Add(time.Second)); ref != nil {
		t.Fatal(ref)
	}
	if n := b.Tracked(); n > 2 {
		t.Errorf("tracking %d clients after they all went idle, want the newcomer and the overflow only", n)
	}
}

// Tests that, with MaxTracked unnamed callers busy, a client the config
// names still gets its own budget, and that the overflow bucket the
// newcomers share has the default budget whoever arrived first, a named
// client included.
func TestNamedClientsNeverOverflow(t *testing.T) {
	b := mustNew(t, testConfig())
	for i := range MaxTracked {
		if _, ref := b.Charge(fmt.Sprintf("c%d", i), 1, t0); ref != nil {
			t.Fatalf("client %d: %v", i, ref)
		}
	}
	// Each busy: one item in flight, so none is forgotten. "bulk" is
	// named, with a burst of 200 and 150 in flight against the
	// default's 1,000.
	if _, ref := b.Charge("bulk", 150, t0); ref != nil {
		t.Fatalf("named client with MaxTracked others busy: %v", ref)
	}
	if _, ref := b.Charge("bulk", 1, t0); ref == nil || ref.Reason != OverInflight || ref.Budget.MaxInflightItems != 150 {
		t.Errorf("named client's 151st item in flight: %+v, want refused by its own cap of 150", ref)
	}
	if _, ref := b.Charge("stranger", 1000, t0); ref != nil {
		t.Errorf("unnamed newcomer within the default budget: %v", ref)
	}
	if _, ref := b.Charge("another", 1, t0); ref == nil || ref.Budget != testConfig().Default {
		t.Errorf("second unnamed newcomer: %+v, want refused by the shared overflow bucket's default budget", ref)
	}
}

func TestValidate(t *testing.T) {
	for _, bad := range []Budget{
		{ItemsPerSecond: 0, Burst: 1, MaxInflightItems: 1},
		{ItemsPerSecond: 1, Burst: 0, MaxInflightItems: 1},
		{ItemsPerSecond: 1, Burst: 1, MaxInflightItems: 0},
	} {
		if err := (Config{Default: bad}).Validate(); err == nil {
			t.Errorf("Validate(default %+v) = nil", bad)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Error(err)
	}
}

// Tests the fair-queuing fields: weight 0 means 1, a negative or huge
// weight and a bad unlisted_flows are refused naming the field.
func TestWeightAndFlows(t *testing.T) {
	b := DefaultConfig().Default
	if w := b.FairWeight(); w != 1 {
		t.Errorf("FairWeight of an unset weight = %v, want 1", w)
	}
	b.Weight = 2.5
	if w := b.FairWeight(); w != 2.5 {
		t.Errorf("FairWeight = %v, want 2.5", w)
	}
	for _, w := range []float64{-1, MaxWeight + 1} {
		b.Weight = w
		if err := b.Validate(); err == nil || !strings.Contains(err.Error(), "weight") {
			t.Errorf("weight %v: %v, want an error naming weight", w, err)
		}
	}
	c := DefaultConfig()
	c.UnlistedFlows = 0
	if c.Flows() != DefaultUnlistedFlows || c.Validate() != nil {
		t.Errorf("unlisted_flows 0: Flows %d, Validate %v; want the default and no error", c.Flows(), c.Validate())
	}
	c.UnlistedFlows = -1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "unlisted_flows") {
		t.Errorf("unlisted_flows -1: %v, want an error naming it", err)
	}
	c = DefaultConfig()
	if c.UnlistedShare() != DefaultUnlistedWeight {
		t.Errorf("unlisted_weight unset: UnlistedShare %v, want %d", c.UnlistedShare(), DefaultUnlistedWeight)
	}
	c.UnlistedWeight = 2.5
	if c.UnlistedShare() != 2.5 || c.Validate() != nil {
		t.Errorf("unlisted_weight 2.5: UnlistedShare %v, Validate %v", c.UnlistedShare(), c.Validate())
	}
	for _, w := range []float64{-1, MaxWeight + 1, math.NaN()} {
		c.UnlistedWeight = w
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "unlisted_weight must be between 0 (meaning 8) and 1000") {
			t.Errorf("unlisted_weight %v: %v, want an error naming it and its bounds", w, err)
		}
	}
}

// Tests Spend's charge held as a value: its items count in flight until
// Release, which takes out exactly them, and the zero Spent's Release
// changes nothing.
func TestSpendReleasesItsItems(t *testing.T) {
	b := mustNew(t, testConfig())
	spent, ref := b.Spend("bulk", 100, t0)
	if ref != nil {
		t.Fatalf("100 items: %v", ref)
	}
	if _, ref := b.Spend("bulk", 100, t0); ref == nil || ref.Reason != OverInflight || ref.Inflight != 100 {
		t.Fatalf("100 more with 100 of 150 in flight: %+v, want an in-flight refusal", ref)
	}
	spent.Release()
	Spent{}.Release()
	again, ref := b.Spend("bulk", 100, t0)
	if ref != nil {
		t.Fatalf("100 items after the release: %v", ref)
	}
	again.Release()
}

// Charge is Spend with the charge given back by a release function, for
// the tests: a release may be called more than once, and only the first
// call counts.
func (b *Budgets) Charge(name string, cost int64, now time.Time) (release func(), refusal *Refusal) {
	spent, refusal := b.Spend(name, cost, now)
	if refusal != nil {
		return nil, refusal
	}
	var once sync.Once
	return func() { once.Do(spent.Release) }, nil
}

// Tests that a refunded charge (a request shed before any work) gives
// its items back to the client's rate and its in-flight count, while a
// released one (work done) keeps them spent.
func TestRefundGivesTheItemsBack(t *testing.T) {
	b := mustNew(t, testConfig())
	spent, ref := b.Spend("bulk", 150, t0)
	if ref != nil {
		t.Fatal(ref)
	}
	spent.Refund(t0)
	if _, ref := b.Spend("bulk", 150, t0); ref != nil {
		t.Fatalf("the same 150 items again after a refund: %v, want admitted (burst 200, nothing done)", ref)
	}
	// That charge is released: the work was done, the items stay spent.
	b2 := mustNew(t, testConfig())
	done, _ := b2.Spend("bulk", 150, t0)
	done.Release()
	if _, ref := b2.Spend("bulk", 150, t0); ref == nil || ref.Reason != OverRate {
		t.Fatalf("150 items again after work was done: %+v, want a rate refusal", ref)
	}
}

// Tests that a charge refunded after another request of the client was
// refused for its rate gets all its items back: the refusal takes
// nothing from the bucket, not even from the refunds that follow it.
func TestRefundAfterARateRefusalGivesAllTheItemsBack(t *testing.T) {
	b := mustNew(t, testConfig())
	shed, ref := b.Spend("x", 600, t0) // 400 left of the burst of 1,000
	if ref != nil {
		t.Fatal(ref)
	}
	done, ref := b.Spend("x", 300, t0) // 100 left
	if ref != nil {
		t.Fatal(ref)
	}
	done.Release()
	if _, ref := b.Spend("x", 200, t0); ref == nil || ref.Reason != OverRate {
		t.Fatalf("200 items with 100 left: %+v, want a rate refusal", ref)
	}
	shed.Refund(t0) // 700 left
	if _, ref := b.Spend("x", 700, t0); ref != nil {
		t.Fatalf("700 items after the 600 were refunded with 100 left: %v, want admitted", ref)
	}
}

// Tests that a refund made while the client's later requests were
// charged gives back no more than the bucket would hold had the shed
// request never been charged: the refill during its wait is not counted
// twice, and the client never gets more than its burst at once.
func TestRefundNeverGivesMoreThanTheBurst(t *testing.T) {
	b := mustNew(t, Config{Default: Budget{ItemsPerSecond: 1000, Burst: 1000, MaxInflightItems: 100000}})
	shed, ref := b.Spend("c", 1000, t0) // full: 0 left
	if ref != nil {
		t.Fatal(ref)
	}
	t1 := t0.Add(500 * time.Millisecond)
	done, ref := b.Spend("c", 500, t1) // 500 refilled: 0 left
	if ref != nil {
		t.Fatal(ref)
	}
	defer done.Release()
	shed.Refund(t1)
	// Never charged, the bucket would have stayed full until t1 and held
	// 500 after the second request.
	if _, ref := b.Spend("c", 501, t1); ref == nil {
		t.Fatal("501 items admitted at once after the refund: with the 500 just admitted, more than the burst of 1,000")
	}
	if _, ref := b.Spend("c", 500, t1); ref != nil {
		t.Fatalf("500 items after the refund: %v, want admitted (what the bucket would hold had the shed request never been charged)", ref)
	}
}

// Tests that a request shed after waiting, with nothing else charged,
// leaves the bucket as full as if it had never been charged.
func TestRefundAfterAWaitRefillsToWhereItWouldBe(t *testing.T) {
	b := mustNew(t, Config{Default: Budget{ItemsPerSecond: 1000, Burst: 1000, MaxInflightItems: 100000}})
	shed, ref := b.Spend("c", 1000, t0)
	if ref != nil {
		t.Fatal(ref)
	}
	t1 := t0.Add(300 * time.Millisecond)
	shed.Refund(t1)
	if _, ref := b.Spend("c", 1000, t1); ref != nil {
		t.Fatalf("the whole burst after the only charge was refunded: %v, want admitted", ref)
	}
}
