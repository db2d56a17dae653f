package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Tests that -h and --help exit 0 and print the flags, and that a flag
// that does not exist does not.
func TestHelpExitsZero(t *testing.T) {
	for _, flag := range []string{"-h", "--help", "-help"} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{flag}, &stdout, &stderr); code != exitOK || !strings.Contains(stderr.String(), "-scenario") {
			t.Errorf("sluice-load %s: exit %d, stderr %q; want %d and the flags", flag, code, stderr.String(), exitOK)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"--no-such-flag"}, &stdout, &stderr); code != exitError {
		t.Errorf("sluice-load --no-such-flag: exit %d, want %d", code, exitError)
	}
}
