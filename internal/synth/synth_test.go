package synth

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/store"
)

func TestPostsAreRealistic(t *testing.T) {
	g := New(1, 50)
	seen := map[string]bool{}
	for range 2000 {
		r := g.Next()
		if _, err := aturi.ParseIn(r.URI, aturi.PostCollection); err != nil {
			t.Fatalf("bad uri %q: %v", r.URI, err)
		}
		if seen[r.URI] {
			t.Fatalf("duplicate uri %q", r.URI)
		}
		seen[r.URI] = true
		if n := len(r.JSON); n < 100 || n > 3000 {
			t.Errorf("record %s is %d bytes, want 100..3000", r.URI, n)
		}
		var p map[string]any
		if err := json.Unmarshal(r.JSON, &p); err != nil {
			t.Fatalf("record %s: %v", r.URI, err)
		}
		if err := checkPostFields(p); err != nil {
			t.Errorf("record %s: %v: %s", r.URI, err, r.JSON)
		}
	}
	if miss := g.MissingURI(); seen[miss] {
		t.Errorf("MissingURI %q was generated", miss)
	} else if _, err := aturi.Parse(miss); err != nil {
		t.Errorf("MissingURI %q: %v", miss, err)
	}
}

// checkPostFields reports the first field of an app.bsky.feed.post record
// that is missing, of the wrong JSON type or empty.
func checkPostFields(p map[string]any) error {
	if p["$type"] != "app.bsky.feed.post" {
		return fmt.Errorf("$type is %v, want app.bsky.feed.post", p["$type"])
	}
	if text, ok := p["text"].(string); !ok || text == "" {
		return fmt.Errorf("text is %#v, want a non-empty string", p["text"])
	}
	created, ok := p["createdAt"].(string)
	if !ok {
		return fmt.Errorf("createdAt is %#v, want a string", p["createdAt"])
	}
	if _, err := time.Parse(time.RFC3339, created); err != nil {
		return fmt.Errorf("createdAt: %w", err)
	}
	if langs, ok := p["langs"].([]any); !ok || len(langs) == 0 {
		return fmt.Errorf("langs is %#v, want a non-empty list", p["langs"])
	}
	return nil
}

// Tests that checkPostFields refuses each field missing or empty.
func TestCheckPostFields(t *testing.T) {
	good := func() map[string]any {
		return map[string]any{"$type": "app.bsky.feed.post", "text": "hi", "createdAt": "2024-01-02T03:04:05Z", "langs": []any{"en"}}
	}
	if err := checkPostFields(good()); err != nil {
		t.Fatalf("a complete post: %v", err)
	}
	for _, field := range []string{"$type", "text", "createdAt", "langs"} {
		for name, v := range map[string]any{"missing": nil, "empty": ""} {
			p := good()
			if v == nil {
				delete(p, field)
			} else {
				p[field] = v
			}
			if err := checkPostFields(p); err == nil {
				t.Errorf("a post with %s %s passed", name, field)
			}
		}
	}
}

func TestDeterministic(t *testing.T) {
	a, b := New(7, 3), New(7, 3)
	for range 10 {
		if x, y := a.Next(), b.Next(); x.URI != y.URI || string(x.JSON) != string(y.JSON) {
			t.Fatalf("same seed differs: %s vs %s", x.URI, y.URI)
		}
	}
}

// Tests that synthetic CIDs are well-formed CIDv1 strings: base32
// multibase, version 1, dag-cbor, a 32-byte sha-256 digest.
func TestCIDsAreWellFormed(t *testing.T) {
	g := New(3, 5)
	for _, r := range []store.Record{g.Next(), g.NextIn(LikeCollection), g.NextIn(ProfileCollection)} {
		if !strings.HasPrefix(r.CID, "bafyrei") {
			t.Errorf("%s: cid %q does not start like a dag-cbor sha-256 CIDv1", r.URI, r.CID)
			continue
		}
		raw, err := plcEncoding.DecodeString(r.CID[1:])
		if err != nil {
			t.Fatalf("%s: cid %q: %v", r.URI, r.CID, err)
		}
		if len(raw) != 36 || raw[0] != 0x01 || raw[1] != 0x71 || raw[2] != 0x12 || raw[3] != 0x20 {
			t.Errorf("%s: cid %q decodes to % x, want 01 71 12 20 and a 32-byte digest", r.URI, r.CID, raw[:min(4, len(raw))])
		}
	}
}
