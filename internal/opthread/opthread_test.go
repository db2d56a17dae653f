package opthread

import (
	"slices"
	"testing"
	"time"
)

const did = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"

// uri is the post whose record key is the TID of t.
func uri(t time.Time) string {
	v := uint64(t.UnixMicro()) << 10
	b := make([]byte, 13)
	for i := 12; i >= 0; i-- {
		b[i] = tidAlphabet[v&31]
		v >>= 5
	}
	return "at://" + did + "/app.bsky.feed.post/" + string(b)
}

// Tests the canonical OP thread the way the reference resolves it: the
// oldest contiguous line; a deleted reply keeps its place while a reply
// below it survives; a vacated place goes only to a reply written after
// the deletion; no OP replies, or a cycle, give none.
func TestResolve(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }
	root, a, b, c, late := uri(at(0)), uri(at(1)), uri(at(2)), uri(at(3)), uri(at(10))
	if m, ok := tidMicros(root[len(root)-13:]); !ok || m != at(0).UnixMicro() {
		t.Fatalf("tidMicros = %d, %v; want %d", m, ok, at(0).UnixMicro())
	}
	cases := []struct {
		name    string
		replies []Reply
		want    []string
	}{
		{"none", nil, nil},
		{"chain", []Reply{{URI: b, Parent: a}, {URI: a, Parent: root}}, []string{root, a, b}},
		{"oldest sibling", []Reply{{URI: c, Parent: root}, {URI: a, Parent: root}, {URI: b, Parent: c}}, []string{root, a}},
		{"deleted keeps its place", []Reply{{URI: a, Parent: root, DeletedAt: at(5)}, {URI: b, Parent: a}}, []string{root, a, b}},
		{"vacated, older sibling", []Reply{{URI: a, Parent: root, DeletedAt: at(5)}, {URI: b, Parent: root}}, nil},
		{"vacated, newer sibling", []Reply{{URI: a, Parent: root, DeletedAt: at(5)}, {URI: late, Parent: root}}, []string{root, late}},
		{"cycle", []Reply{{URI: a, Parent: root}, {URI: b, Parent: a}, {URI: a, Parent: b}}, nil},
	}
	for _, tc := range cases {
		if got := Resolve(root, tc.replies); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Resolve = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Tests that the index keeps one entry per reply, marks deletions once,
// and survives its stored form.
func TestIndex(t *testing.T) {
	var idx Index
	if !idx.Add(Reply{URI: "x", Parent: "r"}) || idx.Add(Reply{URI: "x", Parent: "other"}) {
		t.Error("Add: want the first added, the second (same URI) not")
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if !idx.MarkDeleted("x", at) || idx.MarkDeleted("x", at) || idx.MarkDeleted("y", at) {
		t.Error("MarkDeleted: want only the first mark of a held reply")
	}
	got := Decode(idx.Encode())
	if len(got.Replies) != 1 || got.Replies[0] != (Reply{URI: "x", Parent: "r", DeletedAt: at}) || got.Type != Collection {
		t.Errorf("round trip = %+v", got)
	}
}
