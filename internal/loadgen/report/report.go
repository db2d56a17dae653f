// Package report holds the result of a load run — per-client counts,
// latency percentiles and timelines, and the server's vital signs — and
// writes it as a table, as JSON, as a self-contained HTML page, or side
// by side with another run.
//
// It measures nothing and reads no server; packages recorder and vitals
// fill it. The JSON form is the stable one: --compare and the benchmark
// scripts read it back.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// Report is one load run.
type Report struct {
	Scenario string    `json:"scenario"`
	Target   string    `json:"target"`
	Started  time.Time `json:"started"`
	// ElapsedSeconds is the run's wall time, from the first scheduled
	// request to the last response.
	ElapsedSeconds float64  `json:"elapsed_seconds"`
	Clients        []Client `json:"clients"`
	Vitals         *Vitals  `json:"vitals,omitempty"`
	// Probe is a bare memcached get timed beside the clients (package
	// probe): the machine's floor for a round trip from the harness.
	Probe *Client `json:"probe,omitempty"`
	SLO   []SLO   `json:"slo,omitempty"`
}

// Client is what one client sent and saw.
type Client struct {
	Name   string `json:"name"`
	Method string `json:"method"`
	// Scheduled counts requests whose send time came; Sent those actually
	// sent; Dropped those not sent because MaxOutstanding requests were
	// in flight (Scheduled = Sent + Dropped).
	Scheduled int64 `json:"scheduled"`
	Sent      int64 `json:"sent"`
	Dropped   int64 `json:"dropped"`
	// Late counts requests sent more than LateThreshold after their
	// scheduled time (the harness fell behind).
	Late int64 `json:"late"`
	OK   int64 `json:"ok"`
	// Errors counts finished requests that did not succeed; Codes splits
	// them by gRPC code name.
	Errors int64            `json:"errors"`
	Codes  map[string]int64 `json:"codes"`
	// FirstErrors is the message of the first error of each code, so a
	// report says why requests failed, not only how many.
	FirstErrors map[string]string `json:"first_errors,omitempty"`
	// Items counts URIs answered in successful responses.
	Items       int64   `json:"items"`
	ItemsPerSec float64 `json:"items_per_sec"`
	// Latency is measured from each request's scheduled send time to its
	// response, for every finished request (successful or not).
	Latency Latency `json:"latency_ms"`
	// SendLag is how long after its scheduled time each request was sent.
	SendLag  Latency `json:"send_lag_ms"`
	Timeline []Point `json:"timeline"`
}

// LateThreshold is the send lag past which a request counts as late.
const LateThreshold = 10 * time.Millisecond

// Latency is a latency distribution in milliseconds.
type Latency struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p99_9"`
	Max   float64 `json:"max"`
}

// Point is one second of a client's run, by completion time.
type Point struct {
	Second int     `json:"t"`
	OK     int64   `json:"ok"`
	Errors int64   `json:"errors"`
	Items  int64   `json:"items"`
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	Max    float64 `json:"max_ms"`
}

// Vitals are the server's vital signs sampled during the run. A figure
// that could not be read is -1.
type Vitals struct {
	// Sources says where each figure came from, e.g.
	// "threads": "/proc/1234/status".
	Sources map[string]string `json:"sources"`
	Samples []Sample          `json:"samples"`
	// First and Peak are the first sample and the per-figure maxima.
	First Sample `json:"first"`
	Peak  Sample `json:"peak"`
	Last  Sample `json:"last"`
	// Errors are scrape failures, at most a few.
	Errors []string `json:"errors,omitempty"`
	// Latency is what the server's own histograms counted between the
	// first and last scrapes that succeeded; nil when it exports none.
	Latency *ServerLatency `json:"server_latency,omitempty"`
}

// ServerLatency is latency as the server measured it over the run, read
// from its histograms (quantiles interpolated within buckets, as
// PromQL's histogram_quantile does).
type ServerLatency struct {
	// FromSeconds and ToSeconds are when the two scrapes compared were
	// taken, in seconds since sampling began: a failed first or last
	// scrape narrows the window.
	FromSeconds float64 `json:"from_seconds"`
	ToSeconds   float64 `json:"to_seconds"`
	// CPUWait is how long the server's goroutines were runnable before
	// the Go scheduler ran them (sluice_go_sched_latency_seconds; the
	// runtime samples, so Count is not the number of events).
	CPUWait *Quantiles `json:"cpu_wait,omitempty"`
	// Clients are each client's requests from admission to response
	// (sluice_request_duration_seconds, every method), by metric label.
	Clients map[string]Quantiles `json:"clients,omitempty"`
}

// Quantiles summarise one histogram's samples over the run.
type Quantiles struct {
	Count  float64 `json:"count"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
}

// Sample is one reading of the server's vital signs.
type Sample struct {
	Seconds    float64 `json:"t"`
	Goroutines float64 `json:"goroutines"`
	Threads    float64 `json:"threads"`
	RSSBytes   float64 `json:"rss_bytes"`
	// HeapBytes is the Go heap in use (go_memstats_heap_inuse_bytes).
	HeapBytes float64 `json:"heap_bytes"`
	// MemoryLimitBytes is the Go runtime's soft memory limit
	// (go_gc_gomemlimit_bytes), the budget sluice's caps are checked
	// against; math.MaxInt64 when none is set.
	MemoryLimitBytes float64 `json:"memory_limit_bytes"`
	MemcachedConns   float64 `json:"memcached_conns"`
	MemcachedDials   float64 `json:"memcached_dials"`
	MemcachedTWait   float64 `json:"memcached_time_wait"`
	CacheErrors      float64 `json:"cache_errors"`
	ScrapeSucceeded  bool    `json:"ok"`
}

// SLO is one checked target.
type SLO struct {
	Spec   string `json:"spec"`
	Client string `json:"client"`
	Met    bool   `json:"met"`
	Detail string `json:"detail"`
}

// Client returns the named client's result, or nil.
func (r *Report) Client(name string) *Client {
	for i := range r.Clients {
		if r.Clients[i].Name == name {
			return &r.Clients[i]
		}
	}
	return nil
}

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("report: encode JSON: %w", err)
	}
	return nil
}

// ReadJSON reads a report that WriteJSON wrote.
func ReadJSON(path string) (*Report, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("report: %s is not a sluice-load JSON report: %w", path, err)
	}
	return &r, nil
}

// WriteFile writes r to path with write (WriteJSON, WriteHTML).
func WriteFile(path string, r *Report, write func(io.Writer, *Report) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := write(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("report: write %s: %w", path, err)
	}
	return nil
}
