package cqlstore

import (
	"sync"
	"testing"
	"time"
)

// Tests that write timestamps only go forward: each one later than the
// last, even when many are taken in one microsecond, from several
// goroutines, or after the wall clock has stepped back.
func TestWriteTimestampsOnlyGoForward(t *testing.T) {
	var s Store
	prev := s.timestamp()
	for range 10000 {
		ts := s.timestamp()
		if ts <= prev {
			t.Fatalf("timestamp %d after %d: not later", ts, prev)
		}
		prev = ts
	}

	const workers, each = 4, 2000
	got := make([][]int64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range each {
				got[w] = append(got[w], s.timestamp())
			}
		})
	}
	wg.Wait()
	seen := map[int64]bool{}
	for _, tss := range got {
		for _, ts := range tss {
			if seen[ts] {
				t.Fatalf("timestamp %d given twice: two writes of one record would tie", ts)
			}
			seen[ts] = true
		}
	}

	ahead := time.Now().Add(time.Hour).UnixMicro() // as if the clock then stepped back an hour
	s.lastTS.Store(ahead)
	if ts := s.timestamp(); ts <= ahead {
		t.Fatalf("timestamp %d after the clock stepped back, not later than the last given, %d", ts, ahead)
	}
}
