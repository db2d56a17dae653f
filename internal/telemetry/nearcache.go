package telemetry

import (
	"context"

	"github.com/sluice-dev/sluice/internal/nearcache"
	"go.opentelemetry.io/otel/metric"
)

// ObserveNearCache exports the near cache's figures: hits and misses
// (reads answered from process memory, and reads passed on to memcached),
// entries evicted for the byte cap and dropped at the end of their TTL,
// and the bytes held against the cap. A near cache that is off reports
// zeros.
func (t *Telemetry) ObserveNearCache(stats func() nearcache.Stats) error {
	m := t.meter
	counters := map[string]func(nearcache.Stats) int64{
		"sluice.near_cache.hits":      func(s nearcache.Stats) int64 { return int64(s.Hits) },
		"sluice.near_cache.misses":    func(s nearcache.Stats) int64 { return int64(s.Misses) },
		"sluice.near_cache.evictions": func(s nearcache.Stats) int64 { return int64(s.Evictions) },
		"sluice.near_cache.expired":   func(s nearcache.Stats) int64 { return int64(s.Expired) },
	}
	gauges := map[string]func(nearcache.Stats) int64{
		"sluice.near_cache.bytes":     func(s nearcache.Stats) int64 { return int64(s.Bytes) },
		"sluice.near_cache.max_bytes": func(s nearcache.Stats) int64 { return int64(s.MaxBytes) },
	}
	insts, obs, err := observables(m, counters, gauges)
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		for inst, f := range obs {
			o.ObserveInt64(inst.(metric.Int64Observable), f(s))
		}
		return nil
	}, insts...)
	return err
}
