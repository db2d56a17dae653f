// A main with a listed lifecycle site.
package main

import (
	"os"
	"os/signal"

	"github.com/sluice-dev/sluice/internal/testenv" // want `testsupport: internal/testenv is test-support code`
)

// main is listed: it watches for a signal.
func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	go func() { <-sig; os.Exit(1) }()
	testenv.Background(func() {})
	run()
}

// Evasion: an unlisted function of a main.
func run() { // want run:"starts"
	go func() {}() // want `goroutine: go statement in cmd/tool.run`
}
