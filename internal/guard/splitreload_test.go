package guard_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/sluice-dev/sluice/internal/guard/budget"
)

// Tests that a client dropped from admission.clients on reload may no
// longer split, though the method's oversize policy still names it:
// after a reload without "indexer", its 20,000-URI batch, split before
// the reload, is refused with InvalidArgument naming max_items without
// reaching the handler, as any other caller's is.
func TestSplitRefusedAfterReloadDropsTheClient(t *testing.T) {
	cfg := splitConfig(budget.Budget{ItemsPerSecond: 1e6, Burst: 5_000, MaxInflightItems: 5_000})
	f := start(t, cfg, newPostRecords())
	if _, err := as(t, "indexer").get(f, 20_000); err != nil {
		t.Fatalf("indexer's 20,000 URIs while it has a budget of its own: %v", err)
	}

	next := cfg.Admission
	next.Clients = map[string]budget.Budget{"feed": cfg.Admission.Clients["feed"]}
	if err := f.srv.SetBudgets(next); err != nil {
		t.Fatalf("reload without indexer: %v", err)
	}
	before := f.impl.calls.Load()
	_, err := as(t, "indexer").get(f, 20_000)
	st := wantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(st.Message(), "limit of 1000") {
		t.Errorf("message %q does not name the limit of 1000", st.Message())
	}
	if got := f.impl.calls.Load(); got != before {
		t.Errorf("the handler ran %d times for indexer's batch after it was dropped, want 0", got-before)
	}
}

// Tests that a reload cannot leave a client that may split unable to: a
// budget whose burst or in-flight cap is below one piece is refused, as
// at start-up, and the budget in force stays.
func TestSplitReloadKeepsAPieceAdmissible(t *testing.T) {
	cfg := splitConfig(budget.Budget{ItemsPerSecond: 1e6, Burst: 5_000, MaxInflightItems: 5_000})
	f := start(t, cfg, newPostRecords())
	for _, b := range []budget.Budget{
		{ItemsPerSecond: 1e6, Burst: 50, MaxInflightItems: 5_000},
		{ItemsPerSecond: 1e6, Burst: 5_000, MaxInflightItems: 50},
	} {
		next := cfg.Admission
		next.Clients = map[string]budget.Budget{"indexer": b, "feed": cfg.Admission.Clients["feed"]}
		if err := f.srv.SetBudgets(next); err == nil || !strings.Contains(err.Error(), "at least one piece") {
			t.Errorf("reload with indexer at %v: %v, want refused for a piece that can never be admitted", b, err)
		}
	}
	if got := f.srv.Budget("indexer"); got.Burst != 5_000 || got.MaxInflightItems != 5_000 {
		t.Errorf("indexer's budget after the refused reloads is %v, want the one in force before", got)
	}
	if _, err := as(t, "indexer").get(f, 20_000); err != nil {
		t.Errorf("indexer's 20,000 URIs after the refused reloads: %v", err)
	}
}
