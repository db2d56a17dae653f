package telemetry

import (
	"cmp"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// historySeconds is how much per-second history ClientStats keeps.
const historySeconds = 60

// latencyBounds are the upper bounds, in seconds, of the latency buckets
// ClientStats keeps per second and of sluice_request_duration_seconds.
// They are close together below 10 ms, where a small request's latency
// lives, so that a quantile read from them can tell 2 ms from 3 ms.
var latencyBounds = [...]float64{
	0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075,
	0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
}

// latencyBuckets counts latencyBounds' buckets and the +Inf one.
const latencyBuckets = len(latencyBounds) + 1

// ClientStats aggregates, in process, what each client asked of sluice
// over the last minute, second by second: requests, items, errors,
// rejections, item sources and latency. It is fed by the same hooks as
// the request metrics (guard.Observer and rpc.ItemRecorder, through
// Requests) and read by the admin /clients page, so the page works with no
// Prometheus around. Clients are keyed by their bounded metric label.
//
// It keeps a fixed ring of seconds per client, so its memory is bounded by
// the number of labels; recording takes one short per-client lock. It is
// safe for concurrent use.
type ClientStats struct {
	label func(string) string
	now   func() time.Time
	sched *schedWindow

	mu        sync.RWMutex
	clients   map[string]*clientSeries
	admission func() AdmissionState                 // nil until ObserveAdmission
	memory    atomic.Pointer[func() MemorySnapshot] // set by ObserveMemory
}

func (c *ClientStats) setAdmission(state func() AdmissionState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.admission = state
}

// clientSeries is one client's ring of seconds and its totals.
type clientSeries struct {
	mu     sync.Mutex
	ring   [historySeconds]secondStats
	totals secondStats
}

// secondStats is what happened in one second (or in total). items are
// the items requested, refused ones included; fromCache, fromStore and
// notFound the items served; refused the items refused, by reason.
type secondStats struct {
	unix                           int64
	requests, items, errors        int64
	rejections                     int64
	fromCache, fromStore, notFound int64
	refused                        [len(rejectionReasons) + 1]int64 // by reasonIndex: RejectionReasons, then other
	latency                        [latencyBuckets]int64
}

// reasonIndex is a rejection reason's place in secondStats.refused.
func reasonIndex(reason string) int {
	for i, r := range RejectionReasons {
		if r == reason {
			return i
		}
	}
	return len(RejectionReasons)
}

// reasonName is the reason at index i of secondStats.refused.
func reasonName(i int) string {
	if i < len(RejectionReasons) {
		return RejectionReasons[i]
	}
	return Other
}

func (s *secondStats) served() int64 { return s.fromCache + s.fromStore + s.notFound }

func (s *secondStats) refusedItems() int64 {
	var n int64
	for _, v := range s.refused {
		n += v
	}
	return n
}

func newClientStats(label func(string) string) *ClientStats {
	return &ClientStats{label: label, now: time.Now, sched: newSchedWindow(), clients: map[string]*clientSeries{}}
}

// series returns the client's series, creating it on first use.
func (c *ClientStats) series(client string) *clientSeries {
	name := c.label(client)
	c.mu.RLock()
	s, ok := c.clients[name]
	c.mu.RUnlock()
	if ok {
		return s
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok = c.clients[name]; !ok {
		s = &clientSeries{}
		c.clients[name] = s
	}
	return s
}

// record applies f to the client's current second and to its totals.
func (c *ClientStats) record(client string, f func(*secondStats)) {
	s := c.series(client)
	now := c.now().Unix()
	c.sched.observe(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	sec := &s.ring[now%historySeconds]
	if sec.unix != now {
		*sec = secondStats{unix: now}
	}
	f(sec)
	f(&s.totals)
}

func (c *ClientStats) finished(client string, items int, failed bool, elapsed time.Duration) {
	b, _ := slices.BinarySearch(latencyBounds[:], elapsed.Seconds())
	c.record(client, func(s *secondStats) {
		s.requests++
		s.items += int64(items)
		if failed {
			s.errors++
		}
		s.latency[b]++
	})
}

func (c *ClientStats) rejected(client string, items int, reason string) {
	i := reasonIndex(reason)
	c.record(client, func(s *secondStats) {
		s.requests++
		s.items += int64(items)
		s.rejections++
		s.refused[i] += int64(items)
	})
}

func (c *ClientStats) served(client string, fromCache, fromStore, notFound int) {
	c.record(client, func(s *secondStats) {
		s.fromCache += int64(fromCache)
		s.fromStore += int64(fromStore)
		s.notFound += int64(notFound)
	})
}

// ClientsSnapshot is what the /clients page shows.
type ClientsSnapshot struct {
	// At is when the snapshot was taken.
	At time.Time `json:"at"`
	// WindowSeconds is the window the rates and quantiles cover: the
	// last full seconds before At.
	WindowSeconds int `json:"window_seconds"`
	// Clients has one row per client seen, the most items served per
	// second first.
	Clients []ClientRow `json:"clients"`
	// ServedItemsPerSec is what all clients were served together over
	// the window: the capacity actually used, which each row's
	// ServedShare divides.
	ServedItemsPerSec float64 `json:"served_items_per_sec"`
	// Goroutines and OSThreads are the process's, now.
	Goroutines int `json:"goroutines"`
	OSThreads  int `json:"os_threads"`
	// SchedWait is the Go scheduler's queue over about the window; nil
	// until two readings a second or more apart were taken.
	SchedWait *SchedWait `json:"sched_wait,omitempty"`
	// Admission is the guard's process-wide admission now (nil when
	// not wired, as in tests of this package alone).
	Admission *AdmissionState `json:"admission,omitempty"`
	// Memory is the memory budget and what holds it, now; nil until
	// the server's guard is observed.
	Memory *MemorySnapshot `json:"memory,omitempty"`
}

// ClientRow is one client's figures. Items requested are split into
// items served (answered: from the cache, the store, or not found) and
// items refused before any work, by reason; the rest belong to requests
// that failed while being worked on.
type ClientRow struct {
	Client string `json:"client"`
	// Rates over the window, per second. ItemsPerSec counts the items
	// requested, refused ones included.
	RequestsPerSec   float64 `json:"requests_per_sec"`
	ItemsPerSec      float64 `json:"items_per_sec"`
	ErrorsPerSec     float64 `json:"errors_per_sec"`
	RejectionsPerSec float64 `json:"rejections_per_sec"`
	// ServedItemsPerSec are the items answered; RefusedItemsPerSec the
	// items of refused requests, split by reason in RefusedByReason
	// (every reason of RejectionReasons, at zero when none).
	ServedItemsPerSec  float64            `json:"served_items_per_sec"`
	RefusedItemsPerSec float64            `json:"refused_items_per_sec"`
	RefusedByReason    map[string]float64 `json:"refused_items_per_sec_by_reason"`
	// ServedShare is this client's part of the items all clients were
	// served over the window (0 to 1; 0 when nothing was served).
	ServedShare float64 `json:"served_share"`
	// MeanBatch is items per request over the window.
	MeanBatch float64 `json:"mean_batch"`
	// P50Ms and P99Ms are latency quantiles over the window, in
	// milliseconds, interpolated within histogram buckets.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	// CacheHitRatio is the share of answered items that came from the
	// cache over the window; -1 when none were answered.
	CacheHitRatio float64 `json:"cache_hit_ratio"`
	// Totals since start.
	Requests     int64 `json:"requests"`
	Items        int64 `json:"items"`
	ServedItems  int64 `json:"served_items"`
	RefusedItems int64 `json:"refused_items"`
	Errors       int64 `json:"errors"`
	Rejections   int64 `json:"rejections"`
	// History is per second over the last minute, oldest first.
	History ClientHistory `json:"history"`
}

// ClientHistory is one client's per-second series.
type ClientHistory struct {
	Requests    []int64   `json:"requests"`
	Items       []int64   `json:"items"`
	ServedItems []int64   `json:"served_items"`
	P99Ms       []float64 `json:"p99_ms"`
}

// Snapshot returns every client's figures over the last window seconds
// (1 to 60).
func (c *ClientStats) Snapshot(window int) ClientsSnapshot {
	window = min(max(window, 1), historySeconds-1)
	now := c.now()
	snap := ClientsSnapshot{At: now, WindowSeconds: window, Clients: []ClientRow{}, Goroutines: runtime.NumGoroutine()}
	snap.OSThreads, _ = OSThreads()
	if w, ok := c.sched.over(now.Unix(), window); ok {
		snap.SchedWait = &w
	}
	if f := c.memory.Load(); f != nil {
		m := (*f)()
		snap.Memory = &m
	}
	c.mu.RLock()
	if c.admission != nil {
		a := c.admission()
		snap.Admission = &a
	}
	// The map is keyed by label already: looking a row up through
	// series would pass the label through c.label again, and count
	// "other" as an unlisted caller's name.
	all := make(map[string]*clientSeries, len(c.clients))
	for name, s := range c.clients {
		all[name] = s
	}
	c.mu.RUnlock()
	for name, s := range all {
		row := s.row(name, now.Unix(), window)
		snap.ServedItemsPerSec += row.ServedItemsPerSec
		snap.Clients = append(snap.Clients, row)
	}
	for i := range snap.Clients {
		if snap.ServedItemsPerSec > 0 {
			snap.Clients[i].ServedShare = snap.Clients[i].ServedItemsPerSec / snap.ServedItemsPerSec
		}
	}
	slices.SortFunc(snap.Clients, func(a, b ClientRow) int {
		if c := cmp.Compare(b.ServedItemsPerSec, a.ServedItemsPerSec); c != 0 {
			return c
		}
		if c := cmp.Compare(b.ServedItems, a.ServedItems); c != 0 {
			return c
		}
		return cmp.Compare(a.Client, b.Client)
	})
	return snap
}

// row computes one client's figures; the current, partial second is left
// out of rates and history.
func (s *clientSeries) row(name string, now int64, window int) ClientRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := ClientRow{Client: name, Requests: s.totals.requests, Items: s.totals.items, Errors: s.totals.errors, Rejections: s.totals.rejections,
		ServedItems: s.totals.served(), RefusedItems: s.totals.refusedItems()}
	var sum secondStats
	for ago := int64(historySeconds - 1); ago >= 1; ago-- {
		sec := s.at(now - ago)
		r.History.Requests = append(r.History.Requests, sec.requests)
		r.History.Items = append(r.History.Items, sec.items)
		r.History.ServedItems = append(r.History.ServedItems, sec.served())
		r.History.P99Ms = append(r.History.P99Ms, quantile(sec.latency[:], 0.99)*1000)
		if ago <= int64(window) {
			sum.add(sec)
		}
	}
	w := float64(window)
	r.RequestsPerSec, r.ItemsPerSec = float64(sum.requests)/w, float64(sum.items)/w
	r.ErrorsPerSec, r.RejectionsPerSec = float64(sum.errors)/w, float64(sum.rejections)/w
	r.ServedItemsPerSec, r.RefusedItemsPerSec = float64(sum.served())/w, float64(sum.refusedItems())/w
	r.RefusedByReason = map[string]float64{}
	for i, n := range sum.refused {
		if n > 0 || i < len(RejectionReasons) {
			r.RefusedByReason[reasonName(i)] = float64(n) / w
		}
	}
	if sum.requests > 0 {
		r.MeanBatch = float64(sum.items) / float64(sum.requests)
	}
	r.P50Ms, r.P99Ms = quantile(sum.latency[:], 0.5)*1000, quantile(sum.latency[:], 0.99)*1000
	r.CacheHitRatio = -1
	if answered := sum.served(); answered > 0 {
		r.CacheHitRatio = float64(sum.fromCache) / float64(answered)
	}
	return r
}

// at returns the stats of second unix, or zeros if the ring has moved on.
func (s *clientSeries) at(unix int64) secondStats {
	sec := s.ring[unix%historySeconds]
	if sec.unix != unix {
		return secondStats{unix: unix}
	}
	return sec
}

func (s *secondStats) add(o secondStats) {
	s.requests += o.requests
	s.items += o.items
	s.errors += o.errors
	s.rejections += o.rejections
	s.fromCache += o.fromCache
	s.fromStore += o.fromStore
	s.notFound += o.notFound
	for i, n := range o.refused {
		s.refused[i] += n
	}
	for i, n := range o.latency {
		s.latency[i] += n
	}
}

// quantile estimates the q-quantile of counts in latencyBounds' buckets
// (quantileOf).
func quantile(counts []int64, q float64) float64 { return quantileOf(counts, latencyBounds[:], q) }

// quantileOf estimates the q-quantile of bucket counts, one per bound
// and one above the last, the way Prometheus's histogram_quantile does:
// linear within the bucket, the lowest bucket starting at 0, the +Inf
// bucket reported as the highest finite bound. It returns 0 for no
// observations.
func quantileOf(counts []int64, bounds []float64, q float64) float64 {
	var total int64
	for _, n := range counts {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var seen int64
	for i, n := range counts {
		if float64(seen+n) < rank || n == 0 {
			seen += n
			continue
		}
		if i == len(bounds) {
			return bounds[len(bounds)-1]
		}
		lower := 0.0
		if i > 0 {
			lower = bounds[i-1]
		}
		return lower + (bounds[i]-lower)*(rank-float64(seen))/float64(n)
	}
	return bounds[len(bounds)-1]
}
