package guard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"github.com/sluice-dev/sluice/internal/identity"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Oversized batches. A batch over its method's max_items is refused with
// InvalidArgument (OversizeRefuse), unless the method's policy names the
// caller with OversizeSplit: then the guard serves it in pieces of at
// most max_items and piece_items, each admitted on its own as batch work — the caller's
// budget charged, its fair-queuing flow, the process-wide item capacity,
// shed like any other batch — and joins the pieces' answers in request
// order. Only a client that has a budget of its own in the admission
// config may split (a caller without a name, or with a name the config
// does not list, is always refused), and never above its max_split_items.
//
// A piece refused for now is retried after the advised delay while the
// batch's timeout allows (servePiece).
//
// Memory: the request is decoded whole (max_split_items URIs, bounded by
// max_recv_msg_bytes too). At most splitConcurrency pieces are in the
// cache and store at once, each holding only its own fetches; each
// piece's answer is encoded as it finishes (its decoded records go at
// once) and its wire bytes are kept until the transport has written
// them, since a unary response is one message: the answer holds at most
// max_split_items records, once, in wire form. Those bytes are reserved
// in the response ledger piece by piece as each finishes, so the ledger
// counts them while the batch runs, and a caller over its share or a
// process out of answer memory stops the batch at the piece that would
// pass it (ResourceExhausted or Unavailable, with RetryInfo), not after
// every piece has been served.

// Oversize modes.
const (
	OversizeRefuse = "refuse"
	OversizeSplit  = "split"
)

// MaxSplitCeiling bounds max_split_items, whatever the config says.
const MaxSplitCeiling = 100_000

// splitConcurrency is how many pieces of one split batch are worked on
// at once.
const splitConcurrency = 4

// Oversize is what happens to one client's batches over max_items.
type Oversize struct {
	// Mode is OversizeRefuse (the default) or OversizeSplit.
	Mode string `yaml:"mode"`
	// MaxSplitItems is the largest batch split; larger ones are refused
	// as over the limit. Required with split.
	MaxSplitItems int `yaml:"max_split_items"`
	// Timeout bounds the whole split batch; 0 means the method's timeout.
	Timeout time.Duration `yaml:"timeout"`
}

// validate checks one client's oversize entry of a policy with maxItems.
func (o Oversize) validate(client string, maxItems int) error {
	switch {
	case client == "" || client == identity.Unknown:
		return fmt.Errorf("oversize: client %q: a caller without a name can never have its batches split", client)
	case o.Mode == "" || o.Mode == OversizeRefuse:
		return nil
	case o.Mode != OversizeSplit:
		return fmt.Errorf("oversize: client %q: mode must be %s or %s, got %q", client, OversizeRefuse, OversizeSplit, o.Mode)
	case o.MaxSplitItems <= maxItems || o.MaxSplitItems > MaxSplitCeiling:
		return fmt.Errorf("oversize: client %q: max_split_items must be above max_items %d and at most %d, got %d", client, maxItems, MaxSplitCeiling, o.MaxSplitItems)
	case o.Timeout < 0:
		return fmt.Errorf("oversize: client %q: timeout must not be negative, got %v", client, o.Timeout)
	}
	return nil
}

// splits reports whether o splits batches.
func (o Oversize) splits() bool { return o.Mode == OversizeSplit }

// validateOversize checks a method's oversize entries against its own
// policy and the admission config: a client that may split must have a
// budget of its own.
func (c Config) validateOversize(name string, p Policy) []error {
	var errs []error
	for _, client := range slices.Sorted(maps.Keys(p.Oversize)) {
		o := p.Oversize[client]
		if err := o.validate(client, p.MaxItems); err != nil {
			errs = append(errs, fmt.Errorf("guard: method %s: %w", name, err))
			continue
		}
		b, listed := c.Admission.Clients[client]
		switch {
		case !o.splits():
		case !listed:
			errs = append(errs, fmt.Errorf("guard: method %s: oversize: client %q may split only with a budget of its own under admission.clients", name, client))
		default:
			if err := pieceFits(client, b, min(p.MaxItems, c.PieceItems)); err != nil {
				errs = append(errs, fmt.Errorf("guard: method %s: %w", name, err))
			}
		}
	}
	return errs
}

// pieceFits reports why budget b of a client that may split can never
// admit a piece of piece items, or nil. Each piece is charged to the
// budget whole: a burst or an in-flight cap smaller than a piece would
// refuse every piece, for good.
func pieceFits(client string, b budget.Budget, piece int) error {
	switch {
	case b.Burst < piece:
		return fmt.Errorf("oversize: client %q may split only with a burst of at least one piece (%d items, the smaller of max_items and piece_items), got burst %d", client, piece, b.Burst)
	case b.MaxInflightItems < int64(piece):
		return fmt.Errorf("oversize: client %q may split only with max_inflight_items of at least one piece (%d items, the smaller of max_items and piece_items), got %d", client, piece, b.MaxInflightItems)
	}
	return nil
}

// splitBudgetErrors checks the budgets of a new admission config against
// the registered methods' oversize entries, as start-up does (pieceFits):
// a reload must not leave a client that may split unable to.
func (s *Server) splitBudgetErrors(cfg budget.Config) error {
	var errs []error
	for _, full := range slices.Sorted(maps.Keys(s.methods)) {
		m := s.methods[full]
		for _, client := range slices.Sorted(maps.Keys(m.policy.Oversize)) {
			b, listed := cfg.Clients[client]
			if !listed || !m.policy.Oversize[client].splits() {
				continue // a client dropped from the list is refused split (splitFor)
			}
			if err := pieceFits(client, b, min(m.policy.MaxItems, s.cfg.PieceItems)); err != nil {
				errs = append(errs, fmt.Errorf("guard: method %s: %w", methodName(full), err))
			}
		}
	}
	return errors.Join(errs...)
}

// splitFor returns the oversize entry under which client's batches over
// max_items are split, if any. A client dropped from the admission config
// while serving is refused again.
func (s *Server) splitFor(m *method, client string) (Oversize, bool) {
	o, ok := m.policy.Oversize[client]
	if !ok || !o.splits() {
		return Oversize{}, false
	}
	if _, listed := s.budgets.Config().Clients[client]; !listed {
		return Oversize{}, false
	}
	return o, true
}

// maxItemsFor is the largest batch client may send to m.
func (s *Server) maxItemsFor(m *method, client string) int {
	if o, ok := s.splitFor(m, client); ok {
		return o.MaxSplitItems
	}
	return m.policy.MaxItems
}

// checkSplittable refuses, at Register, a split policy on a method whose
// answer cannot be joined.
func checkSplittable(name string, p Policy, joins bool, out protoreflect.MessageDescriptor) error {
	for _, o := range p.Oversize {
		if o.splits() && !joins {
			return fmt.Errorf("guard: method %s: oversize split needs a request with a list of items and a response that is one list aligned with them (%s is not)", name, out.FullName())
		}
	}
	return nil
}

// joinable reports whether a batch of the method can be served in
// pieces: the request carries a list of items, and the response is one
// list aligned with it, so the pieces' answers concatenate into the
// whole. Writes answer a count, so they are never served in pieces (a
// partial write would be neither all nor nothing).
func joinable(in *itemField, out protoreflect.MessageDescriptor) bool {
	f := out.Fields()
	return in != nil && in.field.IsList() && f.Len() == 1 && f.Get(0).IsList()
}

// serveSplit answers an oversized batch piece by piece (see the top of
// this file). The first piece that fails fails the whole request.
func (s *Server) serveSplit(ctx context.Context, fullMethod, client string, m *method, o Oversize, req proto.Message, n int, handler grpc.UnaryHandler) (*joinedAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(o.Timeout, m.policy.Timeout))
	defer cancel()
	size := min(m.policy.MaxItems, s.cfg.PieceItems)
	parts := make([][]byte, (n+size-1)/size)
	held, refusal := s.mem.responses.Reserve(client, 0) // grows as the pieces finish
	if refusal != nil {
		return nil, s.mem.refuse(shortName(fullMethod), whileAnswering, refusal)
	}
	err := fanout.Each(fanout.WithLimit(ctx, splitConcurrency), len(parts), func(ctx context.Context, i int) error {
		lo, hi := i*size, min(n, (i+1)*size)
		resp, err := s.servePiece(ctx, fullMethod, client, m, m.items.slice(req, lo, hi), int64(hi-lo), handler)
		if err != nil {
			return err
		}
		if parts[i], err = pieceWire(shortName(fullMethod), resp, i, hi-lo); err != nil {
			return err
		}
		if refusal := held.Grow(membudget.Bytes(len(parts[i]))); refusal != nil {
			return s.mem.refuseAnswer(shortName(fullMethod), held.Size(), refusal)
		}
		return nil
	})
	if err != nil {
		held.Release()
		return nil, deadlineToStatus(ctx, err)
	}
	joined := joinWire(parts)
	joined.res = held
	return joined, nil
}

// servePiece admits and serves one piece as batch work. A piece refused
// for now — by the caller's budget (rate or in-flight items, not a burst
// it can never fit) or shed because interactive work was waiting (batch
// work is shed first) — waits the advised delay and tries again while
// the batch's deadline leaves time: the batch yields to interactive work
// and goes on when there is room, instead of failing whole for one piece.
func (s *Server) servePiece(ctx context.Context, fullMethod, client string, m *method, req proto.Message, cost int64, handler grpc.UnaryHandler) (proto.Message, error) {
	for {
		admitted, reason, err := s.admit(ctx, fullMethod, client, cost, true)
		if err != nil {
			wait, retry := retryDelay(err)
			deadline, _ := ctx.Deadline()
			if reason == ReasonDeadline {
				// The batch's own timeout left no time for this piece:
				// that is the server out of capacity, not the caller's
				// deadline.
				return nil, overloaded(shortName(fullMethod), fmt.Sprintf("a piece of %d items could not start within the split batch's timeout", cost), s.cfg.QueueInterval)
			}
			if (reason != ReasonQuota && reason != ReasonOverload) || !retry || time.Until(deadline) < wait+s.service.expect(fullMethod, cost) {
				return nil, err
			}
			if err := sleep(ctx, wait); err != nil {
				return nil, status.Errorf(codes.DeadlineExceeded, "%s: the deadline passed while waiting for budget", shortName(fullMethod))
			}
			continue
		}
		began := time.Now()
		resp, err := handler(fanout.WithLimit(ctx, m.policy.Concurrency), req)
		admitted.release()
		if err != nil {
			return nil, err
		}
		took := time.Since(began)
		s.service.observe(fullMethod, cost, took)
		s.observeCapacity(cost, took)
		return resp.(proto.Message), nil
	}
}

// retryDelay reads the RetryInfo of a refusal.
func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// slice returns a copy of req whose item list holds only items [lo, hi);
// its other fields are shared with req.
func (f *itemField) slice(req proto.Message, lo, hi int) proto.Message {
	src := req.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd != f.field {
			dst.Set(fd, v)
		}
		return true
	})
	from, to := src.Get(f.field).List(), dst.Mutable(f.field).List()
	for i := lo; i < hi; i++ {
		to.Append(from.Get(i))
	}
	return dst.Interface()
}

// errMisaligned reports a piece whose answer does not hold one element
// per item asked.
var errMisaligned = errors.New("guard: a piece's answer is not aligned with its items")

// pieceWire is a piece's answer in wire form, checked to hold one list
// element per item. The response is one repeated field (checkSplittable),
// so the wire forms of the pieces' answers, concatenated in order, are
// the wire form of the whole answer. Encoding each piece as it finishes
// lets its decoded records go at once (and keeps answers that handlers
// build from cached wire bytes as they are).
func pieceWire(name string, resp proto.Message, i, want int) ([]byte, error) {
	b, ok := verbatim(resp)
	if !ok {
		var err error
		if b, err = proto.Marshal(resp); err != nil {
			return nil, status.Errorf(codes.Internal, "%s: piece %d: %v", name, i, err)
		}
	}
	field := resp.ProtoReflect().Descriptor().Fields().Get(0).Number()
	if got := countField(b, field); got != want {
		return nil, status.Errorf(codes.Internal, "%s: %v: piece %d answered %d of %d", name, errMisaligned, i, got, want)
	}
	return b, nil
}

// countField counts the occurrences of field num in the wire bytes b.
func countField(b []byte, num protowire.Number) int {
	n := 0
	for len(b) > 0 {
		got, _, length := protowire.ConsumeField(b)
		if length < 0 {
			return -1
		}
		if got == num {
			n++
		}
		b = b[length:]
	}
	return n
}
