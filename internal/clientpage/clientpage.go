// Package clientpage serves the admin /clients page: who is calling
// sluice right now, for when no Grafana is around. One table row per
// client (items served, its share of all items served, items refused by
// reason, items requested, requests/s, batch size, p50/p99 latency,
// errors, rejections, cache hit ratio; sortable, the most items served
// first), a status line for the process (goroutines, threads, the Go
// scheduler's wait, admission), a line for its memory budget, and small
// live charts of the last minute, refreshed by the page itself from the
// JSON form of the same handler.
//
// Everything the page needs — template, script, styles — is embedded in
// the binary; it loads nothing from elsewhere. The package only renders:
// the figures come from a Source (telemetry.ClientStats in sluice), read
// at request time, and it keeps no state of its own.
package clientpage

import (
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/internal/telemetry"
)

// Source provides the figures the page shows; *telemetry.ClientStats is
// one.
type Source interface {
	Snapshot(windowSeconds int) telemetry.ClientsSnapshot
}

// DefaultWindow is the window, in seconds, rates and quantiles cover
// unless the request asks for another with ?window=N.
const DefaultWindow = 10

// MaxWindow is the longest window a request may ask for.
const MaxWindow = 59

//go:embed page.html
var pageHTML string

var page = template.Must(template.New("clients").Funcs(template.FuncMap{
	"f1":        func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
	"pct":       percent,
	"reasons":   reasons,
	"schedWait": schedWait,
	"mib":       func(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB" },
}).Parse(pageHTML))

// Handler serves the page as HTML, or as JSON when the path ends in .json
// or the request accepts application/json.
type Handler struct{ src Source }

// New returns a Handler reading from src.
func New(src Source) *Handler { return &Handler{src: src} }

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	window, err := windowParam(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	snap := h.src.Snapshot(window)
	w.Header().Set("Cache-Control", "no-store")
	if wantsJSON(r) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(snap)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := page.Execute(w, snap); err != nil {
		http.Error(w, "clients page: "+err.Error(), http.StatusInternalServerError)
	}
}

func wantsJSON(r *http.Request) bool {
	return strings.HasSuffix(r.URL.Path, ".json") || strings.Contains(r.Header.Get("Accept"), "application/json")
}

// windowParam reads ?window=N, 1 to MaxWindow seconds.
func windowParam(r *http.Request) (int, error) {
	v := r.URL.Query().Get("window")
	if v == "" {
		return DefaultWindow, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxWindow {
		return 0, fmt.Errorf("clients page: window=%q must be a whole number of seconds from 1 to %d", v, MaxWindow)
	}
	return n, nil
}

// reasons lists the reasons items were refused for, largest first, the
// way the page's script does: "shape 1000.0, quota 20.0", or "–".
func reasons(byReason map[string]float64) string {
	names := slices.Collect(maps.Keys(byReason))
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(byReason[b], byReason[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, n := range names {
		if byReason[n] > 0 {
			parts = append(parts, n+" "+strconv.FormatFloat(byReason[n], 'f', 1, 64))
		}
	}
	if len(parts) == 0 {
		return "–"
	}
	return strings.Join(parts, ", ")
}

// schedWait is the scheduler wait's p99 as the page's script writes it:
// "2.88 ms", with the span when it is not the window, or "–".
func schedWait(w *telemetry.SchedWait, window int) string {
	if w == nil {
		return "–"
	}
	s := strconv.FormatFloat(w.P99Ms, 'f', 2, 64) + " ms"
	if w.Seconds != window {
		s += " (over " + strconv.Itoa(w.Seconds) + " s)"
	}
	return s
}

func percent(ratio float64) string {
	if ratio < 0 {
		return "–"
	}
	return strconv.FormatFloat(ratio*100, 'f', 1, 64) + "%"
}
