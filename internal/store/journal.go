package store

import (
	"context"
	"errors"
	"time"
)

// Change is one entry of a store's invalidation journal: the URI of a
// record that was written or deleted, when, and by whom.
type Change struct {
	// URI is the record's AT-URI.
	URI string
	// At is the change's time by the writer's clock, kept to a
	// microsecond.
	At time.Time
	// Origin names the writer: the JournalOrigin the writing process
	// opened its store with. A follower skips its own changes.
	Origin string
}

// Journal is the invalidation journal a backend keeps beside its records.
//
// Every Put and Delete records one Change per URI with the record change
// (the embedded backend: in the same transaction; the CQL backend: right
// after the record's own write, acknowledged only after both), so a
// change the store acknowledged is never missing from the journal, and a
// journal entry never lacks the record change it names. A CQL write that
// failed between the two may have changed the record without an entry. Entries are kept for Retention and then
// dropped; a reader that needs older ones must treat them as lost.
type Journal interface {
	// Changes calls fn for every change with from <= At < to, oldest
	// first (within the backend's ordering of equal times), stopping at
	// fn's first error. It fails with ErrJournalGap when from is older
	// than what the journal still keeps.
	Changes(ctx context.Context, from, to time.Time, fn func(Change) error) error
	// Retention is how long entries are kept.
	Retention() time.Duration
}

// ErrJournalGap reports a read of journal entries older than the
// journal's retention: some of them may be gone.
var ErrJournalGap = errors.New("store: journal entries older than its retention were asked for")

// DefaultJournalRetention is how long backends keep journal entries
// unless told otherwise: half an hour, three times the cache's default
// 10-minute entry lifetime. A cache entry older than the change it hides
// expires within one entry lifetime of that change, so a follower that
// replays the last entry lifetime of the journal onto a memcached server
// that came back has corrected every stale entry on it; the margin covers
// a longer configured TTL and clock skew between writers.
const DefaultJournalRetention = 30 * time.Minute
