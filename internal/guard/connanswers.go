package guard

import (
	"context"
	"net"
	"net/netip"
	"sync"

	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/grpc/peer"
)

// connAnswers are one connection's answers whose bytes are reserved in
// the response ledger and not yet written. An answer's reservation
// normally goes back when the transport frees its buffers; but grpc-go's
// writer drops the answers still queued on a connection that closes
// without freeing them, so the end of the connection (answersListener)
// gives back whatever is still held here.
type connAnswers struct {
	mu    sync.Mutex
	held  map[*membudget.Reservation]struct{}
	ended bool
}

// hold records res as an answer queued on c. On a connection that has
// ended the answer cannot be queued (the transport refuses and frees
// it), so res goes back at once. A nil c (no connection known) tracks
// nothing.
func (c *connAnswers) hold(res *membudget.Reservation) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		res.Release()
		return
	}
	c.held[res] = struct{}{}
	c.mu.Unlock()
}

// release gives res back: its answer was written or will never be.
func (c *connAnswers) release(res *membudget.Reservation) {
	if c != nil {
		c.mu.Lock()
		delete(c.held, res)
		c.mu.Unlock()
	}
	res.Release()
}

// end gives back every answer still held: the connection is closed, and
// what was queued on it will not be written.
func (c *connAnswers) end() {
	c.mu.Lock()
	held := c.held
	c.held, c.ended = nil, true
	c.mu.Unlock()
	for res := range held {
		res.Release()
	}
}

// connKey names a TCP connection by its two ends, as the stream's peer
// (google.golang.org/grpc/peer) and the accepted net.Conn both give them.
type connKey struct{ remote, local netip.AddrPort }

func keyOf(remote, local net.Addr) (connKey, bool) {
	r, ok1 := remote.(*net.TCPAddr)
	l, ok2 := local.(*net.TCPAddr)
	if !ok1 || !ok2 {
		return connKey{}, false
	}
	return connKey{r.AddrPort(), l.AddrPort()}, true
}

// answersListener gives each accepted connection its connAnswers and
// ends them when the transport closes the connection. It tracks TCP
// connections only; answers on others go untracked, as before.
type answersListener struct {
	net.Listener
	conns *sync.Map // connKey → *connAnswers
}

func (l answersListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	key, ok := keyOf(c.RemoteAddr(), c.LocalAddr())
	if !ok {
		return c, nil
	}
	answers := &connAnswers{held: map[*membudget.Reservation]struct{}{}}
	l.conns.Store(key, answers)
	return &answersConn{Conn: c, key: key, answers: answers, conns: l.conns}, nil
}

type answersConn struct {
	net.Conn
	key     connKey
	answers *connAnswers
	conns   *sync.Map
}

// Close ends the connection's answers: the transport has closed it, and
// what was queued on it will not be written.
func (c *answersConn) Close() error {
	err := c.Conn.Close()
	c.conns.CompareAndDelete(c.key, c.answers)
	c.answers.end()
	return err
}

// answersOf is the connAnswers of the connection ctx's stream is on, or
// nil if it is not one the server tracks.
func (s *Server) answersOf(ctx context.Context) *connAnswers {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	key, ok := keyOf(p.Addr, p.LocalAddr)
	if !ok {
		return nil
	}
	c, _ := s.mem.answers.Load(key)
	answers, _ := c.(*connAnswers)
	return answers
}
