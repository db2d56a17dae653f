package app

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/pkg/client"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// latencies collects request durations from many goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// quantile returns the q-quantile (0 < q ≤ 1) of the durations.
func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// merge adds m's durations to l.
func (l *latencies) merge(m *latencies) {
	m.mu.Lock()
	d := slices.Clone(m.d)
	m.mu.Unlock()
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

func (l *latencies) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

// normalLoad is the everyday traffic of the incident: clients named
// feed-0…, each sending a 1–50-URI batch every interval. Each latency is
// filed by whether the bulk client was calling when the request started,
// so that both figures come from the same seconds of a shared machine.
type normalLoad struct {
	without, with latencies
	bulkOn        atomic.Bool
	errors        atomic.Int64
	first         atomic.Value
	stop          chan struct{}
	once          sync.Once
	wg            sync.WaitGroup
}

func startNormalLoad(ts *testServer, clients int, interval time.Duration) *normalLoad {
	l := &normalLoad{stop: make(chan struct{})}
	for c := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			ctx := ts.ctx(fmt.Sprintf("feed-%d", c))
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				n := 1 + rng.IntN(50)
				from := rng.IntN(len(ts.posts) - n)
				lat := &l.without
				if l.bulkOn.Load() {
					lat = &l.with
				}
				start := time.Now()
				resp, err := ts.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: ts.uris(from, from+n)})
				if err != nil || len(resp.GetRecords()) != n || !resp.GetRecords()[n-1].GetFound() {
					l.errors.Add(1)
					l.first.CompareAndSwap(nil, fmt.Sprintf("%v (%d records)", err, len(resp.GetRecords())))
					continue
				}
				lat.add(time.Since(start))
			}
		}()
	}
	return l
}

// finish stops the load and waits for it; it may be called more than
// once.
func (l *normalLoad) finish() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// The incident: normal callers with 1–50-URI batches, and a bulk caller
// that needs 20,000 records per call.
const (
	bulkRate      = 5_000 // the bulk client's items/s
	bulkBurst     = 1_000
	bulkPerCall   = 20_000
	normalClients = 6
	normalEvery   = 20 * time.Millisecond // 50 requests/s per normal client
	p99Factor     = 3                     // bound: p99 with bulk ≤ 3× p99 without …
	p99Slack      = 50 * time.Millisecond // … or without + 50ms, whichever is larger
)

// Tests the incident mix against a real sluice and memcached: the bulk
// client, through pkg/client, gets every one of its 20,000 records per
// call at its budget's pace; normal clients see no errors and their p99
// stays within max(3× their p99 without the bulk client, +50ms). The
// normal load runs throughout, and the seconds without the bulk client
// come before, between and after its calls, so a machine whose other
// core turns busy slows both figures alike.
func TestIncidentMix(t *testing.T) {
	skipUnderRace(t)
	ts := startServer(t, bulkPerCall+1000, func(c *Config) {
		c.Guard.Admission = budget.Config{
			Default: budget.Budget{ItemsPerSecond: 50_000, Burst: 5_000, MaxInflightItems: 5_000},
			Clients: map[string]budget.Budget{"bulk": {ItemsPerSecond: bulkRate, Burst: bulkBurst, MaxInflightItems: 2_000}, "warmup": unlimited},
		}
	})
	ts.warm(1000)

	// A raw 20,000-URI request is still refused by shape, before budgets.
	raw := make([]string, bulkPerCall)
	for i := range raw {
		raw[i] = ts.posts[i].URI
	}
	_, err := ts.client.GetPostRecords(ts.ctx("bulk"), &sluicev1.GetPostRecordsRequest{Uris: raw})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "20000 uris exceeds the limit of 1000") {
		t.Fatalf("raw 20,000-URI request: %v, want InvalidArgument naming the limit", err)
	}

	bulk, err := client.Dial(ts.ctx("bulk"), ts.conn.Target(), "bulk")
	if err != nil {
		t.Fatal(err)
	}
	defer bulk.Close()
	normal := startNormalLoad(ts, normalClients, normalEvery)
	defer normal.finish()
	var calls []time.Duration
	for call := range 2 {
		time.Sleep(time.Second)
		normal.bulkOn.Store(true)
		start := time.Now()
		records, err := bulk.GetPostRecords(ts.ctx("bulk"), raw)
		calls = append(calls, time.Since(start))
		normal.bulkOn.Store(false)
		if err != nil {
			t.Fatalf("bulk call %d: %v", call, err)
		}
		for i, r := range records {
			if r.GetUri() != raw[i] || !r.GetFound() {
				t.Fatalf("bulk call %d: records[%d] = %s found=%v, want %s", call, i, r.GetUri(), r.GetFound(), raw[i])
			}
		}
	}
	time.Sleep(time.Second)
	normal.finish()
	without, with := &normal.without, &normal.with

	p99Without, p99With := without.quantile(0.99), with.quantile(0.99)
	ratio := float64(p99With) / float64(p99Without)
	bound := max(p99Factor*p99Without, p99Without+p99Slack)
	pace := time.Duration(float64(bulkPerCall-1000) / bulkRate * float64(time.Second))
	t.Logf("normal clients: %d requests without bulk, p50 %v p99 %v; %d requests with bulk, p50 %v p99 %v; p99 ratio %.2f (bound %v)",
		without.count(), without.quantile(0.5), p99Without, with.count(), with.quantile(0.5), p99With, ratio, bound)
	t.Logf("bulk client: %d records per call in %v (budget pace %d items/s: at least %v per call); limits %+v",
		bulkPerCall, calls, bulkRate, pace, bulk.Limits())
	if n := normal.errors.Load(); n != 0 {
		t.Errorf("normal clients saw %d errors (first: %v), want 0", n, normal.first.Load())
	}
	if p99With > bound {
		t.Errorf("normal p99 with bulk %v exceeds the bound %v (p99 without bulk %v)", p99With, bound, p99Without)
	}
	for i, d := range calls {
		if d < pace*9/10 || d > 4*pace {
			t.Errorf("bulk call %d took %v; its budget's pace is about %v", i, d, pace)
		}
	}

	// pkg/client paces itself to the budget it reads from GetLimits, so
	// the calls above keep the pace even if the server did not enforce
	// it. A bulk caller that does not pace itself is held to the budget
	// by the server: what it gets served is at most the burst plus the
	// rate over the time it spent asking, and the rest is refused with
	// ResourceExhausted and a RetryInfo.
	u := unpacedBulk(ts, raw, 2)
	allowed := float64(bulkBurst) + bulkRate*u.took.Seconds()
	t.Logf("unpaced bulk caller: %d × %d-URI requests, 2 at a time, in %v: %d items served (budget allows %.0f), %d refused",
		len(raw)/bulkBurst, bulkBurst, u.took, u.served, allowed, u.refused)
	if float64(u.served) > allowed {
		t.Errorf("an unpaced bulk caller was served %d items in %v; its budget (%d items/s, burst %d) allows %.0f", u.served, u.took, bulkRate, bulkBurst, allowed)
	}
	if u.wrong != "" {
		t.Errorf("an unpaced bulk caller's refusal: %s; want ResourceExhausted with a RetryInfo", u.wrong)
	}
}

// unpaced is what a caller that ignores its budget's pace got.
type unpaced struct {
	served, refused int
	took            time.Duration
	wrong           string // the first answer that was neither served nor a clear refusal
}

// unpacedBulk sends uris as "bulk" in requests of bulkBurst URIs,
// parallel at a time, each as soon as the previous one is answered.
func unpacedBulk(ts *testServer, uris []string, parallel int) unpaced {
	var (
		u    unpaced
		mu   sync.Mutex
		next atomic.Int64
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range parallel {
		wg.Go(func() {
			for {
				i := int(next.Add(1)-1) * bulkBurst
				if i >= len(uris) {
					return
				}
				_, err := ts.client.GetPostRecords(ts.ctx("bulk"), &sluicev1.GetPostRecordsRequest{Uris: uris[i : i+bulkBurst]})
				_, hint := retryInfo(err)
				mu.Lock()
				switch {
				case err == nil:
					u.served += bulkBurst
				case status.Code(err) == codes.ResourceExhausted && hint:
					u.refused++
				case u.wrong == "":
					u.wrong = fmt.Sprintf("%v (RetryInfo %v)", err, hint)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	u.took = time.Since(start)
	return u
}

// retryInfo returns the RetryInfo delay of err, if it has one.
func retryInfo(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// Tests that a client over its budget is refused at once with
// ResourceExhausted, a RetryInfo and a message naming it and its budget;
// that a client with no name gets the default budget; and that GetLimits
// reports both.
func TestOverBudget(t *testing.T) {
	// tiny refills at 10 items/s, so the 50 items asked right after its
	// burst are seconds away: a slow machine between the two calls refills
	// a little, never enough to admit them.
	ts := startServer(t, 3000, func(c *Config) {
		c.Guard.Admission = budget.Config{
			Default: budget.Budget{ItemsPerSecond: 100, Burst: 1_500, MaxInflightItems: 5_000},
			Clients: map[string]budget.Budget{"tiny": {ItemsPerSecond: 10, Burst: 100, MaxInflightItems: 100}, "warmup": unlimited},
		}
	})
	burstAt := time.Now()
	if _, err := ts.client.GetPostRecords(ts.ctx("tiny"), &sluicev1.GetPostRecordsRequest{Uris: ts.uris(0, 100)}); err != nil {
		t.Fatalf("a full burst: %v", err)
	}
	start := time.Now()
	_, err := ts.client.GetPostRecords(ts.ctx("tiny"), &sluicev1.GetPostRecordsRequest{Uris: ts.uris(0, 50)})
	took := time.Since(start)
	sinceBurst := time.Since(burstAt)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("over budget: %v, want ResourceExhausted", err)
	}
	// 50 items at 10/s from an empty bucket is 5s; whatever refilled
	// since the burst was taken (at most sinceBurst of refill) comes off.
	const full = 5 * time.Second
	delay, ok := retryInfo(err)
	if !ok || delay > full || delay < full-sinceBurst-100*time.Millisecond {
		t.Errorf("RetryInfo %v (present %v), want %v less at most the %v since the burst: 50 items at 10/s", delay, ok, full, sinceBurst)
	}
	for _, want := range []string{`client "tiny"`, "budget 10 items/s, burst 100,"} {
		if !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("message %q lacks %q", status.Convert(err).Message(), want)
		}
	}
	t.Logf("refusal after %v: %s (retry in %v)", took, status.Convert(err).Message(), delay)
	// A refusal that queued for the budget would take about the delay it
	// asks the caller to wait; at once is well under half of it.
	if took > delay/2 {
		t.Errorf("the refusal took %v, retry in %v; it must come at once, not after queueing", took, delay)
	}
	if n := ts.metrics().Sum("sluice_rejections_total", map[string]string{"reason": "quota"}); n < 1 {
		t.Errorf("sluice_rejections_total{reason=quota} = %v, want ≥ 1", n)
	}

	// No name: GetLimits and admission both use the default budget.
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	lim, err := ts.client.GetLimits(ctx, &sluicev1.GetLimitsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if b := lim.GetBudget(); b.GetClient() != "unknown" || b.GetBurst() != 1500 || b.GetItemsPerSecond() != 100 {
		t.Errorf("GetLimits without a name: %+v, want the default budget for unknown", b)
	}
	if !slices.ContainsFunc(lim.GetMethods(), func(m *sluicev1.MethodLimits) bool {
		return m.GetMethod() == "sluice.v1.PostRecords/GetPostRecords" && m.GetMaxItems() == 1000 && m.GetMaxUriLength() == 512
	}) {
		t.Errorf("GetLimits methods %v lack GetPostRecords' limits", lim.GetMethods())
	}
	if _, err := ts.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: ts.uris(0, 1000)}); err != nil {
		t.Fatalf("unnamed, within the default burst: %v", err)
	}
	_, err = ts.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: ts.uris(0, 1000)})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), `client "unknown"`) {
		t.Errorf("unnamed, over the default budget: %v, want ResourceExhausted naming unknown", err)
	}
	// A named client of its own is not affected by unknown's spending.
	if _, err := ts.client.GetPostRecords(ts.ctx("feed"), &sluicev1.GetPostRecordsRequest{Uris: ts.uris(0, 1000)}); err != nil {
		t.Errorf("feed after unknown spent its budget: %v", err)
	}
	// Batch criticality is accepted; an unknown one is a clear error.
	bctx := metadata.AppendToOutgoingContext(ts.ctx("feed2"), "x-criticality", "urgent")
	if _, err := ts.client.GetPostRecords(bctx, &sluicev1.GetPostRecordsRequest{Uris: ts.uris(0, 1)}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "interactive (the default) or batch") {
		t.Errorf("x-criticality: urgent: %v, want InvalidArgument naming the choices", err)
	}
}

// phase is what one load phase measured.
type phase struct {
	ok, shed, other atomic.Int64
	shedNoRetryInfo atomic.Int64
	firstOther      atomic.Value
	accepted, shedL latencies
	took            time.Duration
}

// merge adds what q measured to p.
func (p *phase) merge(q *phase) {
	p.ok.Add(q.ok.Load())
	p.shed.Add(q.shed.Load())
	p.other.Add(q.other.Load())
	p.shedNoRetryInfo.Add(q.shedNoRetryInfo.Load())
	if v := q.firstOther.Load(); v != nil {
		p.firstOther.CompareAndSwap(nil, v)
	}
	p.accepted.merge(&q.accepted)
	p.shedL.merge(&q.shedL)
	p.took += q.took
}

func (p *phase) goodput(batch int) float64 {
	return float64(p.ok.Load()*int64(batch)) / p.took.Seconds()
}

func (p *phase) record(start time.Time, err error) {
	switch status.Code(err) {
	case codes.OK:
		p.ok.Add(1)
		p.accepted.add(time.Since(start))
	case codes.Unavailable:
		p.shed.Add(1)
		if _, ok := retryInfo(err); !ok {
			p.shedNoRetryInfo.Add(1)
		}
		p.shedL.add(time.Since(start))
	default:
		p.other.Add(1)
		p.firstOther.CompareAndSwap(nil, err.Error())
	}
}

func (ts *testServer) call(ctx context.Context, rng *rand.Rand, batch int) error {
	from := rng.IntN(len(ts.posts) - batch)
	resp, err := ts.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: ts.uris(from, from+batch)})
	if err == nil && (len(resp.GetRecords()) != batch || !resp.GetRecords()[0].GetFound()) {
		return fmt.Errorf("%d records for %d uris", len(resp.GetRecords()), batch)
	}
	return err
}

// closedLoop runs clients back to back for d.
func (ts *testServer) closedLoop(clients, batch int, d time.Duration) *phase {
	p := &phase{}
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 2))
			ctx := ts.ctx(fmt.Sprintf("load-%d", c))
			for time.Since(start) < d {
				t0 := time.Now()
				p.record(t0, ts.call(ctx, rng, batch))
			}
		})
	}
	wg.Wait()
	p.took = time.Since(start)
	return p
}

// openLoop sends requests at a fixed rate for d whatever the answers,
// as many independent callers do.
func (ts *testServer) openLoop(perSecond float64, batch int, d time.Duration) *phase {
	p := &phase{}
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / perSecond)
	start := time.Now()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if at.Sub(start) >= d {
			break
		}
		time.Sleep(time.Until(at))
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			ctx, cancel := context.WithTimeout(ts.ctx(fmt.Sprintf("load-%d", i%64)), 2*time.Second)
			defer cancel()
			t0 := time.Now()
			p.record(t0, ts.call(ctx, rng, batch))
		})
	}
	wg.Wait()
	p.took = time.Since(start)
	return p
}

// Tests overload: capacity is made small by configuration — 1,000 items
// in flight, 10 store reads at a time per request, 20ms per store read
// (a remote store's latency) with memcached down so every read reaches
// the store — so a 100-URI request takes about 200ms and the server
// completes about 5,000 items/s. An offered load of 4× what it completes
// at capacity is then met by shedding — fast Unavailable answers with
// RetryInfo — while accepted requests keep a bounded p99 and goodput
// stays near capacity. Capacity and overload rounds alternate, so each
// bound is against figures measured in the same seconds.
func TestOverloadShedsAndKeepsGoodput(t *testing.T) {
	skipUnderRace(t)
	const batch, overload, capItems = 100, 4, 1_000
	ts := startServer(t, 6000, func(c *Config) {
		c.Guard.MaxInflightItems = capItems
		p := c.Guard.Methods["sluice.v1.PostRecords/GetPostRecords"]
		p.Concurrency = 10
		c.Guard.Methods["sluice.v1.PostRecords/GetPostRecords"] = p
		c.StoreReadDelay = 20 * time.Millisecond
		c.Guard.Admission.Default = budget.Budget{ItemsPerSecond: 1e7, Burst: 1e6, MaxInflightItems: 1e6}
	})
	ts.memcached.Stop()

	// Capacity and overload alternate, 1.5s each, twice: both figures
	// come from the same stretch of a shared machine, so a busy other
	// core slows them alike. Each overload round offers 4× what the
	// capacity rounds so far completed.
	base, over := &phase{}, &phase{}
	for range 2 {
		b := ts.closedLoop(capItems/batch, batch, 1500*time.Millisecond)
		if b.ok.Load() == 0 || b.other.Load() != 0 {
			t.Fatalf("at capacity: ok=%d shed=%d other=%d (%v)", b.ok.Load(), b.shed.Load(), b.other.Load(), b.firstOther.Load())
		}
		base.merge(b)
		rate := overload * float64(base.ok.Load()) / base.took.Seconds()
		over.merge(ts.openLoop(rate, batch, 1500*time.Millisecond))
	}
	rate := overload * float64(base.ok.Load()) / base.took.Seconds()
	queue := ts.app.Guard.QueueStats()

	g1, g2 := base.goodput(batch), over.goodput(batch)
	p1, p2 := base.accepted.quantile(0.99), over.accepted.quantile(0.99)
	t.Logf("at capacity (%d closed-loop clients × %d URIs): %d ok, goodput %.0f items/s, p50 %v p99 %v",
		capItems/batch, batch, base.ok.Load(), g1, base.accepted.quantile(0.5), p1)
	t.Logf("offered about %.0f requests/s (%d× capacity) for 2 × 1.5s: %d ok, %d shed, %d other; goodput %.0f items/s (%.0f%% of capacity); accepted p50 %v p99 %v; shed p50 %v p99 %v; queue %+v",
		rate, overload, over.ok.Load(), over.shed.Load(), over.other.Load(), g2, 100*g2/g1,
		over.accepted.quantile(0.5), p2, over.shedL.quantile(0.5), over.shedL.quantile(0.99), queue)
	if over.other.Load() != 0 {
		t.Errorf("%d requests failed with something other than Unavailable (first: %v)", over.other.Load(), over.firstOther.Load())
	}
	if over.shed.Load() == 0 {
		t.Errorf("nothing was shed at %d× capacity", overload)
	}
	if g2 < 0.4*g1 {
		t.Errorf("goodput collapsed to %.0f items/s under overload, capacity %.0f", g2, g1)
	}
	if bound := max(3*p1, p1+100*time.Millisecond); p2 > bound {
		t.Errorf("accepted p99 %v under overload, bound %v (3× or +100ms over %v at capacity)", p2, bound, p1)
	}
	// Shedding is quick: a shed answer comes sooner than an accepted one
	// (on an idle machine within N = 100ms; the bound allows for a shared
	// 2-core machine).
	if s50, a50 := over.shedL.quantile(0.5), over.accepted.quantile(0.5); s50 >= a50 {
		t.Errorf("shed p50 %v is not quicker than accepted p50 %v", s50, a50)
	}
	if s99, bound := over.shedL.quantile(0.99), max(p2, 300*time.Millisecond); s99 > bound {
		t.Errorf("shed requests waited %v at p99, bound %v", s99, bound)
	}
	if n := over.shedNoRetryInfo.Load(); n != 0 {
		t.Errorf("%d shed answers carried no RetryInfo", n)
	}
}
