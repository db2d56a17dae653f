package cqlstore

import "github.com/gocql/gocql"

// Pick returns the hosts the inner policy offers for q and then, for an
// idempotent statement, the same hosts once more.
//
// gocql's speculative execution shares one host iterator between a
// statement's first attempt and its speculative one. When the first
// attempt has taken the only live replica (a one-node cluster, or the
// others down), the speculative attempt finds the iterator empty and
// answers "no hosts available in the pool" at once; that answer reaches
// the caller before the first attempt's, which was still under way and
// would have succeeded. With the replay the speculative attempt goes to a
// replica already tried instead. Each host is still offered at most
// twice, so an iteration over hosts that are all down still ends.
func (p watchedPolicy) Pick(q gocql.ExecutableQuery) gocql.NextHost {
	next := p.HostSelectionPolicy.Pick(q)
	if q == nil || !q.IsIdempotent() {
		return next
	}
	return replayOnce(next)
}

// replayOnce returns next's hosts until it runs out, then the same hosts
// again in the same order, then nil. gocql calls the iterator it gets
// from Pick under its own lock, so this one needs none.
func replayOnce(next gocql.NextHost) gocql.NextHost {
	var offered []gocql.SelectedHost
	replayed, exhausted := 0, false
	return func() gocql.SelectedHost {
		if !exhausted {
			if h := next(); h != nil {
				offered = append(offered, h)
				return h
			}
			exhausted = true
		}
		if replayed == len(offered) {
			return nil
		}
		replayed++
		return offered[replayed-1]
	}
}
