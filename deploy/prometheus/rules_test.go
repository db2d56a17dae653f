// Package prometheus_test checks sluice's Prometheus rules: promtool
// accepts them, every alert has a promtool unit test that fires it and
// one that expects it not to, every runbook_url leads to a section of
// docs/operations.md, and, against a
// real Prometheus scraping a real sluice, the oversized-caller alert
// fires naming the caller.
package prometheus_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"gopkg.in/yaml.v3"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/app/apptest"
	"github.com/sluice-dev/sluice/internal/loadgen"
	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
	"github.com/sluice-dev/sluice/internal/testenv"
)

const (
	rulesFile  = "prometheus_rules.yaml"
	alertsFile = "prometheus_alerts.yaml"
	runbooks   = "https://github.com/sluice-dev/sluice/blob/main/docs/operations.md#"
)

// ruleFile is the shape of a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readRules(t *testing.T, path string) []rule {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

func promtool(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(testenv.PromtoolBinary(t), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), bytes.TrimSpace(out))
}

// Tests that promtool accepts both rule files, and the production-like
// stack's Prometheus config that loads them (with the container's rule
// paths pointed at this directory).
func TestPromtoolCheckRules(t *testing.T) {
	promtool(t, "check", "rules", rulesFile, alertsFile)
	raw, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{rulesFile, alertsFile} {
		if !bytes.Contains(raw, []byte("/etc/prometheus/sluice/"+f)) {
			t.Errorf("prometheus.yml does not load %s", f)
		}
	}
	cfg := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(cfg, bytes.ReplaceAll(raw, []byte("/etc/prometheus/sluice/"), []byte(here+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "config", cfg)
}

// Tests the rules against the promtool unit tests in tests/: the
// recording rules' figures, and for every alert input series that fire
// it and a near miss that does not (TestEveryAlertIsTestedAndDocumented
// checks that each alert has both).
func TestPromtoolTestRules(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("tests", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests in tests/ (%v)", err)
	}
	promtool(t, append([]string{"test", "rules"}, files...)...)
}

// unitTests is the part of a promtool test file this test reads.
type unitTests struct {
	Tests []struct {
		InputSeries []struct {
			Series string `yaml:"series"`
			Values string `yaml:"values"`
		} `yaml:"input_series"`
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			EvalTime  string `yaml:"eval_time"`
			// ExpAlerts is nil when the case leaves exp_alerts out,
			// and points to an empty list for `exp_alerts: []`.
			ExpAlerts *[]struct {
				ExpLabels map[string]string `yaml:"exp_labels"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// Tests that every alerting rule — each of the burn-rate rules that
// share one name is told apart by its labels — has a promtool case that
// expects it to fire, that every alert name has a near miss: a case that
// says `exp_alerts: []` in a test with input series (the series are just
// under the threshold, or over it for less than the `for:`; each test
// file's comments say which), and that every alert carries what an
// on-call needs: a severity, a summary, a description and a runbook.
func TestEveryAlertIsTestedAndDocumented(t *testing.T) {
	fired := map[string][]map[string]string{}
	nearMiss := map[string][]string{}
	files, _ := filepath.Glob(filepath.Join("tests", "*.yaml"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var u unitTests
		if err := yaml.Unmarshal(raw, &u); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, tc := range u.Tests {
			for _, a := range tc.AlertRuleTest {
				if a.ExpAlerts == nil {
					continue
				}
				if len(*a.ExpAlerts) == 0 && len(tc.InputSeries) > 0 {
					nearMiss[a.Alertname] = append(nearMiss[a.Alertname], f+" at "+a.EvalTime)
				}
				for _, e := range *a.ExpAlerts {
					fired[a.Alertname] = append(fired[a.Alertname], e.ExpLabels)
				}
			}
		}
	}
	alerts := 0
	seen := map[string]bool{}
	for _, r := range readRules(t, alertsFile) {
		if r.Alert == "" {
			continue
		}
		alerts++
		if !slices.ContainsFunc(fired[r.Alert], func(l map[string]string) bool { return hasAll(l, r.Labels) }) {
			t.Errorf("alert %s %v: no promtool case in tests/ expects it to fire", r.Alert, r.Labels)
		}
		if !seen[r.Alert] && len(nearMiss[r.Alert]) == 0 {
			t.Errorf("alert %s: no near miss in tests/: add an alert_rule_test case with `exp_alerts: []` at an eval_time where its input series are just under the threshold, or over it for less than its `for:` (for: %s)", r.Alert, cmp.Or(r.For, "none"))
		}
		seen[r.Alert] = true
		if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
			t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, s)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if r.Annotations[a] == "" {
				t.Errorf("alert %s: no %s annotation", r.Alert, a)
			}
		}
		if d := r.Annotations["description"]; strings.Contains(r.Expr, "client_method") && !(strings.Contains(d, "$labels.client") && strings.Contains(d, "$labels.method")) {
			t.Errorf("alert %s: a per-client alert whose description does not name the client and method: %s", r.Alert, d)
		}
	}
	if alerts < 20 {
		t.Errorf("%d alerting rules in %s; the file lost some", alerts, alertsFile)
	}
}

func hasAll(got, want map[string]string) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// headingAnchor is the anchor GitHub gives a Markdown heading.
func headingAnchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	h = regexp.MustCompile(`[^\p{L}\p{N}\- _]`).ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// Tests that every alert's runbook_url is a section of docs/operations.md.
func TestRunbookURLsExist(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{1,6} (.+)$`).FindAllStringSubmatch(string(raw), -1) {
		anchors[headingAnchor(m[1])] = true
	}
	seen := map[string]bool{}
	for _, r := range readRules(t, alertsFile) {
		if r.Alert == "" || seen[r.Alert] {
			continue
		}
		seen[r.Alert] = true
		url := r.Annotations["runbook_url"]
		anchor, ok := strings.CutPrefix(url, runbooks)
		if !ok {
			t.Errorf("alert %s: runbook_url %q is not under %s", r.Alert, url, runbooks)
			continue
		}
		if !anchors[anchor] {
			t.Errorf("alert %s: runbook_url %s: docs/operations.md has no heading with anchor #%s", r.Alert, url, anchor)
		}
	}
}

// fastRules writes a copy of the rule files to a temporary directory with
// every alert's `for` cut to 2s, so that a real Prometheus evaluating
// them every second fires an alert within seconds of its expression
// turning true. The expressions are the shipped ones, unchanged. It
// returns the copies' paths.
func fastRules(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	forLine := regexp.MustCompile(`(?m)^(\s+for:) \S+$`)
	var paths []string
	for _, f := range []string{rulesFile, alertsFile} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, f)
		if err := os.WriteFile(p, forLine.ReplaceAll(raw, []byte("$1 2s")), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// Tests the oversized-caller alert end to end: a real Prometheus loads
// the rules (with `for` cut to 2s, see fastRules) and scrapes a real
// sluice while the incident preset's bulk client sends its 15,000 to
// 20,000-URI batches; SluiceClientOversizedBatches must go to firing,
// naming bulk and the method, read from Prometheus's /api/v1/alerts.
func TestOversizedCallerAlertFires(t *testing.T) {
	srv := apptest.Start(t, apptest.Options{Posts: 200, Configure: func(c *app.Config) {
		c.Telemetry.Clients = []string{"bulk"}
	}})
	prom := testenv.StartPrometheusWithRules(t, fastRules(t), strings.TrimPrefix(srv.AdminURL, "http://"))
	prom.WaitForSeries(t, `up{job="sluice"} == 1`, 1, 30*time.Second)

	incident, err := scenario.Preset("incident", srv.URIFile)
	if err != nil {
		t.Fatal(err)
	}
	bulk := slices.IndexFunc(incident.Clients, func(c scenario.Client) bool { return c.Name == "bulk" })
	if bulk < 0 {
		t.Fatal("the incident preset has no bulk client")
	}
	incident.Clients = incident.Clients[bulk : bulk+1]
	incident.Duration = 90 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := loadgen.Run(ctx, loadgen.Options{Target: srv.GRPCAddr, Scenario: incident})
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("load: %v", err)
		}
	}()

	start := time.Now()
	var last []promv1.Alert
	for ctx.Err() == nil {
		res, err := prom.API.Alerts(ctx)
		if err == nil {
			last = res.Alerts
			for _, a := range res.Alerts {
				if a.Labels["alertname"] == "SluiceClientOversizedBatches" && a.State == promv1.AlertStateFiring {
					t.Logf("firing %.1fs after the bulk client started: %v\n  %s", time.Since(start).Seconds(), a.Labels, a.Annotations["description"])
					if a.Labels["client"] != "bulk" || a.Labels["method"] != "GetPostRecords" || a.Labels["reason"] != "shape" {
						t.Errorf("alert labels %v; want client=bulk, method=GetPostRecords, reason=shape", a.Labels)
					}
					if d := string(a.Annotations["description"]); !strings.HasPrefix(d, "bulk calling sluice.v1.PostRecords/GetPostRecords") {
						t.Errorf("description %q does not name bulk and its method first", d)
					}
					return
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("SluiceClientOversizedBatches did not fire within %v; alerts: %s", time.Since(start).Round(time.Second), describe(last))
}

func describe(alerts []promv1.Alert) string {
	var parts []string
	for _, a := range alerts {
		parts = append(parts, fmt.Sprintf("%s %s", a.State, a.Labels))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}
