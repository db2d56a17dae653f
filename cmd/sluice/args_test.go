package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/synth"
)

// Tests that a word left over after the flags is refused, not ignored:
// the flag package stops at the first argument that is not a flag, so
// "--memcached a:1 b:2 --config f" would otherwise serve without f.
func TestStrayArgumentsRefused(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte("slo:\n  availability: 0.99\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := parseServe([]string{"--memcached", "127.0.0.1:1", "127.0.0.1:2", "--config", cfgPath})
	if err == nil || !strings.Contains(err.Error(), `"127.0.0.1:2"`) {
		t.Errorf("serve with a stray argument: %v, want an error naming it", err)
	}
	err = seed(t.Context(), []string{"--posts", "1", "extra", "--uris-out", filepath.Join(t.TempDir(), "u")})
	if err == nil || !strings.Contains(err.Error(), `"extra"`) {
		t.Errorf("seed with a stray argument: %v, want an error naming it", err)
	}
	var out bytes.Buffer
	err = migrate(t.Context(), []string{"--cql-hosts", "127.0.0.1:1", "3"}, &out)
	if err == nil || !strings.Contains(err.Error(), `"3"`) {
		t.Errorf("migrate with a stray argument: %v, want an error naming it", err)
	}
}

// failingStore accepts a number of Put calls, then fails every one.
type failingStore struct {
	store.Store
	puts, okPuts int
}

func (s *failingStore) Put(context.Context, []store.Record) error {
	s.puts++
	if s.puts > s.okPuts {
		return errors.New("store down")
	}
	return nil
}

// Tests that when a seed fails part-way, the URIs file still lists every
// post the store accepted before the failure.
func TestSeedFailureKeepsWrittenURIs(t *testing.T) {
	urisOut := filepath.Join(t.TempDir(), "uris.txt")
	gen := synth.New(1, 10)
	st := &failingStore{okPuts: 2}
	err := writePosts(t.Context(), st, gen.Next, 50, 10, urisOut)
	if err == nil {
		t.Fatal("writePosts succeeded over a failing store")
	}
	raw, err := os.ReadFile(urisOut)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(strings.Fields(string(raw))); got != 20 {
		t.Errorf("URIs file lists %d posts after 2 batches of 10 were written, want 20", got)
	}
}

// Tests that a flag the config file can also set overrides it when
// given, even with an empty or zero value, and leaves it alone when not.
func TestGivenFlagsOverrideTheFileEvenWhenEmpty(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "c.yaml")
	file := "telemetry:\n  otlp_endpoint: collector:4317\n  trace_sample_ratio: 0.5\nguard:\n  memory_limit: 768MiB\n"
	if err := os.WriteFile(cfgPath, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	kept, err := parseServe([]string{"--config", cfgPath})
	if err != nil {
		t.Fatal(err)
	}
	if c := kept.cfg; c.Telemetry.OTLPEndpoint != "collector:4317" || c.Telemetry.TraceSampleRatio != 0.5 || c.Guard.MemoryLimit == 0 {
		t.Fatalf("without flags: endpoint %q, ratio %v, memory limit %v; want the file's", c.Telemetry.OTLPEndpoint, c.Telemetry.TraceSampleRatio, c.Guard.MemoryLimit)
	}
	cleared, err := parseServe([]string{"--config", cfgPath, "--otlp-endpoint", "", "--trace-sample-ratio", "0", "--memory-limit", "0"})
	if err != nil {
		t.Fatal(err)
	}
	if c := cleared.cfg; c.Telemetry.OTLPEndpoint != "" || c.Telemetry.TraceSampleRatio != 0 || c.Guard.MemoryLimit != 0 {
		t.Fatalf("with empty and zero flags: endpoint %q, ratio %v, memory limit %v; want them cleared", c.Telemetry.OTLPEndpoint, c.Telemetry.TraceSampleRatio, c.Guard.MemoryLimit)
	}
}
