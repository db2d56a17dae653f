package guard

import (
	"cmp"
	"context"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Batches in pieces. The items in flight are what the machine works on
// at once, so they decide how long every request waits for the CPU
// behind the others (Little's law: at a given throughput, the time in
// the process grows with the items in it). A 1,000-item batch admitted
// whole holds its 1,000 items in flight until its last item is answered,
// so the item limit could never go below the largest batch, and a small
// request admitted beside a few such batches waits behind tens of
// milliseconds of their work.
//
// So a read batch larger than piece_items is admitted in two steps. The
// whole batch is charged to the caller's budget and takes one request
// slot, as any request does (admitRequest); then it is served in pieces
// of piece_items, at most pieceConcurrency at once, each waiting for its
// own items in the caller's fair-queuing flow under the adaptive limit
// (admitItems). A small request arriving meanwhile waits for at most a
// piece's worth of work, not a batch's, and the limit can follow the
// machine down to a few pieces. The pieces' answers are joined in
// request order, as a split batch's are (split.go).
//
// Shedding happens at the first piece: the others wait until it is
// admitted, then queue as continuations (queue.Request.Continues), which
// go before their flow's new requests and are not shed for a standing
// queue, since shedding them would waste the work already done. One
// that still cannot start before the deadline leaves time fails the
// batch with Unavailable and RetryInfo.
//
// Only methods whose answer is one list aligned with the request are
// served in pieces (joinable); writes answer a count and are admitted
// whole.

// pieceConcurrency is how many pieces of one batch are worked on at once.
const pieceConcurrency = 2

// servePieces serves r, a batch larger than piece_items, in pieces (see
// the top of this file), reporting its outcome to the observer.
func (s *Server) servePieces(ctx context.Context, r Request, m *method, req proto.Message, batch bool, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, m.policy.Timeout)
	defer cancel()
	admitted, reason, err := s.admitRequest(ctx, r.Method, r.Client, int64(r.Items), batch)
	if err != nil {
		s.observer.Rejected(ctx, r, reason)
		return nil, err
	}
	resp, served, reason, err := s.pieces(ctx, r, m, req, batch, handler)
	if !served {
		// No piece reached the handler: refused before any work, if only
		// because the deadline ended before the first piece could wait;
		// the caller is not charged for it.
		admitted.refund()
		s.observer.Rejected(ctx, r, cmp.Or(reason, ReasonDeadline))
		return nil, err
	}
	defer admitted.release()
	out, err := s.holdResponse(ctx, r.Method, r.Client, resp, deadlineToStatus(ctx, err))
	s.observer.Finished(ctx, r, status.Code(err), time.Since(start))
	return out, err
}

// pieces admits and serves every piece of r. served reports whether any
// piece reached the handler; reason is why a piece was refused, if one
// was.
func (s *Server) pieces(ctx context.Context, r Request, m *method, req proto.Message, batch bool, handler grpc.UnaryHandler) (resp *joinedAnswer, served bool, reason string, err error) {
	size, n := s.cfg.PieceItems, r.Items
	parts := make([][]byte, (n+size-1)/size)
	var started atomic.Bool
	var began time.Time          // when the first piece was admitted
	var refusal atomic.Value     // string
	first := make(chan struct{}) // closed once the first piece is admitted
	err = fanout.Each(fanout.WithLimit(ctx, pieceConcurrency), len(parts), func(ctx context.Context, i int) error {
		if i > 0 {
			select {
			case <-first:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		lo, hi := i*size, min(n, (i+1)*size)
		admitted, why, err := s.admitItems(ctx, r.Method, r.Client, int64(hi-lo), int64(n-lo), batch, i > 0)
		if err != nil {
			refusal.CompareAndSwap(nil, why)
			return err
		}
		if i == 0 {
			began = time.Now()
			close(first)
		}
		started.Store(true)
		pieceBegan := time.Now()
		out, err := handler(fanout.WithLimit(ctx, m.policy.Concurrency), m.items.slice(req, lo, hi))
		admitted.release()
		if err != nil {
			return err
		}
		took := time.Since(pieceBegan)
		s.service.observe(r.Method, int64(hi-lo), took)
		s.observeCapacity(int64(hi-lo), took)
		parts[i], err = pieceWire(shortName(r.Method), out.(proto.Message), i, hi-lo)
		return err
	})
	why, _ := refusal.Load().(string)
	if err != nil {
		return nil, started.Load(), why, deadlineToStatus(ctx, err)
	}
	// The batch's service time runs from its first piece's admission:
	// the wait before it is left out, as it is from a whole request's, or
	// a queue would make batches look hopeless; the later pieces' waits
	// are part of serving in pieces, so they count.
	s.service.observe(r.Method, int64(n), time.Since(began))
	return joinWire(parts), true, "", nil
}
