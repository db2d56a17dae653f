package clientpage

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/telemetry"
)

// fakeSource returns a fixed snapshot and remembers the window asked for.
type fakeSource struct{ window int }

func (f *fakeSource) Snapshot(window int) telemetry.ClientsSnapshot {
	f.window = window
	return telemetry.ClientsSnapshot{
		At: time.Unix(1_700_000_000, 0), WindowSeconds: window, Goroutines: 42, OSThreads: 9,
		SchedWait: &telemetry.SchedWait{Seconds: min(window, 12), P50Ms: 0.05, P99Ms: 2.875},
		Admission: &telemetry.AdmissionState{ItemLimit: 1234, MinItemLimit: 400, MaxItemLimit: 20000, ItemsInUse: 567, Waiting: 8},
		Clients: []telemetry.ClientRow{
			{Client: "bulk", ItemsPerSec: 1800, RequestsPerSec: 2, MeanBatch: 900, CacheHitRatio: 0.5, Requests: 20, Items: 18000,
				ServedItemsPerSec: 900, ServedShare: 0.75, RefusedItemsPerSec: 900, RefusedByReason: map[string]float64{"shape": 800, "quota": 100, "overload": 0}},
			{Client: "<feed>", ItemsPerSec: 200, RequestsPerSec: 20, MeanBatch: 10, CacheHitRatio: -1, Requests: 200, Items: 2000},
		},
	}
}

// Tests that one handler answers HTML or JSON by path and Accept header,
// escapes client names, embeds its script (no external assets) and
// refuses a bad window with the limit in the message.
func TestHandler(t *testing.T) {
	src := &fakeSource{}
	h := New(src)
	tests := []struct {
		name, path, accept string
		wantStatus         int
		wantType           string
		wantWindow         int
		wantBody           []string
	}{
		{"html", "/clients", "text/html", 200, "text/html; charset=utf-8", DefaultWindow,
			[]string{`<td class="client">bulk</td><td>900.0</td><td>75.0%</td><td>900.0</td><td>shape 800.0, quota 100.0</td><td>1800.0</td>`, `<td>–</td>`, `&lt;feed&gt;`, `50.0%`, `fetch("/clients.json"`, `goroutines <b id="goroutines">42</b>`, `Go scheduler wait p99 <b id="schedp99">2.88 ms</b>`,
				`item limit <b id="itemlimit">1234</b> (adaptive, 400–20000) · in flight <b id="itemsinuse">567</b> · waiting <b id="waiting">8</b>`}},
		{"html, a span other than the window", "/clients?window=30", "text/html", 200, "text/html; charset=utf-8", 30,
			[]string{`Go scheduler wait p99 <b id="schedp99">2.88 ms (over 12 s)</b>`}},
		{"json by path", "/clients.json", "", 200, "application/json", DefaultWindow, []string{`"client":"bulk"`, `"items_per_sec":1800`, `"sched_wait":{"seconds":10,"p50_ms":0.05,"p99_ms":2.875}`,
			`"item_limit":1234,"min_item_limit":400,"max_item_limit":20000,"items_in_use":567,"waiting":8`}},
		{"json by accept", "/clients?window=30", "application/json", 200, "application/json", 30, []string{`"window_seconds":30`}},
		{"bad window", "/clients?window=600", "", 400, "text/plain; charset=utf-8", 0, []string{`from 1 to 59`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src.window = 0
			req := httptest.NewRequest(http.MethodGet, tt.path, nil)
			req.Header.Set("Accept", tt.accept)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body := rec.Body.String()
			if rec.Code != tt.wantStatus || rec.Header().Get("Content-Type") != tt.wantType {
				t.Fatalf("status %d, type %q; want %d, %q\n%s", rec.Code, rec.Header().Get("Content-Type"), tt.wantStatus, tt.wantType, body)
			}
			if src.window != tt.wantWindow {
				t.Errorf("source asked for window %d, want %d", src.window, tt.wantWindow)
			}
			for _, w := range tt.wantBody {
				if !strings.Contains(body, w) {
					t.Errorf("body lacks %s", w)
				}
			}
			if tt.wantType == "application/json" {
				var snap telemetry.ClientsSnapshot
				if err := json.Unmarshal(rec.Body.Bytes(), &snap); err != nil || len(snap.Clients) != 2 {
					t.Errorf("JSON does not decode to two clients: %v", err)
				}
			}
			for _, external := range []string{`src="http`, `href="http`, `@import`, `url(http`} {
				if strings.Contains(body, external) {
					t.Errorf("page refers to an external asset: %s", external)
				}
			}
		})
	}
}
