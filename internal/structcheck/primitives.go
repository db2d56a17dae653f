package structcheck

import (
	"go/ast"
	"go/constant"
	"go/types"
	"regexp"

	"golang.org/x/tools/go/types/typeutil"
)

const (
	grpcPath         = "google.golang.org/grpc"
	errgroupPath     = "golang.org/x/sync/errgroup"
	singleflightPath = "golang.org/x/sync/singleflight"
)

// recvName is the name of a method's receiver type ("WaitGroup"), or ""
// for a function.
func recvName(fn *types.Func) string {
	recv := fn.Signature().Recv()
	if recv == nil {
		return ""
	}
	t := recv.Type()
	if pt, ok := t.(*types.Pointer); ok {
		t = pt.Elem()
	}
	if named, ok := types.Unalias(t).(*types.Named); ok {
		return named.Obj().Name()
	}
	return ""
}

// goroutinePrimitive names fn if calling it starts a goroutine, and says
// whether it is an errgroup's Go or TryGo.
func goroutinePrimitive(fn *types.Func) (desc string, errgroupGo bool) {
	if fn.Pkg() == nil {
		return "", false
	}
	path, recv, name := fn.Pkg().Path(), recvName(fn), fn.Name()
	switch {
	case (path == "time" || path == "context") && recv == "" && name == "AfterFunc":
		return path + ".AfterFunc", false
	case path == "sync" && recv == "WaitGroup" && name == "Go":
		return "(*sync.WaitGroup).Go", false
	case path == singleflightPath && recv == "Group" && name == "DoChan":
		return "(*singleflight.Group).DoChan", false
	case path == errgroupPath && recv == "Group" && (name == "Go" || name == "TryGo"):
		return "(*errgroup.Group)." + name, true
	}
	return "", false
}

// registrationPrimitive names fn if using it registers a gRPC service or
// builds a server to register on: grpc.NewServer, grpc.UnknownServiceHandler,
// any RegisterService method taking a *grpc.ServiceDesc, and any function
// of another module taking something that can register services.
func registrationPrimitive(fn *types.Func) string {
	if fn.Pkg() == nil {
		return ""
	}
	sig := fn.Signature()
	switch {
	case fn.Pkg().Path() == grpcPath && sig.Recv() == nil && (fn.Name() == "NewServer" || fn.Name() == "UnknownServiceHandler"):
		return "grpc." + fn.Name()
	case fn.Name() == "RegisterService" && sig.Recv() != nil && sig.Params().Len() > 0 && isServiceDesc(sig.Params().At(0).Type()):
		return "RegisterService"
	case !inModule(fn.Pkg()):
		for i := range sig.Params().Len() {
			if canRegister(sig.Params().At(i).Type()) {
				return fn.Pkg().Name() + "." + funcKey(fn) + ", which takes a service registrar"
			}
		}
	}
	return ""
}

// isServiceDesc reports whether t is *grpc.ServiceDesc.
func isServiceDesc(t types.Type) bool {
	pt, ok := types.Unalias(t).(*types.Pointer)
	if !ok {
		return false
	}
	named, ok := types.Unalias(pt.Elem()).(*types.Named)
	return ok && named.Obj().Pkg() != nil && named.Obj().Pkg().Path() == grpcPath && named.Obj().Name() == "ServiceDesc"
}

// canRegister reports whether values of t have a RegisterService method
// taking a *grpc.ServiceDesc: a *grpc.Server, a grpc.ServiceRegistrar, or
// anything wrapping one.
func canRegister(t types.Type) bool {
	obj, _, _ := types.LookupFieldOrMethod(t, true, nil, "RegisterService")
	fn, ok := obj.(*types.Func)
	return ok && fn.Signature().Params().Len() > 0 && isServiceDesc(fn.Signature().Params().At(0).Type())
}

// isGRPCServer reports whether t is grpc.Server or *grpc.Server.
func isGRPCServer(t types.Type) bool {
	if pt, ok := types.Unalias(t).(*types.Pointer); ok {
		t = pt.Elem()
	}
	named, ok := types.Unalias(t).(*types.Named)
	return ok && named.Obj().Pkg() != nil && named.Obj().Pkg().Path() == grpcPath && named.Obj().Name() == "Server"
}

var registrationName = regexp.MustCompile(`^(RegisterService|Register\w*Server)$`)

// reflectRegistration returns the method name when call looks up a
// registration method by reflection (reflect.Value.MethodByName or
// reflect.Type.MethodByName with a constant name).
func reflectRegistration(info *types.Info, call *ast.CallExpr) string {
	fn, ok := typeutil.Callee(info, call).(*types.Func)
	if !ok || fn.Pkg() == nil || fn.Pkg().Path() != "reflect" || fn.Name() != "MethodByName" || len(call.Args) != 1 {
		return ""
	}
	tv := info.Types[call.Args[0]]
	if tv.Value == nil || tv.Value.Kind() != constant.String {
		return ""
	}
	if name := constant.StringVal(tv.Value); registrationName.MatchString(name) {
		return name
	}
	return ""
}
