package telemetry

import "go.opentelemetry.io/otel/metric"

// observables creates one observable counter per entry of counters and
// one observable gauge per entry of gauges, each read from a snapshot S
// by its function. It returns the instruments, for RegisterCallback, and
// each instrument's function, for the callback to observe.
func observables[S any](m metric.Meter, counters, gauges map[string]func(S) int64) ([]metric.Observable, map[metric.Observable]func(S) int64, error) {
	var insts []metric.Observable
	obs := make(map[metric.Observable]func(S) int64, len(counters)+len(gauges))
	for name, f := range counters {
		c, err := m.Int64ObservableCounter(name)
		if err != nil {
			return nil, nil, err
		}
		insts, obs[c] = append(insts, c), f
	}
	for name, f := range gauges {
		g, err := m.Int64ObservableGauge(name)
		if err != nil {
			return nil, nil, err
		}
		insts, obs[g] = append(insts, g), f
	}
	return insts, obs, nil
}
