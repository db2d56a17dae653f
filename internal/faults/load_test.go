package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/app/apptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// loadShape is the steady load every scenario runs under: clients named
// client-0 … client-N, each sending one batch of batch seeded URIs every
// interval (or right after the previous answer, if that took longer),
// with a deadline of timeout per request.
type loadShape struct {
	clients, batch int
	interval       time.Duration
	timeout        time.Duration
}

// defaultLoad is 8 clients × 100-URI batches, 5 requests/s each: modest,
// so that on two shared cores under the race detector the server is not
// saturated and latency reflects the fault, not a queue.
var defaultLoad = loadShape{clients: 8, batch: 100, interval: 200 * time.Millisecond, timeout: 2 * time.Second}

func (s loadShape) String() string {
	return fmt.Sprintf("%d clients × %d-URI batches, %d req/s each", s.clients, s.batch, int(time.Second/s.interval))
}

// outcome is one request as a client saw it.
type outcome struct {
	client  int
	start   time.Time
	elapsed time.Duration
	code    codes.Code
	msg     string
	wrong   bool // answered OK but not with the seeded records
}

// load runs a loadShape against a server until stop.
type load struct {
	shape loadShape
	srv   *apptest.Server
	stopc chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	mu    sync.Mutex
	out   []outcome
}

func startLoad(srv *apptest.Server, shape loadShape) *load {
	l := &load{shape: shape, srv: srv, stopc: make(chan struct{})}
	for c := range shape.clients {
		l.wg.Add(1)
		go l.client(c)
	}
	return l
}

func (l *load) client(c int) {
	defer l.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(c), 7))
	tick := time.NewTicker(l.shape.interval)
	defer tick.Stop()
	name := fmt.Sprintf("client-%d", c)
	for {
		select {
		case <-l.stopc:
			return
		case <-tick.C:
		}
		from := rng.IntN(len(l.srv.Posts) - l.shape.batch)
		l.record(l.one(c, name, from))
	}
}

// one sends one batch and checks the answer.
func (l *load) one(c int, name string, from int) outcome {
	ctx, cancel := context.WithTimeout(l.srv.Ctx(name), l.shape.timeout)
	defer cancel()
	o := outcome{client: c, start: time.Now()}
	resp, err := l.srv.Client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: l.srv.URIRange(from, from+l.shape.batch)})
	o.elapsed = time.Since(o.start)
	st := status.Convert(err)
	o.code, o.msg = st.Code(), st.Message()
	if err == nil {
		o.wrong = !answersMatch(l.srv, from, resp)
	}
	return o
}

func answersMatch(srv *apptest.Server, from int, resp *sluicev1.GetPostRecordsResponse) bool {
	for i, rec := range resp.GetRecords() {
		want := srv.Posts[from+i]
		if rec.GetUri() != want.URI || !rec.GetFound() || rec.GetCid() != want.CID {
			return false
		}
	}
	return len(resp.GetRecords()) > 0
}

func (l *load) record(o outcome) {
	l.mu.Lock()
	l.out = append(l.out, o)
	l.mu.Unlock()
}

// stop ends the load and waits for the clients' last requests. It may be
// called more than once.
func (l *load) stop() {
	l.once.Do(func() { close(l.stopc) })
	l.wg.Wait()
}

// count is how many requests that started at or after from have been
// answered.
func (l *load) count(from time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.out {
		if !o.start.Before(from) {
			n++
		}
	}
	return n
}

// window summarises the requests that started in [from, to).
func (l *load) window(from, to time.Time) summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s summary
	var lat []time.Duration
	for _, o := range l.out {
		if o.start.Before(from) || !o.start.Before(to) {
			continue
		}
		s.n++
		lat = append(lat, o.elapsed)
		if o.code != codes.OK || o.wrong {
			s.failed++
			if s.firstErr == "" {
				s.firstErr = fmt.Sprintf("client-%d: %s %q wrong=%v", o.client, o.code, o.msg, o.wrong)
			}
		}
		s.codes = appendCode(s.codes, o.code)
	}
	slices.Sort(lat)
	s.p50, s.p99, s.max = quantile(lat, 0.50), quantile(lat, 0.99), quantile(lat, 1)
	return s
}

// summary is what a window of outcomes came to.
type summary struct {
	n, failed     int
	p50, p99, max time.Duration
	firstErr      string
	codes         []codes.Code
}

func (s summary) successRate() float64 {
	if s.n == 0 {
		return 0
	}
	return float64(s.n-s.failed) / float64(s.n)
}

func (s summary) String() string {
	return fmt.Sprintf("%d requests, %.2f%% ok, p50 %v, p99 %v, max %v", s.n, 100*s.successRate(),
		s.p50.Round(100*time.Microsecond), s.p99.Round(100*time.Microsecond), s.max.Round(100*time.Microsecond))
}

func appendCode(cs []codes.Code, c codes.Code) []codes.Code {
	if slices.Contains(cs, c) {
		return cs
	}
	return append(cs, c)
}

// quantile reads the q-quantile of sorted latencies (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
