package telemetry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// SLO is what sluice promises its callers, as the config file's slo
// section states it. sluice exports the objectives as metrics
// (sluice_slo_objective_ratio, sluice_slo_latency_threshold_seconds) and
// counts the requests slower than the latency threshold
// (sluice_requests_slow_total), so the burn-rate alerts in
// deploy/prometheus read the objectives from the servers they watch
// instead of repeating them.
type SLO struct {
	// Availability is the share of requests that must not fail on
	// sluice's side: answered with Unavailable, DeadlineExceeded,
	// Internal, Unknown or DataLoss (shed, timed out, store down, a bug).
	// Refusals that are the caller's to fix — InvalidArgument,
	// ResourceExhausted, PermissionDenied — are not counted at all.
	Availability float64 `yaml:"availability"`
	// Latency is the share of successful requests that must finish
	// within a threshold.
	Latency LatencySLO `yaml:"latency"`
}

// LatencySLO is a latency objective: Objective of the successful
// requests finish within Threshold.
type LatencySLO struct {
	Objective float64       `yaml:"objective"`
	Threshold time.Duration `yaml:"threshold"`
}

// DefaultSLO is 99.9% available, and 99% of successful requests within
// 250 ms.
func DefaultSLO() SLO {
	return SLO{Availability: 0.999, Latency: LatencySLO{Objective: 0.99, Threshold: 250 * time.Millisecond}}
}

// Objective bounds: the fast-burn alert fires at 14.4 times the error
// budget, so a budget above 1/14.4 (an objective below about 0.931)
// could never page; an objective above five nines leaves a budget no
// one-hour window can measure.
const (
	minObjective = 0.95
	maxObjective = 0.99999
	maxThreshold = time.Minute
)

// Validate checks the objectives and the threshold, naming the key and
// its limits.
func (s SLO) Validate() error {
	var errs []error
	check := func(key string, v float64) {
		if !(v >= minObjective && v <= maxObjective) { // NaN too
			errs = append(errs, fmt.Errorf("slo: %s must be between %v and %v, got %v (below %v the fast-burn alert, at 14.4 times the error budget, could never fire)", key, minObjective, maxObjective, v, minObjective))
		}
	}
	check("availability", s.Availability)
	check("latency.objective", s.Latency.Objective)
	if s.Latency.Threshold <= 0 || s.Latency.Threshold > maxThreshold {
		errs = append(errs, fmt.Errorf("slo: latency.threshold must be positive and at most %v, got %v", maxThreshold, s.Latency.Threshold))
	}
	return errors.Join(errs...)
}

// Merge overlays the fields of o that are set on s.
func (s SLO) Merge(o SLO) SLO {
	if o.Availability != 0 {
		s.Availability = o.Availability
	}
	if o.Latency.Objective != 0 {
		s.Latency.Objective = o.Latency.Objective
	}
	if o.Latency.Threshold != 0 {
		s.Latency.Threshold = o.Latency.Threshold
	}
	return s
}

// ObserveSLO exports the objectives: sluice_slo_objective_ratio{slo} for
// "availability" and "latency", and sluice_slo_latency_threshold_seconds.
func (t *Telemetry) ObserveSLO(s SLO) error {
	m := t.meter
	objective, err := m.Float64ObservableGauge("sluice.slo.objective_ratio",
		metric.WithDescription("The objectives of the config file's slo section: the share of requests that must be available, or fast."))
	if err != nil {
		return err
	}
	threshold, err := m.Float64ObservableGauge("sluice.slo.latency_threshold", metric.WithUnit("s"),
		metric.WithDescription("The latency objective's threshold (slo.latency.threshold)."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveFloat64(objective, s.Availability, metric.WithAttributes(attribute.String("slo", "availability")))
		o.ObserveFloat64(objective, s.Latency.Objective, metric.WithAttributes(attribute.String("slo", "latency")))
		o.ObserveFloat64(threshold, s.Latency.Threshold.Seconds())
		return nil
	}, objective, threshold)
	return err
}
