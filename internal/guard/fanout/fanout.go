// Package fanout runs the parallel parts of one request under the
// concurrency limit its guard policy set.
//
// It is the only way code below the guard may do work in parallel: the
// guard stores the method's per-request concurrency in the request context
// with WithLimit, and Each reads it back. A context without a limit runs
// work one item at a time, so forgetting the guard makes a handler slow,
// never unbounded. A fan-out runs its calls on at most its limit of
// goroutines, started with an errgroup.Group, each taking the next call
// when its last one returns; it does not retry or recover panics.
package fanout

import (
	"context"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
)

type limitKey struct{}

// WithLimit returns a context whose fan-outs run at most n tasks at once.
// A limit below one is treated as one.
func WithLimit(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, limitKey{}, max(n, 1))
}

// Limit reports the fan-out limit carried by ctx, or 1 when none is set.
func Limit(ctx context.Context) int {
	if n, ok := ctx.Value(limitKey{}).(int); ok {
		return n
	}
	return 1
}

// Each calls fn(ctx, i) for every i in [0, n), running at most Limit(ctx)
// calls at once, in order of i, on min(Limit(ctx), n) goroutines. The
// first error cancels the context passed to the other
// calls, stops scheduling new ones, and is returned once all running calls
// have finished. No call starts once the context has ended.
//
// When at most one call may run at a time (one task, or a limit of one)
// the calls run in order on the caller's goroutine: the same outcome, with
// no goroutine to start, grow and wait for. A single-record read then
// costs no goroutine at all below the handler's.
func Each(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	if n == 0 {
		return nil
	}
	if min(Limit(ctx), n) == 1 {
		return inOrder(ctx, n, fn)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(min(Limit(ctx), n))
	var next atomic.Int64
	for range min(Limit(ctx), n) {
		g.Go(func() error { return work(gctx, &next, n, fn) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// work is one of Each's goroutines: it takes the next index not yet
// taken and calls fn with it until none are left or ctx ends. Each's
// calls run on its few long-lived goroutines, not one goroutine per
// call, so a goroutine's stack grows once for all the calls it makes.
func work(ctx context.Context, next *atomic.Int64, n int, fn func(ctx context.Context, i int) error) error {
	for {
		// The context may have ended since the last call: a call
		// failed, or the caller gave up.
		if err := ctx.Err(); err != nil {
			return err
		}
		i := int(next.Add(1) - 1)
		if i >= n {
			return nil
		}
		if err := fn(ctx, i); err != nil {
			return err
		}
	}
}

// inOrder is Each with one call at a time: it stops at the first error,
// which it returns, and calls nothing once ctx has ended.
func inOrder(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	for i := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(ctx, i); err != nil {
			return err
		}
	}
	return ctx.Err()
}
