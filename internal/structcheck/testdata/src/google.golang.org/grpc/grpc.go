// Package grpc is a stub of the parts of google.golang.org/grpc the
// analyzer looks at.
package grpc

type ServiceDesc struct{ ServiceName string }

type ServiceInfo struct{}

type ServiceRegistrar interface {
	RegisterService(desc *ServiceDesc, impl any)
}

type ServerOption interface{ apply() }

type ServerStream interface{}

type StreamHandler func(srv any, stream ServerStream) error

type Server struct{}

func NewServer(opt ...ServerOption) *Server { return &Server{} }

func UnknownServiceHandler(h StreamHandler) ServerOption { return nil }

func (s *Server) RegisterService(sd *ServiceDesc, ss any) {}

func (s *Server) GetServiceInfo() map[string]ServiceInfo { return nil }

func (s *Server) GracefulStop() {}
