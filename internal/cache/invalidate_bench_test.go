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
// the default batch policy. make bench runs the two alternately and
// reports their ratio.
func BenchmarkInvalidate(b *testing.B) {
	benchmarkPerKey(b, "tombstones/s", func(ctx context.Context, c *Cache, _ string, uris []string) error {
		return c.Invalidate(ctx, uris)
	})
}

// BenchmarkDropOn measures a journal replay of 1,000 URIs onto one
// memcached (deletes) the same way.
func BenchmarkDropOn(b *testing.B) {
	benchmarkPerKey(b, "deletes/s", func(ctx context.Context, c *Cache, addr string, uris []string) error {
		return c.DropOn(ctx, addr, uris)
	})
}

// benchmarkPerKey runs op on 1,000 URIs with the pipeline and without,
// reporting keys/s in unit.
func benchmarkPerKey(b *testing.B, unit string, op func(ctx context.Context, c *Cache, addr string, uris []string) error) {
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
			ctx := testContext(b, 50)
			uris := uniqueURIs(b, 1000)
			for b.Loop() {
				if err := op(ctx, c, addr, uris); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(uris))/b.Elapsed().Seconds(), unit)
		})
	}
}
