package posts

import (
	"math/rand/v2"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-dev/sluice/internal/store"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Tests that checkWire accepts exactly the cached encodings a server may
// splice into a response for the requested URI.
func TestCheckWire(t *testing.T) {
	const uri = "at://did:plc:abc/app.bsky.feed.post/3k1"
	ts := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	good, err := proto.Marshal(ToProto(store.Record{URI: uri, CID: "bafy", JSON: []byte(`{"$type":"app.bsky.feed.post"}`), CreatedAt: ts, IndexedAt: ts}, true))
	if err != nil {
		t.Fatal(err)
	}
	notFound, _ := proto.Marshal(ToProto(store.Record{URI: uri}, false))
	other, _ := proto.Marshal(ToProto(store.Record{URI: uri + "x", CID: "bafy"}, true))
	badCID, _ := proto.Marshal(ToProto(store.Record{URI: uri}, true))
	badCID = protowire.AppendBytes(protowire.AppendTag(badCID, fieldCID, protowire.BytesType), []byte{0xff, 0xfe})
	wrongType := protowire.AppendVarint(protowire.AppendTag(append([]byte{}, good...), fieldCID, protowire.VarintType), 7)
	badTime := protowire.AppendBytes(protowire.AppendTag(append([]byte{}, good...), fieldCreatedAt, protowire.BytesType),
		protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("x")))
	unknown := protowire.AppendVarint(protowire.AppendTag(append([]byte{}, good...), 99, protowire.VarintType), 1)
	withField := func(num protowire.Number, typ protowire.Type, v []byte) []byte {
		b := protowire.AppendTag(append([]byte{}, good...), num, typ)
		if typ == protowire.VarintType {
			return protowire.AppendVarint(b, 1)
		}
		return protowire.AppendBytes(b, v)
	}
	gatesWith := func(num protowire.Number, typ protowire.Type) []byte {
		g := protowire.AppendTag(nil, num, typ)
		if typ == protowire.VarintType {
			return protowire.AppendVarint(g, 1)
		}
		return protowire.AppendBytes(g, []byte("x"))
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"a record as the cache holds it", good, true},
		{"an unknown field from a newer writer", unknown, true},
		{"found=false", notFound, false},
		{"another URI", other, false},
		{"truncated", good[:len(good)-3], false},
		{"empty", nil, false},
		{"cid not UTF-8", badCID, false},
		{"cid as a varint", wrongType, false},
		{"timestamp seconds as bytes", badTime, false},
		{"a takedown", withField(fieldTakedownRef, protowire.BytesType, []byte("mod-1")), true},
		{"takedown_ref not UTF-8", withField(fieldTakedownRef, protowire.BytesType, []byte{0xff}), false},
		{"takedown_ref as a varint", withField(fieldTakedownRef, protowire.VarintType, nil), false},
		{"a tag", withField(fieldTags, protowire.BytesType, []byte("spam")), true},
		{"a tag not UTF-8", withField(fieldTags, protowire.BytesType, []byte{'a', 0xc3}), false},
		{"gates", withField(fieldGates, protowire.BytesType, gatesWith(1, protowire.VarintType)), true},
		{"gates as a varint", withField(fieldGates, protowire.VarintType, nil), false},
		{"a gate as bytes", withField(fieldGates, protowire.BytesType, gatesWith(3, protowire.BytesType)), false},
		{"found as bytes", withField(fieldFound, protowire.BytesType, []byte{1}), false},
	} {
		if got := checkWire(uri, tc.b); got != tc.want {
			t.Errorf("%s: checkWire = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Tests that checkWire's schema (postRecordFields) is sluice.v1.PostRecord
// as generated: every field of the message has the kind its declared type
// needs, and no number the message lacks is checked as a known field. A
// field added to the message without a kind here fails this test, instead
// of passing into responses unchecked.
func TestCheckWireKnowsEveryField(t *testing.T) {
	fields := (&sluicev1.PostRecord{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		want := kindOf(t, f)
		if f.Number() == fieldURI {
			want = uriField
		}
		if got := kindAt(f.Number()); got != want {
			t.Errorf("field %s (%d): checkWire checks it as kind %d, want %d", f.Name(), f.Number(), got, want)
		}
	}
	for num, kind := range postRecordFields {
		if kind != unknownField && fields.ByNumber(protowire.Number(num)) == nil {
			t.Errorf("checkWire checks field %d, which sluice.v1.PostRecord does not have", num)
		}
	}
	// The nested messages checkWire reads as varints only.
	for _, tc := range []struct {
		msg   protoreflect.MessageDescriptor
		known protowire.Number
	}{
		{(&timestamppb.Timestamp{}).ProtoReflect().Descriptor(), 2},
		{(&sluicev1.PostGates{}).ProtoReflect().Descriptor(), 4},
	} {
		nested := tc.msg.Fields()
		if nested.Len() != int(tc.known) {
			t.Errorf("%s has %d fields; checkWire checks %d", tc.msg.FullName(), nested.Len(), tc.known)
		}
		for i := range nested.Len() {
			f := nested.Get(i)
			if f.Number() > tc.known || !isVarint(f.Kind()) {
				t.Errorf("%s.%s (%d, %s): checkWire reads fields 1 to %d as varints", tc.msg.FullName(), f.Name(), f.Number(), f.Kind(), tc.known)
			}
		}
	}
}

func kindAt(num protowire.Number) fieldKind {
	if int(num) < len(postRecordFields) {
		return postRecordFields[num]
	}
	return unknownField
}

// kindOf is the fieldKind a field of f's declared type needs.
func kindOf(t *testing.T, f protoreflect.FieldDescriptor) fieldKind {
	switch f.Kind() {
	case protoreflect.BoolKind:
		return boolField
	case protoreflect.StringKind:
		return stringField
	case protoreflect.BytesKind:
		return bytesField
	case protoreflect.MessageKind:
		switch f.Message().FullName() {
		case "google.protobuf.Timestamp":
			return timestampField
		case "sluice.v1.PostGates":
			return gatesField
		}
	}
	t.Errorf("field %s of type %s: checkWire has no kind for it", f.Name(), f.Kind())
	return unknownField
}

func isVarint(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.BoolKind, protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.EnumKind:
		return true
	}
	return false
}

// Tests the property the splice rests on: whatever bytes checkWire
// accepts, a client's decoder decodes, as the record asked for. A full
// record (every field set) is mutated at random, many times over, and
// each mutation checkWire accepts is decoded.
func TestCheckWireAcceptsOnlyWhatDecodes(t *testing.T) {
	const uri = "at://did:plc:abc/app.bsky.feed.post/3k1"
	ts := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	full, err := proto.Marshal(ToProto(store.Record{URI: uri, CID: "bafyé", JSON: []byte(`{"text":"hé"}`), CreatedAt: ts, IndexedAt: ts,
		TakedownRef: "mod-é", Tags: []string{"spam", "sé"}, Gates: store.Gates{HasThreadGate: true, ViolatesEmbeddingRules: true}}, true))
	if err != nil {
		t.Fatal(err)
	}
	if !checkWire(uri, full) {
		t.Fatal("checkWire refuses a full record")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for i := range 200_000 {
		b := mutate(rng, full)
		if !checkWire(uri, b) {
			continue
		}
		accepted++
		var pr sluicev1.PostRecord
		if err := proto.Unmarshal(b, &pr); err != nil {
			t.Fatalf("mutation %d: checkWire accepted %x, which does not decode: %v", i, b, err)
		}
		if pr.GetUri() != uri || !pr.GetFound() {
			t.Fatalf("mutation %d: checkWire accepted %x, which decodes as uri %q found %v", i, b, pr.GetUri(), pr.GetFound())
		}
	}
	if accepted == 0 {
		t.Fatal("no mutation was accepted: the test shows nothing")
	}
	t.Logf("%d of 200000 mutations accepted, each decoded", accepted)
}

// mutate returns a copy of b with one to three random changes: a byte
// set, one removed, or one inserted.
func mutate(rng *rand.Rand, b []byte) []byte {
	out := append([]byte{}, b...)
	for range 1 + rng.IntN(3) {
		at := rng.IntN(len(out) + 1)
		switch op := rng.IntN(3); {
		case op == 0 && at < len(out):
			out[at] = mutantByte(rng)
		case op == 1 && at < len(out):
			out = append(out[:at], out[at+1:]...)
		default:
			out = append(out[:at], append([]byte{mutantByte(rng)}, out[at:]...)...)
		}
	}
	return out
}

// mutantByte favours the bytes that break UTF-8 and wire types.
func mutantByte(rng *rand.Rand) byte {
	interesting := []byte{0x00, 0x01, 0x02, 0x7f, 0x80, 0xc3, 0xe2, 0xff, 0x0a, 0x12, 0x3a, 0x42, 0x4a, 0x38, 0x40, 0x48}
	if rng.IntN(2) == 0 {
		return interesting[rng.IntN(len(interesting))]
	}
	return byte(rng.IntN(256))
}
