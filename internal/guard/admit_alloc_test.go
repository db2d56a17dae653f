package guard

import (
	"context"
	"testing"
	"time"
)

// Tests that admitting a request and releasing it allocates nothing: the
// budget charge, request slot and queued items are held as values, not
// as release closures, on the path every request takes.
func TestAdmitAllocatesNothing(t *testing.T) {
	const method = "sluice.v1.PostRecords/GetPostRecord"
	cfg := DefaultConfig()
	cfg.Methods = map[string]Policy{method: {MaxItems: 1, MaxURILength: 512, Concurrency: 1, Timeout: 5 * time.Second}}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	allocs := testing.AllocsPerRun(100, func() {
		admitted, reason, err := s.admit(ctx, "/"+method, "alloc-test", 1, false)
		if err != nil {
			t.Fatalf("admit: %v (%s)", err, reason)
		}
		admitted.release()
	})
	if allocs != 0 {
		t.Errorf("admit and release allocate %v times per request, want 0", allocs)
	}
	if n := s.InflightItems(); n != 0 {
		t.Errorf("%d items in flight after every release, want 0", n)
	}
}
