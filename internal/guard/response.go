package guard

import (
	"runtime"
	"sync/atomic"

	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// sizedResponse is a response whose wire size is reserved in the
// response ledger; codec marshals it into buffers that give the bytes
// back when the transport is done with them (responsePool). It holds
// either a message or a joined answer's wire parts.
type sizedResponse struct {
	msg   proto.Message // nil for a joined answer
	parts [][]byte      // a joined answer's pieces, in order
	size  int           // proto.Size or the parts' total, as reserved; it also fills the message's size cache
	res   *membudget.Reservation
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
func (s *Server) holdResponse(fullMethod, client string, resp any, err error) (any, error) {
	if err != nil || resp == nil {
		return resp, err
	}
	var out *sizedResponse
	switch r := resp.(type) {
	case *joinedAnswer:
		out = &sizedResponse{parts: r.parts, size: r.size}
	case proto.Message:
		out = &sizedResponse{msg: r, size: proto.Size(r)}
	default:
		return resp, err
	}
	res, refusal := s.mem.responses.Reserve(client, membudget.Bytes(out.size))
	if refusal != nil {
		return nil, s.mem.refuse(shortName(fullMethod), refusal)
	}
	out.res = res
	return out, nil
}

// marshalSized writes r into buffers that give r's reservation back
// once the transport is done with them (see responsePool): a message is
// marshalled into one pooled buffer (its sizes were computed when it was
// reserved, so the marshal reuses them); a joined answer's parts go out
// as they are.
func marshalSized(r *sizedResponse) (mem.BufferSlice, error) {
	if r.msg == nil {
		return partsBuffers(r.parts, r.res), nil
	}
	buf := mem.DefaultBufferPool().Get(r.size)
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], r.msg)
	if err != nil {
		mem.DefaultBufferPool().Put(buf)
		r.res.Release()
		return nil, err
	}
	*buf = out
	return trackedBuffers([]*[]byte{buf}, mem.DefaultBufferPool(), r.res), nil
}

// partsBuffers hands parts to the transport without copying them; res
// (nil for none) is given back as trackedBuffers says.
func partsBuffers(parts [][]byte, res *membudget.Reservation) mem.BufferSlice {
	bufs := make([]*[]byte, 0, len(parts))
	for i, part := range parts {
		parts[i] = nil // the transport owns it now
		if len(part) > 0 {
			bufs = append(bufs, &part)
		}
	}
	return trackedBuffers(bufs, nil, res)
}

// trackedBuffers wraps one response's buffers for the transport under a
// responsePool that gives res back when the last of them is freed.
// mem.NewBuffer neither pools nor frees buffers under its pooling
// threshold, so those are not waited for (their bytes are too few to
// hold back), and with none left res goes back at once.
func trackedBuffers(bufs []*[]byte, reuse mem.BufferPool, res *membudget.Reservation) mem.BufferSlice {
	pool := newResponsePool(reuse, res)
	out := make(mem.BufferSlice, 0, len(bufs))
	for _, b := range bufs {
		if !mem.IsBelowBufferPoolingThreshold(cap(*b)) {
			pool.left.Add(1)
		}
	}
	for _, b := range bufs {
		out = append(out, mem.NewBuffer(b, pool))
	}
	if pool.left.Load() == 0 {
		res.Release()
	}
	return out
}

// responsePool is the pool of one response's buffers. It gives the
// response's reservation back when the transport frees the last of them:
// after writing them out, after copying them (gzip compresses into
// buffers of its own), or when the stream is reset. Buffers of a message
// go back to gRPC's pool; a joined answer's parts, the pieces' own
// marshal buffers, are dropped.
//
// When a connection closes with answers still queued, grpc-go's writer
// drops them without freeing them, so Put never comes: a cleanup run
// when the pool becomes unreachable, at the garbage collection after the
// transport let go of its buffers, gives the reservation back then.
// Release counts only its first call, so the two never both count.
type responsePool struct {
	reuse mem.BufferPool // nil: keep none
	left  atomic.Int64
	res   *membudget.Reservation
}

func newResponsePool(reuse mem.BufferPool, res *membudget.Reservation) *responsePool {
	p := &responsePool{reuse: reuse, res: res}
	if res != nil {
		runtime.AddCleanup(p, (*membudget.Reservation).Release, res)
	}
	return p
}

func (p *responsePool) Get(length int) *[]byte {
	if p.reuse != nil {
		return p.reuse.Get(length)
	}
	b := make([]byte, length)
	return &b
}

func (p *responsePool) Put(buf *[]byte) {
	if p.reuse != nil {
		p.reuse.Put(buf)
	}
	if p.left.Add(-1) == 0 {
		p.res.Release()
	}
}
