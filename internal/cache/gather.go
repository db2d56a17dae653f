package cache

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/sluice-dev/sluice/internal/spans"
)

// gather sends one server's single-key gets, at most inFlight at once.
// A single-key read that arrives while inFlight are out waits, and the
// reads waiting when a get returns go out together as one multi-get of
// up to MaxKeysPerGet keys, each key once: under load, one round trip
// and one pair of system calls answer many callers, and a hot key read
// by many at once is fetched once. Below inFlight nothing waits.
//
// No goroutine is started for it: the caller whose get returns hands the
// waiting reads to the first of them, which runs their get on its own
// goroutine and then does the same.
type gather struct {
	srv      *server
	inFlight int
	maxKeys  int
	timeout  time.Duration // Config.Timeout: the longest one call may take
	tracer   spans.Tracer

	mu      sync.Mutex
	running int      // gets out now, each held by the goroutine running it
	waiting []*asked // reads waiting for the next get, in arrival order
}

// asked is one waiting single-key read.
type asked struct {
	ctx  context.Context
	key  string
	turn chan []*asked // a batch to run (this read is its first), or nil once answered
	item *memcache.Item
}

func newGather(srv *server, cfg Config, tracer spans.Tracer) *gather {
	return &gather{srv: srv, inFlight: cfg.SingleGetsInFlight, maxKeys: cfg.MaxKeysPerGet, timeout: cfg.Timeout, tracer: tracer}
}

// get reads key, alone or gathered with others. It returns nil for a
// miss, a failed call and a key the server may not answer now (hide).
func (g *gather) get(ctx context.Context, key string) *memcache.Item {
	g.mu.Lock()
	if g.running < g.inFlight {
		g.running++
		g.mu.Unlock()
		items := g.fetch(ctx, []string{key})
		g.handOn()
		return items[key]
	}
	a := &asked{ctx: ctx, key: key, turn: make(chan []*asked, 1)}
	g.waiting = append(g.waiting, a)
	g.mu.Unlock()
	select {
	case batch := <-a.turn:
		g.serve(batch)
	case <-ctx.Done():
		if g.withdraw(a) {
			g.srv.waitExpired.Add(1)
			return nil
		}
		g.serve(<-a.turn) // already taken into a batch: see it through
	}
	g.srv.gathered.Add(1)
	return a.item
}

// withdraw takes a out of the waiting reads, reporting whether it was
// still there.
func (g *gather) withdraw(a *asked) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	i := slices.Index(g.waiting, a)
	if i < 0 {
		return false
	}
	g.waiting = slices.Delete(g.waiting, i, i+1)
	return true
}

// serve runs batch, if this read was handed one, answers each of its
// reads, and hands on the running slot it came with.
func (g *gather) serve(batch []*asked) {
	if batch == nil {
		return // answered by another read's batch
	}
	ctx := batch[0].ctx
	if ctx.Err() != nil {
		// The runner's caller has gone; the others are still waiting,
		// for no longer than one call may take.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
		defer cancel()
	}
	keys := make([]string, 0, len(batch))
	for _, a := range batch {
		if !slices.Contains(keys, a.key) {
			keys = append(keys, a.key)
		}
	}
	items := g.fetch(ctx, keys)
	for i, a := range batch {
		a.item = items[a.key]
		if i > 0 {
			a.turn <- nil
		}
	}
	g.handOn()
}

// fetch is one get of keys on the server, with the keys it may not
// answer now taken out.
func (g *gather) fetch(ctx context.Context, keys []string) map[string]*memcache.Item {
	ch := chunk{srv: g.srv, keys: keys}
	sent := time.Now()
	items := ch.get(ctx, g.tracer)
	g.srv.hide(items, sent)
	return items
}

// handOn passes a running slot whose get has returned to the reads
// waiting, as one batch run by the first of them, or gives it up when
// none waits.
func (g *gather) handOn() {
	g.mu.Lock()
	if len(g.waiting) == 0 {
		g.running--
		g.mu.Unlock()
		return
	}
	n := min(len(g.waiting), g.maxKeys)
	batch := slices.Clone(g.waiting[:n])
	g.waiting = slices.Delete(g.waiting, 0, n)
	g.mu.Unlock()
	batch[0].turn <- batch
}
