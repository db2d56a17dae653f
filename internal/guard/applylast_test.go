package guard

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Tests that when many callers store and apply limits at once, the limit
// applied last is the one stored last, however their applications
// interleave (each application yields before it lands, so they reorder).
func TestApplyLastEndsWithTheLimitStoredLast(t *testing.T) {
	for trial := range 200 {
		var stored atomic.Int64
		var mu sync.Mutex
		applied := int64(0)
		apply := func(v int64) {
			runtime.Gosched()
			mu.Lock()
			applied = v
			mu.Unlock()
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 50 {
					applyLast(&stored, 1+rand.Int64N(1000), apply)
				}
			})
		}
		wg.Wait()
		if applied != stored.Load() {
			t.Fatalf("trial %d: %d applied last, %d stored last", trial, applied, stored.Load())
		}
	}
}
