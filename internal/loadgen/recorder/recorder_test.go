package recorder

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// near reports whether got (ms) is within HdrHistogram's precision
// (0.1%, plus rounding) of the exact q-th percentile of sorted values,
// taken by the nearest-rank rule or one rank either side (rank rounding
// differs between definitions, and the tail is sparse).
func near(sorted []time.Duration, q, got float64) (bool, float64) {
	rank := int(math.Ceil(q/100*float64(len(sorted)))) - 1
	want := 0.0
	for r := max(rank-1, 0); r <= min(rank+1, len(sorted)-1); r++ {
		v := float64(sorted[r]) / float64(time.Millisecond)
		if r == rank {
			want = v
		}
		if math.Abs(got-v)/v <= 0.002 {
			return true, v
		}
	}
	return false, want
}

// Tests that the recorded percentiles match the exact percentiles of a
// known, skewed set of latencies within HdrHistogram's precision (3
// significant digits, so 0.1%), that counts, codes and the timeline
// add up, and that the first message of each error code is kept.
func TestPercentilesMatchKnownInputs(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	r := New("feed", "GetPostRecords", start)
	rng := rand.New(rand.NewPCG(7, 7))
	var lat []time.Duration
	for i := range 20_000 {
		// log-normal around 2 ms with a long tail up to seconds
		d := time.Duration(math.Exp(rng.NormFloat64()*1.2+math.Log(2e6))) + time.Microsecond
		lat = append(lat, d)
		code, message := "OK", ""
		if i%100 == 0 {
			code, message = "Unavailable", fmt.Sprintf("shed #%d", i)
		}
		r.Sent(0)
		r.Done(start.Add(time.Duration(i)*time.Millisecond/4), d, code, message, 10)
	}
	slices.Sort(lat)
	got := r.Result()
	for _, tc := range []struct {
		name string
		got  float64
		q    float64
	}{
		{"p50", got.Latency.P50, 50}, {"p90", got.Latency.P90, 90}, {"p99", got.Latency.P99, 99},
		{"p99.9", got.Latency.P999, 99.9}, {"max", got.Latency.Max, 100},
	} {
		if ok, want := near(lat, tc.q, tc.got); !ok {
			t.Errorf("%s = %.4f ms, exact %.4f ms (off by %.3f%%)", tc.name, tc.got, want, 100*math.Abs(tc.got-want)/want)
		}
	}
	if got.OK != 19_800 || got.Errors != 200 || got.Codes["Unavailable"] != 200 || got.Items != 198_000 {
		t.Errorf("ok %d errors %d codes %v items %d", got.OK, got.Errors, got.Codes, got.Items)
	}
	if want := map[string]string{"Unavailable": "shed #0"}; !maps.Equal(got.FirstErrors, want) {
		t.Errorf("first errors %v, want %v (the first message of each code)", got.FirstErrors, want)
	}
	// 20,000 completions, 4 per millisecond: 5 seconds of timeline.
	if len(got.Timeline) != 5 {
		t.Fatalf("timeline has %d seconds, want 5", len(got.Timeline))
	}
	var ok int64
	for _, p := range got.Timeline {
		ok += p.OK
	}
	if ok != got.OK {
		t.Errorf("timeline ok sums to %d, want %d", ok, got.OK)
	}
	if got.ItemsPerSec < 39_000 || got.ItemsPerSec > 41_000 {
		t.Errorf("items/s %.0f, want 198,000 over ~5 s", got.ItemsPerSec)
	}
}

// Tests that send lag over the late threshold is counted as late and
// that drops are counted apart from sends.
func TestLateAndDropped(t *testing.T) {
	r := New("c", "GetPostRecords", time.Now())
	r.Scheduled(time.Now())
	r.Sent(time.Millisecond)
	r.Scheduled(time.Now())
	r.Sent(50 * time.Millisecond)
	r.Scheduled(time.Now())
	r.Dropped()
	got := r.Result()
	if got.Scheduled != 3 || got.Sent != 2 || got.Late != 1 || got.Dropped != 1 {
		t.Errorf("got %+v", got)
	}
	if got.SendLag.Max < 49 || got.SendLag.Max > 51 {
		t.Errorf("send lag max %.2f ms, want 50", got.SendLag.Max)
	}
}

// Tests that items per second are over the client's own active time: a
// client whose first request is due 20 s into the run and whose last
// answer comes at 30 s answered its 10,000 items in 10 s, not in 30.
func TestItemsPerSecondFromTheClientsFirstSend(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	r := New("late", "GetPostRecords", start)
	for i := range 10 {
		at := start.Add(20*time.Second + time.Duration(i)*time.Second)
		r.Scheduled(at)
		r.Sent(0)
		r.Done(at.Add(time.Second), time.Second, "OK", "", 1000)
	}
	got := r.Result()
	if got.Items != 10_000 || math.Abs(got.ItemsPerSec-1000) > 1 {
		t.Errorf("items %d, items/s %.1f; want 10,000 items over the 10 s from the first scheduled send to the last answer, 1,000/s", got.Items, got.ItemsPerSec)
	}
	// The timeline stays on the run's clock, so clients line up.
	if len(got.Timeline) != 31 || got.Timeline[21].OK != 1 || got.Timeline[20].OK != 0 {
		t.Errorf("timeline of %d seconds: %+v", len(got.Timeline), got.Timeline)
	}
}
