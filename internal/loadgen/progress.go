package loadgen

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/loadgen/recorder"
)

// printProgress writes one line per client every opts.ProgressEvery
// until ctx ends: requests sent, ok, dropped, errors by code, and the p99
// of the last second.
func printProgress(ctx context.Context, opts Options, plans []plan, recs []*recorder.Recorder, start time.Time) {
	every := opts.ProgressEvery
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	width := 0
	for _, p := range plans {
		width = max(width, len(p.client.Name))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for i, rec := range recs {
				fmt.Fprintln(opts.Progress, progressLine(now.Sub(start), plans[i].client.Name, width, rec.Progress(now)))
			}
		}
	}
}

func progressLine(elapsed time.Duration, name string, width int, p recorder.Progress) string {
	errs := "0"
	if len(p.Codes) > 0 {
		var parts []string
		for _, code := range slices.Sorted(maps.Keys(p.Codes)) {
			parts = append(parts, fmt.Sprintf("%s=%d", code, p.Codes[code]))
		}
		errs = strings.Join(parts, ",")
	}
	return fmt.Sprintf("[%5.1fs] %-*s sent %7d  ok %7d  dropped %d  errors %s  p99 %v",
		elapsed.Seconds(), width, name, p.Sent, p.OK, p.Dropped, errs, p.P99.Round(10*time.Microsecond))
}
