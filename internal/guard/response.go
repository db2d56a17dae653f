package guard

import (
	"context"
	"sync/atomic"

	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// sizedResponse is a response whose wire size is reserved in the
// response ledger; codec marshals it into buffers that give the bytes
// back when the transport frees them, after writing them out. It holds
// either a message or wire parts: a joined answer's, or the one part of
// a message carried verbatim.
type sizedResponse struct {
	msg   proto.Message // nil for wire parts
	parts [][]byte      // the wire form in parts, in order: the transport reads them, never writes or pools them
	// recycle is the pooled answer buffer (answerbuf.go) that the one
	// part is, which goes back to the pool once written; nil for none.
	recycle *[]byte
	size    int // proto.Size or the parts' total, as reserved; it also fills the message's size cache
	res     *membudget.Reservation
	conn    *connAnswers // the connection it is written to; nil if untracked
}

// joinedAnswer is an answer served in pieces (pieces.go, split.go), kept
// as its pieces' wire forms in request order. The response is one
// repeated field, so the parts written one after the other are the wire
// form of the whole answer: codec hands them to the transport as they
// are, and a 20,000-record answer is neither copied into one buffer nor
// marshalled a second time.
type joinedAnswer struct {
	parts [][]byte
	size  int
	// res, when set, already holds size bytes in the response ledger,
	// reserved as the parts finished (a split batch's, serveSplit);
	// holdResponse then takes it over instead of reserving again.
	res *membudget.Reservation
}

// joinWire is the whole answer built from the pieces' wire forms.
func joinWire(parts [][]byte) *joinedAnswer {
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	return &joinedAnswer{parts: parts, size: size}
}

// holdResponse reserves resp's wire size before it is marshalled, or
// refuses it: the records are read but will not be queued for a wire
// that is not draining. resp must not change after this call: the sizes
// computed here are the ones codec writes.
func (s *Server) holdResponse(ctx context.Context, fullMethod, client string, resp any, err error) (any, error) {
	if err != nil || resp == nil {
		return resp, err
	}
	var out *sizedResponse
	switch r := resp.(type) {
	case *joinedAnswer:
		out = &sizedResponse{parts: r.parts, size: r.size, res: r.res}
	case proto.Message:
		if wire, ok := verbatim(r); ok {
			slot, _ := ctx.Value(answerSlotKey{}).(*answerSlot)
			out = &sizedResponse{parts: [][]byte{wire}, size: len(wire), recycle: slot.recycles(wire)}
			break
		}
		out = &sizedResponse{msg: r, size: proto.Size(r)}
	default:
		return resp, err
	}
	if out.res == nil {
		res, refusal := s.mem.responses.Reserve(client, membudget.Bytes(out.size))
		if refusal != nil {
			return nil, s.mem.refuse(shortName(fullMethod), beforeAnswer, refusal)
		}
		out.res = res
	}
	out.conn = s.answersOf(ctx)
	out.conn.hold(out.res)
	uncompressed(ctx)
	return out, nil
}

// verbatim returns m's wire form without marshalling it when m is carried
// entirely in its unknown fields, no known field set: the read path
// splices cached encodings into its answers that way (package rpc), and
// marshalling such a message only copies those bytes into a new buffer.
// The transport is handed them as they are: it reads them, and a
// verbatim part, like a joined answer's, is never put in a pool.
func verbatim(m proto.Message) ([]byte, bool) {
	r := m.ProtoReflect()
	wire := r.GetUnknown()
	if len(wire) == 0 {
		return nil, false
	}
	known := false
	r.Range(func(protoreflect.FieldDescriptor, protoreflect.Value) bool {
		known = true
		return false
	})
	return wire, !known
}

// uncompressed has the answer written as it was marshalled, whatever
// encoding the request came in (gRPC answers a gzipped request gzipped
// by default): a compressed answer goes out from gRPC's own buffers and
// the marshalled ones are freed at once, so the response ledger could
// not hold its bytes until they are written.
func uncompressed(ctx context.Context) {
	st, ok := grpc.ServerTransportStreamFromContext(ctx).(interface{ SendCompress() string })
	if !ok {
		return
	}
	if c := st.SendCompress(); c != "" && c != encoding.Identity {
		_ = grpc.SetSendCompressor(ctx, encoding.Identity)
	}
}

// marshalSized writes r into buffers whose last Free gives r's
// reservation back: a message is marshalled into one pooled buffer (its
// sizes were computed when it was reserved, so the marshal reuses them);
// wire parts go out as they are, a pooled answer buffer back to its pool
// once written.
func marshalSized(r *sizedResponse) (mem.BufferSlice, error) {
	if r.recycle != nil {
		pool := &answerPool{shared: &answerBuffers, res: r.res, conn: r.conn}
		pool.left.Store(1)
		return mem.BufferSlice{mem.NewBuffer(r.recycle, pool)}, nil
	}
	if r.msg == nil {
		return partsBuffers(r.parts, r.res, r.conn), nil
	}
	pool := &answerPool{shared: mem.DefaultBufferPool(), res: r.res, conn: r.conn}
	pool.left.Store(1)
	buf := pool.shared.Get(r.size)
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], r.msg)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = out
	if mem.IsBelowBufferPoolingThreshold(cap(out)) {
		// mem.NewBuffer does not pool (and so never frees) small
		// buffers; their bytes are too few to hold back.
		r.conn.release(r.res)
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// partsBuffers hands parts to the transport without copying them. res
// (nil for none) goes back when the transport has freed every part large
// enough to be tracked (mem.NewBuffer neither pools nor frees small
// ones; their bytes are too few to hold back).
func partsBuffers(parts [][]byte, res *membudget.Reservation, conn *connAnswers) mem.BufferSlice {
	out := make(mem.BufferSlice, 0, len(parts))
	pool := &answerPool{res: res, conn: conn}
	for i, part := range parts {
		parts[i] = nil // the transport owns it now
		if len(part) == 0 {
			continue
		}
		if !mem.IsBelowBufferPoolingThreshold(cap(part)) {
			pool.left.Add(1)
		}
		out = append(out, mem.NewBuffer(&part, pool))
	}
	if pool.left.Load() == 0 {
		conn.release(res)
	}
	return out
}

// answerPool is the pool of one answer's buffers. A marshalled message's
// buffer goes back to the shared pool; a joined answer's parts (the
// pieces' own marshal buffers) are left to the collector. The answer's
// reservation goes back when the last tracked buffer is freed.
type answerPool struct {
	shared mem.BufferPool // nil for a joined answer's parts
	left   atomic.Int64   // tracked buffers not yet freed
	res    *membudget.Reservation
	conn   *connAnswers
}

func (p *answerPool) Get(length int) *[]byte {
	if p.shared != nil {
		return p.shared.Get(length)
	}
	b := make([]byte, length)
	return &b
}

func (p *answerPool) Put(buf *[]byte) {
	if p.shared != nil {
		p.shared.Put(buf)
	}
	if p.left.Add(-1) == 0 {
		p.conn.release(p.res)
	}
}
