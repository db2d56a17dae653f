package cache

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/bradfitz/gomemcache/memcache"
)

// A journal replay drops keys: it deletes what a key holds unless it is
// a tombstone. A tombstone on a replayed key was set by a write less than
// TombstoneTTL ago, and stands between that write and a read that fetched
// the record before it and has yet to refill it; a plain delete would
// remove it and let that refill store the old record until the entry's
// TTL ends. So a pipelined drop reads each key's flags and CAS (meta get,
// `mg KEY f c`), then deletes those holding anything else only if they
// have not changed since (meta delete, `md KEY C<cas>`), on the same
// connection; a key that changed in between is read again, up to
// dropRounds times. A single key is dropped so too. A server that does
// not understand the meta get (memcached before 1.6.10, whose meta
// commands answered OK, or a proxy without them) is sent classic deletes
// instead.

// dropRounds is how many times a pipelined drop reads and deletes the
// keys that changed between its read and its delete before it gives up.
const dropRounds = 3

// errMetaUnsupported marks a meta get the server did not understand.
var errMetaUnsupported = errors.New("cache: the server does not understand the meta get")

// dropExchange drops the keys of items (see above) on one connection. It
// returns the items not dropped although the server answered: deletes it
// refused, and keys still changing after dropRounds reads; their indexes
// are into items. renew gives the connection a whole socket timeout
// again: each exchange after the first gets its own, as every pipelined
// write's exchange does.
func dropExchange(rw *bufio.ReadWriter, items []*memcache.Item, renew func() error) (refusals, error) {
	keys, at := items, make([]int, len(items)) // keys[k] is items[at[k]]
	for i := range at {
		at[i] = i
	}
	for round := range dropRounds {
		if round > 0 {
			if err := renew(); err != nil {
				return refusals{}, err
			}
		}
		held, err := metaGet(rw, keys)
		if errors.Is(err, errMetaUnsupported) {
			if err := renew(); err != nil {
				return refusals{}, err
			}
			refused, err := exchange(rw, "delete", keys)
			return refusals{at: elementsAt(at, refused.at), of: len(items), first: refused.first}, err
		}
		if err != nil {
			return refusals{}, err
		}
		var doomed []*memcache.Item
		var doomedAt []int
		var cas []uint64
		for k, h := range held {
			if h.present && h.flags != flagTombstone {
				doomed, doomedAt, cas = append(doomed, keys[k]), append(doomedAt, at[k]), append(cas, h.cas)
			}
		}
		if len(doomed) > 0 {
			if err := renew(); err != nil {
				return refusals{}, err
			}
		}
		changed, refused, err := metaDelete(rw, doomed, cas)
		if err != nil {
			return refusals{}, err
		}
		if len(refused.at) > 0 {
			return refusals{at: elementsAt(doomedAt, refused.at), of: len(items), first: refused.first}, nil
		}
		if len(changed) == 0 {
			return refusals{of: len(items)}, nil
		}
		keys, at = elementsAt(doomed, changed), elementsAt(doomedAt, changed)
	}
	return refusals{at: at, of: len(items), first: fmt.Sprintf("changed between its read and its delete %d times in a row", dropRounds)}, nil
}

// elementsAt returns from[i] for each i of which, in order.
func elementsAt[T any](from []T, which []int) []T {
	out := make([]T, len(which))
	for k, i := range which {
		out[k] = from[i]
	}
	return out
}

// heldKey is what a meta get found under a key.
type heldKey struct {
	present bool
	flags   uint32
	cas     uint64
}

// metaGet reads the flags and CAS of every key of items, in one write.
// It reads every answer, and returns errMetaUnsupported when any was
// neither a hit (HD) nor a miss (EN) nor a server error, and an error
// naming the first server error when there was one.
func metaGet(rw *bufio.ReadWriter, items []*memcache.Item) ([]heldKey, error) {
	var line []byte
	for _, it := range items {
		line = append(append(append(line[:0], "mg "...), it.Key...), " f c\r\n"...)
		if _, err := rw.Write(line); err != nil {
			return nil, err
		}
	}
	if err := rw.Flush(); err != nil {
		return nil, err
	}
	held := make([]heldKey, len(items))
	var unknown, failed string
	for i := range items {
		line, err := rw.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		switch {
		case bytes.Equal(line, []byte("EN\r\n")):
		case bytes.HasPrefix(line, []byte("HD")):
			if held[i], err = parseHeld(line); err != nil {
				return nil, err
			}
		case bytes.HasPrefix(line, []byte("SERVER_ERROR")):
			failed = cmp.Or(failed, string(bytes.TrimSpace(line)))
		default: // ERROR, CLIENT_ERROR, an older server's OK
			unknown = cmp.Or(unknown, string(bytes.TrimSpace(line)))
		}
	}
	switch {
	case failed != "":
		return nil, fmt.Errorf("%w: a meta get was answered %q", errRefillFault, failed)
	case unknown != "":
		return nil, fmt.Errorf("%w: a meta get was answered %q", errMetaUnsupported, unknown)
	}
	return held, nil
}

// parseHeld reads a meta get's hit, `HD f<flags> c<cas>`, the two in
// any order.
func parseHeld(line []byte) (heldKey, error) {
	h := heldKey{present: true}
	var seen int
	for _, tok := range bytes.Fields(line)[1:] {
		switch tok[0] {
		case 'f':
			f, err := strconv.ParseUint(string(tok[1:]), 10, 32)
			if err != nil {
				return heldKey{}, fmt.Errorf("%w: flags %q in a meta get's answer", errRefillProtocol, tok)
			}
			h.flags, seen = uint32(f), seen|1
		case 'c':
			c, err := strconv.ParseUint(string(tok[1:]), 10, 64)
			if err != nil {
				return heldKey{}, fmt.Errorf("%w: CAS %q in a meta get's answer", errRefillProtocol, tok)
			}
			h.cas, seen = c, seen|2
		}
	}
	if seen != 3 {
		return heldKey{}, fmt.Errorf("%w: %q lacks the flags or the CAS asked for", errRefillProtocol, bytes.TrimSpace(line))
	}
	return h, nil
}

// metaDelete deletes the key of each of items if its CAS is still the
// one given, in one write. changed are the indexes (into items) of the
// keys that changed since (EX): they must be read again. refused are the
// deletes answered with a refusal (as readAnswers tells them); any other
// server error fails the exchange (errRefillFault), once every answer is
// read.
func metaDelete(rw *bufio.ReadWriter, items []*memcache.Item, cas []uint64) (changed []int, refused refusals, err error) {
	if len(items) == 0 {
		return nil, refusals{}, nil
	}
	var line []byte
	for i, it := range items {
		line = append(append(append(line[:0], "md "...), it.Key...), " C"...)
		line = append(strconv.AppendUint(line, cas[i], 10), "\r\n"...)
		if _, err := rw.Write(line); err != nil {
			return nil, refusals{}, err
		}
	}
	if err := rw.Flush(); err != nil {
		return nil, refusals{}, err
	}
	refused.of = len(items)
	var fault string
	for i := range items {
		line, err := rw.ReadSlice('\n')
		if err != nil {
			return nil, refusals{}, err
		}
		switch text := string(bytes.TrimSpace(line)); {
		case text == "HD", text == "NF":
		case text == "EX":
			changed = append(changed, i)
		case refusal(text):
			refused.at = append(refused.at, i)
			refused.first = cmp.Or(refused.first, text)
		case strings.HasPrefix(text, "SERVER_ERROR"):
			fault = cmp.Or(fault, text)
		default:
			return nil, refusals{}, fmt.Errorf("%w: %q to a meta delete", errRefillProtocol, text)
		}
	}
	if fault != "" {
		return nil, refusals{}, fmt.Errorf("%w: a meta delete was answered %q", errRefillFault, fault)
	}
	return changed, refused, nil
}

// dropOne drops one key with the gomemcache client, on a server with
// too few connections for a refill pipeline. The client knows no meta
// command: dropOne reads the key and deletes it unless it holds a
// tombstone, so a tombstone set between the two is deleted, a window of
// one round trip that the pipelined drop does not have.
func dropOne(mc *memcache.Client, it *memcache.Item) error {
	got, err := mc.Get(it.Key)
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return nil
	case err != nil:
		return err
	case got.Flags == flagTombstone:
		return nil
	}
	return mc.Delete(it.Key)
}
