package app

import (
	"io"
	"log/slog"
	"strings"
	"testing"
)

// Tests, end to end through the wiring sluice serve uses, that a handler
// whose method has no policy stops start-up with an error naming the
// method, for each of the two services.
func TestStartupRefusesMethodWithoutPolicy(t *testing.T) {
	for _, method := range []string{
		"sluice.v1.PostRecords/PutPostRecords",
		"bsky.Service/GetPostRecords",
	} {
		t.Run(method, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DataDir = t.TempDir()
			if _, ok := cfg.Guard.Methods[method]; !ok {
				t.Fatalf("the default config has no policy for %s to remove", method)
			}
			delete(cfg.Guard.Methods, method)
			a, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err == nil {
				a.Close()
				t.Fatalf("New succeeded without a policy for %s", method)
			}
			if !strings.Contains(err.Error(), "no policy for") || !strings.Contains(err.Error(), method[strings.IndexByte(method, '/')+1:]) {
				t.Fatalf("New failed with %q, want it to say there is no policy for %s", err, method)
			}
		})
	}
}
