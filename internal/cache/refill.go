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

// refills sends one server's refills as pipelined writes: every item's
// add (add KEY FLAGS TTL LEN) goes out in one write, and the answers,
// one line per item, are read back together, so a refill of n keys costs
// one round trip and a pair of system calls on each side instead of n.
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
type refills struct {
	sem     *semaphore.Weighted
	size    int64
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
	return &refills{sem: semaphore.NewWeighted(int64(conns)), size: int64(conns), timeout: timeout, dial: dial, addr: addr}
}

// errRefillProtocol marks an answer the pipeline could not read as an
// add's: the connection is closed, not reused.
var errRefillProtocol = errors.New("cache: unexpected answer to a pipelined refill")

// errRefillUnsure marks a pipelined refill that failed once its adds
// began to go out: any of them may have been stored, or may be yet. Its
// keys are owed (Distrust): a read of one before the exchange began may
// be older than a write whose tombstone expires before the add lands.
var errRefillUnsure = errors.New("cache: the refill's outcome is unknown")

// errRefillNotSent marks a pipelined refill that failed before any add
// went out.
var errRefillNotSent = errors.New("cache: refill not sent")

// errRefillFault marks a pipelined refill whose every add memcached
// answered, some with a failure that is not a refusal of the item: the
// outcome of each is known, and the connection is not reused.
var errRefillFault = errors.New("cache: memcached failed refilled items")

// add adds items on one connection in one exchange. It returns an error
// for a failed exchange, or for items the server refused for a reason
// other than an existing key (memcached's SERVER_ERROR, such as an item
// too large), naming how many.
//
// The dial and the exchange each get the whole socket timeout, whatever
// is left of ctx (as gomemcache's calls do): the caller's wait for a
// connection is bounded by ctx, but an exchange cut short by a caller
// about to leave would count against a healthy server's breaker.
func (r *refills) add(ctx context.Context, items []*memcache.Item) error {
	cn, err := r.conn(ctx)
	if err != nil {
		return err
	}
	if err := cn.nc.SetDeadline(time.Now().Add(r.timeout)); err != nil {
		_ = cn.nc.Close()
		return fmt.Errorf("%w: %w", errRefillNotSent, err)
	}
	refused, err := exchange(cn.rw, items)
	switch {
	case errors.Is(err, errRefillFault): // every add answered: nothing more can land
		_ = cn.nc.Close()
		return err
	case err != nil:
		abort(cn.nc)
		return fmt.Errorf("%w: %w", errRefillUnsure, err)
	}
	r.put(cn)
	if refused != nil {
		return refused
	}
	return nil
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

// exchange writes items as adds, then reads one answer per item.
// refused reports items the server did not store for a reason other than
// an existing key; err, an exchange that failed (the connection must then
// be closed).
func exchange(rw *bufio.ReadWriter, items []*memcache.Item) (refused, err error) {
	var line []byte
	for _, it := range items {
		line = appendAdd(line[:0], it)
		if _, err := rw.Write(line); err != nil {
			return nil, err
		}
		if _, err := rw.Write(it.Value); err != nil {
			return nil, err
		}
		if _, err := rw.WriteString("\r\n"); err != nil {
			return nil, err
		}
	}
	if err := rw.Flush(); err != nil {
		return nil, err
	}
	return readAnswers(rw.Reader, len(items))
}

// appendAdd appends the command line of a classic add of it.
func appendAdd(b []byte, it *memcache.Item) []byte {
	b = append(b, "add "...)
	b = append(b, it.Key...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(it.Flags), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(it.Expiration), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(it.Value)), 10)
	return append(b, "\r\n"...)
}

// readAnswers reads the answers to items adds: STORED, NOT_STORED for a
// key that exists already (a refused add, which is normal), and
// SERVER_ERROR for an item the server did not store: refused as too
// large or for want of memory (errItemRefused: the server is up, and
// skipped the value and went on), or any other server error, a failure
// after which the connection is not reused.
func readAnswers(r *bufio.Reader, items int) (refused, err error) {
	failed := 0
	var firstRefusal, firstFault string
	for range items {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		switch {
		case bytes.Equal(line, []byte("STORED\r\n")), bytes.Equal(line, []byte("NOT_STORED\r\n")):
		case bytes.HasPrefix(line, []byte("SERVER_ERROR ")):
			failed++
			text := string(bytes.TrimSpace(line))
			switch {
			case !refusal(text):
				firstFault = cmp.Or(firstFault, text)
			default:
				firstRefusal = cmp.Or(firstRefusal, text)
			}
		default:
			return nil, fmt.Errorf("%w: %q", errRefillProtocol, bytes.TrimSpace(line))
		}
	}
	switch {
	case firstFault != "": // not a refusal of an item: the server failed, and the connection is closed
		return nil, fmt.Errorf("%w: it did not store %d of %d (first failure: %s)", errRefillFault, failed, items, firstFault)
	case failed > 0:
		return fmt.Errorf("%w: %d of %d refilled items: %s", errItemRefused, failed, items, firstRefusal), nil
	}
	return nil, nil
}
