package posts

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of sluice.v1.PostRecord and google.protobuf.Timestamp.
const (
	fieldURI       protowire.Number = 1
	fieldFound     protowire.Number = 2
	fieldCID       protowire.Number = 3
	fieldRecord    protowire.Number = 4
	fieldCreatedAt protowire.Number = 5
	fieldIndexedAt protowire.Number = 6
)

// checkWire reports whether b is a sluice.v1.PostRecord encoding that a
// server may copy into its response for uri without decoding it: every
// field well formed and of its declared wire type, the strings valid
// UTF-8 (a client's decoder refuses them otherwise), found set, and the
// URI exactly uri — the cache key is a hash of the URI, and this is what
// makes a value stored under the wrong key harmless. Anything else is
// refused, and the caller reads the record from the store instead.
//
// It is one pass over the bytes with no allocation, where decoding and
// re-encoding a record allocated the message, its strings and its
// timestamps.
func checkWire(uri string, b []byte) bool {
	sawURI, found := false, false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == fieldFound && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			found, b = v != 0, b[n:]
		case (num == fieldURI || num == fieldCID || num == fieldRecord || num == fieldCreatedAt || num == fieldIndexedAt) && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !checkBytesField(num, v, uri) {
				return false
			}
			if num == fieldURI {
				sawURI = true
			}
			b = b[n:]
		case num <= fieldIndexedAt:
			return false // a known field with the wrong wire type
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return false
			}
			b = b[n:]
		}
	}
	return sawURI && found
}

func checkBytesField(num protowire.Number, v []byte, uri string) bool {
	switch num {
	case fieldURI:
		return string(v) == uri
	case fieldCID:
		return utf8.Valid(v)
	case fieldCreatedAt, fieldIndexedAt:
		return checkTimestamp(v)
	}
	return true
}

// checkTimestamp accepts a google.protobuf.Timestamp encoding whose
// seconds (1) and nanos (2) are varints.
func checkTimestamp(b []byte) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ != protowire.VarintType {
			return false
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return false
		}
		b = b[n:]
	}
	return true
}
