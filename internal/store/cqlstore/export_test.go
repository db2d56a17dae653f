package cqlstore

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"
)

// Acquire lets the external tests hold query slots.
func (s *Store) Acquire(ctx context.Context) (release func(), err error) { return s.acquire(ctx) }

// Translate is the address the driver dials for a node advertising addr.
func (c Config) Translate(addr string) (string, error) {
	t, err := c.addressTranslator()
	if err != nil || t == nil {
		return addr, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, _ := strconv.Atoi(port)
	ip, p := t.Translate(net.ParseIP(host), p)
	return net.JoinHostPort(ip.String(), strconv.Itoa(p)), nil
}

// Heal reports a query's outcome to the healer, as every query does.
func (s *Store) Heal(err error) { s.heal(err) }

// StuckFor pretends queries have failed for lack of a connection for d.
func (s *Store) StuckFor(d time.Duration) {
	s.healer.stuckSince.Store(time.Now().Add(-d).UnixNano())
}

// ForgetLastReopen lets the next stuck query try a reopen at once.
func (s *Store) ForgetLastReopen() {
	s.healer.mu.Lock()
	defer s.healer.mu.Unlock()
	s.healer.lastTry = time.Time{}
}

// FailReopens makes every later attempt to open fresh sessions fail, as
// it does while the cluster is unreachable.
func (s *Store) FailReopens() {
	s.healer.mu.Lock()
	defer s.healer.mu.Unlock()
	s.healer.open = func() (*sessionPair, error) { return nil, errors.New("cluster unreachable") }
}

// StuckAfter is how long queries may fail before the sessions are replaced.
func (c Config) StuckAfter() time.Duration { return c.stuckAfter() }

// WaitReopen waits for a reopen under way to finish.
func (s *Store) WaitReopen() {
	s.healer.mu.Lock()
	defer s.healer.mu.Unlock()
}

// HoldReopens makes every later attempt to open fresh sessions wait for
// release first, as a connect to a slow cluster does.
func (s *Store) HoldReopens(release <-chan struct{}) {
	s.healer.mu.Lock()
	defer s.healer.mu.Unlock()
	open := s.healer.open
	s.healer.open = func() (*sessionPair, error) {
		<-release
		return open()
	}
}
