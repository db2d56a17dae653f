// Package baseline is a benchmark baseline, unguarded on purpose.
package baseline

import "google.golang.org/grpc"

// NewServer is a listed unguarded site: it may build and register.
func NewServer() *grpc.Server {
	s := grpc.NewServer()
	s.RegisterService(&grpc.ServiceDesc{}, nil)
	go func() {}()
	return s
}

// Evasion: an unlisted function of an unguarded package is strict.
func Other(s *grpc.Server) { // want Other:"registers" `register: grpc.Server in bench/baseline.Other`
	s.RegisterService(&grpc.ServiceDesc{}, nil) // want `register: RegisterService in bench/baseline.Other`
}
