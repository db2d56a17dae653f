package promtext

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
)

func scrapePage(t *testing.T, page string) Families {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(page)) }))
	defer srv.Close()
	fams, err := Scrape(context.Background(), nil, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

const latBefore = `# TYPE lat histogram
lat_bucket{client="feed",method="a",le="0.001"} 10
lat_bucket{client="feed",method="a",le="0.002"} 10
lat_bucket{client="feed",method="a",le="0.004"} 10
lat_bucket{client="feed",method="a",le="+Inf"} 10
lat_sum{client="feed",method="a"} 0.005
lat_count{client="feed",method="a"} 10
`

// Between the scrapes feed asked 100 more times over two methods: 50 in
// (0, 1 ms], 40 in (1, 2 ms], 8 in (2, 4 ms] and 2 above 4 ms; search
// (another client) 1,000 times, all slow.
const latAfter = `# TYPE lat histogram
lat_bucket{client="feed",method="a",le="0.001"} 40
lat_bucket{client="feed",method="a",le="0.002"} 60
lat_bucket{client="feed",method="a",le="0.004"} 66
lat_bucket{client="feed",method="a",le="+Inf"} 68
lat_sum{client="feed",method="a"} 0.1
lat_count{client="feed",method="a"} 68
lat_bucket{client="feed",method="b",le="0.001"} 20
lat_bucket{client="feed",method="b",le="0.002"} 40
lat_bucket{client="feed",method="b",le="0.004"} 42
lat_bucket{client="feed",method="b",le="+Inf"} 42
lat_sum{client="feed",method="b"} 0.05
lat_count{client="feed",method="b"} 42
lat_bucket{client="search",method="a",le="0.001"} 0
lat_bucket{client="search",method="a",le="0.002"} 0
lat_bucket{client="search",method="a",le="0.004"} 0
lat_bucket{client="search",method="a",le="+Inf"} 1000
lat_sum{client="search",method="a"} 10
lat_count{client="search",method="a"} 1000
`

func TestHistogramQuantileBetweenScrapes(t *testing.T) {
	feed := map[string]string{"client": "feed"}
	before, after := scrapePage(t, latBefore).Histogram("lat", feed), scrapePage(t, latAfter).Histogram("lat", feed)
	h, ok := after.Since(before)
	if !ok || h.Count() != 100 {
		t.Fatalf("count = %g, want the 100 requests between the scrapes", h.Count())
	}
	for _, tc := range []struct{ q, want float64 }{
		{0.25, 0.0005}, // 25 of the 50 in (0, 1 ms]
		{0.5, 0.001},   // the last of them
		{0.7, 0.0015},  // 20 of the 40 in (1, 2 ms]
		{0.94, 0.003},  // 4 of the 8 in (2, 4 ms]
		{0.99, 0.004},  // in +Inf: the highest finite bound
	} {
		if got := h.Quantile(tc.q); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("q%g = %g, want %g", tc.q, got, tc.want)
		}
	}
	if got := (Histogram{}).Quantile(0.5); !math.IsNaN(got) {
		t.Errorf("an empty histogram's median = %g, want NaN", got)
	}
	if got := (Histogram{Bounds: []float64{math.Inf(1)}, Counts: []float64{5}}).Quantile(0.5); !math.IsNaN(got) {
		t.Errorf("the median of a histogram with only +Inf = %g, want NaN", got)
	}
	// Scraped in the wrong order (or across a restart): counts fell.
	if _, ok := before.Since(after); ok {
		t.Error("a histogram whose counts fell reads as a difference")
	}
	if n := scrapePage(t, latAfter).Histogram("absent", nil).Count(); n != 0 {
		t.Errorf("a missing family counts %g", n)
	}
}
