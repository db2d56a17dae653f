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
