// Package membudget owns sluice's memory budget: the limit the Go runtime
// runs under (DefaultLimit, Apply), the IEC sizes that configure it
// (Bytes), and the ledgers that bound bytes in flight (Ledger).
//
// A Ledger is a process-wide byte cap with a share per caller. Work takes
// a Reservation for its worst case before the bytes exist — a request
// stream before its body is read, a response before it is queued for the
// wire — and gives it back when the bytes are gone. A reservation that
// does not fit is refused at once, never waited for: the caller is told,
// with how much is held and the cap, and retries later.
//
// The package measures nothing itself and knows nothing of gRPC; package
// guard decides what a worst case is and when bytes are gone.
package membudget

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Ledger counts reserved bytes against a total cap and a per-caller
// share of it. The zero value is not usable; use NewLedger.
type Ledger struct {
	name   string
	cap    int64
	share  int64
	mu     sync.Mutex
	held   int64
	caller map[string]int64 // only callers holding bytes

	refusedTotal  atomic.Int64
	refusedCaller atomic.Int64
	peak          atomic.Int64
}

// NewLedger returns a ledger of capacity bytes of which one caller may
// hold at most share; name says what it counts in refusals
// ("request bytes being received").
func NewLedger(name string, capacity, share Bytes) *Ledger {
	return &Ledger{name: name, cap: int64(capacity), share: int64(min(share, capacity)), caller: map[string]int64{}}
}

// Refusal says why a reservation did not fit.
type Refusal struct {
	Ledger string
	Caller string
	// PerCaller is true when the caller's share was full, false when the
	// whole ledger was.
	PerCaller bool
	Need      Bytes
	Held      Bytes // by the caller when PerCaller, else by everyone
	Cap       Bytes // the caller's share when PerCaller, else the total
}

func (r *Refusal) Error() string {
	if r.PerCaller {
		return fmt.Sprintf("%s: caller %q holds %v of its share of %v and this needs %v more", r.Ledger, r.Caller, r.Held, r.Cap, r.Need)
	}
	return fmt.Sprintf("%s: %v of the process-wide cap of %v are held and this needs %v more", r.Ledger, r.Held, r.Cap, r.Need)
}

// Reserve takes n bytes for caller, or refuses without waiting.
func (l *Ledger) Reserve(caller string, n Bytes) (*Reservation, *Refusal) {
	need := int64(n)
	l.mu.Lock()
	mine := l.caller[caller]
	switch {
	case mine+need > l.share:
		l.mu.Unlock()
		l.refusedCaller.Add(1)
		return nil, &Refusal{Ledger: l.name, Caller: caller, PerCaller: true, Need: n, Held: Bytes(mine), Cap: Bytes(l.share)}
	case l.held+need > l.cap:
		held := l.held
		l.mu.Unlock()
		l.refusedTotal.Add(1)
		return nil, &Refusal{Ledger: l.name, Caller: caller, Need: n, Held: Bytes(held), Cap: Bytes(l.cap)}
	}
	l.caller[caller] = mine + need
	l.held += need
	held := l.held
	l.mu.Unlock()
	for p := l.peak.Load(); held > p && !l.peak.CompareAndSwap(p, held); p = l.peak.Load() {
	}
	return &Reservation{l: l, caller: caller, n: need}, nil
}

func (l *Ledger) release(caller string, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held -= n
	if left := l.caller[caller] - n; left > 0 {
		l.caller[caller] = left
	} else {
		delete(l.caller, caller)
	}
}

// Stats is a ledger's state.
type Stats struct {
	Held, Peak, Cap, Share Bytes
	Callers                int   // callers holding bytes now
	RefusedTotal           int64 // refusals because the whole ledger was full
	RefusedCaller          int64 // refusals because the caller's share was full
}

// Stats reports the ledger's state.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	held, callers := l.held, len(l.caller)
	l.mu.Unlock()
	return Stats{Held: Bytes(held), Peak: Bytes(l.peak.Load()), Cap: Bytes(l.cap), Share: Bytes(l.share),
		Callers: callers, RefusedTotal: l.refusedTotal.Load(), RefusedCaller: l.refusedCaller.Load()}
}

// Held reports the bytes reserved for caller now.
func (l *Ledger) Held(caller string) Bytes {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Bytes(l.caller[caller])
}

// Reservation is bytes held in a Ledger until Release.
type Reservation struct {
	l      *Ledger
	caller string
	mu     sync.Mutex
	n      int64
	done   bool
}

// Release gives the bytes back; only the first call counts, so the
// early release (the bytes are gone) and the late one (the stream ended)
// may both run.
func (r *Reservation) Release() {
	if r == nil {
		return
	}
	r.mu.Lock()
	n, done := r.n, r.done
	r.done = true
	r.mu.Unlock()
	if !done {
		r.l.release(r.caller, n)
	}
}

// Grow adds n bytes to the reservation for its caller, or refuses
// without waiting, as Reserve does: an answer that grows as its parts
// finish is reserved part by part. Bytes grown after Release are given
// back at once.
func (r *Reservation) Grow(n Bytes) *Refusal {
	more, refusal := r.l.Reserve(r.caller, n)
	if refusal != nil {
		return refusal
	}
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		more.Release()
		return nil
	}
	r.n += int64(n)
	r.mu.Unlock()
	return nil
}

// Shrink gives back all but keep bytes of the reservation, which holds
// them until Release: the worst case is gone, what remains is known.
func (r *Reservation) Shrink(keep Bytes) {
	if r == nil {
		return
	}
	r.mu.Lock()
	give := r.n - int64(keep)
	if r.done || give <= 0 {
		r.mu.Unlock()
		return
	}
	r.n = int64(keep)
	r.mu.Unlock()
	r.l.release(r.caller, give)
}

// Size is the bytes reserved.
func (r *Reservation) Size() Bytes {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Bytes(r.n)
}
