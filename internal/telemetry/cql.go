package telemetry

import (
	"context"

	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ObserveCQL exports the CQL store's process-wide query slots (in flight,
// the cap, and how many queries had to wait for one), how often its
// sessions were replaced because the driver had no usable connection, and
// per node: query attempts it coordinated, failed attempts, and whether
// the driver holds it up.
func (t *Telemetry) ObserveCQL(stats func() cqlstore.Stats) error {
	m := t.meter
	inFlight, err := m.Int64ObservableGauge("sluice.cql.queries.in_flight",
		metric.WithDescription("CQL queries holding one of the process-wide slots now."))
	if err != nil {
		return err
	}
	limit, err := m.Int64ObservableGauge("sluice.cql.queries.max_in_flight",
		metric.WithDescription("The process-wide cap on CQL queries in flight (--cql-max-inflight)."))
	if err != nil {
		return err
	}
	waits, err := m.Int64ObservableCounter("sluice.cql.slot_waits",
		metric.WithDescription("CQL queries that had to wait for a slot."))
	if err != nil {
		return err
	}
	reopened, err := m.Int64ObservableCounter("sluice.cql.sessions.reopened",
		metric.WithDescription("Times the CQL sessions were replaced after the driver stayed without a usable connection."))
	if err != nil {
		return err
	}
	hostQueries, err := m.Int64ObservableCounter("sluice.cql.host.queries",
		metric.WithDescription("CQL query attempts sent to each node (host: its address and native port)."))
	if err != nil {
		return err
	}
	hostErrors, err := m.Int64ObservableCounter("sluice.cql.host.errors",
		metric.WithDescription("CQL query attempts to each node that failed."))
	if err != nil {
		return err
	}
	hostUp, err := m.Int64ObservableGauge("sluice.cql.host.up",
		metric.WithDescription("1 while the driver session (read or write) holds the node up, 0 while it holds it down."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(inFlight, s.InFlight)
		o.ObserveInt64(limit, int64(s.MaxInflight))
		o.ObserveInt64(waits, s.Waits)
		o.ObserveInt64(reopened, s.Reopened)
		for _, h := range s.Hosts {
			at := metric.WithAttributes(attribute.String("host", h.Addr))
			o.ObserveInt64(hostQueries, h.Queries, at)
			o.ObserveInt64(hostErrors, h.Errors, at)
			for session, up := range h.UpIn {
				o.ObserveInt64(hostUp, boolInt(up), metric.WithAttributes(attribute.String("host", h.Addr), attribute.String("session", cqlstore.Session(session).String())))
			}
		}
		return nil
	}, inFlight, limit, waits, reopened, hostQueries, hostErrors, hostUp)
	return err
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
