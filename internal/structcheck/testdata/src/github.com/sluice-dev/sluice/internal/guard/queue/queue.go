// Package queue has a spawner: a clock that runs its caller's function.
package queue

import "time"

type SystemClock struct{}

// AfterFunc is a listed spawner; it keeps its fact.
func (SystemClock) AfterFunc(d time.Duration, f func()) func() bool { // want AfterFunc:"starts"
	return time.AfterFunc(d, f).Stop
}

// Allowed: the queue itself may use its clock (and so starts goroutines).
func Wait(d time.Duration) { // want Wait:"starts"
	SystemClock{}.AfterFunc(d, func() {})
}
