package cqlstore

import "context"

// Acquire lets the external tests hold query slots.
func (s *Store) Acquire(ctx context.Context) (release func(), err error) { return s.acquire(ctx) }
