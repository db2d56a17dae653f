package cache

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"strconv"

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
// not know the meta commands (memcached before 1.6, some proxies) is
// sent classic deletes instead.

// dropRounds is how many times a pipelined drop reads and deletes the
// keys that changed between its read and its delete before it gives up.
const dropRounds = 3

// errMetaUnsupported marks a server that answered the meta get with
// ERROR: it does not know the command.
var errMetaUnsupported = errors.New("cache: the server does not know the meta commands")

// dropExchange drops the keys of items (see above) on one connection,
// and returns the items the server refused to delete (a proxy's refusal).
func dropExchange(rw *bufio.ReadWriter, items []*memcache.Item) (refusals, error) {
	keys := items
	for range dropRounds {
		held, err := metaGet(rw, keys)
		if errors.Is(err, errMetaUnsupported) {
			return exchange(rw, "delete", keys)
		}
		if err != nil {
			return refusals{}, err
		}
		var doomed []*memcache.Item
		var cas []uint64
		for i, h := range held {
			if h.present && h.flags != flagTombstone {
				doomed, cas = append(doomed, keys[i]), append(cas, h.cas)
			}
		}
		changed, refused, err := metaDelete(rw, doomed, cas)
		if err != nil || len(refused.at) > 0 {
			refused.of = len(items)
			return refused, err
		}
		if keys = changed; len(keys) == 0 {
			return refusals{of: len(items)}, nil
		}
	}
	return refusals{}, fmt.Errorf("%w: %d of %d keys changed between their read and their delete %d times in a row", errRefillFault, len(keys), len(items), dropRounds)
}

// heldKey is what a meta get found under a key.
type heldKey struct {
	present bool
	flags   uint32
	cas     uint64
}

// metaGet reads the flags and CAS of every key of items, in one write.
// It returns errMetaUnsupported, with every answer read, when the server
// answered ERROR to each.
func metaGet(rw *bufio.ReadWriter, items []*memcache.Item) ([]heldKey, error) {
	for _, it := range items {
		if _, err := fmt.Fprintf(rw, "mg %s f c\r\n", it.Key); err != nil {
			return nil, err
		}
	}
	if err := rw.Flush(); err != nil {
		return nil, err
	}
	held := make([]heldKey, len(items))
	unknown := 0
	for i := range items {
		line, err := rw.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		switch {
		case bytes.Equal(line, []byte("EN\r\n")):
		case bytes.Equal(line, []byte("ERROR\r\n")):
			unknown++
		case bytes.HasPrefix(line, []byte("HD")):
			if held[i], err = parseHeld(line); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%w: %q to a meta get", errRefillProtocol, bytes.TrimSpace(line))
		}
	}
	switch unknown {
	case 0:
		return held, nil
	case len(items):
		return nil, errMetaUnsupported
	}
	return nil, fmt.Errorf("%w: ERROR to %d of %d meta gets", errRefillProtocol, unknown, len(items))
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
// one given, in one write. changed are the items whose key changed since
// (EX): they must be read again. refused are the deletes answered with a
// refusal; a server error of another kind fails the exchange.
func metaDelete(rw *bufio.ReadWriter, items []*memcache.Item, cas []uint64) (changed []*memcache.Item, refused refusals, err error) {
	if len(items) == 0 {
		return nil, refusals{}, nil
	}
	for i, it := range items {
		if _, err := fmt.Fprintf(rw, "md %s C%d\r\n", it.Key, cas[i]); err != nil {
			return nil, refusals{}, err
		}
	}
	if err := rw.Flush(); err != nil {
		return nil, refusals{}, err
	}
	for i, it := range items {
		line, err := rw.ReadSlice('\n')
		if err != nil {
			return nil, refusals{}, err
		}
		switch {
		case bytes.Equal(line, []byte("HD\r\n")), bytes.Equal(line, []byte("NF\r\n")):
		case bytes.Equal(line, []byte("EX\r\n")):
			changed = append(changed, it)
		case bytes.HasPrefix(line, []byte("SERVER_ERROR ")):
			refused.at = append(refused.at, i)
			refused.first = cmp.Or(refused.first, string(bytes.TrimSpace(line)))
		default:
			return nil, refusals{}, fmt.Errorf("%w: %q to a meta delete", errRefillProtocol, bytes.TrimSpace(line))
		}
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
