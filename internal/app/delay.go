package app

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// delayedStore adds a fixed latency to every read, so that the embedded
// store can rehearse a remote one (Scylla answers in milliseconds, bbolt
// in microseconds) in load and overload tests. The wait ends early when
// the caller's context does: a read never gets more than the request's
// remaining budget.
type delayedStore struct {
	store.Store
	delay time.Duration
}

func (s delayedStore) Get(ctx context.Context, uri string) (store.Record, error) {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return store.Record{}, fmt.Errorf("store: read %s: %w", uri, ctx.Err())
	}
	return s.Store.Get(ctx, uri)
}
