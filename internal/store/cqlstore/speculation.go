package cqlstore

import "github.com/gocql/gocql"

// Pick returns the hosts the inner policy offers for q and then, for an
// idempotent statement, the same hosts again, up to p.rounds passes in
// all.
//
// gocql gives a statement's first attempt, its retries and its
// speculative attempt one host iterator between them. When they have
// used up the only live node (a one-node cluster, or the others down),
// the speculative attempt found the iterator empty and answered "no hosts
// available in the pool" at once; that answer reached the caller before
// the first attempt's (or its retry's), still under way, which would have
// succeeded. With the further passes the speculative attempt and the
// retries go to a node already tried instead. The passes are bounded, so
// an iteration over nodes that are all down, or have no connection,
// still ends; the attempts actually sent stay bounded by the retry policy.
//
// The iterator it returns never panics (noPanic).
func (p watchedPolicy) Pick(q gocql.ExecutableQuery) gocql.NextHost {
	next := noPanic(p.pickFor(q))
	if q == nil || !q.IsIdempotent() || p.rounds < 2 {
		return next
	}
	return replay(next, p.rounds)
}

// noPanic returns next, except that a panic inside it (a driver fault in
// its host selection, as gocql v1.7.0's token-aware policy had) ends the
// iteration instead: gocql calls the iterator on goroutines of its own
// for a read's speculative attempts, where Store.run's recover cannot
// reach, and a panic there would end the process. The statement then
// fails as one with no hosts left to try, which the store answers
// Unavailable.
func noPanic(next gocql.NextHost) gocql.NextHost {
	return func() (h gocql.SelectedHost) {
		defer func() {
			if recover() != nil {
				h = nil
			}
		}()
		return next()
	}
}

// replay returns next's hosts until it runs out, then the same hosts
// again in the same order, rounds passes in all, then nil. gocql calls an
// iterator from one goroutine, or under its own lock when attempts run
// side by side, so this one needs none.
func replay(next gocql.NextHost, rounds int) gocql.NextHost {
	var offered []gocql.SelectedHost
	given := 0 // hosts returned so far, over every pass
	return func() gocql.SelectedHost {
		if given == len(offered) { // still in the first pass
			if h := next(); h != nil {
				offered = append(offered, h)
				given++
				return h
			}
		}
		if given >= rounds*len(offered) {
			return nil
		}
		given++
		return offered[(given-1)%len(offered)]
	}
}

// pickFor is the session's policy's Pick, or order's for a batch read's
// group (groups.go).
func (p watchedPolicy) pickFor(q gocql.ExecutableQuery) gocql.NextHost {
	if p.order != nil && isGroupRead(q) {
		return p.order.Pick(q)
	}
	return p.HostSelectionPolicy.Pick(q)
}
