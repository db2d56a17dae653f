package cache

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"golang.org/x/sync/semaphore"
)

// refills sends one server's refills, and its batches of tombstones, as
// pipelined writes: every item's add (add KEY FLAGS TTL LEN), or set,
// goes out in one write, and the answers, one line per item, are read
// back together, so a refill or an invalidation of n keys costs one
// round trip and a pair of system calls on each side instead of n.
//
// The classic add, not the meta protocol's ms in add mode: when memcached
// cannot store a value (too large, or out of memory), ms drops whatever
// the key held, whatever the mode, and that can be a tombstone, which a
// later refill of an older read would then replace. A failed classic add
// leaves the key as it was.
//
// It holds its own connections, a share of the server's cap taken away
// from the gomemcache client's (refillConnsFor), each used by one refill
// at a time under its own semaphore and kept idle afterwards: the
// server's connections, in use plus idle, stay under MaxConnsPerServer.
//
// Refills (adds) are best effort, tombstones and a replay's deletes are
// what keeps the cache from answering old records; so adds may hold all
// but one of the connections (adds, taken before sem), and a storm of
// cold reads can never make an invalidation wait behind more than the
// exchanges already on the wire.
type refills struct {
	sem     *semaphore.Weighted
	size    int64
	adds    *semaphore.Weighted // addShare(size) slots: what adds may hold of sem
	timeout time.Duration
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	addr    string

	mu   sync.Mutex
	idle []*refillConn
}

type refillConn struct {
	nc net.Conn
	rw *bufio.ReadWriter
}

// refillConnsFor is how many of a server's cap connections carry refills:
// a sixteenth, none below 16 (refills then go one key per call through
// the gomemcache client, as other writes do).
func refillConnsFor(maxConns int) int { return maxConns / 16 }

// refillItemsPerWrite is the most items one pipelined write carries; a
// larger refill is split, and its parts run side by side under the
// request's fan-out limit.
const refillItemsPerWrite = 500

// refillWriteBuffer is the write buffer of a refill connection: a
// pipeline of 50 records of about 500 bytes goes out in one system call.
const refillWriteBuffer = 64 << 10

func newRefills(addr string, conns int, timeout time.Duration, dial func(context.Context, string, string) (net.Conn, error)) *refills {
	return &refills{
		sem: semaphore.NewWeighted(int64(conns)), size: int64(conns),
		adds:    semaphore.NewWeighted(addShare(int64(conns))),
		timeout: timeout, dial: dial, addr: addr,
	}
}

// addShare is how many of conns refill connections adds may hold at
// once: all but one, which is kept for tombstones and deletes (all of
// them when there is only one).
func addShare(conns int64) int64 { return max(conns-1, 1) }

// errRefillProtocol marks an answer the pipeline could not read as a
// storage command's: the connection is closed, not reused.
var errRefillProtocol = errors.New("cache: unexpected answer to a pipelined write")

// errRefillUnsure marks a pipelined write that failed once its commands
// began to go out: any of them may have been stored, or may be yet. The
// keys of a refill are owed (Distrust): a read of one before the exchange
// began may be older than a write whose tombstone expires before the add
// lands. Tombstones of such a write count as not written, so their keys
// are owed too.
var errRefillUnsure = errors.New("cache: the outcome of the pipelined write is unknown")

// errRefillNotSent marks a pipelined write that failed before any
// command went out.
var errRefillNotSent = errors.New("cache: pipelined write not sent")

// errRefillFault marks a pipelined write whose every command memcached
// answered, some with a failure that is not a refusal of the item: the
// outcome of each is known, and the connection is not reused.
var errRefillFault = errors.New("cache: memcached failed items of a pipelined write")

// add adds items on one connection in one exchange. It returns an error
// for a failed exchange, or for items the server refused for a reason
// other than an existing key (memcached's SERVER_ERROR, such as an item
// too large), naming how many.
func (r *refills) add(ctx context.Context, items []*memcache.Item) error {
	refused, err := r.send(ctx, "add", items)
	if err != nil {
		return err
	}
	return refused.err("refilled")
}

// set sets items (tombstones) on one connection in one exchange. It
// returns the indexes of the items memcached did not store, and an error
// for a failed exchange, after which any of them may or may not be
// stored.
func (r *refills) set(ctx context.Context, items []*memcache.Item) (refusals, error) {
	return r.send(ctx, "set", items)
}

// drop drops the keys of items on one connection (dropExchange: each is
// deleted unless it holds a tombstone); a key not there is no failure.
// It returns an error for a failed exchange, after which any of them may
// or may not be deleted, and for keys the server answered with a refusal
// (a proxy's), which are not deleted.
func (r *refills) drop(ctx context.Context, items []*memcache.Item) error {
	refused, err := r.on(ctx, func(cn *refillConn) (refusals, error) {
		return dropExchange(cn.rw, items, func() error { return cn.nc.SetDeadline(time.Now().Add(r.timeout)) })
	})
	if err != nil {
		return err
	}
	return refused.err("deleted")
}

// send writes items as verb commands on one connection in one exchange
// and reads their answers.
//
// The dial and the exchange each get the whole socket timeout, whatever
// is left of ctx (as gomemcache's calls do): the caller's wait for a
// connection is bounded by ctx, but an exchange cut short by a caller
// about to leave would count against a healthy server's breaker.
func (r *refills) send(ctx context.Context, verb string, items []*memcache.Item) (refusals, error) {
	return r.on(ctx, func(cn *refillConn) (refusals, error) { return exchange(cn.rw, verb, items) })
}

// on runs op, the exchanges of one pipelined write, on one connection,
// as send describes.
func (r *refills) on(ctx context.Context, op func(*refillConn) (refusals, error)) (refusals, error) {
	cn, err := r.conn(ctx)
	if err != nil {
		return refusals{}, err
	}
	if err := cn.nc.SetDeadline(time.Now().Add(r.timeout)); err != nil {
		_ = cn.nc.Close()
		return refusals{}, fmt.Errorf("%w: %w", errRefillNotSent, err)
	}
	refused, err := op(cn)
	switch {
	case errors.Is(err, errRefillFault): // every command answered: nothing more can land
		_ = cn.nc.Close()
		return refusals{}, err
	case err != nil:
		abort(cn.nc)
		return refusals{}, fmt.Errorf("%w: %w", errRefillUnsure, err)
	}
	r.put(cn)
	return refused, nil
}

// linger is a connection whose SO_LINGER can be set (*net.TCPConn).
type linger interface{ SetLinger(sec int) error }

// abort closes nc at once, discarding whatever it has not sent
// (SO_LINGER 0, so the kernel resets the connection rather than go on
// delivering its buffer): adds left unsent when an exchange failed must
// not reach the server late, once the tombstone that should have stopped
// them has expired.
func abort(nc net.Conn) {
	if l, ok := nc.(linger); ok {
		_ = l.SetLinger(0)
	}
	_ = nc.Close()
}

// conn returns an idle connection, or dials one.
func (r *refills) conn(ctx context.Context) (*refillConn, error) {
	r.mu.Lock()
	if n := len(r.idle); n > 0 {
		cn := r.idle[n-1]
		r.idle = r.idle[:n-1]
		r.mu.Unlock()
		return cn, nil
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	nc, err := r.dial(ctx, "tcp", r.addr)
	if err != nil {
		return nil, err
	}
	return &refillConn{nc: nc, rw: bufio.NewReadWriter(bufio.NewReader(nc), bufio.NewWriterSize(nc, refillWriteBuffer))}, nil
}

// put keeps cn idle. The semaphore holds at most size refills at once,
// each with one connection, so the idle list never outgrows size.
func (r *refills) put(cn *refillConn) {
	r.mu.Lock()
	r.idle = append(r.idle, cn)
	r.mu.Unlock()
}

// closeIdle closes the idle connections.
func (r *refills) closeIdle() error {
	r.mu.Lock()
	idle := r.idle
	r.idle = nil
	r.mu.Unlock()
	var errs []error
	for _, cn := range idle {
		errs = append(errs, cn.nc.Close())
	}
	return errors.Join(errs...)
}

// exchange writes items as verb commands (add, set or delete), then
// reads one answer per item. refused holds the items the server did not store for
// a reason other than an existing key; err, an exchange that failed (the
// connection must then be closed).
func exchange(rw *bufio.ReadWriter, verb string, items []*memcache.Item) (refused refusals, err error) {
	var scratch []byte
	for _, it := range items {
		if scratch, err = writeCommand(rw.Writer, verb, it, scratch); err != nil {
			return refusals{}, err
		}
	}
	if err := rw.Flush(); err != nil {
		return refusals{}, err
	}
	return readAnswers(rw.Reader, verb, len(items))
}

// writeCommand writes the command of verb for it: a delete's line, or a
// storage command's line and value. It returns scratch, the buffer the
// line was built in, for the next command.
func writeCommand(w *bufio.Writer, verb string, it *memcache.Item, scratch []byte) ([]byte, error) {
	if verb == "delete" {
		scratch = append(append(append(scratch[:0], "delete "...), it.Key...), "\r\n"...)
		_, err := w.Write(scratch)
		return scratch, err
	}
	scratch = appendStore(scratch[:0], verb, it)
	if _, err := w.Write(scratch); err != nil {
		return scratch, err
	}
	if _, err := w.Write(it.Value); err != nil {
		return scratch, err
	}
	_, err := w.WriteString("\r\n")
	return scratch, err
}

// appendStore appends the command line of a classic storage command
// (add or set) of it.
func appendStore(b []byte, verb string, it *memcache.Item) []byte {
	b = append(b, verb...)
	b = append(b, ' ')
	b = append(b, it.Key...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(it.Flags), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(it.Expiration), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(it.Value)), 10)
	return append(b, "\r\n"...)
}

// refusals are the items of one exchange that memcached refused to
// store: too large, or no memory left for them.
type refusals struct {
	at    []int  // their indexes in the exchange, in order
	of    int    // how many items the exchange sent
	first string // the first refusal's answer
}

// err is nil when nothing was refused, else errItemRefused saying how
// many of the exchange's items (what names them) were refused.
func (r refusals) err(what string) error {
	if len(r.at) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d of %d %s items: %s", errItemRefused, len(r.at), r.of, what, r.first)
}

// readAnswers reads the answers to items commands of verb: STORED;
// NOT_STORED, which for an add is a key that exists already (a refused
// add, which is normal) and for a set a value not stored; DELETED and
// NOT_FOUND (nothing to delete) for a delete; and
// SERVER_ERROR for an item the server did not store: refused as too
// large or for want of memory (errItemRefused: the server is up, and
// skipped the value and went on), or any other server error, a failure
// after which the connection is not reused.
func readAnswers(r *bufio.Reader, verb string, items int) (refusals, error) {
	refused := refusals{of: items}
	faults := 0
	var firstFault string
	for i := range items {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return refusals{}, err
		}
		switch {
		case bytes.Equal(line, []byte("STORED\r\n")) && verb != "delete":
		case (bytes.Equal(line, []byte("DELETED\r\n")) || bytes.Equal(line, []byte("NOT_FOUND\r\n"))) && verb == "delete":
		case bytes.Equal(line, []byte("NOT_STORED\r\n")) && verb != "delete":
			if verb != "add" {
				refused.at = append(refused.at, i)
				refused.first = cmp.Or(refused.first, "NOT_STORED")
			}
		case bytes.HasPrefix(line, []byte("SERVER_ERROR ")):
			text := string(bytes.TrimSpace(line))
			if !refusal(text) {
				faults++
				firstFault = cmp.Or(firstFault, text)
				continue
			}
			refused.at = append(refused.at, i)
			refused.first = cmp.Or(refused.first, text)
		default:
			return refusals{}, fmt.Errorf("%w: %q", errRefillProtocol, bytes.TrimSpace(line))
		}
	}
	if faults > 0 { // not a refusal of an item: the server failed, and the connection is closed
		return refusals{}, fmt.Errorf("%w: it did not store %d of %d (first failure: %s)", errRefillFault, faults+len(refused.at), items, firstFault)
	}
	return refused, nil
}
