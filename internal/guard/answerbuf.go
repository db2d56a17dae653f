package guard

import (
	"context"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Answer buffers. A handler that writes its answer's wire form itself
// (package rpc splices cached encodings into the response as its unknown
// fields) asks for the buffer with AnswerBuffer. Under the guard the
// buffer comes from a pool and goes back to it once the transport has
// written the answer: a batch's answer is tens of KiB, and a fresh buffer
// of that size on every call is a large allocation whose pages the
// kernel must fault in first, measured at a tenth of the read path's CPU.
//
// A buffer is recycled only when the answer is exactly its bytes (the
// response carried verbatim, see verbatim); a buffer the handler grew
// past its capacity, kept, or answered some other way is left to the
// collector, so recycling can never hand out bytes still in use.

// Sizes of the pooled answer buffers: powers of two from 4 KiB to 1 MiB.
// Smaller answers are cheap to allocate; larger ones are rare.
const (
	minAnswerTier = 12
	maxAnswerTier = 20
)

// answerBuffers is the process's pool of answer buffers. Its buffers are
// not cleared between uses: an answer's handler writes every byte the
// transport sends.
var answerBuffers answerTiers

// answerTiers is a mem.BufferPool of buffers of 2^minAnswerTier to
// 2^maxAnswerTier bytes.
type answerTiers [maxAnswerTier - minAnswerTier + 1]sync.Pool

// Get returns a buffer of length n from the smallest tier that holds n.
// n must be at most 2^maxAnswerTier.
func (t *answerTiers) Get(n int) *[]byte {
	tier := max(bits.Len(uint(n-1)), minAnswerTier)
	if b, ok := t[tier-minAnswerTier].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<tier)
	return &b
}

// Put takes back a buffer Get returned; one of another capacity is left
// to the collector.
func (t *answerTiers) Put(b *[]byte) {
	c := cap(*b)
	tier := bits.Len(uint(c)) - 1
	if c != 1<<tier || tier < minAnswerTier || tier > maxAnswerTier {
		return
	}
	t[tier-minAnswerTier].Put(b)
}

// answerSlot is the one pooled buffer a guarded call may answer from.
type answerSlot struct {
	taken atomic.Bool
	buf   *[]byte // set by the one AnswerBuffer call that took the slot
}

type answerSlotKey struct{}

// withAnswerSlot gives the call of ctx a slot for one pooled answer
// buffer.
func withAnswerSlot(ctx context.Context) (context.Context, *answerSlot) {
	slot := &answerSlot{}
	return context.WithValue(ctx, answerSlotKey{}, slot), slot
}

// AnswerBuffer returns an empty buffer with room for size bytes, for the
// wire form of the answer to the call of ctx. Under the guard, the first
// such buffer of a call comes from a pool and goes back to it after the
// transport has written the answer, if the answer is the buffer's bytes
// as they are; the caller must then not touch it once the handler has
// returned. Otherwise, and outside a guarded call, it is a plain
// allocation.
func AnswerBuffer(ctx context.Context, size int) []byte {
	slot, _ := ctx.Value(answerSlotKey{}).(*answerSlot)
	if slot == nil || size < 1<<minAnswerTier/2 || size > 1<<maxAnswerTier || !slot.taken.CompareAndSwap(false, true) {
		return make([]byte, 0, size)
	}
	slot.buf = answerBuffers.Get(size)
	return (*slot.buf)[:0]
}

// recycles returns the slot's pooled buffer if wire is its bytes, nil
// otherwise (no slot, no buffer taken, or wire is not in it).
func (slot *answerSlot) recycles(wire []byte) *[]byte {
	if slot == nil || slot.buf == nil || len(wire) == 0 {
		return nil
	}
	b := *slot.buf
	if cap(b) < len(wire) || &b[:1][0] != &wire[0] {
		return nil
	}
	*slot.buf = b[:len(wire)]
	return slot.buf
}
