package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// runMainEnv, when set, makes the test binary run main with the
// arguments after "--" instead of the tests, so a test can check the
// exit status the real binary gives.
const runMainEnv = "SLUICE_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"sluice"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// sluice runs the binary's main with args and returns its exit status and
// what it printed.
func sluice(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run sluice %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// Tests that help exits 0 for every verb, with every spelling of the
// flag, and prints the verb's flags; and that a usage mistake exits 2.
func TestHelpExitsZero(t *testing.T) {
	for _, verb := range []string{"serve", "seed", "migrate"} {
		for _, flag := range []string{"-h", "--help", "-help"} {
			code, out := sluice(t, verb, flag)
			if code != 0 || !strings.Contains(out, "Usage of "+verb) {
				t.Errorf("sluice %s %s: exit %d, output %q; want 0 and the verb's flags", verb, flag, code, out)
			}
		}
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		if code, out := sluice(t, args...); code != 0 || !strings.Contains(out, "verbs:") {
			t.Errorf("sluice %v: exit %d, output %q; want 0 and the list of verbs", args, code, out)
		}
	}
	for _, args := range [][]string{{}, {"frobnicate"}} {
		if code, out := sluice(t, args...); code != 2 || !strings.Contains(out, "verbs:") {
			t.Errorf("sluice %v: exit %d, output %q; want 2 and the usage", args, code, out)
		}
	}
	if code, _ := sluice(t, "migrate", "--no-such-flag"); code == 0 {
		t.Errorf("sluice migrate --no-such-flag exited 0")
	}
}

// Tests that serve's help shows no stand-in default (a -1 meaning "not
// given") and that a negative drain timeout is refused before serving.
func TestServeFlagsSayWhatTheyMean(t *testing.T) {
	_, out := sluice(t, "serve", "-h")
	for _, stand := range []string{"(default -1ns)", "(default -1)"} {
		if strings.Contains(out, stand) {
			t.Errorf("serve -h prints %q:\n%s", stand, out)
		}
	}
	code, out := sluice(t, "serve", "--drain-timeout", "-1s", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	if want := "drain timeout -1s must be between 0 (stop at once) and 10m0s"; code != 1 || !strings.Contains(out, want) {
		t.Errorf("serve --drain-timeout -1s: exit %d, output %q; want 1 and %q", code, out, want)
	}
}
