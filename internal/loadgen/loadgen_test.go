package loadgen_test

import (
	"bytes"
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/app/apptest"
	"github.com/sluice-dev/sluice/internal/loadgen"
	"github.com/sluice-dev/sluice/internal/loadgen/probe"
	"github.com/sluice-dev/sluice/internal/loadgen/report"
	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
	"github.com/sluice-dev/sluice/internal/loadgen/trace"
	"github.com/sluice-dev/sluice/internal/loadgen/vitals"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const defaultTestTimeout = 2 * time.Minute

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// stallable starts a sluice whose requests block, rather than fail, while
// its memcached is paused: long cache and method timeouts and a breaker
// that never opens.
func stallable(t *testing.T) *apptest.Server {
	s := apptest.Start(t, apptest.Options{Posts: 1000, Configure: func(c *app.Config) {
		c.Cache.Timeout = 4 * time.Second
		c.Cache.BreakerFailures = 1_000_000
		c.Cache.TombstoneTTL = 20 * time.Second
		for name, p := range c.Guard.Methods {
			p.Timeout = 10 * time.Second
			c.Guard.Methods[name] = p
		}
	}})
	if err := loadgen.Warm(testContext(t), s.GRPCAddr, s.URIs, 500, 2, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

func oneClient(s *apptest.Server, rate float64, d time.Duration, maxOutstanding int) scenario.Scenario {
	return scenario.Scenario{
		Name: "stall", Duration: d, URIs: scenario.URISource{File: s.URIFile},
		Clients: []scenario.Client{{Name: "steady", Rate: rate, Batch: scenario.Batch{Dist: scenario.Fixed, Size: 5}, MaxOutstanding: maxOutstanding}},
	}
}

// runWithStall runs sc and pauses memcached from pauseAt to pauseAt+stall
// after the schedule starts.
func runWithStall(t *testing.T, s *apptest.Server, opts loadgen.Options, pauseAt, stall time.Duration) *report.Report {
	t.Helper()
	type result struct {
		r   *report.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := loadgen.Run(testContext(t), opts)
		done <- result{r, err}
	}()
	time.Sleep(200*time.Millisecond + pauseAt) // the schedule starts 200ms after Run
	s.Memcached.Pause()
	time.Sleep(stall)
	s.Memcached.Resume()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	return res.r
}

// Tests that the open loop keeps its schedule while the server stalls:
// with memcached frozen for 1.5 s of a 4 s run, every request is still
// sent on time, and the stall shows in the latency of the many requests
// scheduled during it (measured from their scheduled time), not as one
// slow request followed by silence, as a closed loop would record it.
func TestOpenLoopKeepsScheduleWhileServerStalls(t *testing.T) {
	s := stallable(t)
	const rate, stall = 50, 1500 * time.Millisecond
	opts := loadgen.Options{
		Target:   s.GRPCAddr,
		Scenario: oneClient(s, rate, 4*time.Second, 1000),
		Vitals:   &vitals.Config{MetricsURL: s.MetricsURL, Interval: 200 * time.Millisecond},
		Probe:    &probe.Config{Addr: s.Memcached.Addr(), Every: 20 * time.Millisecond},
	}
	r := runWithStall(t, s, opts, time.Second, stall)
	c := r.Clients[0]
	t.Logf("scheduled=%d sent=%d ok=%d errors=%v dropped=%d late=%d lag=%+v latency=%+v", c.Scheduled, c.Sent, c.OK, c.Codes, c.Dropped, c.Late, c.SendLag, c.Latency)

	if want := int64(rate * 4); c.Scheduled != want || c.Sent != want || c.Dropped != 0 {
		t.Fatalf("scheduled %d, sent %d, dropped %d; want all %d sent", c.Scheduled, c.Sent, c.Dropped, want)
	}
	if c.OK != c.Sent {
		t.Errorf("ok %d of %d (errors %v); a stall within the timeouts must not fail requests", c.OK, c.Sent, c.Codes)
	}
	// Sends stay on schedule even while ~75 requests hang: a closed loop
	// would send them up to the whole 1.5 s stall late.
	checkSendLag(t, c.SendLag, stall, "requests were not sent on schedule during the stall")
	// About 37% of the requests were scheduled during the stall, half of
	// them more than 750 ms before it ended.
	if c.Latency.P90 < 300 {
		t.Errorf("latency p90 %.1f ms; the 1.5 s stall is hidden (coordinated omission?)", c.Latency.P90)
	}
	if c.Latency.Max < 1000 {
		t.Errorf("latency max %.1f ms; want at least 1 s for the requests sent at the stall's start", c.Latency.Max)
	}
	if c.Latency.P50 >= c.Latency.P90 {
		t.Errorf("p50 %.1f ≥ p90 %.1f: the requests outside the stall should be fast", c.Latency.P50, c.Latency.P90)
	}

	// The probe's gets went to the frozen memcached too: the ones due
	// during the stall waited for it (or timed out after a second).
	if p := r.Probe; p == nil || p.OK < 1 || p.Errors == 0 && p.Latency.Max < 1000 {
		t.Errorf("probe %+v: want gets answered, and the stall in its latency or errors", p)
	}

	v := r.Vitals
	if v == nil || len(v.Samples) < 10 {
		t.Fatalf("vital signs: %+v; want a sample every 200 ms", v)
	}
	capConns := float64(s.Config.Cache.MaxConnsPerServer)
	if v.Peak.MemcachedConns < 1 || v.Peak.MemcachedConns > capConns || v.Peak.Goroutines < 1 || v.Peak.Threads < 1 || v.Peak.RSSBytes < 1 || v.Peak.HeapBytes < 1 || v.Peak.MemoryLimitBytes < 1 {
		t.Errorf("vital signs peak %+v: want connections in [1, %v] and live process figures", v.Peak, capConns)
	}
	if v.Peak.MemcachedTWait < 0 || v.Sources["time_wait"] == "" {
		t.Errorf("TIME_WAIT not sampled: %v (sources %v)", v.Peak.MemcachedTWait, v.Sources)
	}
	// The server's own histograms over the run: every request, and the
	// stall inside the server (they waited there for memcached).
	l := v.Latency
	if l == nil || l.CPUWait == nil || l.CPUWait.Count < 1 || len(l.Clients) != 1 {
		t.Fatalf("server latency %+v: want the scheduler wait and one client's requests", l)
	}
	if l.ToSeconds-l.FromSeconds < 4 {
		t.Errorf("server latency between scrapes at %.1f s and %.1f s; want the whole 4 s run between them", l.FromSeconds, l.ToSeconds)
	}
	for name, q := range l.Clients {
		if q.Count != float64(c.Sent) || q.P99Ms < 1000 || q.P50Ms >= q.P99Ms {
			t.Errorf("client %q inside the server: %+v; want all %d requests, p99 ≥ 1 s from the stall, p50 below it", name, q, c.Sent)
		}
	}
}

// Tests that the outstanding bound keeps the harness from piling up
// requests behind a stalled server: requests due while the bound is
// reached are dropped and counted, never queued, and the rest still go
// out on time.
func TestOutstandingBoundDropsInsteadOfQueueing(t *testing.T) {
	s := stallable(t)
	const rate, bound, stall = 50, 5, 1500 * time.Millisecond
	opts := loadgen.Options{Target: s.GRPCAddr, Scenario: oneClient(s, rate, 3*time.Second, bound)}
	r := runWithStall(t, s, opts, 800*time.Millisecond, stall)
	c := r.Clients[0]
	t.Logf("scheduled=%d sent=%d dropped=%d ok=%d lag=%+v", c.Scheduled, c.Sent, c.Dropped, c.OK, c.SendLag)
	if c.Scheduled != rate*3 || c.Sent+c.Dropped != c.Scheduled {
		t.Fatalf("scheduled %d = sent %d + dropped %d; want %d scheduled", c.Scheduled, c.Sent, c.Dropped, rate*3)
	}
	// ~75 requests fall due during the stall, at most 5 can be in flight.
	if c.Dropped < 30 {
		t.Errorf("dropped %d; with %d outstanding allowed and a 1.5 s stall at %d/s, most of the stall's requests must be dropped", c.Dropped, bound, rate)
	}
	checkSendLag(t, c.SendLag, stall, "the requests within the bound were not sent on time")
}

// checkSendLag fails the test if sends lagged their schedule by a sizeable
// share of span, a stall: a closed loop, or one that queued behind the
// stalled requests, lags by up to the whole stall from its start on, so
// its p99 is nearly all of it and its p50 a large part. The bounds are
// shares of the stall, not milliseconds, with room for a shared machine
// under the race detector whose other core is busy (the scheduler then
// delays a few sends by hundreds of milliseconds — 640 ms at p99 was seen
// at load 21 on 2 cores — but not most of them, and not by the stall).
func checkSendLag(t *testing.T, lag report.Latency, span time.Duration, what string) {
	t.Helper()
	spanMS := float64(span.Milliseconds())
	if lag.P50 > spanMS/10 || lag.P99 > spanMS/2 {
		t.Errorf("send lag p50 %.1f ms, p99 %.1f ms, want ≤ %.0f and ≤ %.0f (a tenth and a half of %v); %s",
			lag.P50, lag.P99, spanMS/10, spanMS/2, span, what)
	}
}

// Tests that a recorded trace replays the same requests — clients,
// methods, URIs — at the speed factor, and that a trace of batch sizes
// only replays the same sizes.
func TestReplayRoundTrip(t *testing.T) {
	s := apptest.Start(t, apptest.Options{Posts: 500})
	sc := scenario.Scenario{
		Name: "mix", Duration: 2 * time.Second, URIs: scenario.URISource{File: s.URIFile, Missing: 0.1},
		Clients: []scenario.Client{
			{Name: "feed", Rate: 40, Batch: scenario.Batch{Dist: scenario.Uniform, Min: 1, Max: 20}},
			{Name: "single", Method: scenario.GetPostRecord, Rate: 20, Batch: scenario.Batch{Dist: scenario.Fixed, Size: 1}},
		},
	}
	for _, withURIs := range []bool{true, false} {
		name := map[bool]string{true: "uris", false: "sizes only"}[withURIs]
		t.Run(name, func(t *testing.T) {
			var first bytes.Buffer
			rec := trace.NewWriter(&first, withURIs)
			orig, err := loadgen.Run(testContext(t), loadgen.Options{Target: s.GRPCAddr, Scenario: sc, Record: rec})
			if err != nil {
				t.Fatal(err)
			}
			if err := rec.Flush(); err != nil {
				t.Fatal(err)
			}
			a, err := trace.Read(&first)
			if err != nil {
				t.Fatal(err)
			}
			if len(a) != 120 {
				t.Fatalf("recorded %d requests, want 2 s × (40 + 20)/s = 120", len(a))
			}

			var second bytes.Buffer
			rec2 := trace.NewWriter(&second, withURIs)
			began := time.Now()
			replay, err := loadgen.Run(testContext(t), loadgen.Options{Target: s.GRPCAddr, Scenario: sc, Replay: a, Speed: 2, Record: rec2})
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(began)
			if err := rec2.Flush(); err != nil {
				t.Fatal(err)
			}
			b, err := trace.Read(&second)
			if err != nil {
				t.Fatal(err)
			}
			compareTraces(t, a, b, 2, withURIs)
			for _, c := range replay.Clients {
				o := orig.Client(c.Name)
				if o == nil || c.Sent != o.Sent || c.OK != c.Sent || c.Method != o.Method {
					t.Errorf("replayed %s: %+v; original %+v", c.Name, c, o)
				}
			}
			// The schedule cannot run ahead (at least 1 s), and from its
			// first request to its last answer the replay takes clearly less
			// than the original run did just before it: a replay at the
			// original pace would take as long.
			t.Logf("original run %.2fs, replay at speed 2 %.2fs (%v with start-up)", orig.ElapsedSeconds, replay.ElapsedSeconds, took)
			if took < 900*time.Millisecond {
				t.Errorf("replay at speed 2 of a 2 s trace took %v, want ≥ 900ms: it ran ahead of its schedule", took)
			}
			if replay.ElapsedSeconds > orig.ElapsedSeconds*3/4 {
				t.Errorf("replay at speed 2 ran %.2fs, want ≤ ¾ of the original run's %.2fs", replay.ElapsedSeconds, orig.ElapsedSeconds)
			}
		})
	}
}

func compareTraces(t *testing.T, a, b []trace.Entry, speed float64, withURIs bool) {
	t.Helper()
	order := func(x, y trace.Entry) int {
		if x.Client != y.Client {
			return map[bool]int{true: -1, false: 1}[x.Client < y.Client]
		}
		return int(math.Copysign(1, x.OffsetMS-y.OffsetMS))
	}
	slices.SortStableFunc(a, order)
	slices.SortStableFunc(b, order)
	if len(a) != len(b) {
		t.Fatalf("replay recorded %d requests, original %d", len(b), len(a))
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Client != y.Client || x.Method != y.Method || x.Size() != y.Size() || math.Abs(x.OffsetMS/speed-y.OffsetMS) > 0.01 {
			t.Fatalf("request %d: original %+v, replay %+v", i, x, y)
		}
		if withURIs && !slices.Equal(x.URIs, y.URIs) {
			t.Fatalf("request %d: URIs differ", i)
		}
	}
}
