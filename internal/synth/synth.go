// Package synth makes synthetic but realistic post records for seeding
// and load tests: did:plc authors, TID record keys, and app.bsky.feed.post
// JSON of 100–3,000 bytes with text, createdAt, langs, and now and then a
// reply, an image embed or a video embed.
//
// Output is deterministic for a given seed, so tests and benchmarks can
// regenerate the same dataset. Synth does not write anywhere.
package synth

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// Generator produces posts from a deterministic random source.
type Generator struct {
	rng     *rand.Rand
	authors []string
	clock   time.Time
	seq     uint64
}

// New returns a Generator for seed with the given number of distinct
// authors (at least one).
func New(seed uint64, authors int) *Generator {
	g := &Generator{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), clock: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	for range max(authors, 1) {
		g.authors = append(g.authors, g.did())
	}
	return g
}

const base32Sortable = "234567abcdefghijklmnopqrstuvwxyz"

var plcEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// did returns a did:plc identifier: 24 characters of base32.
func (g *Generator) did() string {
	var b [15]byte
	for i := range b {
		b[i] = byte(g.rng.UintN(256))
	}
	return "did:plc:" + plcEncoding.EncodeToString(b[:])[:24]
}

// tid returns a timestamp identifier: 13 base32-sortable characters of
// microseconds since the epoch and a clock id.
func tid(t time.Time, clockID uint64) string {
	v := uint64(t.UnixMicro())<<10 | clockID&0x3ff
	var out [13]byte
	for i := 12; i >= 0; i-- {
		out[i] = base32Sortable[v&31]
		v >>= 5
	}
	return string(out[:])
}

// Next returns the next post.
func (g *Generator) Next() store.Record {
	g.seq++
	g.clock = g.clock.Add(time.Duration(1+g.rng.IntN(5000)) * time.Millisecond)
	author := g.authors[g.rng.IntN(len(g.authors))]
	uri := fmt.Sprintf("at://%s/app.bsky.feed.post/%s", author, tid(g.clock, g.seq))
	body := g.record(uri)
	return store.Record{
		URI:       uri,
		CID:       cidFor(body),
		JSON:      body,
		CreatedAt: g.clock,
		IndexedAt: g.clock.Add(time.Duration(g.rng.IntN(2000)) * time.Millisecond),
	}
}

// cidFor returns a well-formed CIDv1 (dag-cbor codec, sha-256 multihash)
// over body, in the base32 multibase form records carry ("bafyrei…"), so
// clients that parse CIDs, as the AppView does, accept it. Real CIDs hash
// the record's DAG-CBOR encoding; the JSON stands in for it here.
func cidFor(body []byte) string {
	sum := sha256.Sum256(body)
	raw := append([]byte{0x01, 0x71, 0x12, 0x20}, sum[:]...)
	return "b" + plcEncoding.EncodeToString(raw)
}

// MissingURI returns a well-formed post URI that Next never produces.
func (g *Generator) MissingURI() string {
	return fmt.Sprintf("at://%s/app.bsky.feed.post/%s", g.did(), tid(g.clock.Add(-time.Hour*24*365), g.rng.Uint64()))
}

type post struct {
	Type      string          `json:"$type"`
	Text      string          `json:"text"`
	CreatedAt string          `json:"createdAt"`
	Langs     []string        `json:"langs"`
	Reply     *reply          `json:"reply,omitempty"`
	Embed     json.RawMessage `json:"embed,omitempty"`
}

type strongRef struct {
	URI string `json:"uri"`
	CID string `json:"cid"`
}

type reply struct {
	Root   strongRef `json:"root"`
	Parent strongRef `json:"parent"`
}

var words = strings.Fields(`the a of and to in is it that for on with as was at by this be from or have an
they which one you had not but what all were when we there can been has more if no out do so would up
about into than them could only other new some time these two may first then any like our over such
feed post reply thread media image video link today people night morning coffee music photo garden
river city train book read write code ship deploy cache memory batch client server`)

var langs = []string{"en", "en", "en", "ja", "pt", "de", "es", "fr", "ko"}

// record returns the JSON of one post, 100–3,000 bytes.
func (g *Generator) record(uri string) []byte {
	p := post{
		Type:      "app.bsky.feed.post",
		CreatedAt: g.clock.Format(time.RFC3339Nano),
		Langs:     []string{langs[g.rng.IntN(len(langs))]},
	}
	target := 100 + g.rng.IntN(2900)
	switch r := g.rng.IntN(10); {
	case r == 0:
		parent := strongRef{URI: fmt.Sprintf("at://%s/app.bsky.feed.post/%s", g.authors[g.rng.IntN(len(g.authors))], tid(g.clock.Add(-time.Minute), 1)), CID: "bafyreiparent"}
		p.Reply = &reply{Root: parent, Parent: parent}
	case r == 1:
		p.Embed = json.RawMessage(`{"$type":"app.bsky.embed.images","images":[{"alt":"","image":{"$type":"blob","ref":{"$link":"bafkreiimage"},"mimeType":"image/jpeg","size":123456}}]}`)
	case r == 2:
		p.Embed = json.RawMessage(`{"$type":"app.bsky.embed.video","video":{"$type":"blob","ref":{"$link":"bafkreivideo"},"mimeType":"video/mp4","size":2345678}}`)
	}
	base, _ := json.Marshal(p)
	p.Text = g.text(max(target-len(base), 1))
	out, _ := json.Marshal(p)
	return out
}

func (g *Generator) text(n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[g.rng.IntN(len(words))])
	}
	return b.String()[:n]
}
