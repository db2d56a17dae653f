package promtext

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

const page = `# TYPE reqs_total counter
reqs_total{client="feed",code="OK"} 3
reqs_total{client="feed",code="Unavailable"} 2
reqs_total{client="bulk",code="OK"} 5
# TYPE conns gauge
conns{server="a"} 7
# TYPE lat histogram
lat_bucket{le="1"} 4
lat_bucket{le="+Inf"} 6
lat_sum 3.5
lat_count 6
loose{state="TIME_WAIT"} 4
loose{state="ESTABLISHED"} 8
`

func TestScrapeAndSum(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(page)) }))
	defer srv.Close()
	fams, err := Scrape(context.Background(), nil, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		want  map[string]string
		sum   float64
		count int
	}{
		{"reqs_total", nil, 10, 3},
		{"reqs_total", map[string]string{"client": "feed"}, 5, 2},
		{"reqs_total", map[string]string{"client": "feed", "code": "OK"}, 3, 1},
		{"reqs_total", map[string]string{"client": "nobody"}, 0, 0},
		{"conns", nil, 7, 1},
		{"lat", nil, 6, 1},
		{"loose", nil, 12, 2},
		{"loose", map[string]string{"state": "TIME_WAIT"}, 4, 1},
		{"absent", nil, 0, 0},
	} {
		if got := fams.Sum(tc.name, tc.want); got != tc.sum {
			t.Errorf("Sum(%s, %v) = %v, want %v", tc.name, tc.want, got, tc.sum)
		}
		if got := fams.Count(tc.name, tc.want); got != tc.count {
			t.Errorf("Count(%s, %v) = %v, want %v", tc.name, tc.want, got, tc.count)
		}
	}
}

func TestScrapeRefusesErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusServiceUnavailable) }))
	defer srv.Close()
	if _, err := Scrape(context.Background(), nil, srv.URL); err == nil {
		t.Fatal("a 503 page was accepted")
	}
}
