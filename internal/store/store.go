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
}

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

// Check reports why r cannot be stored by a backend whose limits are
// maxURI bytes of URI and maxJSON bytes of record, wrapping ErrInvalid:
// an empty or too long URI, too much JSON, or JSON that does not parse.
// Backends call it for every record before writing any.
func Check(r Record, maxURI, maxJSON int) error {
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
