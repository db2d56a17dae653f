package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/clientpage"
	"github.com/sluice-dev/sluice/internal/telemetry"
	"github.com/sluice-dev/sluice/internal/testenv"
	"golang.org/x/net/html"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The two callers of the per-client tests: one sends a few huge batches,
// the other many small ones.
const (
	bulkClient, bulkBatch, bulkEvery = "bulk", 900, 500 * time.Millisecond
	feedClient, feedBatch, feedEvery = "feed", 10, 50 * time.Millisecond
	// quiet sends only batches over the 1,000-URI limit: it asks for the
	// most items and is served none, as the outage's caller was.
	quietClient, quietBatch, quietEvery = "quiet", 2500, 250 * time.Millisecond
)

// twoClients drives bulk and feed at their fixed rates until stop, and
// counts what each sent.
type twoClients struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	started  time.Time
	requests map[string]*atomic.Int64
	failed   atomic.Int64
	firstErr atomic.Value
}

func startTwoClients(ts *testServer) *twoClients {
	tc := &twoClients{stop: make(chan struct{}), started: time.Now(),
		requests: map[string]*atomic.Int64{bulkClient: {}, feedClient: {}}}
	for _, c := range []struct {
		name  string
		batch int
		every time.Duration
	}{{bulkClient, bulkBatch, bulkEvery}, {feedClient, feedBatch, feedEvery}} {
		tc.wg.Add(1)
		go func() {
			defer tc.wg.Done()
			tick := time.NewTicker(c.every)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-tc.stop:
					return
				case <-tick.C:
				}
				from := (i * c.batch) % (len(ts.posts) - c.batch)
				ctx, cancel := context.WithTimeout(ts.ctx(c.name), 30*time.Second)
				_, err := ts.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: ts.uris(from, from+c.batch)})
				cancel()
				if err != nil {
					tc.failed.Add(1)
					tc.firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				tc.requests[c.name].Add(1)
			}
		}()
	}
	tc.wg.Add(1)
	go func() {
		defer tc.wg.Done()
		tick := time.NewTicker(quietEvery)
		defer tick.Stop()
		oversized := ts.uris(0, quietBatch)
		for {
			select {
			case <-tc.stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(ts.ctx(quietClient), 30*time.Second)
			_, err := ts.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: oversized})
			cancel()
			if status.Code(err) != codes.InvalidArgument {
				tc.failed.Add(1)
				tc.firstErr.CompareAndSwap(nil, fmt.Sprintf("quiet's %d-URI batch: %v, want InvalidArgument", quietBatch, err))
			}
		}
	}()
	return tc
}

func (tc *twoClients) finish() {
	close(tc.stop)
	tc.wg.Wait()
}

// rates returns requests/s and items/s each client sent so far.
func (tc *twoClients) rates() map[string][2]float64 {
	secs := time.Since(tc.started).Seconds()
	return map[string][2]float64{
		bulkClient: {float64(tc.requests[bulkClient].Load()) / secs, float64(tc.requests[bulkClient].Load()*bulkBatch) / secs},
		feedClient: {float64(tc.requests[feedClient].Load()) / secs, float64(tc.requests[feedClient].Load()*feedBatch) / secs},
	}
}

// startTwoClientServer serves a store both clients can read, with both
// names in the client list, and sends each client one over-limit batch so
// the rejection and error panels have something to show.
func startTwoClientServer(t *testing.T) *testServer {
	logs := telemetry.NewLogHandler(io.Discard, telemetry.LogConfig{})
	t.Cleanup(func() { _ = logs.CloseWithTimeout() })
	// The test asserts what the metrics and the page show, not speed: a
	// patient deadline keeps a batch on a busy machine from failing for
	// want of time.
	ts := startServer(t, 4000, withPatientBatches(30*time.Second, func(c *Config) {
		c.Telemetry.Clients = []string{bulkClient, feedClient, quietClient}
	}), withLogger(slog.New(logs)))
	tooMany := append(ts.uris(0, 1000), ts.uris(0, 1)...)
	for _, name := range []string{bulkClient, feedClient} {
		if _, err := ts.client.GetPostRecords(ts.ctx(name), &sluicev1.GetPostRecordsRequest{Uris: tooMany}); err == nil {
			t.Fatalf("a 1,001-URI batch from %s was accepted", name)
		}
	}
	return ts
}

// Tests the two observability surfaces an SRE would use to find a heavy
// caller, with two callers of opposite shapes: a real Prometheus scraping
// sluice answers every query of the shipped Grafana dashboard and ranks
// the callers as they were driven; and the built-in /clients page,
// loaded in headless Chromium, shows both with non-zero figures.
func TestPerClientObservability(t *testing.T) {
	ts := startTwoClientServer(t)
	// With the shipped rules loaded, the dashboard's panels on recorded
	// series and on ALERTS have something to show too.
	prom := testenv.StartPrometheusWithRules(t, shippedRules(t), strings.TrimPrefix(ts.adminURL, "http://"))
	prom.WaitForSeries(t, `up{job="sluice"} == 1`, 1, 30*time.Second)
	tc := startTwoClients(ts)
	defer tc.finish()
	time.Sleep(12 * time.Second)
	// Both clients' rates need two scrapes of their traffic; on a busy
	// machine a scrape can come late.
	prom.WaitForSeries(t, `sum by (client) (rate(sluice_requests_total{client=~"bulk|feed",code="OK"}[10s])) > 0`, 2, 30*time.Second)

	t.Run("dashboard queries in Prometheus", func(t *testing.T) { checkDashboard(t, prom, tc) })
	t.Run("clients page in Chromium", func(t *testing.T) { checkClientsPage(t, ts) })
	if n := tc.failed.Load(); n != 0 {
		t.Errorf("%d requests of the two clients failed (first: %v)", n, tc.firstErr.Load())
	}
}

// shippedRules returns the absolute paths of deploy/prometheus's rule
// files.
func shippedRules(t *testing.T) []string {
	var paths []string
	for _, f := range []string{"prometheus_rules.yaml", "prometheus_alerts.yaml"} {
		p, err := filepath.Abs(filepath.Join("..", "..", "deploy", "prometheus", f))
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// dashboardExprs returns every PromQL expression of the shipped
// dashboard by panel title, with Grafana's variables replaced by values.
func dashboardExprs(t *testing.T, vars map[string]string) map[string][]string {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "dashboards", "sluice.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	out := map[string][]string{}
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			expr := target.Expr
			for k, v := range vars {
				expr = strings.ReplaceAll(expr, k, v)
			}
			if strings.Contains(expr, "$") {
				t.Fatalf("panel %q: unsubstituted variable in %s", p.Title, expr)
			}
			out[p.Title] = append(out[p.Title], expr)
		}
	}
	return out
}

func checkDashboard(t *testing.T, prom *testenv.Prometheus, tc *twoClients) {
	exprs := dashboardExprs(t, map[string]string{"$__rate_interval": "10s", "$client": bulkClient + "|" + feedClient + "|" + quietClient})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	query := func(expr string) model.Vector {
		t.Helper()
		v, warnings, _, err := prom.API.Query(ctx, expr, time.Now())
		if err != nil {
			t.Errorf("query %s: %v", expr, err)
			return nil
		}
		if len(warnings) > 0 {
			t.Logf("query %s: warnings %v", expr, warnings)
		}
		vec, ok := v.(model.Vector)
		if !ok {
			t.Errorf("query %s: got %s, want an instant vector", expr, v.Type())
		}
		return vec
	}
	total := 0
	for title, list := range exprs {
		for _, expr := range list {
			total++
			vec := query(expr)
			// This server runs on the embedded store: the panels of the
			// CQL nodes row have nothing to show here (the cluster suite,
			// make test-cluster, reads the same metrics from a CQL-backed
			// sluice). Their queries must still be valid PromQL.
			if strings.Contains(expr, "sluice_cql_") {
				continue
			}
			// A scrape that timed out on a busy machine marks every
			// series stale until the next one: an instant selector then
			// returns nothing for a second or so. Ask again for a while;
			// a metric that is not exported never answers.
			for retry := time.Now(); len(vec) == 0 && time.Since(retry) < 15*time.Second; {
				time.Sleep(500 * time.Millisecond)
				vec = query(expr)
			}
			if len(vec) == 0 {
				t.Errorf("panel %q: %s returned no series", title, expr)
			}
		}
	}
	t.Logf("%d dashboard expressions, each returned at least one series unless reported above", total)

	perClient := func(title string) map[string]float64 {
		out := map[string]float64{}
		for _, s := range query(exprs[title][0]) {
			out[string(s.Metric["client"])] = float64(s.Value)
		}
		return out
	}
	items, requests := perClient("Top clients by items served/s"), perClient("Top clients by requests/s")
	sent := tc.rates()
	t.Logf("Prometheus items/s %v requests/s %v; sent (requests/s, items/s) %v", items, requests, sent)
	if items[bulkClient] <= items[feedClient] {
		t.Errorf("items served/s bulk=%.1f feed=%.1f; bulk sent %.1f and feed %.1f items/s, so bulk must lead", items[bulkClient], items[feedClient], sent[bulkClient][1], sent[feedClient][1])
	}
	if items[quietClient] != 0 {
		t.Errorf("items served/s quiet=%.1f; every batch it sent was refused", items[quietClient])
	}
	requested := perClient("Top clients by items requested/s")
	if requested[quietClient] <= requested[bulkClient] {
		t.Errorf("items requested/s quiet=%.1f bulk=%.1f; quiet asks for the most", requested[quietClient], requested[bulkClient])
	}
	refused := map[string]float64{}
	for _, s := range query(exprs["Items refused per client and reason"][0]) {
		refused[string(s.Metric["client"])+"/"+string(s.Metric["reason"])] = float64(s.Value)
	}
	if refused[quietClient+"/shape"] <= 0 || refused[feedClient+"/shape"] != 0 || refused[quietClient+"/quota"] != 0 {
		t.Errorf("items refused/s by client/reason %v; want quiet's by shape only, none of feed's", refused)
	}
	if requests[feedClient] <= requests[bulkClient] {
		t.Errorf("requests/s feed=%.1f bulk=%.1f; feed sent %.1f and bulk %.1f requests/s, so feed must lead", requests[feedClient], requests[bulkClient], sent[feedClient][0], sent[bulkClient][0])
	}
	for _, c := range []string{bulkClient, feedClient} {
		if r := items[c] / sent[c][1]; r < 0.5 || r > 2 {
			t.Errorf("%s: Prometheus says %.1f items served/s, the test was answered %.1f; want within a factor of 2", c, items[c], sent[c][1])
		}
	}
}

func checkClientsPage(t *testing.T, ts *testServer) {
	url := ts.adminURL + "/clients"
	dom, err := testenv.Chromium(t, 60*time.Second, "--virtual-time-budget=4000", "--dump-dom", url)
	if err != nil {
		t.Fatal(err)
	}
	updates, order, rows := parseClientsDOM(t, dom)
	if updates < 1 {
		t.Errorf("the page's script never refreshed it (data-updates=%d); DOM:\n%s", updates, dom)
	}
	t.Logf("per-client table the page showed (script refreshes: %d), in its order %v:\n%s", updates, order, formatRows(order, rows))
	num := func(c, col string) float64 {
		t.Helper()
		v, err := strconv.ParseFloat(strings.TrimSuffix(rows[c][col], "%"), 64)
		if err != nil {
			t.Errorf("client %s: %s = %q, not a number", c, col, rows[c][col])
		}
		return v
	}
	for _, c := range []string{bulkClient, feedClient, quietClient} {
		if _, ok := rows[c]; !ok {
			t.Fatalf("client %s not on the page; rows %v", c, order)
		}
	}
	for _, c := range []string{bulkClient, feedClient} {
		for _, col := range []string{"items served/s", "share of served", "items requested/s", "requests/s", "mean batch", "requests", "items served"} {
			if num(c, col) <= 0 {
				t.Errorf("client %s: %s = %q; want a figure above zero", c, col, rows[c][col])
			}
		}
	}
	// Every item requested is served or refused (no request of these
	// clients fails while being worked on), over the same window. A
	// refusal counts its items requested and refused at once, so quiet's
	// figures agree exactly; a served request counts its items served
	// when it answers and requested when it finishes, which on a busy
	// machine can fall either side of a second at the window's edges, so
	// bulk's and feed's (one request in flight each) may differ by one
	// batch over the window.
	straddle := map[string]float64{bulkClient: bulkBatch, feedClient: feedBatch, quietClient: 0}
	for _, c := range []string{bulkClient, feedClient, quietClient} {
		served, refused, requested := num(c, "items served/s"), num(c, "items refused/s"), num(c, "items requested/s")
		if d, room := served+refused-requested, straddle[c]/clientpage.DefaultWindow+0.2; d < -room || d > room {
			t.Errorf("client %s: %.1f served + %.1f refused items/s != %.1f requested (more than %.1f apart)", c, served, refused, requested, room)
		}
	}
	if num(quietClient, "items served/s") != 0 || num(quietClient, "share of served") != 0 || num(quietClient, "items refused/s") <= 0 {
		t.Errorf("quiet (only %d-URI batches, all refused): served %s (share %s), refused %s; want 0, 0%% and above zero",
			quietBatch, rows[quietClient]["items served/s"], rows[quietClient]["share of served"], rows[quietClient]["items refused/s"])
	}
	if got := rows[quietClient]["refused by reason"]; !strings.HasPrefix(got, "shape ") || strings.Contains(got, ",") {
		t.Errorf("quiet refused by reason %q; want only shape", got)
	}
	if num(quietClient, "items requested/s") <= num(bulkClient, "items requested/s") {
		t.Errorf("quiet requested %s items/s, bulk %s: the test drives quiet to ask for the most", rows[quietClient]["items requested/s"], rows[bulkClient]["items requested/s"])
	}
	if num(feedClient, "items refused/s") != 0 || rows[feedClient]["refused by reason"] != "–" {
		t.Errorf("feed refused %s items/s (%s); want none", rows[feedClient]["items refused/s"], rows[feedClient]["refused by reason"])
	}
	if share := num(bulkClient, "share of served") + num(feedClient, "share of served"); share < 99.8 || share > 100.2 {
		t.Errorf("bulk and feed shares of served items add up to %.1f%%, want 100%%", share)
	}
	if b, f := num(bulkClient, "items served/s"), num(feedClient, "items served/s"); b <= f {
		t.Errorf("page: bulk items served/s %.1f not above feed %.1f", b, f)
	}
	// Sorted by items served, the quiet caller that asked for the most
	// comes last, not first.
	if len(order) != 3 || order[0] != bulkClient || order[2] != quietClient {
		t.Errorf("rows in order %v; want by items served: bulk, feed, quiet", order)
	}

	shot := filepath.Join(testenv.ArtifactDir(t), "clients-page.png")
	if _, err := testenv.Chromium(t, 60*time.Second, "--virtual-time-budget=4000", "--window-size=1400,820", "--screenshot="+shot, url); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Errorf("screenshot %s missing or too small (%v)", shot, err)
	}
	t.Logf("screenshot: %s", shot)
}

// parseClientsDOM reads the table the page's script rendered (rows with
// data-client, and their order) and the body's data-updates counter.
func parseClientsDOM(t *testing.T, dom []byte) (int, []string, map[string]map[string]string) {
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		t.Fatalf("parse DOM: %v", err)
	}
	var headers, order []string
	rows := map[string]map[string]string{}
	updates := 0
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			switch {
			case n.Data == "body":
				updates, _ = strconv.Atoi(attr(n, "data-updates"))
			case n.Data == "th":
				headers = append(headers, text(n))
			case n.Data == "tr" && attr(n, "data-client") != "":
				row := map[string]string{}
				i := 0
				for c := n.FirstChild; c != nil; c = c.NextSibling {
					if c.Type == html.ElementNode && c.Data == "td" && i < len(headers) {
						row[headers[i]] = text(c)
						i++
					}
				}
				rows[attr(n, "data-client")] = row
				order = append(order, attr(n, "data-client"))
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	return updates, order, rows
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func text(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.TrimSpace(b.String())
}

// formatRows prints the page's table as a Markdown table, rows in order.
func formatRows(names []string, rows map[string]map[string]string) string {
	cols := []string{"items served/s", "share of served", "items refused/s", "refused by reason", "items requested/s", "requests/s",
		"mean batch", "p50 ms", "p99 ms", "errors/s", "rejections/s", "cache hits", "requests", "items served", "items refused"}
	var b strings.Builder
	fmt.Fprintf(&b, "| client | %s |\n|---|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, name := range names {
		vals := make([]string, len(cols))
		for i, c := range cols {
			vals[i] = rows[name][c]
		}
		fmt.Fprintf(&b, "| %s | %s |\n", name, strings.Join(vals, " | "))
	}
	return b.String()
}
