package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/app"
)

// Tests that a SIGHUP reload refuses a file start-up would refuse, even
// when its admission section is valid: the budgets in force stay, instead
// of the file's budgets being applied from a file that no longer starts
// a server.
func TestReloadRefusesFileStartupRefuses(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte(budgetYAML(300)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", cfgPath, "--data-dir", filepath.Join(dir, "data"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--memcached", "127.0.0.1:1"}
	flags, err := parseServe(args)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := app.New(flags.cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := a.Guard.Budget("reloaded").Burst; got != 300 {
		t.Fatalf("burst %d at start, want 300", got)
	}
	// A valid budget beside an objective start-up refuses.
	bad := budgetYAML(700) + "slo:\n  availability: 0.5\n"
	if err := os.WriteFile(cfgPath, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	err = reload(a, args, cfgPath)
	if err == nil || !strings.Contains(err.Error(), "0.5") {
		t.Errorf("reload of a file start-up refuses: %v, want the objective's error", err)
	}
	if got := a.Guard.Budget("reloaded").Burst; got != 300 {
		t.Errorf("burst %d after reloading a file start-up refuses, want 300 kept", got)
	}
	if err := os.WriteFile(cfgPath, []byte(budgetYAML(700)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := reload(a, args, cfgPath); err != nil {
		t.Fatal(err)
	}
	if got := a.Guard.Budget("reloaded").Burst; got != 700 {
		t.Errorf("burst %d after a valid reload, want 700", got)
	}
}
