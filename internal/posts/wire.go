package posts

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of sluice.v1.PostRecord.
const (
	fieldURI         protowire.Number = 1
	fieldFound       protowire.Number = 2
	fieldCID         protowire.Number = 3
	fieldRecord      protowire.Number = 4
	fieldCreatedAt   protowire.Number = 5
	fieldIndexedAt   protowire.Number = 6
	fieldTakedownRef protowire.Number = 7
	fieldTags        protowire.Number = 8
	fieldGates       protowire.Number = 9
)

// fieldKind is what checkWire requires of one field's value.
type fieldKind uint8

const (
	unknownField   fieldKind = iota // a field this build does not know: any well-formed value
	uriField                        // a string equal to the URI asked
	boolField                       // a varint
	stringField                     // length-delimited, valid UTF-8 (proto3 strings)
	bytesField                      // length-delimited, anything
	timestampField                  // a google.protobuf.Timestamp
	gatesField                      // a sluice.v1.PostGates
)

// postRecordFields is sluice.v1.PostRecord's schema as checkWire reads
// it, indexed by field number; TestCheckWireKnowsEveryField holds it to
// the generated descriptor, so a field added to the message cannot go
// unchecked.
var postRecordFields = [...]fieldKind{
	fieldURI:         uriField,
	fieldFound:       boolField,
	fieldCID:         stringField,
	fieldRecord:      bytesField,
	fieldCreatedAt:   timestampField,
	fieldIndexedAt:   timestampField,
	fieldTakedownRef: stringField,
	fieldTags:        stringField, // repeated: one such field per tag
	fieldGates:       gatesField,
}

// checkWire reports whether b is a sluice.v1.PostRecord encoding that a
// server may copy into its response for uri without decoding it: every
// field well formed and of its declared wire type, the strings valid
// UTF-8 (a client's decoder refuses them otherwise), the nested messages
// (timestamps, gates) likewise, found set, and the URI exactly uri — the
// cache key is a hash of the URI, and this is what makes a value stored
// under the wrong key harmless. Anything else is refused, and the caller
// reads the record from the store instead. A value checkWire accepts
// decodes (TestCheckWireAcceptsOnlyWhatDecodes).
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
		kind := unknownField
		if int(num) < len(postRecordFields) {
			kind = postRecordFields[num]
		}
		if n = consumeField(kind, num, typ, b, uri); n < 0 {
			return false
		}
		switch kind {
		case uriField:
			sawURI = true
		case boolField:
			v, _ := protowire.ConsumeVarint(b)
			found = v != 0
		}
		b = b[n:]
	}
	return sawURI && found
}

// consumeField checks one field's value, at the start of b, against its
// kind and returns its length, or a negative number when it is malformed
// or of another wire type than its kind's.
func consumeField(kind fieldKind, num protowire.Number, typ protowire.Type, b []byte, uri string) int {
	switch kind {
	case unknownField:
		return protowire.ConsumeFieldValue(num, typ, b)
	case boolField:
		if typ != protowire.VarintType {
			return -1
		}
		_, n := protowire.ConsumeVarint(b)
		return n
	}
	if typ != protowire.BytesType {
		return -1
	}
	v, n := protowire.ConsumeBytes(b)
	if n < 0 || !checkBytes(kind, v, uri) {
		return -1
	}
	return n
}

// checkBytes checks a length-delimited value against its kind.
func checkBytes(kind fieldKind, v []byte, uri string) bool {
	switch kind {
	case uriField:
		return string(v) == uri
	case stringField:
		return utf8.Valid(v)
	case timestampField:
		return checkVarintFields(v, 2) // seconds (1), nanos (2)
	case gatesField:
		return checkVarintFields(v, 4) // four bools
	}
	return true
}

// checkVarintFields accepts a message encoding whose fields 1 to known
// are varints (as google.protobuf.Timestamp's and sluice.v1.PostGates's
// all are) and whose other fields are well formed.
func checkVarintFields(b []byte, known protowire.Number) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num <= known && typ != protowire.VarintType {
			return false
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return false
		}
		b = b[n:]
	}
	return true
}
