package cqlstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
)

// Tests that a Get waiting for a slot gives up when its context ends, with
// the context's error and a message naming the limit, and sends nothing.
func TestSlotWaitBoundedByContext(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_slotwait")
	cfg.MaxInflight = 1
	obs := &cqltest.Observer{}
	cfg.QueryObserver = obs
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := cqlstore.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, before := obs.Peak()
	release, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond) // time to reach the wait on a loaded machine
	defer cancelShort()
	start := time.Now()
	_, err = s.Get(short, "at://did:plc:x/app.bsky.feed.post/3k")
	waited := time.Since(start)
	release()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "one of 1 in-flight CQL query slots") {
		t.Fatalf("Get while the slot is held: %v, want DeadlineExceeded naming the limit", err)
	}
	if waited > 5*time.Second {
		t.Errorf("Get waited %v for a 500ms deadline", waited)
	}
	if _, after := obs.Peak(); after != before {
		t.Errorf("%d queries sent while no slot was free, want 0", after-before)
	}
	if s.Stats().Waits != 1 {
		t.Errorf("waits = %d, want 1", s.Stats().Waits)
	}
}
