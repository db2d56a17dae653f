package guard

import (
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// sizedResponse is a response whose wire size is reserved in the
// response ledger; codec marshals it into a buffer that gives the bytes
// back when the transport frees it, after writing it out.
type sizedResponse struct {
	proto.Message
	size int // proto.Size, as reserved; it also fills the message's size cache
	res  *membudget.Reservation
}

// holdResponse reserves resp's wire size before it is marshalled, or
// refuses it: the records are read but will not be queued for a wire
// that is not draining. resp must not change after this call: the sizes
// computed here are the ones marshalSized writes.
func (s *Server) holdResponse(fullMethod, client string, resp any, err error) (any, error) {
	msg, ok := resp.(proto.Message)
	if err != nil || !ok || msg == nil {
		return resp, err
	}
	size := proto.Size(msg)
	res, refusal := s.mem.responses.Reserve(client, membudget.Bytes(size))
	if refusal != nil {
		return nil, s.mem.refuse(shortName(fullMethod), refusal)
	}
	return &sizedResponse{Message: msg, size: size, res: res}, nil
}

// marshalSized marshals r into one pooled buffer whose last Free gives
// r's reservation back. The message's sizes were computed when it was
// reserved, so the marshal reuses them.
func marshalSized(r *sizedResponse) (mem.BufferSlice, error) {
	pool := releasingPool{BufferPool: mem.DefaultBufferPool(), res: r.res}
	buf := pool.BufferPool.Get(r.size)
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], r.Message)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = out
	if mem.IsBelowBufferPoolingThreshold(cap(out)) {
		// mem.NewBuffer does not pool (and so never frees) small
		// buffers; their bytes are too few to hold back.
		r.res.Release()
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// releasingPool returns buffers to the pool and a reservation to its
// ledger.
type releasingPool struct {
	mem.BufferPool
	res *membudget.Reservation
}

func (p releasingPool) Put(buf *[]byte) {
	p.res.Release()
	p.BufferPool.Put(buf)
}
