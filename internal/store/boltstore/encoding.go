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
// A change to the layout takes a new version byte; decodeValue refuses
// versions it does not know rather than guessing.
const encodingV1 byte = 1

// errCorrupt is wrapped by every decoding error.
var errCorrupt = errors.New("corrupt value")

// encodeValue returns the version 1 encoding of r's fields other than URI.
func encodeValue(r store.Record) []byte {
	b := make([]byte, 0, 1+4*binary.MaxVarintLen64+len(r.CID)+len(r.JSON))
	b = append(b, encodingV1)
	b = binary.AppendUvarint(b, uint64(len(r.CID)))
	b = append(b, r.CID...)
	b = binary.AppendVarint(b, r.CreatedAt.UnixMicro())
	b = binary.AppendVarint(b, r.IndexedAt.UnixMicro())
	b = binary.AppendUvarint(b, uint64(len(r.JSON)))
	return append(b, r.JSON...)
}

// decodeValue decodes a value written by encodeValue. The caller owns v and
// the returned JSON aliases it. The URI is left empty for the caller to set.
func decodeValue(v []byte) (store.Record, error) {
	if len(v) == 0 {
		return store.Record{}, fmt.Errorf("decode value: %w: empty", errCorrupt)
	}
	if v[0] != encodingV1 {
		return store.Record{}, fmt.Errorf("decode value: %w: unknown encoding version %d", errCorrupt, v[0])
	}
	d := decoder{buf: v[1:]}
	var r store.Record
	r.CID = string(d.bytes("CID"))
	r.CreatedAt = d.micros("CreatedAt")
	r.IndexedAt = d.micros("IndexedAt")
	r.JSON = d.bytes("JSON")
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
