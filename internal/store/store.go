// Package store owns the contract every record backend honours: the Record
// type, the Store interface and the sentinel errors callers match with
// errors.Is.
//
// Records are keyed by AT-URI and the store is generic over collections:
// posts, likes and profiles are all just a URI, a CID and a JSON body. The
// package knows nothing of caching, gRPC status codes or any particular
// database; backends live in their own packages (boltstore is the embedded
// default) and prove their conformance with the storetest suite.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Record is one stored record.
//
// Backends keep CreatedAt and IndexedAt to at least microsecond precision;
// finer detail and the time's location may be lost in a round trip, so
// compare times with time.Equal after truncating to a microsecond.
type Record struct {
	URI       string    // AT-URI the record is keyed by, e.g. at://did:plc:abc/app.bsky.feed.post/3k…
	CID       string    // content identifier of this version of the record
	JSON      []byte    // the record's JSON encoding
	CreatedAt time.Time // when the author created the record
	IndexedAt time.Time // when the record was indexed

	// Moderation state, kept beside the record as the AppView's record
	// table keeps it. A record with a TakedownRef is taken down.
	TakedownRef string   // the takedown's reference; empty when not taken down
	Tags        []string // moderation tags, in the order written

	// Gates is derived state of a post, computed by the writer when the
	// post or one of its gate records is written; zero for other records.
	Gates Gates
}

// Gates is a post's gate state, as the AppView's post table keeps it.
type Gates struct {
	HasThreadGate          bool // a thread-gate record exists for the post
	HasPostGate            bool // a post-gate record exists for the post
	ViolatesThreadGate     bool // the post is a reply its root's thread-gate disallows
	ViolatesEmbeddingRules bool // the post quotes a post whose post-gate disallows it
}

// Limits on a record's CID and moderation state every backend accepts
// (Check enforces them). A CID is a few dozen bytes (a CIDv1 of a SHA-256
// digest in base32 is 59), so MaxCIDBytes leaves room for any hash.
const (
	MaxCIDBytes         = 256
	MaxTakedownRefBytes = 1024
	MaxTags             = 64
	MaxTagBytes         = 256
)

// Errors returned by every backend, usually wrapped with detail. Match them
// with errors.Is.
var (
	// ErrNotFound reports that no record is stored under a URI.
	ErrNotFound = errors.New("store: record not found")
	// ErrUnavailable reports a transport, server or storage failure.
	// Backends wrap it (fmt.Errorf("...: %w", ErrUnavailable)) so callers
	// can map it to gRPC Unavailable and retry elsewhere.
	ErrUnavailable = errors.New("store: unavailable")
	// ErrInvalid reports a record the backend refuses: an empty URI, a URI
	// or body over the backend's limits, malformed JSON. The wrapping error
	// says which record and which limit.
	ErrInvalid = errors.New("store: invalid record")
)

// Store reads and writes records by URI.
//
// Implementations are safe for concurrent use. Every method except Close
// returns ctx.Err(), wrapped, when ctx is already done, and then changes
// nothing. Records returned to callers are theirs: their JSON slices share
// no memory with the store or with other callers.
type Store interface {
	// Get returns the record stored under uri, or an error wrapping
	// ErrNotFound.
	Get(ctx context.Context, uri string) (Record, error)
	// Put writes recs atomically where the backend can (all or nothing for
	// the embedded one); existing records with the same URI are replaced.
	// If any record is invalid, Put returns an error wrapping ErrInvalid
	// and stores none of recs. Put does not retain recs or their JSON.
	Put(ctx context.Context, recs []Record) error
	// Delete removes the records stored under uris and returns how many
	// existed. Deleting a missing URI is not an error.
	Delete(ctx context.Context, uris []string) (int, error)
	// Close releases the store's resources. The store must not be used
	// afterwards.
	Close() error
}

// forWriteKey marks a context whose reads are those of a write.
type forWriteKey struct{}

// ForWrite marks ctx's reads as those of a read-modify-write (or of what
// a write is computed from): a backend whose plain reads may answer an
// older copy than the last acknowledged write (CQL at its read
// consistency, LOCAL_ONE by default) reads at its write consistency
// instead, so that what is written back keeps every acknowledged write.
// Backends with one copy ignore it.
func ForWrite(ctx context.Context) context.Context {
	return context.WithValue(ctx, forWriteKey{}, true)
}

// IsForWrite reports whether ctx was marked by ForWrite.
func IsForWrite(ctx context.Context) bool {
	v, _ := ctx.Value(forWriteKey{}).(bool)
	return v
}

// BatchReader is implemented by a backend that reads many records at once
// more cheaply than one at a time: the embedded store reads them all in one
// read transaction, the CQL store in groups of partitions, one query each.
type BatchReader interface {
	// GetMany returns the records stored under uris, keyed by URI; a URI
	// with no record is absent from the map, and a URI given twice is read
	// once. Like Get, it returns ctx.Err(), wrapped, when ctx is already
	// done, and the records are the caller's.
	GetMany(ctx context.Context, uris []string) (map[string]Record, error)
}

// Check reports why r cannot be stored by a backend whose limits are
// maxURI bytes of URI and maxJSON bytes of record, wrapping ErrInvalid:
// an empty or too long URI, a too long CID, too much JSON, JSON that does not parse, or
// moderation state over its limits. Backends call it for every record
// before writing any.
func Check(r Record, maxURI, maxJSON int) error {
	if err := CheckModeration(r.TakedownRef, r.Tags); err != nil {
		return err
	}
	if err := CheckCID(r.CID); err != nil {
		return err
	}
	switch {
	case r.URI == "":
		return fmt.Errorf("%w: empty URI", ErrInvalid)
	case len(r.URI) > maxURI:
		return fmt.Errorf("%w: URI is %d bytes, over the %d-byte limit", ErrInvalid, len(r.URI), maxURI)
	case len(r.JSON) > maxJSON:
		return fmt.Errorf("%w: JSON is %d bytes, over the %d-byte limit", ErrInvalid, len(r.JSON), maxJSON)
	case !json.Valid(r.JSON):
		return fmt.Errorf("%w: JSON is not valid", ErrInvalid)
	}
	return nil
}

// CheckCID reports why a CID cannot be stored (over MaxCIDBytes, or not
// UTF-8, which no reader could decode), wrapping ErrInvalid.
func CheckCID(cid string) error {
	switch {
	case len(cid) > MaxCIDBytes:
		return fmt.Errorf("%w: CID is %d bytes, over the %d-byte limit", ErrInvalid, len(cid), MaxCIDBytes)
	case !utf8.ValidString(cid):
		return fmt.Errorf("%w: CID is not valid UTF-8", ErrInvalid)
	}
	return nil
}

// CheckModeration reports why a takedown reference or tags cannot be
// stored, wrapping ErrInvalid and naming the limit.
func CheckModeration(takedownRef string, tags []string) error {
	switch {
	case len(takedownRef) > MaxTakedownRefBytes:
		return fmt.Errorf("%w: takedown_ref is %d bytes, over the %d-byte limit", ErrInvalid, len(takedownRef), MaxTakedownRefBytes)
	case !utf8.ValidString(takedownRef):
		return fmt.Errorf("%w: takedown_ref is not valid UTF-8", ErrInvalid)
	case len(tags) > MaxTags:
		return fmt.Errorf("%w: %d tags, over the limit of %d", ErrInvalid, len(tags), MaxTags)
	}
	for i, tag := range tags {
		if tag == "" || len(tag) > MaxTagBytes {
			return fmt.Errorf("%w: tags[%d] is %d bytes; a tag is 1 to %d bytes", ErrInvalid, i, len(tag), MaxTagBytes)
		}
		if !utf8.ValidString(tag) {
			return fmt.Errorf("%w: tags[%d] is not valid UTF-8", ErrInvalid, i)
		}
	}
	return nil
}
