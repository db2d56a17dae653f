//go:build race

package app

// raceEnabled reports that the race detector is on. It slows every
// memory access several-fold, so tests whose assertions are latency
// ratios run in the non-race pass of `make test` instead.
const raceEnabled = true
