// Package fanout is the one server-side errgroup site.
package fanout

import (
	"context"

	"golang.org/x/sync/errgroup"
)

func Limit(ctx context.Context) int { return 4 }

// Each is listed: its limit is the policy's.
func Each(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error { // want Each:"limit\\[1\\]"
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(min(Limit(ctx), n))
	for i := range n {
		g.Go(func() error { return fn(gctx, i) })
	}
	return g.Wait()
}

// Evasion: a second, unlisted errgroup in the fan-out package.
func Unlisted(ctx context.Context) {
	g, _ := errgroup.WithContext(ctx) // want `errgroup: errgroup.WithContext in internal/guard/fanout.Unlisted`
	g.SetLimit(2)                     // want `errgroup: errgroup.\(\*Group\).SetLimit`
}
