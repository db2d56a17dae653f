// Package connlimit caps the connections a listener keeps open at once.
//
// A Listener accepts every connection the kernel hands it, so its backlog
// never fills with callers left hanging; a connection beyond the cap is
// closed at once and counted, and its caller sees the connection refused
// and backs off. Each connection holds read and write buffers and a
// transport whatever it sends, so the cap is part of the memory budget.
//
// The package does not speak HTTP/2 or gRPC and does not decide the cap;
// it counts.
package connlimit

import (
	"net"
	"sync"
	"sync/atomic"
)

// Listener wraps a net.Listener with a cap on open connections.
type Listener struct {
	net.Listener
	max      int64
	open     atomic.Int64
	accepted atomic.Int64
	refused  atomic.Int64
	peak     atomic.Int64
}

// New caps lis at max open connections.
func New(lis net.Listener, max int) *Listener {
	return &Listener{Listener: lis, max: int64(max)}
}

// Accept returns the next connection under the cap, closing those over it.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n := l.open.Add(1)
		if n > l.max {
			l.open.Add(-1)
			l.refused.Add(1)
			c.Close()
			continue
		}
		l.accepted.Add(1)
		for p := l.peak.Load(); n > p && !l.peak.CompareAndSwap(p, n); p = l.peak.Load() {
		}
		return &conn{Conn: c, l: l}, nil
	}
}

// Stats is a listener's state.
type Stats struct {
	Open, Peak, Max   int64
	Accepted, Refused int64
}

// Stats reports the listener's state.
func (l *Listener) Stats() Stats {
	return Stats{Open: l.open.Load(), Peak: l.peak.Load(), Max: l.max, Accepted: l.accepted.Load(), Refused: l.refused.Load()}
}

type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}
