package posts

import (
	"context"
	"sync"

	"github.com/sluice-dev/sluice/internal/store"
)

// Batch reads shared between requests. Concurrent requests that miss the
// same URI (a hot record whose cache entry just expired or was
// invalidated) would each read it from the store; over a store read in
// batches, a request instead leads one batch read of the URIs no other
// request is reading, and waits for the reads already under way for the
// rest. The rules are the single-URI path's (load): a waiter reads the
// URI again on its own if the shared read began before a write of it
// that was acknowledged before the waiter began, or if the leader gave up
// (its context ended) while the waiter still has time.

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

// loadShared reads uris (distinct) from br, sharing reads with concurrent
// callers, and returns their results in order; failed counts the URIs
// whose read failed.
func (s *Service) loadShared(ctx context.Context, br store.BatchReader, uris []string) ([]Result, int, error) {
	out := make([]Result, len(uris))
	lead, joined, again := s.joinFlights(uris)
	if err := s.leadFlights(ctx, br, uris, lead, out); err != nil {
		return nil, len(lead), err
	}
	for i, f := range joined {
		if f == nil {
			continue
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, len(uris) - len(lead), ctx.Err()
		}
		s.coalesced.Add(1)
		switch {
		case f.err != nil && isContextErr(f.err) && ctx.Err() == nil:
			again = append(again, i)
		case f.err != nil:
			return nil, 1, f.err
		default:
			out[i] = f.res
		}
	}
	return s.readAgain(ctx, br, uris, again, out)
}

// joinFlights starts a flight for each URI no one is reading (lead, their
// positions) and returns, by position, the flights already under way that
// the others join (nil where this caller does not join one), and the
// positions of URIs whose flight began before a write this caller must
// see (alone: it reads them itself).
func (s *Service) joinFlights(uris []string) (lead []int, joined []*flight, alone []int) {
	joined = make([]*flight, len(uris))
	s.flights.mu.Lock()
	defer s.flights.mu.Unlock()
	if s.flights.m == nil {
		s.flights.m = make(map[string]*flight)
	}
	for i, uri := range uris {
		writes := s.slotOf(uri).writes.Load()
		switch f, ok := s.flights.m[uri]; {
		case !ok:
			s.flights.m[uri] = &flight{done: make(chan struct{}), writes: writes}
			lead = append(lead, i)
		case f.writes == writes:
			joined[i] = f
		default:
			alone = append(alone, i)
		}
	}
	return lead, joined, alone
}

// leadFlights reads the URIs at positions lead in one batch read, answers
// their flights (whatever the outcome, so no waiter is left waiting) and
// fills out.
func (s *Service) leadFlights(ctx context.Context, br store.BatchReader, uris []string, lead []int, out []Result) error {
	if len(lead) == 0 {
		return nil
	}
	mine := make([]string, len(lead))
	for k, i := range lead {
		mine[k] = uris[i]
	}
	res, _, err := loadBatch(ctx, br, mine)
	s.flights.mu.Lock()
	led := make([]*flight, len(lead))
	for k, uri := range mine {
		led[k] = s.flights.m[uri]
		delete(s.flights.m, uri)
	}
	s.flights.mu.Unlock()
	for k, f := range led {
		if err != nil {
			f.err = err
		} else {
			f.res = res[k]
			out[lead[k]] = res[k]
		}
		close(f.done)
	}
	return err
}

// readAgain reads the URIs at positions again with a batch read of this
// caller's own, for the reasons at the top of this file.
func (s *Service) readAgain(ctx context.Context, br store.BatchReader, uris []string, again []int, out []Result) ([]Result, int, error) {
	if len(again) == 0 {
		return out, 0, nil
	}
	some := make([]string, len(again))
	for k, i := range again {
		some[k] = uris[i]
	}
	res, failed, err := loadBatch(ctx, br, some)
	if err != nil {
		return nil, failed, err
	}
	for k, i := range again {
		out[i] = res[k]
	}
	return out, 0, nil
}
