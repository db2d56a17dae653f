package cqlstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/cqlstore/cqltest"
)

// Tests that on a one-node cluster a read whose speculative attempt starts
// before the first attempt answers still gets the node's answer. gocql's
// speculative attempt shares the first attempt's host iterator; with the
// only node taken it found the iterator empty and failed the read with
// "no hosts available in the pool" while the first attempt was still
// under way. A delay of a microsecond makes the speculative attempt start
// on nearly every read.
func TestSpeculativeAttemptOnOneNodeKeepsTheAnswer(t *testing.T) {
	cfg := cqltest.Keyspace(t, "sluice_test_speculation")
	cfg.SpeculativeDelay = time.Microsecond
	obs := &cqltest.Observer{}
	cfg.QueryObserver = obs
	s := mustOpen(t, cfg)
	defer s.Close()
	ctx := testContext(t)
	const workers, reads = 8, 50
	var mu sync.Mutex
	var failed []error
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range reads {
				uri := fmt.Sprintf("at://did:plc:x/app.bsky.feed.post/3kspec%d-%d", w, i)
				if _, err := s.Get(ctx, uri); !errors.Is(err, store.ErrNotFound) {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if _, attempts := obs.Peak(); attempts <= workers*reads {
		t.Errorf("%d attempts for %d reads: the speculative attempts did not run, so this test shows nothing", attempts, workers*reads)
	}
	// The losing attempt of each pair ends cancelled: the node did
	// nothing wrong, and its error count (and the node-errors alert) must
	// not say otherwise.
	for _, h := range s.Stats().Hosts {
		if h.Errors != 0 {
			t.Errorf("node %s: %d failed attempts counted, want 0: the reads all succeeded", h.Addr, h.Errors)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d reads failed on a one-node cluster with speculation on, e.g. %v; want every read answered not found",
			len(failed), workers*reads, failed[0])
	}
}
