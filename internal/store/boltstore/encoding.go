package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// encodingV1 is the leading byte of every value this package writes. The
// URI is the key and is not repeated in the value. After the version byte,
// version 1 holds, with varints as encoding/binary writes them:
//
//	uvarint  len(CID), then the CID bytes
//	varint   CreatedAt as UnixMicro
//	varint   IndexedAt as UnixMicro
//	uvarint  len(JSON), then the JSON bytes
//
// Version 2, which encodeValue writes, appends the moderation and gate
// state:
//
//	uvarint  len(TakedownRef), then its bytes
//	uvarint  number of tags, then each as uvarint length and bytes
//	byte     gate flags (bit 0 HasThreadGate, 1 HasPostGate,
//	         2 ViolatesThreadGate, 3 ViolatesEmbeddingRules)
//
// A version 1 value reads as a record with no moderation or gate state.
// A change to the layout takes a new version byte; decodeValue refuses
// versions it does not know rather than guessing.
const (
	encodingV1 byte = 1
	encodingV2 byte = 2
)

// maxTagsDecoded bounds the tag count a value may claim, so a corrupt
// count cannot make decodeValue allocate without limit.
const maxTagsDecoded = 1 << 16

// errCorrupt is wrapped by every decoding error.
var errCorrupt = errors.New("corrupt value")

// encodeValue returns the version 2 encoding of r's fields other than URI.
func encodeValue(r store.Record) []byte {
	b := make([]byte, 0, 2+6*binary.MaxVarintLen64+len(r.CID)+len(r.JSON)+len(r.TakedownRef))
	b = append(b, encodingV2)
	b = binary.AppendUvarint(b, uint64(len(r.CID)))
	b = append(b, r.CID...)
	b = binary.AppendVarint(b, r.CreatedAt.UnixMicro())
	b = binary.AppendVarint(b, r.IndexedAt.UnixMicro())
	b = binary.AppendUvarint(b, uint64(len(r.JSON)))
	b = append(b, r.JSON...)
	b = binary.AppendUvarint(b, uint64(len(r.TakedownRef)))
	b = append(b, r.TakedownRef...)
	b = binary.AppendUvarint(b, uint64(len(r.Tags)))
	for _, tag := range r.Tags {
		b = binary.AppendUvarint(b, uint64(len(tag)))
		b = append(b, tag...)
	}
	return append(b, gateFlags(r.Gates))
}

func gateFlags(g store.Gates) byte {
	var f byte
	for i, set := range []bool{g.HasThreadGate, g.HasPostGate, g.ViolatesThreadGate, g.ViolatesEmbeddingRules} {
		if set {
			f |= 1 << i
		}
	}
	return f
}

func gatesOf(f byte) store.Gates {
	return store.Gates{HasThreadGate: f&1 != 0, HasPostGate: f&2 != 0, ViolatesThreadGate: f&4 != 0, ViolatesEmbeddingRules: f&8 != 0}
}

// decodeValue decodes a value written by encodeValue. The caller owns v and
// the returned JSON aliases it. The URI is left empty for the caller to set.
func decodeValue(v []byte) (store.Record, error) {
	if len(v) == 0 {
		return store.Record{}, fmt.Errorf("decode value: %w: empty", errCorrupt)
	}
	if v[0] != encodingV1 && v[0] != encodingV2 {
		return store.Record{}, fmt.Errorf("decode value: %w: unknown encoding version %d", errCorrupt, v[0])
	}
	d := decoder{buf: v[1:]}
	var r store.Record
	r.CID = string(d.bytes("CID"))
	r.CreatedAt = d.micros("CreatedAt")
	r.IndexedAt = d.micros("IndexedAt")
	r.JSON = d.bytes("JSON")
	if v[0] == encodingV2 {
		r.TakedownRef = string(d.bytes("TakedownRef"))
		r.Tags = d.tags()
		r.Gates = gatesOf(d.byte("gate flags"))
	}
	if d.err == nil && len(d.buf) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.buf))
	}
	if d.err != nil {
		return store.Record{}, fmt.Errorf("decode value: %w: %w", errCorrupt, d.err)
	}
	return r, nil
}

// decoder reads fields from buf; the first failure sticks in err and makes
// later reads return zero values.
type decoder struct {
	buf []byte
	err error
}

// bytes reads a length-prefixed field. The result aliases buf and has no
// spare capacity, so appending to it cannot overwrite later fields.
func (d *decoder) bytes(field string) []byte {
	if d.err != nil {
		return nil
	}
	n, size := binary.Uvarint(d.buf)
	if size <= 0 || n > uint64(len(d.buf)-size) {
		d.err = fmt.Errorf("truncated %s", field)
		return nil
	}
	end := size + int(n)
	b := d.buf[size:end:end]
	d.buf = d.buf[end:]
	return b
}

// micros reads a time stored as a varint of Unix microseconds, in UTC.
func (d *decoder) micros(field string) time.Time {
	if d.err != nil {
		return time.Time{}
	}
	us, size := binary.Varint(d.buf)
	if size <= 0 {
		d.err = fmt.Errorf("truncated %s", field)
		return time.Time{}
	}
	d.buf = d.buf[size:]
	return time.UnixMicro(us).UTC()
}

// tags reads a count and that many length-prefixed strings; none is nil.
func (d *decoder) tags() []string {
	if d.err != nil {
		return nil
	}
	n, size := binary.Uvarint(d.buf)
	if size <= 0 || n > maxTagsDecoded {
		d.err = errors.New("truncated or oversized tag count")
		return nil
	}
	d.buf = d.buf[size:]
	if n == 0 {
		return nil
	}
	out := make([]string, 0, n)
	for range n {
		out = append(out, string(d.bytes("tag")))
	}
	return out
}

// byte reads one byte.
func (d *decoder) byte(field string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.buf) == 0 {
		d.err = fmt.Errorf("truncated %s", field)
		return 0
	}
	b := d.buf[0]
	d.buf = d.buf[1:]
	return b
}
