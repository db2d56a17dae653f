// Package socialgraph keeps the two edges of the social graph that
// thread-gate rules ask about — who follows whom, and who is on which
// list — as records that a point read can find, because the store is
// keyed by record URI and cannot query follow or list-item records by
// their subject the way the reference data plane's tables can:
//
//   - while creator has a follow record (app.bsky.graph.follow) of
//     subject, the edge record at://creator/Collection/f:subject exists
//     and lists those follow records' URIs;
//   - while a list-item record (app.bsky.graph.listitem) puts subject on
//     the list at://owner/app.bsky.graph.list/rkey, the edge record
//     at://owner/Collection/l:rkey:subject exists and lists the items.
//
// An edge with no record URIs left is absent. Package socialgraph names
// edges and changes their stored form; it does not read or write the
// store (package records does).
package socialgraph

import (
	"encoding/json"
	"slices"

	"github.com/sluice-dev/sluice/internal/aturi"
)

// Collection is the NSID edge records are stored under; no bsky.Service
// method reads it.
const Collection = "dev.sluice.socialgraph"

// The collections whose records are edges.
const (
	FollowCollection   = "app.bsky.graph.follow"
	ListItemCollection = "app.bsky.graph.listitem"
	ListCollection     = "app.bsky.graph.list"
)

// Follows returns the URI of the edge "creator follows subject"; ok is
// false when no edge can be named (a DID that is not a valid record key,
// or an edge URI longer than a record can be stored under).
func Follows(creator, subject string) (uri string, ok bool) {
	return edge(creator, "f:"+subject)
}

// OnList returns the URI of the edge "subject is on the list listURI".
func OnList(listURI, subject string) (uri string, ok bool) {
	list, err := aturi.ParseIn(listURI, ListCollection)
	if err != nil {
		return "", false
	}
	return edge(list.DID, "l:"+list.RKey+":"+subject)
}

func edge(did, rkey string) (string, bool) {
	u := aturi.URI{DID: did, Collection: Collection, RKey: rkey}
	if _, err := aturi.Parse(u.String()); err != nil || len(u.String()) > aturi.MaxStoredLength {
		return "", false
	}
	return u.String(), true
}

// EdgeOf returns the edge the follow or list-item record u (with body)
// makes, or ok false for any other record or one without a usable subject.
func EdgeOf(u aturi.URI, body []byte) (uri string, ok bool) {
	var rec struct {
		Subject string `json:"subject"`
		List    string `json:"list"`
	}
	if json.Unmarshal(body, &rec) != nil || rec.Subject == "" {
		return "", false
	}
	switch u.Collection {
	case FollowCollection:
		return Follows(u.DID, rec.Subject)
	case ListItemCollection:
		if l, err := aturi.ParseIn(rec.List, ListCollection); err != nil || l.DID != u.DID {
			return "", false // only a list's owner puts people on it
		}
		return OnList(rec.List, rec.Subject)
	}
	return "", false
}

// Edge is the stored form of one edge: the records that make it.
type Edge struct {
	Type    string   `json:"$type"`
	Records []string `json:"records"`
}

// Decode reads a stored edge; empty or undecodable JSON is an empty one.
func Decode(body []byte) Edge {
	var e Edge
	_ = json.Unmarshal(body, &e)
	e.Type = Collection
	return e
}

// Encode is the stored form of e.
func (e Edge) Encode() []byte {
	e.Type = Collection
	b, _ := json.Marshal(e) // strings only: cannot fail
	return b
}

// Exists reports whether any record still makes the edge.
func (e Edge) Exists() bool { return len(e.Records) > 0 }

// Add notes that the record uri makes the edge; it reports whether it was
// new.
func (e *Edge) Add(uri string) bool {
	if slices.Contains(e.Records, uri) {
		return false
	}
	e.Records = append(e.Records, uri)
	return true
}

// Remove notes that the record uri no longer makes the edge; it reports
// whether it did.
func (e *Edge) Remove(uri string) bool {
	i := slices.Index(e.Records, uri)
	if i < 0 {
		return false
	}
	e.Records = slices.Delete(e.Records, i, i+1)
	return true
}
