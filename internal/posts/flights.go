package posts

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/sluice-dev/sluice/internal/store"
)

// Batch reads shared between requests. Concurrent requests that miss the
// same URI (a hot record whose cache entry just expired or was
// invalidated) would each read it from the store; over a store read in
// batches, a request instead leads one batch read of the URIs no other
// request is reading, and waits for the reads already under way for the
// rest. The rules are the single-URI path's (load): a request does not
// join a read that began before a write of the URI acknowledged before
// the request began, and a waiter reads a URI again on its own, once, if
// the shared read failed (the leader gave up, or a part of its batch
// without this waiter's URIs failed) while the waiter still has time.

// flights are the URIs some request is reading from the store now.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

// flight is one URI's shared store read.
type flight struct {
	done   chan struct{} // closed when res and err are set
	res    Result
	err    error
	writes uint64 // the URI's write count when the read began
}

// errLeaderPanicked answers the waiters of a batch read that panicked.
var errLeaderPanicked = errors.New("the shared store read panicked")

// loadShared reads uris (distinct) from br, sharing reads with concurrent
// callers, and returns their results in order; failed counts the URIs
// whose read failed.
func (s *Service) loadShared(ctx context.Context, br store.BatchReader, uris []string) ([]Result, int, error) {
	out := make([]Result, len(uris))
	own, joined := s.joinFlights(uris)
	if failed, err := s.readOwn(ctx, br, uris, own, out); err != nil {
		return nil, failed, err
	}
	var again []int // joined reads that failed, read again on our own
	for i, f := range joined {
		if f == nil {
			continue
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
		s.coalesced.Add(1)
		switch {
		case f.err == nil:
			out[i] = f.res
		case ctx.Err() != nil:
			return nil, 0, ctx.Err()
		default:
			again = append(again, i)
		}
	}
	failed, err := s.readOwn(ctx, br, uris, ownRead{alone: again}, out)
	if err != nil {
		return nil, failed, err
	}
	return out, 0, nil
}

// ownRead is what one caller reads itself: the URIs it leads flights for
// and the ones it reads alone, by position.
type ownRead struct {
	lead, alone []int
}

// joinFlights starts a flight for each URI no one is reading (own.lead)
// and returns, by position, the flights already under way that the
// others join (nil where the caller does not join one). A URI whose
// flight began before a write the caller must see is read alone
// (own.alone).
func (s *Service) joinFlights(uris []string) (own ownRead, joined []*flight) {
	joined = make([]*flight, len(uris))
	s.flights.mu.Lock()
	defer s.flights.mu.Unlock()
	for i, uri := range uris {
		writes := s.slotOf(uri).writes.Load()
		switch f, ok := s.flights.m[uri]; {
		case !ok:
			s.flights.m[uri] = &flight{done: make(chan struct{}), writes: writes}
			own.lead = append(own.lead, i)
		case f.writes == writes:
			joined[i] = f
		default:
			own.alone = append(own.alone, i)
		}
	}
	return own, joined
}

// readOwn reads the caller's own URIs in one batch read, fills out and
// answers the flights it leads, whatever the outcome (a panic included),
// so no waiter is left waiting.
func (s *Service) readOwn(ctx context.Context, br store.BatchReader, uris []string, own ownRead, out []Result) (failed int, err error) {
	at := slices.Concat(own.lead, own.alone)
	if len(at) == 0 {
		return 0, nil
	}
	some := make([]string, len(at))
	for k, i := range at {
		some[k] = uris[i]
	}
	res := []Result(nil)
	err = errLeaderPanicked
	defer func() { s.land(uris, own.lead, res, err) }()
	res, failed, err = loadBatch(ctx, br, some)
	if err != nil {
		return failed, err
	}
	for k, i := range at {
		out[i] = res[k]
	}
	return 0, nil
}

// land answers the flights at positions lead with res (in the same order)
// or err, and forgets them.
func (s *Service) land(uris []string, lead []int, res []Result, err error) {
	if len(lead) == 0 {
		return
	}
	s.flights.mu.Lock()
	led := make([]*flight, len(lead))
	for k, i := range lead {
		led[k] = s.flights.m[uris[i]]
		delete(s.flights.m, uris[i])
	}
	s.flights.mu.Unlock()
	for k, f := range led {
		if err != nil {
			f.err = fmt.Errorf("posts: shared store read: %w", err)
		} else {
			f.res = res[k]
		}
		close(f.done)
	}
}
