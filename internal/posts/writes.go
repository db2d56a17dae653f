package posts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/fanout"

	"github.com/sluice-dev/sluice/internal/store"
)

// Check applies the write rules to the record at position i of a batch,
// filling CreatedAt from the JSON's createdAt when it is zero; Put calls
// it for every record. Writers of several collections call it for the
// whole batch before writing any of it.
func (s *Service) Check(i int, r *store.Record) error { return s.checkRecord(i, r) }

// Update reads the record stored under uri from the store (not the
// cache), applies change, and writes the result back if change reports
// it changed something, then invalidates the cache entry. It reports
// whether a record existed. It is a read-modify-write, serialised with
// this Service's other writes of the URI (Put, Delete, Update, Upsert),
// so none of theirs is lost to it; a write of the same URI through
// another replica at the same moment is not serialised with it, and one
// of the two changes can be lost.
func (s *Service) Update(ctx context.Context, uri string, change func(*store.Record) bool) (bool, error) {
	return s.modify(ctx, uri, false, func(r *store.Record, _ bool) bool { return change(r) })
}

// Upsert is Update for a record that may not exist yet: change gets a
// zero Record with only the URI set, and existed false, when none is
// stored. The changed record must pass the write rules (Put's). It is
// serialised as Update is.
func (s *Service) Upsert(ctx context.Context, uri string, change func(r *store.Record, existed bool) bool) error {
	_, err := s.modify(ctx, uri, true, change)
	return err
}

// Stored reads the record under uri from the store (not the cache), as
// a write reads it (store.ForWrite: every acknowledged write included).
func (s *Service) Stored(ctx context.Context, uri string) (store.Record, bool, error) {
	if err := s.validate([]string{uri}); err != nil {
		return store.Record{}, false, err
	}
	rec, err := s.store.Get(store.ForWrite(ctx), uri)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Record{}, false, nil
	case err != nil:
		return store.Record{}, false, fmt.Errorf("posts: read %s: %w", uri, err)
	}
	return rec, true, nil
}

// UpsertMany is Upsert for many records at once: it reads them from the
// store in one batched read, applies change to each in uris' order (a
// URI given twice is changed twice), and writes those changed in one
// store write, then invalidates their cache entries; existed tells
// whether the record was stored before the call. It is serialised
// with this Service's other writes of the URIs as Upsert is. A change
// that fails the write rules fails the whole call before anything is
// written.
func (s *Service) UpsertMany(ctx context.Context, uris []string, change func(r *store.Record, existed bool) bool) error {
	if len(uris) == 0 {
		return nil
	}
	if err := s.validate(uris); err != nil {
		return err
	}
	wrote := s.ownSlots(uris)
	defer wrote()
	current, err := s.storedNow(ctx, uris)
	if err != nil {
		s.logWriteError(ctx, "update", len(uris), err)
		return fmt.Errorf("posts: read %d records to update: %w", len(uris), err)
	}
	changed, err := s.applyChanges(uris, current, change)
	if err != nil || len(changed) == 0 {
		return err
	}
	if err := s.store.Put(ctx, changed); err != nil {
		s.logWriteError(ctx, "update", len(changed), err)
		s.invalidateUnsure(ctx, uriList(changed), err)
		return fmt.Errorf("posts: update %d records: %w", len(changed), err)
	}
	s.invalidate(ctx, uriList(changed))
	return nil
}

// storedNow reads uris from the store as a write reads them
// (store.ForWrite; not the cache, nor a read shared with others): in one
// batch read when the store has them, otherwise one read per URI under
// the request's fan-out limit.
func (s *Service) storedNow(ctx context.Context, uris []string) (map[string]store.Record, error) {
	ctx = store.ForWrite(ctx)
	if br, ok := s.store.(store.BatchReader); ok {
		return br.GetMany(ctx, uris)
	}
	out := make([]Result, len(uris))
	err := fanout.Each(ctx, len(uris), func(ctx context.Context, i int) (err error) {
		out[i], err = s.storeGet(ctx, uris[i])
		return err
	})
	if err != nil {
		return nil, err
	}
	found := make(map[string]store.Record, len(uris))
	for i, r := range out {
		if r.Found {
			found[uris[i]] = r.Record
		}
	}
	return found, nil
}

// applyChanges applies change to each of uris' records (current holds
// those stored) and returns the changed ones, each once, checked against
// the write rules if new.
func (s *Service) applyChanges(uris []string, current map[string]store.Record, change func(*store.Record, bool) bool) ([]store.Record, error) {
	now := time.Now().UTC()
	recs := map[string]*store.Record{}
	var changed []string
	isChanged := map[string]bool{}
	at := map[string]int{} // a changed URI's first position in uris
	for i, uri := range uris {
		r, ok := recs[uri]
		if !ok {
			stored, existed := current[uri]
			if !existed {
				stored = store.Record{URI: uri}
			}
			r = &stored
			recs[uri] = r
		}
		_, existed := current[uri]
		if change(r, existed) && !isChanged[uri] {
			isChanged[uri] = true
			changed = append(changed, uri)
			at[uri] = i
		}
	}
	out := make([]store.Record, 0, len(changed))
	for _, uri := range changed {
		r := recs[uri]
		if _, existed := current[uri]; !existed {
			if err := s.checkRecord(at[uri], r); err != nil {
				return nil, err
			}
			r.IndexedAt = now
		}
		out = append(out, *r)
	}
	return out, nil
}

// StoredMany reads the records under uris from the store as a write
// reads them (storedNow), in uris' order: what a write computes its
// changes from.
func (s *Service) StoredMany(ctx context.Context, uris []string) ([]Result, error) {
	if err := s.validate(uris); err != nil {
		return nil, err
	}
	found, err := s.storedNow(ctx, uris)
	if err != nil {
		return nil, fmt.Errorf("posts: read %d uris from the store: %w", len(uris), err)
	}
	out := make([]Result, len(uris))
	for i, uri := range uris {
		r, ok := found[uri]
		if !ok {
			r = store.Record{URI: uri}
		}
		out[i] = Result{Record: r, Found: ok}
	}
	return out, nil
}

func (s *Service) modify(ctx context.Context, uri string, create bool, change func(*store.Record, bool) bool) (bool, error) {
	wrote := s.ownSlot(uri)
	defer wrote()
	rec, existed, err := s.Stored(ctx, uri)
	switch {
	case err != nil:
		s.logWriteError(ctx, "update", 1, err)
		return false, err
	case !existed && !create:
		return false, nil
	case !existed:
		rec = store.Record{URI: uri}
	}
	if !change(&rec, existed) {
		return existed, nil
	}
	if !existed {
		if err := s.checkRecord(0, &rec); err != nil {
			return false, err
		}
		rec.IndexedAt = time.Now().UTC()
	}
	if err := s.store.Put(ctx, []store.Record{rec}); err != nil {
		s.logWriteError(ctx, "update", 1, err)
		s.invalidateUnsure(ctx, []string{uri}, err)
		return false, fmt.Errorf("posts: update %s: %w", uri, err)
	}
	s.invalidate(ctx, []string{uri})
	return existed, nil
}

// Put validates every record, writes them all to the store, then
// invalidates their cache entries. A record that fails validation fails
// the whole batch before anything is written. If the store write succeeds
// but invalidation fails (the cache is down), Put still succeeds: the
// store is the source of truth, the failure is counted, and any stale
// entry expires within the cache's TTL. If the store write fails, the
// entries are invalidated all the same (invalidateUnsure): it may have
// landed.
func (s *Service) Put(ctx context.Context, recs []store.Record) (int, error) {
	now := time.Now().UTC()
	for i := range recs {
		if err := s.checkRecord(i, &recs[i]); err != nil {
			return 0, err
		}
		if recs[i].IndexedAt.IsZero() {
			recs[i].IndexedAt = now
		}
	}
	wrote := s.shareSlots(uriList(recs))
	err := s.store.Put(ctx, recs)
	wrote()
	if err != nil {
		s.logWriteError(ctx, "put", len(recs), err)
		s.invalidateUnsure(ctx, uriList(recs), err)
		return 0, fmt.Errorf("posts: write %d records: %w", len(recs), err)
	}
	s.opts.afterStoreWrite(uriList(recs))
	s.invalidate(ctx, uriList(recs))
	return len(recs), nil
}

// Delete removes records from the store, then invalidates their cache
// entries. It reports how many existed.
func (s *Service) Delete(ctx context.Context, uris []string) (int, error) {
	if err := s.validate(uris); err != nil {
		return 0, err
	}
	wrote := s.shareSlots(uris)
	n, err := s.store.Delete(ctx, uris)
	wrote()
	if err != nil {
		s.logWriteError(ctx, "delete", len(uris), err)
		s.invalidateUnsure(ctx, uris, err)
		return 0, fmt.Errorf("posts: delete %d records: %w", len(uris), err)
	}
	s.opts.afterStoreWrite(uris)
	s.invalidate(ctx, uris)
	return n, nil
}

func (s *Service) invalidate(ctx context.Context, uris []string) {
	unique, _ := positions(uris)
	if err := s.cache.Invalidate(ctx, unique); err != nil {
		s.invalidationFailures.Add(1)
		s.opts.log.Error("cache invalidation failed; stale entries expire within the cache TTL", "component", "cache", "kind", "invalidate", "err", err)
	}
}

// unsureInvalidateTimeout bounds the invalidation after a failed write.
const unsureInvalidateTimeout = time.Second

// invalidateUnsure invalidates uris after a store write that failed with
// err: a write whose outcome is not known (a timeout, a caller that
// left, a connection lost after the request was sent) may have landed,
// and the cache must not keep answering what it replaced. The
// invalidation runs even when the caller has left, within
// unsureInvalidateTimeout. A batch the store refused as invalid wrote
// nothing, so it invalidates nothing.
func (s *Service) invalidateUnsure(ctx context.Context, uris []string, err error) {
	if errors.Is(err, store.ErrInvalid) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unsureInvalidateTimeout)
	defer cancel()
	s.invalidate(ctx, uris)
}

// logWriteError logs a failed store write, unless the caller left or the
// batch was invalid (the caller's error, answered to the caller).
func (s *Service) logWriteError(_ context.Context, op string, n int, err error) {
	if isContextErr(err) || errors.Is(err, store.ErrInvalid) {
		return
	}
	s.opts.log.Error("store write failed", "component", "store", "kind", op, "records", n, "err", err)
}

// checkRecord applies the write rules: a record AT-URI of the collection,
// JSON no larger than the limit, and a $type naming the collection.
// createdAt in the JSON fills CreatedAt when the caller left it empty.
func (s *Service) checkRecord(i int, r *store.Record) error {
	if err := s.validate([]string{r.URI}); err != nil {
		return &InvalidRecordError{Index: i, URI: r.URI, Reason: err.(*InvalidURIError).Err.Error()}
	}
	if len(r.JSON) > s.limits.MaxRecordBytes {
		return &InvalidRecordError{Index: i, URI: r.URI, Reason: fmt.Sprintf("record is %d bytes, over the limit of %d", len(r.JSON), s.limits.MaxRecordBytes)}
	}
	if err := store.CheckCID(r.CID); err != nil {
		return &InvalidRecordError{Index: i, URI: r.URI, Reason: err.Error()}
	}
	var head struct {
		Type      string `json:"$type"`
		CreatedAt string `json:"createdAt"`
	}
	if err := json.Unmarshal(r.JSON, &head); err != nil {
		return &InvalidRecordError{Index: i, URI: r.URI, Reason: "record is not a JSON object: " + err.Error()}
	}
	if head.Type != s.collection {
		return &InvalidRecordError{Index: i, URI: r.URI, Reason: fmt.Sprintf("record $type is %q, want %q", head.Type, s.collection)}
	}
	if err := store.CheckModeration(r.TakedownRef, r.Tags); err != nil {
		return &InvalidRecordError{Index: i, URI: r.URI, Reason: err.Error()}
	}
	if r.CreatedAt.IsZero() && head.CreatedAt != "" {
		if t, err := time.Parse(time.RFC3339Nano, head.CreatedAt); err == nil {
			r.CreatedAt = t
		}
	}
	return nil
}

func uriList(recs []store.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.URI
	}
	return out
}
