package main

import (
	"context"
	"errors"
	"flag"
	"testing"
)

// Tests that -h on every part returns flag.ErrHelp (main exits 0 on it)
// before doing any work, and that an unknown part is an error.
func TestHelpOnEveryPart(t *testing.T) {
	for _, part := range []string{"cachehit", "coldpath", "storeread", "incident", "peer", "capacity", "fairshare", "writepath"} {
		if err := run(context.Background(), []string{part, "-h"}); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("sluice-bench %s -h: %v, want flag.ErrHelp", part, err)
		}
	}
	if err := run(context.Background(), []string{"frobnicate"}); err == nil || errors.Is(err, flag.ErrHelp) {
		t.Errorf("sluice-bench frobnicate: %v, want an error", err)
	}
}
