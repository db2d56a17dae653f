package guard

import (
	"context"
	"sync"

	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/grpc/stats"
)

// connAnswers are one connection's answers whose bytes are reserved in
// the response ledger and not yet written. An answer's reservation
// normally goes back when the transport frees its buffers; but grpc-go's
// writer drops the answers still queued on a connection that closes
// without freeing them, so the end of the connection gives back whatever
// is still held here.
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

// connAnswersKey holds a connection's connAnswers in its context, and so
// in the context of every stream on it.
type connAnswersKey struct{}

// answersOf is the connAnswers of the connection ctx's stream is on, or
// nil outside a connection the server tagged.
func answersOf(ctx context.Context) *connAnswers {
	c, _ := ctx.Value(connAnswersKey{}).(*connAnswers)
	return c
}

// connEnds is the stats handler that gives each connection its
// connAnswers and ends them when the connection ends.
type connEnds struct{}

func (connEnds) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connAnswersKey{}, &connAnswers{held: map[*membudget.Reservation]struct{}{}})
}

func (connEnds) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnEnd); ok {
		if c := answersOf(ctx); c != nil {
			c.end()
		}
	}
}

func (connEnds) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (connEnds) HandleRPC(context.Context, stats.RPCStats) {}
