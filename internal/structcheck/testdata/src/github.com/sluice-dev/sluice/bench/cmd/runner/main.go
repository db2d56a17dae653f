// Allowed: a benchmark may import the baseline.
package main

import "github.com/sluice-dev/sluice/bench/baseline"

// main is a listed unguarded site: it holds the baseline's server.
func main() {
	s := baseline.NewServer()
	_ = s
}
