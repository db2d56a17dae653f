package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/app/apptest"
	"github.com/sluice-dev/sluice/internal/loadgen/report"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Tests, against a real sluice, that the exit status is 0 when every
// --slo target is met, 3 when one is missed (an impossible p99, a client
// that errs, a client not in the run) and 1 when a target cannot be
// parsed; and that --json, --html and --compare write what they promise.
func TestSLOExitCodesAndOutputs(t *testing.T) {
	s := apptest.Start(t, apptest.Options{Posts: 300})
	dir := t.TempDir()
	scenarioFile := filepath.Join(dir, "s.yaml")
	yaml := `name: exit-codes
duration: 1s
uris: {file: ` + s.URIFile + `}
clients:
  - name: feed
    rate: 30
    batch: {dist: uniform, min: 1, max: 20}
  - name: bulk
    rate: 3
    batch: {dist: fixed, size: 5000}
`
	if err := os.WriteFile(scenarioFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--target", s.GRPCAddr, "--metrics", s.MetricsURL, "--scenario", scenarioFile, "--progress", "0"}
	for _, tc := range []struct {
		name string
		slos []string
		want int
	}{
		{"met", []string{"client=feed,p99<20s,errors=0", "client=bulk,items/s=0"}, exitOK},
		{"impossible p99", []string{"client=feed,p99<1ns"}, exitSLOMissed},
		{"bulk refused by shape", []string{"client=bulk,errors=0"}, exitSLOMissed},
		{"unknown client", []string{"client=nobody,errors=0"}, exitSLOMissed},
		{"bad target", []string{"client=feed,p99<fast"}, exitError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string(nil), common...)
			for _, spec := range tc.slos {
				args = append(args, "--slo", spec)
			}
			jsonOut := filepath.Join(t.TempDir(), "r.json")
			args = append(args, "--json", jsonOut)
			var stdout, stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if got := run(ctx, args, &stdout, &stderr); got != tc.want {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", got, tc.want, stdout.String(), stderr.String())
			}
			if tc.want == exitError {
				if !strings.Contains(stderr.String(), "p99 needs a duration") {
					t.Errorf("stderr %q does not say what is wrong", stderr.String())
				}
				return
			}
			r, err := report.ReadJSON(jsonOut)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.SLO) != len(tc.slos) || r.Client("bulk").Codes["InvalidArgument"] == 0 {
				t.Errorf("report SLOs %+v, bulk %+v", r.SLO, r.Client("bulk"))
			}
		})
	}

	t.Run("html and compare", func(t *testing.T) {
		a, b, page := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json"), filepath.Join(dir, "r.html")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out bytes.Buffer
		if code := run(ctx, append(common, "--json", a, "--html", page), &out, &out); code != exitOK {
			t.Fatalf("exit %d: %s", code, out.String())
		}
		if code := run(ctx, append(common, "--json", b, "--without", "bulk"), &out, &out); code != exitOK {
			t.Fatalf("exit %d: %s", code, out.String())
		}
		html, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		checkSelfContained(t, string(html))
		out.Reset()
		if code := run(ctx, []string{"--compare", a, b}, &out, &out); code != exitOK {
			t.Fatalf("compare exit %d: %s", code, out.String())
		}
		// feed is in both runs (a ratio), bulk only in A (no ratio).
		if !regexp.MustCompile(`feed\s+p99 ms\s+\S+\s+\S+\s+\d+\.\d\d`).MatchString(out.String()) ||
			!regexp.MustCompile(`bulk\s+requests\s+\d+\s+-\s+-`).MatchString(out.String()) {
			t.Errorf("compare output:\n%s", out.String())
		}
	})
}

// checkSelfContained asserts the page loads nothing from elsewhere and
// holds a latency and an items/s chart naming every client.
func checkSelfContained(t *testing.T, html string) {
	t.Helper()
	if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*"?(https?:|//)`).FindString(html); m != "" {
		t.Errorf("page loads an external asset: %s", m)
	}
	if strings.Contains(html, "<script") || strings.Contains(html, "<link") {
		t.Error("page has a script or link element")
	}
	if n := strings.Count(html, "<svg"); n < 3 {
		t.Errorf("page has %d SVG charts, want latency, items/s and vital signs", n)
	}
	for _, want := range []string{"p99 latency per second", "items answered per second", "server: goroutines", ">feed<", ">bulk<"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
