package cache

import (
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
				if err := c.Invalidate(ctx, uris); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(uris))/b.Elapsed().Seconds(), "tombstones/s")
		})
	}
}
