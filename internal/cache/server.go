package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/semaphore"
)

// errCallerGone marks a call abandoned because the caller's context ended
// before a connection was free. It is the caller's doing, not the
// server's, so the breaker ignores it.
var errCallerGone = errors.New("cache: caller gave up waiting for a connection")

// errItemRefused marks items memcached refused to store: too large for
// its item size limit, or no memory left to store them. memcached
// answered, so it is up: the breaker counts the call as a success. The
// caller still sees the error (an item not written is not written: a
// refused tombstone leaves its key owed), and the server's error count
// rises.
var errItemRefused = errors.New("memcached refused to store the item")

// refusedItem marks err as errItemRefused when it is gomemcache's report
// of a store command answered with memcached's refusal of the item
// (`unexpected response line from "add": "SERVER_ERROR object too large
// for cache…"`). Any other SERVER_ERROR, on a get or from a proxy whose
// backend failed, is left a failure.
func refusedItem(err error) error {
	if err != nil && strings.Contains(err.Error(), `unexpected response line from "`) && refusal(err.Error()) {
		return fmt.Errorf("%w: %w", errItemRefused, err)
	}
	return err
}

// refusal reports whether a SERVER_ERROR answer is memcached refusing an
// item it could not keep, rather than failing.
func refusal(answer string) bool {
	return strings.Contains(answer, "SERVER_ERROR object too large") || strings.Contains(answer, "SERVER_ERROR out of memory storing object")
}

// errOpenedWhileWaiting marks a call the breaker let in while it was
// closed, which then waited for a connection while the breaker opened.
// It is not made: a burst of such calls would otherwise each dial a dead
// server after the breaker had decided to stop (a dial storm the fault
// tests caught: ~30 dials/s to a black-holed server with the breaker
// open).
var errOpenedWhileWaiting = errors.New("cache: breaker opened while the call waited for a connection")

// server is one memcached server: its client, the semaphore that caps the
// client's connections, the refill pipeline with its own share of the
// cap, its breaker and its counters.
type server struct {
	addr    string
	client  *memcache.Client
	sem     *semaphore.Weighted
	size    int64
	refills *refills // nil when the cap is too small to share (refillConnsFor)
	breaker *gobreaker.CircuitBreaker[struct{}]
	closed  atomic.Bool
	dialer  net.Dialer
	log     *slog.Logger

	dials, closes, inUse          atomic.Int64
	hits, misses, errors, skipped atomic.Int64
	waits, waitExpired, gathered  atomic.Int64
	breakerOpens, refillWrites    atomic.Int64
	tombstoneWrites               atomic.Int64
	distrusted                    atomic.Int64
	distrust                      *distrust // nil without WithDistrust
	singles                       *gather
}

func newServer(addr string, cfg Config, log *slog.Logger) *server {
	refillConns := refillConnsFor(cfg.MaxConnsPerServer)
	clientConns := cfg.MaxConnsPerServer - refillConns
	s := &server{
		log:    log.With("server", addr),
		addr:   addr,
		sem:    semaphore.NewWeighted(int64(clientConns)),
		size:   int64(clientConns),
		dialer: net.Dialer{Timeout: cfg.Timeout},
	}
	if refillConns > 0 {
		s.refills = newRefills(addr, refillConns, cfg.Timeout, s.dial)
	}
	s.client = memcache.New(addr)
	s.client.MaxIdleConns = clientConns
	s.client.Timeout = cfg.Timeout
	s.client.DialContext = s.dial
	s.breaker = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        addr,
		MaxRequests: 1,
		Timeout:     cfg.BreakerCoolDown,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= cfg.BreakerFailures
		},
		OnStateChange: s.onStateChange,
		IsSuccessful:  answered,
		IsExcluded:    isExcluded,
	})
	return s
}

// do runs op on the server's client under the breaker and the semaphore.
// It returns ErrUnavailable when the breaker or Close kept the call from
// being made.
func (s *server) do(ctx context.Context, op func(*memcache.Client) error) error {
	return s.guarded(ctx, s.sem, func() error { return refusedItem(op(s.client)) })
}

// addPipelined adds items in one pipelined exchange on one of the
// server's refill connections, as a refill (refill: only while the
// breaker is closed, within the adds' share of the refill semaphore).
// s.refills must not be nil.
func (s *server) addPipelined(ctx context.Context, items []*memcache.Item) error {
	err := s.refill(ctx, s.refills.sem, s.refills.adds, func() error {
		s.refillWrites.Add(1)
		return s.refills.add(ctx, items)
	})
	for _, it := range items {
		s.refilled(it.Key, err)
	}
	return err
}

// setPipelined sets items (tombstones) in one pipelined exchange on one
// of the server's refill connections, as addPipelined adds. It returns
// each item's error: nil for one stored, errItemRefused for one memcached
// refused, and the call's error for every item when the exchange failed
// or was not made (any of them may be stored or not). s.refills must not
// be nil.
func (s *server) setPipelined(ctx context.Context, items []*memcache.Item) []error {
	var refused refusals
	err := s.guarded(ctx, s.refills.sem, func() error {
		s.tombstoneWrites.Add(1)
		var err error
		if refused, err = s.refills.set(ctx, items); err != nil {
			return err
		}
		return refused.err("tombstone")
	})
	if err == nil || !errors.Is(err, errItemRefused) {
		return repeated(err, len(items))
	}
	errs := make([]error, len(items))
	for _, i := range refused.at {
		errs[i] = err
	}
	return errs
}

// dropPipelined drops the keys of items (each deleted unless it holds a
// tombstone) in one pipelined write on one of the server's refill
// connections, as addPipelined adds; a key not there is no failure.
// s.refills must not be nil.
func (s *server) dropPipelined(ctx context.Context, items []*memcache.Item) error {
	return s.guarded(ctx, s.refills.sem, func() error { return s.refills.drop(ctx, items) })
}

// guarded runs op, a call holding one connection slot of sem, under the
// breaker, and counts its outcome. It returns ErrUnavailable when the
// breaker or Close kept the call from being made.
func (s *server) guarded(ctx context.Context, sem *semaphore.Weighted, op func() error) error {
	if s.closed.Load() {
		s.skipped.Add(1)
		return fmt.Errorf("%w: %s: cache closed", ErrUnavailable, s.addr)
	}
	_, err := s.breaker.Execute(func() (struct{}, error) {
		if err := s.acquire(ctx, sem); err != nil {
			return struct{}{}, err
		}
		defer s.release(sem)
		if s.breaker.State() == gobreaker.StateOpen {
			return struct{}{}, errOpenedWhileWaiting
		}
		return struct{}{}, op()
	})
	return s.count(err)
}

// repeated is n copies of err.
func repeated(err error, n int) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// errRefillsWait marks a refill not sent because the server's breaker
// was not closed (refill). It says nothing of the server's health.
var errRefillsWait = errors.New("cache: refill skipped: the breaker is not closed")

// refill runs op, a refill, under the breaker and sem as guarded runs a
// call, but only while the breaker is closed (refillSkip). It checks
// before it waits, and again once the breaker has let it through, since
// the breaker may have opened and half-opened meanwhile: the refill then
// gives up unsent (errRefillsWait, which the breaker does not count, so
// a half-open breaker's probe slot goes back unused). When share is not
// nil (refills.adds) it first holds one slot of it, waiting no longer
// than ctx allows: adds never hold the refill connection kept for
// tombstones and deletes. Only the wait for a connection itself counts
// in Waits (a server short of connections), not the wait for the share.
func (s *server) refill(ctx context.Context, sem, share *semaphore.Weighted, op func() error) error {
	if err := s.refillSkip(); err != nil {
		return err
	}
	if share != nil {
		if err := share.Acquire(ctx, 1); err != nil {
			return s.count(fmt.Errorf("%w: %w", errCallerGone, err))
		}
		defer share.Release(1)
	}
	return s.guarded(ctx, sem, func() error {
		if s.breaker.State() != gobreaker.StateClosed {
			return errRefillsWait
		}
		return op()
	})
}

// refillSkip returns the error, counted as a skipped call, of a refill
// the server must not be sent now, while its breaker is open or half
// open; nil while it is closed. A refill is best effort, and one that is
// the half-open probe into a fault that still holds (a slow or
// black-holed server) fails with its outcome unknown, which leaves every
// key in it owed a tombstone, read as a miss until TombstoneTTL after the
// server is back. Reads, tombstones and a replay's deletes probe instead:
// a failed read owes nothing. Checking before the waits also spares a
// refill the wait for a slot that stalled adds may hold until their
// socket timeout, only to be refused after it.
func (s *server) refillSkip() error {
	if s.breaker.State() == gobreaker.StateClosed {
		return nil
	}
	return s.count(errRefillsWait)
}

// isOpen reports whether the server's breaker is open: calls to it are
// skipped until the cool-down ends.
func (s *server) isOpen() bool { return s.breaker.State() == gobreaker.StateOpen }

// count updates the counters for the outcome of one call.
func (s *server) count(err error) error {
	switch {
	case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests), errors.Is(err, errOpenedWhileWaiting), errors.Is(err, errRefillsWait):
		s.skipped.Add(1)
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, s.addr, err)
	case errors.Is(err, errCallerGone):
		s.waitExpired.Add(1)
	case errors.Is(err, errItemRefused):
		s.errors.Add(1)
		s.log.Warn("memcached refused to store items", "kind", "refused", "err", err)
	case err != nil && !isSuccessful(err):
		s.errors.Add(1)
		s.log.Error("memcached call failed", "kind", errorKind(err), "err", err)
	}
	return err
}

// acquire takes one connection slot of sem, waiting no longer than ctx
// allows.
func (s *server) acquire(ctx context.Context, sem *semaphore.Weighted) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", errCallerGone, err)
	}
	if !sem.TryAcquire(1) {
		s.waits.Add(1)
		if err := sem.Acquire(ctx, 1); err != nil {
			return fmt.Errorf("%w: %w", errCallerGone, err)
		}
	}
	s.inUse.Add(1)
	return nil
}

func (s *server) release(sem *semaphore.Weighted) {
	s.inUse.Add(-1)
	sem.Release(1)
}

// close stops new calls, waits for the running ones to return their
// connections, and closes the idle ones. Each call is bounded by the
// socket timeout, so the wait is too.
func (s *server) close() error {
	s.closed.Store(true)
	_ = s.sem.Acquire(context.Background(), s.size)
	if s.refills == nil {
		return s.client.Close()
	}
	_ = s.refills.sem.Acquire(context.Background(), s.refills.size)
	return errors.Join(s.client.Close(), s.refills.closeIdle())
}

// onStateChange drops idle connections when the breaker opens: after a
// run of failures they are likely dead, and each would otherwise cost the
// half-open probe one more failure and one more cool-down.
func (s *server) onStateChange(_ string, from, to gobreaker.State) {
	s.log.Warn("memcached breaker state changed", "kind", "breaker", "from", from.String(), "to", to.String())
	if to == gobreaker.StateOpen {
		s.breakerOpens.Add(1)
		_ = s.client.Close()
		if s.refills != nil {
			_ = s.refills.closeIdle()
		}
	}
}

// dial connects and counts the connection for Stats.
func (s *server) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	nc, err := s.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	s.dials.Add(1)
	return &countedConn{Conn: nc, closes: &s.closes}, nil
}

func (s *server) stats() ServerStats {
	return ServerStats{
		Addr:            s.addr,
		Dials:           s.dials.Load(),
		OpenConns:       s.dials.Load() - s.closes.Load(),
		InUse:           s.inUse.Load(),
		Hits:            s.hits.Load(),
		Misses:          s.misses.Load(),
		Errors:          s.errors.Load(),
		Skipped:         s.skipped.Load(),
		Waits:           s.waits.Load(),
		WaitExpired:     s.waitExpired.Load(),
		Gathered:        s.gathered.Load(),
		BreakerState:    s.breaker.State().String(),
		BreakerOpens:    s.breakerOpens.Load(),
		RefillWrites:    s.refillWrites.Load(),
		TombstoneWrites: s.tombstoneWrites.Load(),
		Suspect:         s.suspected(),
		OwedTombstones:  int64(s.owedLen()),
		Distrusted:      s.distrusted.Load(),
	}
}

// isSuccessful reports whether err is a normal answer from a healthy
// server: a miss or a refused ADD is not a failure.
func isSuccessful(err error) bool {
	return err == nil || errors.Is(err, memcache.ErrCacheMiss) ||
		errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrCASConflict)
}

// answered reports whether err says the server is healthy, for its
// breaker: a normal answer, or an item it refused to store.
func answered(err error) bool { return isSuccessful(err) || errors.Is(err, errItemRefused) }

// isExcluded reports errors that say nothing about the server's health:
// the caller leaving, a refill given up (errRefillsWait), or a key this
// package should never have built.
func isExcluded(err error) bool {
	return errors.Is(err, errCallerGone) || errors.Is(err, errOpenedWhileWaiting) || errors.Is(err, errRefillsWait) || errors.Is(err, memcache.ErrMalformedKey)
}

// countedConn counts its first Close, so OpenConns = dials − closes.
type countedConn struct {
	net.Conn
	closes *atomic.Int64
	once   atomic.Bool
}

func (c *countedConn) Close() error {
	if c.once.CompareAndSwap(false, true) {
		c.closes.Add(1)
	}
	return c.Conn.Close()
}

// SetLinger sets the TCP connection's SO_LINGER (see abort).
func (c *countedConn) SetLinger(sec int) error {
	if l, ok := c.Conn.(linger); ok {
		return l.SetLinger(sec)
	}
	return nil
}
