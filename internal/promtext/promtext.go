// Package promtext reads a Prometheus text exposition (a /metrics page)
// and adds up its series: the one way sluice's load harness, benchmarks
// and tests look at what a server exports. It does not keep history or
// compute rates; callers sample and subtract, histograms with Since
// (what two scrapes' buckets differ by) and Quantile.
package promtext

import (
	"context"
	"fmt"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Scrape GETs url with client (http.DefaultClient when nil) and parses
// the page. A status other than 200 is an error.
func Scrape(ctx context.Context, client *http.Client, url string) (Families, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("promtext: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("promtext: scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("promtext: scrape %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("promtext: parse %s: %w", url, err)
	}
	return fams, nil
}

// Sum adds the values of family name's series whose labels include every
// pair in want (nil: all series). Counters and gauges add their values,
// untyped series (no TYPE line) their values, histograms their sample
// counts; a missing family sums to 0.
func (f Families) Sum(name string, want map[string]string) float64 {
	var total float64
	for _, m := range f[name].GetMetric() {
		if !hasLabels(m, want) {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Untyped != nil:
			total += m.Untyped.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		}
	}
	return total
}

// Count returns how many of family name's series have labels that
// include every pair in want (nil: all series): 0 tells a series that is
// absent from one that is there with the value 0.
func (f Families) Count(name string, want map[string]string) int {
	n := 0
	for _, m := range f[name].GetMetric() {
		if hasLabels(m, want) {
			n++
		}
	}
	return n
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	got := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}
