package posts

import (
	"testing"
	"time"

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
	} {
		if got := checkWire(uri, tc.b); got != tc.want {
			t.Errorf("%s: checkWire = %v, want %v", tc.name, got, tc.want)
		}
	}
}
