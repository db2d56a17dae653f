package telemetry

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Store wraps a store.Store and counts its reads, writes, errors and read
// latency. It changes no behaviour.
type Store struct {
	store.Store
	reads    metric.Int64Counter
	writes   metric.Int64Counter
	duration metric.Float64Histogram
}

var _ store.Store = (*Store)(nil)

// The op attribute of sluice.store.read.duration and the result attribute
// of sluice.store.reads, built once.
var (
	readGet      = optionsOf(attribute.String("op", "get")).record
	readGetMany  = optionsOf(attribute.String("op", "get_many")).record
	readFound    = optionsOf(attribute.String("result", "found")).add
	readNotFound = optionsOf(attribute.String("result", "not_found")).add
	readFailed   = optionsOf(attribute.String("result", "error")).add
)

// InstrumentStore returns s with metrics. When s reads in batches
// (store.BatchReader), so does the store it returns.
func (t *Telemetry) InstrumentStore(s store.Store) (store.Store, error) {
	w, err := t.instrumentStore(s)
	if err != nil {
		return nil, err
	}
	if br, ok := s.(store.BatchReader); ok {
		return &BatchStore{Store: w, batch: br}, nil
	}
	return w, nil
}

func (t *Telemetry) instrumentStore(s store.Store) (*Store, error) {
	m := t.meter
	w := &Store{Store: s}
	var err error
	if w.reads, err = m.Int64Counter("sluice.store.reads",
		metric.WithDescription("Records read from the store, one per URI asked for, by result (found, not_found, error).")); err != nil {
		return nil, err
	}
	if w.writes, err = m.Int64Counter("sluice.store.writes",
		metric.WithDescription("Store write batches, by operation (put, delete) and result (ok, error).")); err != nil {
		return nil, err
	}
	if w.duration, err = m.Float64Histogram("sluice.store.read.duration", metric.WithUnit("s"),
		metric.WithDescription("Store read latency per call, by op: get (one point read) or get_many (one batch read of a request's cache misses)."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)); err != nil {
		return nil, err
	}
	return w, nil
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, uri string) (store.Record, error) {
	start := time.Now()
	rec, err := s.Store.Get(ctx, uri)
	s.duration.Record(ctx, time.Since(start).Seconds(), readGet...)
	result := readFound
	switch {
	case errors.Is(err, store.ErrNotFound):
		result = readNotFound
	case err != nil:
		result = readFailed
	}
	s.reads.Add(ctx, 1, result...)
	return rec, err
}

// BatchStore is a Store whose backend reads in batches.
type BatchStore struct {
	*Store
	batch store.BatchReader
}

var _ store.BatchReader = (*BatchStore)(nil)

// GetMany implements store.BatchReader. Reads are counted per URI asked
// for, as Get counts them; the latency is the batch's.
func (s *BatchStore) GetMany(ctx context.Context, uris []string) (map[string]store.Record, error) {
	start := time.Now()
	recs, err := s.batch.GetMany(ctx, uris)
	s.duration.Record(ctx, time.Since(start).Seconds(), readGetMany...)
	if err != nil {
		s.reads.Add(ctx, int64(len(uris)), readFailed...)
		return nil, err
	}
	found := 0
	for _, uri := range uris {
		if _, ok := recs[uri]; ok {
			found++
		}
	}
	s.reads.Add(ctx, int64(found), readFound...)
	if missing := len(uris) - found; missing > 0 {
		s.reads.Add(ctx, int64(missing), readNotFound...)
	}
	return recs, nil
}

// Put implements store.Store.
func (s *Store) Put(ctx context.Context, recs []store.Record) error {
	err := s.Store.Put(ctx, recs)
	s.countWrite(ctx, "put", err)
	return err
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, uris []string) (int, error) {
	n, err := s.Store.Delete(ctx, uris)
	s.countWrite(ctx, "delete", err)
	return n, err
}

func (s *Store) countWrite(ctx context.Context, op string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.writes.Add(ctx, 1, metric.WithAttributes(attribute.String("op", op), attribute.String("result", result)))
}
