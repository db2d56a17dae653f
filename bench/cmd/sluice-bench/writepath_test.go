package main

import "testing"

// Tests that quantile follows the nearest-rank rule: the q-quantile of n
// values is the ceil(q·n)-th smallest, so the p99 of 1..100 is 99 (not
// the maximum) and the p50 of 1..100 is 50.
func TestQuantileNearestRank(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[len(xs)-1-i] = float64(i + 1) // unsorted on purpose
	}
	for _, tc := range []struct {
		xs   []float64
		q    float64
		want float64
	}{
		{xs, 0.99, 99},
		{xs, 0.50, 50},
		{xs, 0.995, 100},
		{xs, 1, 100},
		{xs, 0.001, 1},
		{[]float64{3, 1}, 0.5, 1},
		{[]float64{7}, 0.99, 7},
		{nil, 0.5, 0},
	} {
		if got := quantile(tc.xs, tc.q); got != tc.want {
			t.Errorf("quantile(%d values, %v) = %v, want %v", len(tc.xs), tc.q, got, tc.want)
		}
	}
}
