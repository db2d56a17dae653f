package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"
)

// ChromiumBinary returns the chromium executable: $CHROMIUM_BIN, then
// PATH, then /usr/bin/chromium (Debian's package, which
// scripts/test-deps.sh installs).
func ChromiumBinary(t testing.TB) string {
	t.Helper()
	return binary(t, "CHROMIUM_BIN", "chromium", "/usr/bin/chromium")
}

// Chromium runs headless Chromium once with args after the flags that
// keep it quiet, offline and stateless (a fresh profile directory each
// run), and returns its standard output. It gives up after timeout.
func Chromium(t testing.TB, timeout time.Duration, args ...string) ([]byte, error) {
	t.Helper()
	bin := ChromiumBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	base := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--no-first-run", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(),
	}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return out, fmt.Errorf("chromium %v: %w\n%s", args, err, stderr)
	}
	return out, nil
}
