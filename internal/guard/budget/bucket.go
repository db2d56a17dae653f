package budget

import "time"

// bucket is a client's token bucket of items: it fills at rate items per
// second up to burst, Spend takes from it, and Refund gives back. It is
// written here rather than taken from golang.org/x/time/rate because a
// refund must return items as of the moment it is made: rate's
// Reservation.CancelAt can only cancel as of the reservation's own time,
// which rewinds the bucket's clock and counts the refill since then twice.
// The zero bucket is empty; newBucket is full. Callers hold Budgets.mu.
type bucket struct {
	rate, burst float64
	tokens      float64   // as of last
	last        time.Time // never goes back
}

func newBucket(rate float64, burst int, now time.Time) bucket {
	return bucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: now}
}

// at is the tokens held at now (at last's, for a now before it).
func (b *bucket) at(now time.Time) float64 {
	if !now.After(b.last) {
		return b.tokens
	}
	return min(b.burst, b.tokens+b.rate*now.Sub(b.last).Seconds())
}

// moveTo brings the bucket to now: its tokens then, as of then.
func (b *bucket) moveTo(now time.Time) {
	b.tokens = b.at(now)
	if now.After(b.last) {
		b.last = now
	}
}

// take removes n tokens at now; the caller has checked they are there.
func (b *bucket) take(n float64, now time.Time) {
	b.moveTo(now)
	b.tokens -= n
}

// give returns n tokens at now, never past the burst.
func (b *bucket) give(n float64, now time.Time) {
	b.moveTo(now)
	b.tokens = min(b.burst, b.tokens+n)
}

// set changes the rate and burst from now on, keeping the tokens held
// (up to the new burst).
func (b *bucket) set(rate float64, burst int, now time.Time) {
	b.moveTo(now)
	b.rate, b.burst = rate, float64(burst)
	b.tokens = min(b.tokens, b.burst)
}

// refund is how many of cost tokens, taken at `at` leaving `left`, go
// back at now: those the bucket would still hold had they not been
// taken. Without the charge the bucket would have held cost more, until
// that surplus met the burst; the bucket has held at most left plus the
// refill since, so the surplus kept is at least burst minus that. Other
// charges since only lower what it held, so the bound may give back
// less than was kept, never more.
func (b *bucket) refund(cost, left float64, at, now time.Time) float64 {
	peak := min(b.burst, left+b.rate*max(0, now.Sub(at).Seconds()))
	return max(0, min(cost, b.burst-peak))
}
