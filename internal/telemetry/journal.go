package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-dev/sluice/internal/journal"
)

// ObserveJournal exports the invalidation journal follower's lag and
// the bound it is held to (journal.max_lag, which the lag is alerted
// against), tombstones, replays and distrusted servers, and the journal's
// size where the store can count it (size returns false otherwise).
func (t *Telemetry) ObserveJournal(stats func() journal.Stats, size func() (int64, bool), maxLag time.Duration) error {
	m := t.meter
	lag, err := m.Float64ObservableGauge("sluice.journal.lag", metric.WithUnit("s"),
		metric.WithDescription("How far behind now the journal follower's last successful poll read; other writers' changes reach this replica's memcached view within it."))
	if err != nil {
		return err
	}
	bound, err := m.Float64ObservableGauge("sluice.journal.max_lag", metric.WithUnit("s"),
		metric.WithDescription("The bound the follower's lag is held to (journal.max_lag): it polls every quarter of it."))
	if err != nil {
		return err
	}
	applied, err := m.Int64ObservableCounter("sluice.journal.tombstones",
		metric.WithDescription("Keys the journal follower invalidated, by source: follow (tombstones for other writers' changes), retry (tombstones a memcached failure made this process miss, written again) or replay (keys changed since a memcached server was distrusted as a whole, dropped there: deleted unless they hold a tombstone)."))
	if err != nil {
		return err
	}
	own, err := m.Int64ObservableCounter("sluice.journal.own_changes",
		metric.WithDescription("This process's own journal entries, skipped by the follower (the write path tombstoned them)."))
	if err != nil {
		return err
	}
	readErrs, err := m.Int64ObservableCounter("sluice.journal.read_errors",
		metric.WithDescription("Journal reads that failed; the lag grows while they do."))
	if err != nil {
		return err
	}
	replays, err := m.Int64ObservableCounter("sluice.journal.replays",
		metric.WithDescription("Journal replays onto failed memcached servers, by result: trusted (the server is read again), failed (it stays distrusted), truncated (began at the journal's retention)."))
	if err != nil {
		return err
	}
	suspects, err := m.Int64ObservableGauge("sluice.cache.distrusted_servers",
		metric.WithDescription("Memcached servers read as misses until a journal replay catches them up."))
	if err != nil {
		return err
	}
	entries, err := m.Int64ObservableGauge("sluice.journal.entries",
		metric.WithDescription("Entries the store's invalidation journal holds now (embedded store only)."))
	if err != nil {
		return err
	}
	follow, replay, retry := metric.WithAttributes(sourceAttr("follow")), metric.WithAttributes(sourceAttr("replay")), metric.WithAttributes(sourceAttr("retry"))
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveFloat64(lag, s.Lag.Seconds())
		o.ObserveFloat64(bound, maxLag.Seconds())
		o.ObserveInt64(applied, s.Applied, follow)
		o.ObserveInt64(applied, s.ReplayedURIs, replay)
		o.ObserveInt64(applied, s.Retried, retry)
		o.ObserveInt64(own, s.Own)
		o.ObserveInt64(readErrs, s.ReadErrors)
		o.ObserveInt64(replays, s.Replays, metric.WithAttributes(resultAttr("trusted")))
		o.ObserveInt64(replays, s.ReplayFailures, metric.WithAttributes(resultAttr("failed")))
		o.ObserveInt64(replays, s.Truncated, metric.WithAttributes(resultAttr("truncated")))
		o.ObserveInt64(suspects, int64(s.Suspects))
		if n, ok := size(); ok {
			o.ObserveInt64(entries, n)
		}
		return nil
	}, lag, bound, applied, own, readErrs, replays, suspects, entries)
	return err
}

func sourceAttr(v string) attribute.KeyValue { return attribute.String("source", v) }
func resultAttr(v string) attribute.KeyValue { return attribute.String("result", v) }
