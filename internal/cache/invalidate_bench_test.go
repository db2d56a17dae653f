package cache

import (
	"context"
	"testing"

	"github.com/sluice-dev/sluice/internal/testenv"
)

// BenchmarkInvalidate measures a 1,000-record write's tombstones on one
// memcached: pipelined, in writes of refillItemsPerWrite sets on the
// refill connections, against one set per call on the pool's other
// connections (the server's pipeline taken away), both at the fan-out of
// the default batch policy (50). make bench runs the two alternately and
// reports their ratio.
func BenchmarkInvalidate(b *testing.B) {
	benchmarkPerKey(b, "tombstones/s", 50, nil, func(ctx context.Context, c *Cache, _ string, uris []string) error {
		return c.Invalidate(ctx, uris)
	})
}

// BenchmarkDropOn measures a journal replay of 1,000 URIs, each held,
// onto one memcached the same way (pipelined: a meta get and a meta
// delete per key, in writes of refillItemsPerWrite; one by one: a get and
// a delete per key), at the journal follower's default parallelism (16);
// the keys are stored again, untimed, before each replay.
func BenchmarkDropOn(b *testing.B) {
	refill := func(ctx context.Context, c *Cache, uris []string) { c.Fill(ctx, selfValued(uris)) }
	benchmarkPerKey(b, "deletes/s", 16, refill, func(ctx context.Context, c *Cache, addr string, uris []string) error {
		return c.DropOn(ctx, addr, uris)
	})
}

// benchmarkPerKey runs op on 1,000 URIs with the pipeline and without,
// at fan-out fanOut, after prepare (untimed) when it is not nil,
// reporting keys/s in unit.
func benchmarkPerKey(b *testing.B, unit string, fanOut int, prepare func(ctx context.Context, c *Cache, uris []string), op func(ctx context.Context, c *Cache, addr string, uris []string) error) {
	addr := testenv.SharedMemcached(b)
	for _, variant := range []struct {
		name      string
		pipelined bool
	}{{"pipelined", true}, {"one-by-one", false}} {
		b.Run(variant.name, func(b *testing.B) {
			c := newCache(b, []string{addr}, nil)
			if !variant.pipelined {
				c.servers[0].refills = nil
			}
			ctx := testContext(b, fanOut)
			uris := uniqueURIs(b, 1000)
			for b.Loop() {
				if prepare != nil {
					b.StopTimer()
					prepare(ctx, c, uris)
					b.StartTimer()
				}
				if err := op(ctx, c, addr, uris); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(uris))/b.Elapsed().Seconds(), unit)
		})
	}
}
