package boltstore

import (
	"errors"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// Tests that encodeValue and decodeValue round-trip every field, including
// zero and pre-1970 times.
func TestEncodingRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		rec  store.Record
	}{
		{"typical", rec(1)},
		{"zero times and empty CID", store.Record{JSON: []byte(`{}`)}},
		{"before 1970", store.Record{CID: "c", JSON: []byte(`[]`), CreatedAt: time.Date(1969, 7, 20, 20, 17, 0, 999, time.UTC)}},
		{"moderation and gates", store.Record{CID: "c", JSON: []byte(`{}`), TakedownRef: "t:1", Tags: []string{"a", "bb"},
			Gates: store.Gates{HasPostGate: true, ViolatesThreadGate: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeValue(encodeValue(tt.rec))
			if err != nil {
				t.Fatalf("decodeValue: %v", err)
			}
			got.URI = tt.rec.URI
			if !sameRecord(got, tt.rec) {
				t.Fatalf("round trip = %+v, want %+v", got, tt.rec)
			}
		})
	}
}

// Tests that a version 1 value, written before moderation state existed,
// still decodes, as a record with none.
func TestDecodeVersion1(t *testing.T) {
	want := rec(1)
	v := encodeValue(want)
	// Version 1 is version 2 without the trailing moderation and gate
	// fields: an empty takedown, no tags, no flags (three bytes).
	v1 := append([]byte{encodingV1}, v[1:len(v)-3]...)
	got, err := decodeValue(v1)
	if err != nil {
		t.Fatalf("decodeValue(v1): %v", err)
	}
	got.URI = want.URI
	if !sameRecord(got, want) || got.TakedownRef != "" || got.Tags != nil || got.Gates != (store.Gates{}) {
		t.Fatalf("v1 decoded as %+v", got)
	}
}

// Tests that every truncation of a valid value, and trailing garbage, is
// reported as corrupt instead of decoding to a wrong record.
func TestDecodeCorrupt(t *testing.T) {
	v := encodeValue(rec(1))
	for n := range len(v) {
		if _, err := decodeValue(v[:n]); !errors.Is(err, errCorrupt) {
			t.Errorf("decodeValue(first %d of %d bytes) error = %v, want errCorrupt", n, len(v), err)
		}
	}
	if _, err := decodeValue(append(v[:len(v):len(v)], 0)); !errors.Is(err, errCorrupt) {
		t.Errorf("decodeValue(trailing byte) error = %v, want errCorrupt", err)
	}
}

// Tests that appending to a decoded CID-adjacent JSON slice cannot reach
// into memory beyond it.
func TestDecodedJSONHasNoSpareCapacity(t *testing.T) {
	r, err := decodeValue(encodeValue(rec(1)))
	if err != nil {
		t.Fatalf("decodeValue: %v", err)
	}
	if len(r.JSON) != cap(r.JSON) {
		t.Fatalf("decoded JSON len %d cap %d, want equal", len(r.JSON), cap(r.JSON))
	}
}
