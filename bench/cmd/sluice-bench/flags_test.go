package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Tests that a part refuses a worker count, batch size, duration or
// round count below 1, naming the flag, before it measures anything:
// zero workers measure 0 items/s (a ratio of NaN), an empty batch reads
// nothing for the whole duration, zero rounds divide by zero.
func TestNonPositiveCountsAreRefused(t *testing.T) {
	uris := filepath.Join(t.TempDir(), "uris.txt")
	if err := os.WriteFile(uris, []byte("at://did:plc:x/app.bsky.feed.post/3k\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Nothing listens on port 1: a part that goes on to measure fails
	// with a connection error that names no flag.
	const nowhere = "127.0.0.1:1"
	for _, args := range [][]string{
		{"cachehit", "--target", nowhere, "--uris", uris, "--concurrency", "0"},
		{"cachehit", "--target", nowhere, "--uris", uris, "--batch", "0"},
		{"capacity", "--target", nowhere, "--uris", uris, "--duration", "0s"},
		{"coldpath", "--target", nowhere, "--metrics", "http://" + nowhere, "--uris", uris, "--concurrency", "-2"},
		{"writepath", "--on", nowhere, "--off", nowhere, "--uris", uris, "--written", "1", "--rounds", "0"},
		{"writepath", "--on", nowhere, "--off", nowhere, "--uris", uris, "--written", "1", "--readers", "0"},
		{"peer", "--sluice", nowhere, "--peer", nowhere, "--sluice-pid", "1", "--peer-pid", "1", "--memcached-pid", "1", "--uris", uris, "--no-warm", "--rounds", "0"},
		{"peer", "--sluice", nowhere, "--peer", nowhere, "--sluice-pid", "1", "--peer-pid", "1", "--memcached-pid", "1", "--uris", uris, "--no-warm", "--concurrency", "0"},
		{"peer", "--sluice", nowhere, "--peer", nowhere, "--sluice-pid", "1", "--peer-pid", "1", "--memcached-pid", "1", "--uris", uris, "--no-warm", "--control-pid", "0", "--control", nowhere},
		{"peer", "--sluice", nowhere, "--peer", nowhere, "--sluice-pid", "1", "--peer-pid", "1", "--memcached-pid", "1", "--uris", uris, "--no-warm", "--control", nowhere, "--control-pid", "1", "--control-cases", "zipf0"},
	} {
		flag := args[len(args)-2]
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a part that measures anyway stops at once
		if err := run(ctx, args); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("sluice-bench %s: %v; want an error naming %s", strings.Join(args, " "), err, flag)
		}
	}
}
