package promtext

import (
	"math"
	"slices"
)

// Histogram is a histogram's cumulative counts at each bucket's upper
// bound, added up over series; the +Inf bucket is last.
type Histogram struct {
	Bounds []float64
	Counts []float64
}

// Histogram adds up family name's histogram series whose labels include
// every pair in want (nil: all series), bucket by bucket. A missing
// family is an empty histogram.
func (f Families) Histogram(name string, want map[string]string) Histogram {
	at := map[float64]float64{}
	for _, m := range f[name].GetMetric() {
		if m.Histogram == nil || !hasLabels(m, want) {
			continue
		}
		for _, b := range m.Histogram.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) {
				at[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		at[math.Inf(1)] += float64(m.Histogram.GetSampleCount())
	}
	var h Histogram
	for b := range at {
		h.Bounds = append(h.Bounds, b)
	}
	slices.Sort(h.Bounds)
	for _, b := range h.Bounds {
		h.Counts = append(h.Counts, at[b])
	}
	return h
}

// Count is how many samples h holds.
func (h Histogram) Count() float64 {
	if len(h.Counts) == 0 {
		return 0
	}
	return h.Counts[len(h.Counts)-1]
}

// Since returns what h counted that earlier, a scrape of the same
// series before it, had not: the histogram of what happened in between.
// A bucket earlier lacks counts from zero. ok is false when a bucket's
// count fell, as it does when the server restarted between the scrapes:
// the difference then means nothing.
func (h Histogram) Since(earlier Histogram) (between Histogram, ok bool) {
	out := Histogram{Bounds: h.Bounds, Counts: make([]float64, len(h.Counts))}
	for i, b := range h.Bounds {
		before := 0.0
		if j, found := slices.BinarySearch(earlier.Bounds, b); found {
			before = earlier.Counts[j]
		}
		if h.Counts[i] < before {
			return Histogram{}, false
		}
		out.Counts[i] = h.Counts[i] - before
	}
	return out, true
}

// Quantile returns the q-quantile (0 < q ≤ 1) as PromQL's
// histogram_quantile does: found in the bucket that holds it, by linear
// interpolation between the bucket's bounds (the first bucket starts at
// 0); in the +Inf bucket, the highest finite bound. NaN when h is
// empty or has no finite bound.
func (h Histogram) Quantile(q float64) float64 {
	total := h.Count()
	if total == 0 || len(h.Bounds) < 2 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, b := range h.Bounds {
		if h.Counts[i] >= rank {
			if math.IsInf(b, 1) {
				return lower
			}
			in := h.Counts[i] - below
			if in == 0 {
				return b
			}
			return lower + (b-lower)*(rank-below)/in
		}
		lower, below = b, h.Counts[i]
	}
	return lower
}
