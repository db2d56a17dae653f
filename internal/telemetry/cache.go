package telemetry

import (
	"context"

	"github.com/sluice-dev/sluice/internal/cache"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// breakerStates gives the breaker_state gauge its values.
var breakerStates = map[string]int64{"closed": 0, "half-open": 1, "open": 2}

// ObserveCache exports the memcached pool's per-server figures: dials,
// open and in-use connections, waits, single-key reads gathered into
// one get, pipelined refill and tombstone writes, hits, misses, errors, calls skipped
// by the breaker, the breaker's state (0 closed, 1 half-open, 2 open) and
// how often it opened.
func (t *Telemetry) ObserveCache(stats func() []cache.ServerStats) error {
	m := t.meter
	counters := map[string]func(cache.ServerStats) int64{
		"sluice.memcached.dials":            func(s cache.ServerStats) int64 { return s.Dials },
		"sluice.memcached.waits":            func(s cache.ServerStats) int64 { return s.Waits },
		"sluice.memcached.gathered_reads":   func(s cache.ServerStats) int64 { return s.Gathered },
		"sluice.memcached.refill_writes":    func(s cache.ServerStats) int64 { return s.RefillWrites },
		"sluice.memcached.tombstone_writes": func(s cache.ServerStats) int64 { return s.TombstoneWrites },
		"sluice.cache.hits":                 func(s cache.ServerStats) int64 { return s.Hits },
		"sluice.cache.misses":               func(s cache.ServerStats) int64 { return s.Misses },
		"sluice.cache.errors":               func(s cache.ServerStats) int64 { return s.Errors },
		"sluice.cache.skipped":              func(s cache.ServerStats) int64 { return s.Skipped },
		"sluice.cache.breaker_opens":        func(s cache.ServerStats) int64 { return s.BreakerOpens },
		"sluice.cache.distrusted":           func(s cache.ServerStats) int64 { return s.Distrusted },
	}
	gauges := map[string]func(cache.ServerStats) int64{
		"sluice.memcached.connections.open":   func(s cache.ServerStats) int64 { return s.OpenConns },
		"sluice.memcached.connections.in_use": func(s cache.ServerStats) int64 { return s.InUse },
		"sluice.cache.breaker_state":          func(s cache.ServerStats) int64 { return breakerStates[s.BreakerState] },
		"sluice.cache.owed_tombstones":        func(s cache.ServerStats) int64 { return s.OwedTombstones },
	}
	insts, obs, err := observables(m, counters, gauges)
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, s := range stats() {
			attrs := metric.WithAttributes(attribute.String("server", s.Addr))
			for inst, f := range obs {
				o.ObserveInt64(inst.(metric.Int64Observable), f(s), attrs)
			}
		}
		return nil
	}, insts...)
	return err
}

// ObserveCacheLimit exports sluice_memcached_connections_max{server}: the
// cap on connections (in use + idle) per memcached server
// (--memcached-max-conns), which the connections in use are alerted
// against.
func (t *Telemetry) ObserveCacheLimit(maxConns int, servers []string) error {
	_, err := t.meter.Int64ObservableGauge("sluice.memcached.connections.max",
		metric.WithDescription("The cap on connections (in use + idle) to each memcached server (--memcached-max-conns)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for _, s := range servers {
				o.Observe(int64(maxConns), metric.WithAttributes(attribute.String("server", s)))
			}
			return nil
		}))
	return err
}

// RefusedValues returns the counter sluice_cache_refused_values_total
// {collection} for posts.WithRefusedValues: cached values the read path
// refused (malformed, or naming another URI), each read from the store
// and its key tombstoned.
func (t *Telemetry) RefusedValues() (func(collection string, n int), error) {
	c, err := t.meter.Int64Counter("sluice.cache.refused_values",
		metric.WithDescription("Cached values the read path refused (malformed, or naming another URI), by collection: each was read from the store instead and its key tombstoned."))
	if err != nil {
		return nil, err
	}
	return func(collection string, n int) {
		c.Add(context.Background(), int64(n), metric.WithAttributes(attribute.String("collection", collection)))
	}, nil
}
