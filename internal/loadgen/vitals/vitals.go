// Package vitals samples a server's vital signs during a load run:
// goroutines, OS threads, resident memory, the Go heap in use and the Go
// memory limit, memcached connections and dials, cache errors, and
// sockets in TIME_WAIT toward memcached; and, from the first and last
// scrapes, the latency the server's own histograms counted in between
// (each client's requests, its goroutines' wait for the scheduler).
//
// Figures come from the server's Prometheus /metrics (names as in the
// "Metrics" section of docs/operations.md), with two local fallbacks for what the
// metrics may not carry:
//
//   - TIME_WAIT: sluice_memcached_sockets{server,state="TIME_WAIT"} when
//     the server exports it; otherwise the kernel's socket table
//     (package sockets), which works only when memcached's address is on
//     this machine. TIME_WAIT sockets belong to no process, so that count
//     is every such socket with either end at memcached's address: the
//     server's side when it closed first (a full idle pool), memcached's
//     side when memcached did (its connection limit).
//   - OS threads: /proc/<pid>/status when the server's pid is known, else
//     sluice_process_os_threads, else go_threads (threads the Go runtime
//     created, which never shrinks).
//
// The sampler only reads; it never changes the server.
package vitals

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-dev/sluice/internal/loadgen/report"
	"github.com/sluice-dev/sluice/internal/promtext"
	"github.com/sluice-dev/sluice/internal/sockets"
)

// Config says where to read the server's vital signs.
type Config struct {
	// MetricsURL is the server's /metrics, e.g.
	// http://127.0.0.1:8080/metrics.
	MetricsURL string
	// PID is the server's process id on this machine; 0 when unknown.
	PID int
	// Memcached lists memcached addresses for the TIME_WAIT count; when
	// empty they are read from the server label of
	// sluice_memcached_dials_total.
	Memcached []string
	// Interval is the time between samples. Default 500ms.
	Interval time.Duration
}

// Metric names read from /metrics.
const (
	mGoroutines = "go_goroutines"
	mGoThreads  = "go_threads"
	mOSThreads  = "sluice_process_os_threads"
	mRSS        = "process_resident_memory_bytes"
	mHeap       = "go_memstats_heap_inuse_bytes"
	mMemLimit   = "go_gc_gomemlimit_bytes"
	mConns      = "sluice_memcached_connections_open"
	mDials      = "sluice_memcached_dials_total"
	mSockets    = "sluice_memcached_sockets"
	mCacheErrs  = "sluice_cache_errors_total"

	mSchedLatency   = "sluice_go_sched_latency_seconds"
	mRequestLatency = "sluice_request_duration_seconds"
)

// Sampler samples a server until its context ends.
type Sampler struct {
	cfg    Config
	client *http.Client
	start  time.Time

	mu      sync.Mutex
	mcAddrs []string // memcached addresses, once known
	samples []report.Sample
	sources map[string]string
	errors  []string
	// first and last are the first and the latest scrapes that
	// succeeded, for the server's histograms over the run, and when
	// they were taken (seconds since Run began).
	first, last     promtext.Families
	firstAt, lastAt float64
}

// New returns a Sampler for cfg.
func New(cfg Config) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	return &Sampler{
		cfg:     cfg,
		client:  &http.Client{Timeout: 2 * time.Second},
		sources: map[string]string{},
	}
}

// Run samples every Interval until ctx ends, once more at the end.
func (s *Sampler) Run(ctx context.Context) {
	s.start = time.Now()
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.sampleOnce(ctx)
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			s.sampleOnce(final)
			cancel()
			return
		case <-t.C:
		}
	}
}

func (s *Sampler) sampleOnce(ctx context.Context) {
	smp, sources, fams, err := s.sample(ctx)
	smp.Seconds = time.Since(s.start).Seconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, smp)
	if err == nil {
		if s.first == nil {
			s.first, s.firstAt = fams, smp.Seconds
		}
		s.last, s.lastAt = fams, smp.Seconds
	}
	for k, v := range sources {
		s.sources[k] = v
	}
	if err != nil && len(s.errors) < 5 {
		s.errors = append(s.errors, err.Error())
	}
}

// Sample reads every figure once, and says where each came from.
func (s *Sampler) Sample(ctx context.Context) (report.Sample, map[string]string, error) {
	smp, src, _, err := s.sample(ctx)
	return smp, src, err
}

// sample is Sample, also returning the scrape it read.
func (s *Sampler) sample(ctx context.Context) (report.Sample, map[string]string, promtext.Families, error) {
	smp := report.Sample{Goroutines: -1, Threads: -1, RSSBytes: -1, HeapBytes: -1, MemoryLimitBytes: -1, MemcachedConns: -1, MemcachedDials: -1, MemcachedTWait: -1, CacheErrors: -1}
	src := map[string]string{}
	fams, err := s.scrape(ctx)
	if err == nil {
		smp.ScrapeSucceeded = true
		smp.Goroutines = pick(fams, src, "goroutines", mGoroutines)
		smp.RSSBytes = pick(fams, src, "rss", mRSS)
		smp.HeapBytes = pick(fams, src, "heap", mHeap)
		smp.MemoryLimitBytes = pick(fams, src, "memory_limit", mMemLimit)
		smp.MemcachedConns = pick(fams, src, "memcached_conns", mConns)
		smp.MemcachedDials = pick(fams, src, "memcached_dials", mDials)
		smp.CacheErrors = pick(fams, src, "cache_errors", mCacheErrs)
		smp.Threads = pick(fams, src, "threads", mOSThreads, mGoThreads)
		if _, ok := fams[mSockets]; ok {
			smp.MemcachedTWait = fams.Sum(mSockets, map[string]string{"state": "TIME_WAIT"})
			src["time_wait"] = mSockets + `{state="TIME_WAIT"}`
		}
	}
	if s.cfg.PID > 0 {
		s.fromProc(&smp, src)
	}
	if smp.MemcachedTWait < 0 {
		s.timeWaitFromKernel(fams, &smp, src)
	}
	return smp, src, fams, err
}

// fromProc reads threads (and RSS when the metrics lack it) from
// /proc/<pid>/status.
func (s *Sampler) fromProc(smp *report.Sample, src map[string]string) {
	path := fmt.Sprintf("/proc/%d/status", s.cfg.PID)
	st, err := procStatus(path)
	if err != nil {
		return
	}
	if v, ok := st["Threads"]; ok {
		smp.Threads, src["threads"] = v, path
	}
	if v, ok := st["VmRSS"]; ok && smp.RSSBytes < 0 {
		smp.RSSBytes, src["rss"] = v*1024, path
	}
}

func (s *Sampler) timeWaitFromKernel(fams promtext.Families, smp *report.Sample, src map[string]string) {
	addrs := s.memcachedAddrs(fams)
	targets := localAddrs(addrs)
	if len(targets) == 0 {
		return
	}
	all, err := sockets.All()
	if err != nil {
		return
	}
	n := 0
	for _, sk := range all {
		if sk.State == sockets.TimeWait && (targets[sk.Remote] || targets[sk.Local]) {
			n++
		}
	}
	smp.MemcachedTWait, src["time_wait"] = float64(n), "/proc/net/tcp (TIME_WAIT with either end at "+strings.Join(addrs, ",")+")"
}

// memcachedAddrs returns the configured memcached addresses, or those
// the server's metrics named, remembered so that a failed scrape (an
// overloaded server) does not lose the TIME_WAIT count.
func (s *Sampler) memcachedAddrs(fams promtext.Families) []string {
	if len(s.cfg.Memcached) > 0 {
		return s.cfg.Memcached
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if found := labelValues(fams[mDials], "server"); len(found) > 0 {
		s.mcAddrs = found
	}
	return s.mcAddrs
}

func (s *Sampler) scrape(ctx context.Context) (promtext.Families, error) {
	if s.cfg.MetricsURL == "" {
		return nil, fmt.Errorf("vitals: no metrics URL")
	}
	return promtext.Scrape(ctx, s.client, s.cfg.MetricsURL)
}

// Result returns every sample with the first, last and peak values.
func (s *Sampler) Result() *report.Vitals {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := &report.Vitals{Sources: s.sources, Samples: s.samples, Errors: s.errors, Latency: latencyBetween(s.first, s.last, s.firstAt, s.lastAt)}
	if len(s.samples) == 0 {
		return v
	}
	// First and last are scrapes that succeeded; peaks are over every
	// sample, since /proc and the socket table answer even when an
	// overloaded server does not (its figures are -1 then).
	var ok []report.Sample
	for _, x := range s.samples {
		if x.ScrapeSucceeded {
			ok = append(ok, x)
		}
	}
	if len(ok) == 0 {
		ok = s.samples
	}
	v.First, v.Last, v.Peak = ok[0], ok[len(ok)-1], s.samples[0]
	for _, x := range s.samples[1:] {
		p := &v.Peak
		p.Goroutines = max(p.Goroutines, x.Goroutines)
		p.Threads = max(p.Threads, x.Threads)
		p.RSSBytes = max(p.RSSBytes, x.RSSBytes)
		p.HeapBytes = max(p.HeapBytes, x.HeapBytes)
		p.MemoryLimitBytes = max(p.MemoryLimitBytes, x.MemoryLimitBytes)
		p.MemcachedConns = max(p.MemcachedConns, x.MemcachedConns)
		p.MemcachedDials = max(p.MemcachedDials, x.MemcachedDials)
		p.MemcachedTWait = max(p.MemcachedTWait, x.MemcachedTWait)
		p.CacheErrors = max(p.CacheErrors, x.CacheErrors)
		p.Seconds = max(p.Seconds, x.Seconds)
	}
	return v
}

// latencyBetween reads the server's latency histograms between two
// scrapes taken at seconds from and to of the run: how long its
// goroutines queued for the Go scheduler, and each client's requests
// from admission to response. A histogram whose counts fell between the
// scrapes (the server restarted) is left out. Nil when there is no pair
// of scrapes or nothing to report.
func latencyBetween(first, last promtext.Families, from, to float64) *report.ServerLatency {
	if first == nil || last == nil {
		return nil
	}
	out := &report.ServerLatency{FromSeconds: from, ToSeconds: to, Clients: map[string]report.Quantiles{}}
	if q, ok := quantilesBetween(first, last, mSchedLatency, nil); ok {
		out.CPUWait = &q
	}
	clients := labelValues(last[mRequestLatency], "client") // once per series: per method too
	slices.Sort(clients)
	for _, client := range slices.Compact(clients) {
		if q, ok := quantilesBetween(first, last, mRequestLatency, map[string]string{"client": client}); ok {
			out.Clients[client] = q
		}
	}
	if out.CPUWait == nil && len(out.Clients) == 0 {
		return nil
	}
	return out
}

// quantilesBetween summarises histogram name's series with labels want
// between two scrapes; false when it counted nothing or was reset.
func quantilesBetween(first, last promtext.Families, name string, want map[string]string) (report.Quantiles, bool) {
	h, ok := last.Histogram(name, want).Since(first.Histogram(name, want))
	if !ok || h.Count() == 0 {
		return report.Quantiles{}, false
	}
	return quantilesOf(h), true
}

func quantilesOf(h promtext.Histogram) report.Quantiles {
	return report.Quantiles{Count: h.Count(), P50Ms: 1000 * h.Quantile(0.5), P99Ms: 1000 * h.Quantile(0.99), P999Ms: 1000 * h.Quantile(0.999)}
}

// pick returns the sum of the first of names the families hold, noting
// its source; -1 when none is there.
func pick(fams promtext.Families, src map[string]string, figure string, names ...string) float64 {
	for _, n := range names {
		if _, ok := fams[n]; ok {
			src[figure] = n
			return fams.Sum(n, nil)
		}
	}
	return -1
}

// labelValues lists the values of label name across a family's series.
func labelValues(fam *dto.MetricFamily, name string) []string {
	var out []string
	for _, m := range fam.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				out = append(out, l.GetValue())
			}
		}
	}
	return out
}

// localAddrs resolves addrs, keeping those on this machine (loopback or
// one of its interfaces).
func localAddrs(addrs []string) map[netip.AddrPort]bool {
	out := map[netip.AddrPort]bool{}
	for _, a := range addrs {
		tcp, err := net.ResolveTCPAddr("tcp", a)
		if err != nil {
			continue
		}
		ap := tcp.AddrPort()
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if ap.Addr().IsLoopback() || isLocal(ap.Addr()) {
			out[ap] = true
		}
	}
	return out
}

func isLocal(a netip.Addr) bool {
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, ia := range ifaddrs {
		if p, err := netip.ParsePrefix(ia.String()); err == nil && p.Addr().Unmap() == a {
			return true
		}
	}
	return false
}

// procStatus parses the numeric fields of a /proc/<pid>/status file
// ("Threads:\t12", "VmRSS:\t 1234 kB").
func procStatus(path string) (map[string]float64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("vitals: %w", err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		if n, err := strconv.ParseFloat(fields[0], 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}
