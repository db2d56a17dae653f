// Package rpc holds handlers: it may not register anything itself.
package rpc

import (
	"context"
	"reflect"

	"golang.org/x/sync/errgroup"

	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
)

// The generated Register…Server, outside the guard.
func Generated(r grpc.ServiceRegistrar) { // want Generated:"registers"
	sluicev1.RegisterPostRecordsServer(r, nil) // want `register: api/sluice/v1.RegisterPostRecordsServer registers a gRPC service \(RegisterService in api/sluice/v1.RegisterPostRecordsServer\)`
}

// Evasion: the hand-written registration function of api/.
func HandWritten(r grpc.ServiceRegistrar) { // want HandWritten:"registers"
	sluicev1.RegisterAll(r, nil) // want `register: api/sluice/v1.RegisterAll registers a gRPC service`
}

// A server of one's own.
func OwnServer() { // want OwnServer:"registers"
	_ = grpc.NewServer() // want `register: grpc.NewServer in internal/rpc.OwnServer`
}

// Evasion: UnknownServiceHandler serves every method without a policy.
func Unknown() grpc.ServerOption { // want Unknown:"registers"
	return grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error { return nil }) // want `register: grpc.UnknownServiceHandler in internal/rpc.Unknown`
}

// Evasion: RegisterService as a method value.
func MethodValue(r grpc.ServiceRegistrar, desc *grpc.ServiceDesc) { // want MethodValue:"registers"
	register := r.RegisterService // want `register: RegisterService in internal/rpc.MethodValue`
	register(desc, nil)
}

// Evasion: RegisterService as a method expression.
func MethodExpr(desc *grpc.ServiceDesc) { // want MethodExpr:"registers"
	f := (*grpc.Server).RegisterService // want `register: RegisterService in internal/rpc.MethodExpr`
	_ = f
}

// Evasion: RegisterService found by reflection.
func Reflected(x any, desc *grpc.ServiceDesc) { // want Reflected:"registers"
	m := reflect.ValueOf(x).MethodByName("RegisterService") // want `register: reflect lookup of RegisterService in internal/rpc.Reflected`
	m.Call([]reflect.Value{reflect.ValueOf(desc), reflect.ValueOf(x)})
}

// Evasion: a registration function of another module.
func ServerReflection(s reflection.GRPCServer) { // want ServerReflection:"registers"
	reflection.Register(s) // want `register: reflection.Register, which takes a service registrar in internal/rpc.ServerReflection`
}

// Evasion: a differently named wrapper, and a caller of the wrapper.
func install(r grpc.ServiceRegistrar, desc *grpc.ServiceDesc) { // want install:"registers"
	r.RegisterService(desc, nil) // want `register: RegisterService in internal/rpc.install`
}

func Wire(r grpc.ServiceRegistrar) { // want Wire:"registers"
	install(r, nil) // want `register: internal/rpc.install registers a gRPC service \(RegisterService in internal/rpc.install\)`
}

// Evasion: holding a *grpc.Server, which reflection can drive.
type holder struct {
	srv *grpc.Server // want `register: grpc.Server in a package-level declaration`
}

func (h holder) Value() any { // want Value:"registers"
	return h.srv // want `register: a \*grpc.Server value in internal/rpc.holder.Value`
}

// Allowed: handlers that register nothing.
func Handle(req string) string { return req }

// Evasion: an errgroup site listed in a server package.
func Fan(ctx context.Context) error { // want `allowlist: entry "internal/rpc.Fan" lists an errgroup site in a server package`
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	g.Go(func() error { return ctx.Err() })
	return g.Wait()
}
