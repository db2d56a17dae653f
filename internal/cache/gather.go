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
	runs bool          // set under gather.mu when it is handed a batch to run
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
		g.srv.gathered.Add(1)
		return a.item
	case <-ctx.Done():
		g.srv.waitExpired.Add(1)
		if g.leave(a) {
			g.serve(<-a.turn) // this read runs its batch: the others wait on it
		}
		return nil
	}
}

// leave takes a, whose caller has gone, out of the waiting reads, and
// reports whether it must still run the batch it was handed. A read
// taken into a batch it does not run just stops waiting; the batch's
// runner still answers it, unread.
func (g *gather) leave(a *asked) (runs bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.waiting, a); i >= 0 {
		g.waiting = slices.Delete(g.waiting, i, i+1)
		return false
	}
	return a.runs
}

// serve runs batch, if this read was handed one, answers each of its
// reads, and hands on the running slot it came with.
func (g *gather) serve(batch []*asked) {
	if batch == nil {
		return // answered by another read's batch
	}
	// The batch answers every read in it, so it does not end with its
	// runner's deadline; one call's timeout bounds it instead, as it
	// bounds a get once a connection is held.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), g.timeout)
	defer cancel()
	items := g.fetch(ctx, distinctKeys(batch))
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
	batch[0].runs = true
	g.mu.Unlock()
	batch[0].turn <- batch
}

// distinctKeys are the keys of batch, each once, in order.
func distinctKeys(batch []*asked) []string {
	keys := make([]string, 0, len(batch))
	seen := make(map[string]struct{}, len(batch))
	for _, a := range batch {
		if _, dup := seen[a.key]; !dup {
			seen[a.key] = struct{}{}
			keys = append(keys, a.key)
		}
	}
	return keys
}
