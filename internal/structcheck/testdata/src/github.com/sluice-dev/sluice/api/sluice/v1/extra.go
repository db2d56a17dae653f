package sluicev1 // want `generated: extra.go is not protoc output \(no protoc-gen-go or protoc-gen-go-grpc header\)`

import "google.golang.org/grpc"

// Evasion: a hand-written function in api/ that registers a service.
func RegisterAll(s grpc.ServiceRegistrar, srv PostRecordsServer) { // want RegisterAll:"registers"
	s.RegisterService(&PostRecords_ServiceDesc, srv) // want `register: RegisterService in api/sluice/v1.RegisterAll`
}
