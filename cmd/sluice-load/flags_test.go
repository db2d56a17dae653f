package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Tests that an out-of-range --missing, --skew, --duration or
// --max-outstanding is refused with an error naming the flag instead of
// being taken for "not given", which would run the scenario's own value.
func TestOutOfRangeOverridesAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--missing", "-0.1"},
		{"--missing", "1.5"},
		{"--skew", "-1.1"},
		{"--skew", "0.5"},
		{"--duration", "-30s"},
		{"--max-outstanding", "-5"},
	} {
		full := append([]string{"--preset", "steady", "--uris", "u.txt"}, args...)
		if _, err := parseFlags(full, io.Discard); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("sluice-load %s: %v; want an error naming %s", strings.Join(args, " "), err, args[0])
		}
	}
	for _, args := range [][]string{{}, {"--missing", "0"}, {"--skew", "0"}, {"--skew", "1.1"}, {"--max-outstanding", "10"}} {
		full := append([]string{"--preset", "steady", "--uris", "u.txt"}, args...)
		if _, err := parseFlags(full, io.Discard); err != nil {
			t.Errorf("sluice-load %s: %v", strings.Join(args, " "), err)
		}
	}
}

// Tests that --without naming a client the scenario lacks is an error,
// as --rate's is, so that a typo does not leave the client in a run meant
// to be without it.
func TestWithoutUnknownClientIsRefused(t *testing.T) {
	f, err := parseFlags([]string{"--preset", "incident", "--uris", "u.txt", "--without", "blk"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := buildScenario(f); err == nil || !strings.Contains(err.Error(), "blk") {
		t.Errorf("--without blk: %v (clients %d); want an error naming blk", err, len(s.Clients))
	}
	f, err = parseFlags([]string{"--preset", "incident", "--uris", "u.txt", "--without", "bulk, feed"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := buildScenario(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range s.Clients {
		if c.Name == "bulk" || c.Name == "feed" {
			t.Errorf("--without bulk, feed left %s in", c.Name)
		}
	}
	if len(s.Clients) != 3 {
		t.Errorf("%d clients left, want 3", len(s.Clients))
	}
}

// Tests that --missing, like --uris and --skew, overrides the share of
// a client that names its own URI source, so --missing 0 sends no
// missing URI from any client.
func TestMissingOverridesEveryClient(t *testing.T) {
	file := filepath.Join(t.TempDir(), "s.yaml")
	yaml := `name: own-uris
duration: 1s
uris: {file: a.txt, missing: 0.02}
clients:
  - name: feed
    rate: 10
    batch: {dist: fixed, size: 1}
  - name: search
    rate: 10
    batch: {dist: fixed, size: 1}
    uris: {file: b.txt, missing: 0.5}
`
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := parseFlags([]string{"--scenario", file, "--missing", "0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := buildScenario(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range s.Clients {
		if got := s.ClientURIs(c).Missing; got != 0 {
			t.Errorf("client %s: missing share %v, want 0 (--missing 0)", c.Name, got)
		}
	}
}
