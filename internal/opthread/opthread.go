// Package opthread keeps the OP-reply index of threads and resolves a
// thread's canonical OP thread from it, as the AppView's reference data
// plane does with its op_thread_reply table:
//
//   - a post is an OP reply when it has a reply parent and its author is
//     the author of its reply root (wherever in the tree it replies);
//   - the index of a root lists its OP replies (uri, parent) in the order
//     written; a deleted reply keeps its entry, marked with when it was
//     deleted, so the walk can still route through it;
//   - Resolve picks the oldest contiguous line of OP replies from the root.
//
// The index is stored as a record of the pseudo-collection Collection,
// keyed by the root's author and record key, beside the posts; no
// bsky.Service method reads that collection. Package opthread decodes and
// changes indexes; it does not read or write the store (package records
// writes indexes, package bskyrpc reads them).
package opthread

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/aturi"
)

// Collection is the NSID the indexes are stored under.
const Collection = "dev.sluice.opthread"

// Reply is one OP reply of a thread.
type Reply struct {
	URI       string    `json:"uri"`
	Parent    string    `json:"parent"`
	DeletedAt time.Time `json:"deletedAt,omitzero"`
}

// Index is the stored form of a root's OP replies.
type Index struct {
	Type    string  `json:"$type"`
	Replies []Reply `json:"replies"`
}

// Decode reads a stored index; empty or undecodable JSON is an empty one.
func Decode(body []byte) Index {
	var idx Index
	_ = json.Unmarshal(body, &idx)
	idx.Type = Collection
	return idx
}

// Encode is the stored form of idx.
func (idx Index) Encode() []byte {
	idx.Type = Collection
	b, _ := json.Marshal(idx) // strings and times: cannot fail
	return b
}

// Add records r unless the index already holds its URI (as the reference
// indexer's insert does nothing on conflict); it reports whether it added.
func (idx *Index) Add(r Reply) bool {
	if slices.ContainsFunc(idx.Replies, func(x Reply) bool { return x.URI == r.URI }) {
		return false
	}
	idx.Replies = append(idx.Replies, r)
	return true
}

// deletionBytes bounds how much a reply's stored entry grows when it is
// marked deleted: a deletedAt field holding an RFC 3339 time.
const deletionBytes = len(`,"deletedAt":""`) + len(time.RFC3339Nano)

// Size bounds the stored form of idx as its replies are deleted: its
// encoding, with room to mark every reply not yet deleted. An index whose
// Size is within a limit stays within it, whichever replies are deleted.
func (idx Index) Size() int {
	n := len(idx.Encode())
	for _, r := range idx.Replies {
		if r.DeletedAt.IsZero() {
			n += deletionBytes
		}
	}
	return n
}

// AddWithin adds, in order, the replies of rs the index does not hold, as
// Add does, while its Size stays within limit: the replies past the first
// that does not fit are not added. It reports whether it added any.
func (idx *Index) AddWithin(rs []Reply, limit int) bool {
	size := idx.Size()
	added := false
	for _, r := range rs {
		if slices.ContainsFunc(idx.Replies, func(x Reply) bool { return x.URI == r.URI }) {
			continue
		}
		entry, _ := json.Marshal(r) // strings and times: cannot fail
		grow := len(entry) + 1      // and a comma
		if r.DeletedAt.IsZero() {
			grow += deletionBytes
		}
		if size+grow > limit {
			break
		}
		idx.Replies = append(idx.Replies, r)
		size += grow
		added = true
	}
	return added
}

// MarkDeleted notes that the reply uri was deleted at; it reports whether
// the index held the reply undeleted.
func (idx *Index) MarkDeleted(uri string, at time.Time) bool {
	for i := range idx.Replies {
		if idx.Replies[i].URI == uri && idx.Replies[i].DeletedAt.IsZero() {
			idx.Replies[i].DeletedAt = at.UTC()
			return true
		}
	}
	return false
}

// post is the part of a post its thread position depends on.
type post struct {
	Reply *struct {
		Root struct {
			URI string `json:"uri"`
		} `json:"root"`
		Parent struct {
			URI string `json:"uri"`
		} `json:"parent"`
	} `json:"reply"`
}

// RootOf is the thread root of the post u with body: its reply root, or
// the post itself when it is not a reply.
func RootOf(u string, body []byte) string {
	var p post
	if json.Unmarshal(body, &p) == nil && p.Reply != nil && p.Reply.Root.URI != "" {
		return p.Reply.Root.URI
	}
	return u
}

// OPReply reports whether the post u with body is an OP reply, and if so
// the URI of its root's index and the reply to add to it. A root that is
// not a post AT-URI, or whose index URI would be longer than a record can
// be stored under, has no index.
func OPReply(u aturi.URI, body []byte) (index string, r Reply, ok bool) {
	var p post
	if json.Unmarshal(body, &p) != nil || p.Reply == nil || p.Reply.Parent.URI == "" {
		return "", Reply{}, false
	}
	root, err := aturi.ParseIn(p.Reply.Root.URI, aturi.PostCollection)
	if err != nil || root.DID != u.DID {
		return "", Reply{}, false
	}
	index = IndexOf(root)
	if len(index) > aturi.MaxStoredLength {
		return "", Reply{}, false // no index can be stored under it
	}
	return index, Reply{URI: u.String(), Parent: p.Reply.Parent.URI}, true
}

// IndexOf is the URI of the index of the thread rooted at root.
func IndexOf(root aturi.URI) string {
	return aturi.URI{DID: root.DID, Collection: Collection, RKey: root.RKey}.String()
}

// Resolve returns the canonical OP thread of root: the root followed by
// the oldest contiguous line of OP replies, or nil when it has none. A
// deleted reply keeps its place while replies below it survive; once
// nothing survives below it, only a reply whose record key (a TID) dates
// after the deletion may claim the vacated place. Replies of one parent
// are taken in record-key order. An index with a cycle resolves to nil.
func Resolve(root string, replies []Reply) []string {
	byParent := map[string][]string{}
	deletedAt := map[string]time.Time{}
	for _, r := range replies {
		byParent[r.Parent] = append(byParent[r.Parent], r.URI)
		if !r.DeletedAt.IsZero() {
			deletedAt[r.URI] = r.DeletedAt
		}
	}
	for _, siblings := range byParent {
		slices.Sort(siblings)
	}
	w := walk{byParent: byParent, deletedAt: deletedAt, visited: map[string]bool{root: true}, valid: true}
	chain := append([]string{root}, w.resolve(root)...)
	if !w.valid || len(chain) < 2 {
		return nil
	}
	return chain
}

type walk struct {
	byParent  map[string][]string
	deletedAt map[string]time.Time
	visited   map[string]bool
	valid     bool
}

func (w *walk) resolve(parent string) []string {
	var vacatedAt time.Time
	for _, reply := range w.byParent[parent] {
		if w.visited[reply] {
			w.valid = false
			return nil
		}
		if !vacatedAt.IsZero() && !createdAfter(reply, vacatedAt) {
			continue
		}
		w.visited[reply] = true
		below := w.resolve(reply)
		if !w.valid {
			return nil
		}
		deleted, isDeleted := w.deletedAt[reply]
		if !isDeleted || len(below) > 0 {
			return append([]string{reply}, below...)
		}
		delete(w.visited, reply)
		if deleted.After(vacatedAt) {
			vacatedAt = deleted
		}
	}
	return nil
}

// createdAfter reports whether the post uri's record key, a TID, dates
// after t. An rkey that is not a TID is not after anything.
func createdAfter(uri string, t time.Time) bool {
	u, err := aturi.Parse(uri)
	if err != nil {
		return false
	}
	micros, ok := tidMicros(u.RKey)
	// Deletion times are kept to the millisecond, as the reference's are.
	return ok && micros > t.UnixMilli()*1000
}

// tidAlphabet is the base32-sortable alphabet of TIDs.
const tidAlphabet = "234567abcdefghijklmnopqrstuvwxyz"

// tidMicros decodes the microsecond timestamp of a 13-character TID: the
// top 53 of its 65 bits (the first bit is zero, the last ten a clock id).
func tidMicros(s string) (int64, bool) {
	if len(s) != 13 {
		return 0, false
	}
	var v uint64
	for i := range len(s) {
		d := strings.IndexByte(tidAlphabet, s[i])
		if d < 0 || (i == 0 && d >= 16) {
			return 0, false
		}
		v = v<<5 | uint64(d)
	}
	return int64(v >> 10), true
}
