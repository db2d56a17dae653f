// Package admin calls a wrapper of another package.
package admin

import (
	"google.golang.org/grpc"

	"github.com/sluice-dev/sluice/bench/baseline" // want `unguarded: bench/baseline is a benchmark baseline, unguarded on purpose; only packages under bench/ may import it`
	"github.com/sluice-dev/sluice/internal/rpc"
)

// Evasion: the wrapper called from another package.
func Setup(r grpc.ServiceRegistrar) { // want Setup:"registers"
	rpc.Wire(r) // want `register: internal/rpc.Wire registers a gRPC service \(RegisterService in internal/rpc.install\)`
}

// Allowed: calling a handler.
func Echo() string { return rpc.Handle("x") }

// Evasion: serving the unguarded baseline from sluice.
func Baseline() { // want Baseline:"registers"
	_ = baseline.NewServer() // want `register: a \*grpc.Server value in internal/admin.Baseline`
}
