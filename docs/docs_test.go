// Package docs_test keeps the documentation honest: README.md fits on two
// screens, every relative link of README.md and docs/*.md leads to a file
// and heading that exist, every metric the pages name is exported by a
// real sluice, and every recorded series they name is recorded by
// deploy/prometheus.
package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/app/apptest"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
)

// pages returns the Markdown files the test reads, by path from this
// directory.
func pages(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join("..", "README.md"), filepath.Join("..", "deploy", "grafana", "README.md"))
	out := map[string]string{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = string(raw)
	}
	if len(out) < 10 {
		t.Fatalf("only %d pages found", len(out))
	}
	return out
}

var (
	fence   = regexp.MustCompile("(?s)```.*?```")
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// anchors returns the GitHub anchors of a page's headings.
func anchors(page string) map[string]bool {
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(page, ""), -1) {
		h := strings.ToLower(strings.TrimSpace(m[1]))
		h = regexp.MustCompile(`[^\p{L}\p{N}\- _]`).ReplaceAllString(h, "")
		out[strings.ReplaceAll(h, " ", "-")] = true
	}
	return out
}

// Tests that every relative link in the pages resolves: the file exists,
// and a #fragment into a Markdown file names one of its headings.
func TestLinksResolve(t *testing.T) {
	all := pages(t)
	checked := 0
	for path, page := range all {
		for _, m := range link.FindAllStringSubmatch(fence.ReplaceAllString(page, ""), -1) {
			target := m[1]
			if regexp.MustCompile(`^[a-z]+:`).MatchString(target) {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Join(filepath.Dir(path), file)
			}
			raw, err := os.ReadFile(dest)
			if err != nil && !isDir(dest) {
				t.Errorf("%s: link %s: %v", path, target, err)
				continue
			}
			checked++
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(string(raw))[frag] {
				t.Errorf("%s: link %s: %s has no heading with anchor #%s", path, target, dest, frag)
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d links checked; the pages lost their links", checked)
	}
}

// readmeMaxLines is how long README.md may be: two screens. What does
// not fit belongs in a page under docs/, linked from the README.
const readmeMaxLines = 120

// Tests that README.md fits on two screens.
func TestReadmeFitsOnTwoScreens(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(strings.TrimRight(string(raw), "\n"), "\n") + 1
	if lines > readmeMaxLines {
		t.Errorf("README.md has %d lines; the limit is %d (two screens). Move the longer material to a page under docs/ and link it from the README", lines, readmeMaxLines)
	}
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// notExported are metric names the pages mention that a sluice server
// does not export, each with the reason.
var notExported = map[string]string{
	"process_dynamic_tags_for_view": "a field of bsky.Service's GetPostRecords request, not a metric",
}

var (
	metricName = regexp.MustCompile(`(?:^|[^\w:.\-/])((?:sluice|go|process)_[a-z0-9_]*[a-z0-9])\b`)
	recorded   = regexp.MustCompile(`\b([a-z_]+:sluice_[a-z0-9_]+:[a-z0-9_]+)\b`)
)

// Tests that every metric the pages and the Prometheus rules name is on a
// real sluice's /metrics. The server runs on the CQL store against the
// test Cassandra, so the CQL store's metrics are there too, with the
// journal follower on, so the journal's are; it serves a read, a miss, a
// refused batch and a write, then loses its memcached so that cache
// errors are logged and rate-limited, because some series appear only
// once their event has happened. A second server on the embedded store
// adds what only that store exports (the journal's size). Recorded series
// (level:metric:operation) must be recorded by
// deploy/prometheus/prometheus_rules.yaml.
func TestMetricsNamedInDocsAreExported(t *testing.T) {
	named := map[string][]string{}
	records := map[string][]string{}
	for path, page := range pages(t) {
		for _, m := range metricName.FindAllStringSubmatch(page, -1) {
			named[m[1]] = append(named[m[1]], path)
		}
		for _, m := range recorded.FindAllStringSubmatch(page, -1) {
			records[m[1]] = append(records[m[1]], path)
		}
	}
	if len(named) < 30 {
		t.Fatalf("only %d metric names found in the pages: %v", len(named), named)
	}
	inRules := 0
	for path, expr := range ruleExprs(t) {
		for _, m := range metricName.FindAllStringSubmatch(expr, -1) {
			named[m[1]] = append(named[m[1]], path)
			inRules++
		}
	}
	if inRules < 40 {
		t.Fatalf("only %d metric names found in the rules' expressions", inRules)
	}

	cql := cqltest.Keyspace(t, "docs_metrics")
	srv := apptest.Start(t, apptest.Options{Posts: 20, Configure: func(c *app.Config) {
		c.CQL = cql
		c.Telemetry.Clients = []string{"docs"}
	}})
	ctx := srv.Ctx("docs")
	if _, err := srv.Client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: append(srv.URIRange(0, 5), srv.Missing[0])}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: make([]string, 1001)}); err == nil {
		t.Fatal("a 1,001-URI batch was accepted")
	}
	if _, err := srv.Client.PutPostRecords(ctx, &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{posts.ToProto(srv.Posts[0], true)}}); err != nil {
		t.Fatal(err)
	}
	srv.Memcached.Stop()
	for i := range 10 {
		_, _ = srv.Client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: srv.URIRange(i, i+1)})
	}
	fams := srv.Metrics()
	embedded := apptest.Start(t, apptest.Options{Posts: 5})
	for name, fam := range embedded.Metrics() {
		if _, ok := fams[name]; !ok {
			fams[name] = fam
		}
	}

	exported := func(name string) bool {
		for _, n := range []string{name, strings.TrimSuffix(name, "_bucket"), strings.TrimSuffix(name, "_sum"), strings.TrimSuffix(name, "_count")} {
			if _, ok := fams[n]; ok {
				return true
			}
		}
		return false
	}
	for name, where := range named {
		if why, ok := notExported[name]; ok {
			t.Logf("%s: not exported by sluice (%s)", name, why)
			continue
		}
		if !exported(name) {
			t.Errorf("%s is named in %v but sluice does not export it", name, slices.Compact(slices.Sorted(slices.Values(where))))
		}
	}
	t.Logf("%d metric names in the pages and rules, all checked against %d exported families", len(named), len(fams))
	for name := range fams {
		if _, ok := named[name]; !ok && strings.HasPrefix(name, "sluice_") {
			t.Logf("exported but not named in the docs: %s", name)
		}
	}

	rules := recordedSeries(t)
	for name, where := range records {
		if !rules[name] {
			t.Errorf("recorded series %s is named in %v but prometheus_rules.yaml does not record it", name, slices.Compact(slices.Sorted(slices.Values(where))))
		}
	}
}

// ruleExprs returns the expression of every recording and alerting rule
// of deploy/prometheus, keyed by file and rule name.
func ruleExprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range []string{"prometheus_rules.yaml", "prometheus_alerts.yaml"} {
		raw, err := os.ReadFile(filepath.Join("..", "deploy", "prometheus", f))
		if err != nil {
			t.Fatal(err)
		}
		var rules struct {
			Groups []struct {
				Rules []struct {
					Record string `yaml:"record"`
					Alert  string `yaml:"alert"`
					Expr   string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		}
		if err := yaml.Unmarshal(raw, &rules); err != nil {
			t.Fatal(err)
		}
		for _, g := range rules.Groups {
			for i, r := range g.Rules {
				out[fmt.Sprintf("%s %s#%d", f, r.Record+r.Alert, i)] = r.Expr
			}
		}
	}
	return out
}

// recordedSeries returns the names deploy/prometheus records.
func recordedSeries(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "prometheus", "prometheus_rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Record string `yaml:"record"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out[r.Record] = true
		}
	}
	return out
}
