package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// PrometheusBinary returns the prometheus executable: $PROMETHEUS_BIN,
// then PATH, then /usr/bin/prometheus (Debian's package, which
// scripts/test-deps.sh installs).
func PrometheusBinary(t testing.TB) string {
	t.Helper()
	return binary(t, "PROMETHEUS_BIN", "prometheus", "/usr/bin/prometheus")
}

// PromtoolBinary returns the promtool executable: $PROMTOOL_BIN, then
// PATH, then /usr/bin/promtool (shipped in Debian's prometheus package).
func PromtoolBinary(t testing.TB) string {
	t.Helper()
	return binary(t, "PROMTOOL_BIN", "promtool", "/usr/bin/promtool")
}

// Prometheus is a private Prometheus server owned by one test: its own
// config, its own TSDB in a temporary directory, a free loopback port.
type Prometheus struct {
	// URL is the server's base URL, e.g. http://127.0.0.1:40123.
	URL string
	// API is a client of its HTTP API.
	API promv1.API
}

// StartPrometheus starts Prometheus scraping each target's /metrics every
// second under job "sluice", waits until it is ready, and stops it when
// the test ends. Its log goes to the test log if the test fails.
func StartPrometheus(t testing.TB, targets ...string) *Prometheus {
	t.Helper()
	return StartPrometheusWithRules(t, nil, targets...)
}

// StartPrometheusWithRules is StartPrometheus loading the rule files
// given (absolute paths), evaluated every second.
func StartPrometheusWithRules(t testing.TB, ruleFiles []string, targets ...string) *Prometheus {
	t.Helper()
	bin := PrometheusBinary(t)
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, target := range targets {
		quoted[i] = strconv.Quote(target)
	}
	rules := make([]string, len(ruleFiles))
	for i, f := range ruleFiles {
		rules[i] = strconv.Quote(f)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%s]
scrape_configs:
  - job_name: sluice
    scrape_interval: 1s
    scrape_timeout: 1s
    static_configs:
      - targets: [%s]
`, strings.Join(rules, ", "), strings.Join(quoted, ", "))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatalf("prometheus config: %v", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatalf("prometheus log: %v", err)
	}
	cmd := exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			if raw, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("prometheus log:\n%s", raw)
			}
		}
	})
	p := &Prometheus{URL: "http://" + addr}
	if err := waitHTTP(p.URL+"/-/ready", 30*time.Second); err != nil {
		t.Fatalf("prometheus on %s: %v", addr, err)
	}
	client, err := promapi.NewClient(promapi.Config{Address: p.URL})
	if err != nil {
		t.Fatalf("prometheus client: %v", err)
	}
	p.API = promv1.NewAPI(client)
	return p
}

// waitHTTP waits until url answers 200 or timeout passes.
func waitHTTP(url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %v", timeout, last)
}

// binary finds an executable by environment variable, PATH name, or
// fixed path, or reports it missing.
func binary(t testing.TB, env, name, fallback string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat(fallback); err == nil {
		return fallback
	}
	Missing(t, name, fmt.Sprintf("no %s binary in %s, PATH or %s", name, env, fallback))
	return ""
}

// WaitForSeries waits until expr returns at least n series, or fails the
// test after timeout saying what the scrape targets report.
func (p *Prometheus) WaitForSeries(t testing.TB, expr string, n int, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		v, _, _, err := p.API.Query(ctx, expr, time.Now())
		if vec, ok := v.(model.Vector); err == nil && ok && len(vec) >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("prometheus: %s did not return %d series within %v; targets: %s", expr, n, timeout, p.targets())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// targets describes the scrape targets' health, for failure messages.
func (p *Prometheus) targets() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := p.API.Targets(ctx)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, tg := range res.Active {
		parts = append(parts, fmt.Sprintf("%s %s (last scrape %v ago, took %v, error %q)", tg.ScrapeURL, tg.Health, time.Since(tg.LastScrape).Round(time.Millisecond), time.Duration(tg.LastScrapeDuration*float64(time.Second)).Round(time.Millisecond), tg.LastError))
	}
	return strings.Join(parts, "; ")
}
