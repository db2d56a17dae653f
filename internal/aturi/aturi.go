// Package aturi parses and checks AT-URIs of records, the keys sluice
// serves: at://<did>/<collection>/<rkey>.
//
// It accepts exactly the record URIs the AT Protocol allows for did:plc
// and did:web repositories, with a collection NSID and a record key, and
// nothing else: no handles in the authority, no query or fragment, no
// whitespace or control bytes. It does not resolve DIDs or check that a
// record exists.
package aturi

import (
	"errors"
	"fmt"
	"strings"
)

// PostCollection is the NSID of post records.
const PostCollection = "app.bsky.feed.post"

// MaxLength is the longest AT-URI the protocol allows, in bytes.
const MaxLength = 8 * 1024

// MaxStoredLength is the longest URI a record can be stored under, in
// bytes: the store backends' limit. Records, and the records sluice
// derives from them (OP-thread indexes, social-graph edges), with longer
// URIs cannot be written.
const MaxStoredLength = 512

// URI is a parsed record AT-URI.
type URI struct {
	DID        string
	Collection string
	RKey       string
}

// String returns the canonical form, at://did/collection/rkey.
func (u URI) String() string { return "at://" + u.DID + "/" + u.Collection + "/" + u.RKey }

// Errors wrapped by Parse, for callers that need the class of a failure.
var (
	ErrSyntax     = errors.New("aturi: malformed AT-URI")
	ErrCollection = errors.New("aturi: wrong collection")
)

// Parse parses s as a record AT-URI.
func Parse(s string) (URI, error) { return parse(s, "") }

// ParseIn parses s and requires its collection to be collection, which
// must be a valid NSID (every caller passes one of the package's
// constants). It fails as Parse would, in the same order, and then for
// the collection; a URI in collection does not have its NSID checked
// again, since collection is valid: the read path parses every URI of
// every batch through here.
func ParseIn(s, collection string) (URI, error) {
	u, err := parse(s, collection)
	if err != nil {
		return URI{}, err
	}
	if u.Collection != collection {
		return URI{}, fmt.Errorf("%w: collection is %q, want %q", ErrCollection, u.Collection, collection)
	}
	return u, nil
}

// CheckCollection reports whether nsid is a valid collection NSID, the
// middle part of a record AT-URI.
func CheckCollection(nsid string) error { return checkNSID(nsid) }

// parse parses s as a record AT-URI, without checking again the NSID of
// a collection equal to known, a valid one ("" for none).
func parse(s, known string) (URI, error) {
	if len(s) > MaxLength {
		return URI{}, fmt.Errorf("%w: %d bytes, over %d", ErrSyntax, len(s), MaxLength)
	}
	rest, ok := strings.CutPrefix(s, "at://")
	if !ok {
		return URI{}, fmt.Errorf("%w: must start with at://", ErrSyntax)
	}
	if n := strings.Count(rest, "/") + 1; n != 3 {
		return URI{}, fmt.Errorf("%w: want at://<did>/<collection>/<rkey>, got %d path segments", ErrSyntax, n)
	}
	var u URI
	u.DID, rest, _ = strings.Cut(rest, "/")
	u.Collection, u.RKey, _ = strings.Cut(rest, "/")
	if err := checkDID(u.DID); err != nil {
		return URI{}, err
	}
	if known == "" || u.Collection != known {
		if err := checkNSID(u.Collection); err != nil {
			return URI{}, err
		}
	}
	if err := checkRKey(u.RKey); err != nil {
		return URI{}, err
	}
	return u, nil
}

// checkDID accepts did:plc:<24 base32 chars> and did:web:<hostname>.
func checkDID(did string) error {
	switch {
	case strings.HasPrefix(did, "did:plc:"):
		id := did[len("did:plc:"):]
		if len(id) != 24 || !allBytes(id, isBase32) {
			return fmt.Errorf("%w: did:plc identifier must be 24 characters of a-z and 2-7", ErrSyntax)
		}
	case strings.HasPrefix(did, "did:web:"):
		if !isHostname(did[len("did:web:"):]) {
			return fmt.Errorf("%w: did:web identifier must be a hostname", ErrSyntax)
		}
	default:
		return fmt.Errorf("%w: authority must be a did:plc or did:web DID", ErrSyntax)
	}
	return nil
}

// checkNSID accepts a namespaced identifier such as app.bsky.feed.post:
// at least three dot-separated segments, a reversed domain then a name.
func checkNSID(nsid string) error {
	n := strings.Count(nsid, ".") + 1
	if len(nsid) > 317 || n < 3 {
		return fmt.Errorf("%w: collection %q is not an NSID", ErrSyntax, clip(nsid))
	}
	i := 0
	for seg := range strings.SplitSeq(nsid, ".") {
		last := i == n-1
		i++
		if seg == "" || len(seg) > 63 || (last && !allBytes(seg, isAlnum)) || (!last && !isLabel(seg)) {
			return fmt.Errorf("%w: collection %q is not an NSID", ErrSyntax, clip(nsid))
		}
	}
	return nil
}

// checkRKey applies the record-key syntax: 1–512 of A-Za-z0-9 . _ ~ : -
// and not "." or "..".
func checkRKey(rkey string) error {
	if rkey == "" || len(rkey) > 512 || rkey == "." || rkey == ".." || !allBytes(rkey, isRKeyByte) {
		return fmt.Errorf("%w: record key %q is not valid (1-512 of A-Z a-z 0-9 . _ ~ : -)", ErrSyntax, clip(rkey))
	}
	return nil
}

func isHostname(h string) bool {
	if len(h) > 253 || !strings.Contains(h, ".") {
		return false
	}
	for l := range strings.SplitSeq(h, ".") {
		if !isLabel(l) {
			return false
		}
	}
	return true
}

func isLabel(l string) bool {
	return l != "" && len(l) <= 63 && l[0] != '-' && l[len(l)-1] != '-' &&
		allBytes(l, func(c byte) bool { return isAlnum(c) || c == '-' })
}

func allBytes(s string, ok func(byte) bool) bool {
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return true
}

func isBase32(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= '2' && c <= '7') }
func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}
func isRKeyByte(c byte) bool {
	return isAlnum(c) || c == '.' || c == '_' || c == '~' || c == ':' || c == '-'
}

// clip shortens a fragment quoted in an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
