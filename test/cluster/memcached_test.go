//go:build cluster

package cluster

import (
	"fmt"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// TestMemcachedFleet runs one sluice over three memcached servers and the
// cluster, stops one server under load and brings it back: reads keep
// succeeding, about a third of the keys move to the other two and refill
// there, the hit ratio is back after one pass over the key set, the other
// servers stay within their connection caps, and once the server is back
// its keys return to it.
func TestMemcachedFleet(t *testing.T) {
	v := newVerdict(t)
	ks := newKeyspace(t, "sluice_cluster_fleet", 3, 3000)
	var mcs []*testenv.Memcached
	var addrs []string
	for range 3 {
		m := testenv.StartMemcached(t)
		mcs, addrs = append(mcs, m), append(addrs, m.Addr())
	}
	const conns = 16
	r := startReplicaWith(t, fleetConfig, ks, addrs, "--memcached-max-conns", "16")
	p := &passes{t: t, v: v, r: r, uris: ks.uris}
	// Warm up until a whole pass hits: on a busy machine a refill can
	// miss its cache timeout and be dropped, to be refilled next pass.
	for pass := 1; ; pass++ {
		if p.run(fmt.Sprintf("warm-up %d", pass)).hitRatio() >= 0.99 {
			break
		}
		if pass == 5 {
			v.Fatalf("five passes over the key set did not warm the cache to a 0.99 hit ratio")
		}
	}
	l := startLoad(t, ks.uris, r.client())
	from := time.Now()
	dialsBefore := r.metrics(t)

	storeBefore := r.metrics(t).Sum("sluice_items_total", map[string]string{"source": "store"})
	mcs[2].Stop()
	waitBreaker(t, v, r, addrs[2], 2)
	time.Sleep(time.Second) // the load reads with the server out
	p.run("first pass with one server out")
	// Every moved key is read from the store once, by whichever caller
	// reads it first (the load or the pass): count store reads of all
	// callers from the stop to the end of the pass, which covered every key.
	moved := (r.metrics(t).Sum("sluice_items_total", map[string]string{"source": "store"}) - storeBefore) / float64(len(ks.uris))
	figure(t, "memcached server out: keys refilled from the store", "%.1f%% of the key set", 100*moved)
	if moved < 0.2 || moved > 0.47 {
		v.Errorf("with one of three servers out, %.3f of the key set was read from the store, want about a third", moved)
	}
	recovered := p.run("second pass with one server out")
	figure(t, "memcached server out: hit ratio on the second pass", "%.1f%%", 100*recovered.hitRatio())
	if recovered.hitRatio() < 0.95 {
		v.Errorf("hit ratio %.3f on the second pass with one server out, want at least 0.95: the moved keys did not refill on the others", recovered.hitRatio())
	}
	m := r.metrics(t)
	for _, a := range addrs[:2] {
		open := m.Sum("sluice_memcached_connections_open", map[string]string{"server": a})
		dials := m.Sum("sluice_memcached_dials_total", map[string]string{"server": a}) - dialsBefore.Sum("sluice_memcached_dials_total", map[string]string{"server": a})
		figure(t, "memcached server out: "+a, "%.0f connections open (cap %d), %.0f dials during the outage", open, conns, dials)
		if open > conns || dials > conns {
			v.Errorf("server %s: %.0f connections open and %.0f dials during the outage, want both within the cap of %d", a, open, dials, conns)
		}
	}

	// The load shows reads succeed while the server is out; it stops
	// before the server returns, so the passes alone refill its keys.
	l.halt()
	got := l.between(from, time.Now())
	figure(t, "memcached server out: calls", "%v", got)
	if got.reads == 0 || got.readErrs != 0 || got.writeErrs != 0 {
		v.Errorf("calls while a memcached server was out: %v; first error: %s; want reads, 0 failed", got, got.firstErr)
	}

	mcs[2].Start()
	// A half-open breaker closes on a successful call: probe with a few
	// reads (a handful of keys refill early; the pass below counts the rest).
	probe := ks.uris[:10]
	waitBreakerProbed(t, v, r, addrs[2], func() {
		ctx, cancel := ctxAs("checker")
		defer cancel()
		_, _ = r.client().GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: probe})
	})
	hitsBefore := r.metrics(t).Sum("sluice_cache_hits_total", map[string]string{"server": addrs[2]})
	back := p.run("first pass with the server back")
	figure(t, "memcached server back (empty): keys refilled from the store on the first pass", "%.1f%%", 100*back.storeRatio())
	if s := back.storeRatio(); s < 0.2 || s > 0.47 {
		v.Errorf("with the server back, %.3f of keys came from the store, want about a third (its keys returned to it, empty)", s)
	}
	p.run("second pass with the server back")
	hits := r.metrics(t).Sum("sluice_cache_hits_total", map[string]string{"server": addrs[2]}) - hitsBefore
	figure(t, "memcached server back: its share of the hits on the second pass", "%.1f%%", 100*hits/float64(len(ks.uris)))
	if share := hits / float64(len(ks.uris)); share < 0.2 || share > 0.47 {
		v.Errorf("the returned server answered %.3f of a pass's keys, want about a third", share)
	}

}

// passes reads every URI once, in batches, and counts where items came
// from (sluice_items_total by source, before and after).
type passes struct {
	t    *testing.T
	v    *verdict
	r    *replica
	uris []string
}

type passResult struct{ cache, store float64 }

func (p passResult) hitRatio() float64   { return p.cache / (p.cache + p.store) }
func (p passResult) storeRatio() float64 { return p.store / (p.cache + p.store) }

func (p *passes) run(name string) passResult {
	p.t.Helper()
	source := func(s string) float64 {
		return p.r.metrics(p.t).Sum("sluice_items_total", map[string]string{"source": s, "client": "checker"})
	}
	c0, s0 := source("cache"), source("store")
	readSeeded(func(format string, args ...any) { p.v.Fatalf(name+": "+format, args...) }, p.r, p.uris, 100)
	res := passResult{cache: source("cache") - c0, store: source("store") - s0}
	p.t.Logf("%s: %.0f items from the cache, %.0f from the store", name, res.cache, res.store)
	return res
}

// waitBreakerProbed waits until server's breaker is closed again, calling
// probe meanwhile so a half-open breaker gets the call that closes it.
func waitBreakerProbed(t *testing.T, v *verdict, r *replica, server string, probe func()) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if r.metrics(t).Sum("sluice_cache_breaker_state", map[string]string{"server": server}) == 0 {
			return
		}
		probe()
		time.Sleep(100 * time.Millisecond)
	}
	v.Fatalf("breaker of %s not closed within 30s of the server's return", server)
}

// waitBreaker waits until sluice reports server's breaker in state (0
// closed, 2 open).
func waitBreaker(t *testing.T, v *verdict, r *replica, server string, state float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if r.metrics(t).Sum("sluice_cache_breaker_state", map[string]string{"server": server}) == state {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	v.Fatalf("breaker of %s not in state %v within 30s", server, state)
}
