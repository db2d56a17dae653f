// Package guard is the only way a gRPC method of sluice can be served.
//
// A Server owns the *grpc.Server. Services are registered through
// Server.Register, which refuses a service unless the configuration holds
// a Policy for every one of its methods, and refuses streaming methods
// outright. Every request then passes through one interceptor that, before
// the handler does any I/O:
//
//  1. names the caller (package identity) — from its verified certificate
//     under mutual TLS (WithIdentity), refusing with PermissionDenied a
//     caller that may not call;
//  2. checks the request's shape against the method's policy — item count,
//     empty batches, URI length — and answers InvalidArgument with a
//     google.rpc.BadRequest detail that names the limit;
//  3. applies the policy's timeout;
//  4. refuses, with DeadlineExceeded, a request whose remaining deadline
//     is shorter than the service time recent requests of its size took;
//  5. charges the caller's budget (package budget) for the request's
//     items (a batch of n URIs costs n), answering ResourceExhausted with
//     a google.rpc.RetryInfo at once when it is over;
//  6. admits the request against two process-wide caps, in-flight
//     requests and in-flight items; waiting for items goes through a
//     bounded queue with controlled delay and adaptive LIFO (package
//     queue), and a request shed there gets Unavailable with RetryInfo.
//     The metadata x-criticality: batch marks work to shed first;
//  7. puts the policy's concurrency into the context, so that the
//     handler's fan-outs (package fanout) run at most that many tasks.
//
// The health service and server reflection are registered here too, so no
// other package ever calls a generated Register…Server function; a test
// in this package reads the source tree to keep it that way. The guard
// does not decide what a URI means (package posts does) and maps only its
// own refusals to gRPC codes.
package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/adaptive"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/connlimit"
	"github.com/sluice-dev/sluice/internal/guard/queue"
	"github.com/sluice-dev/sluice/internal/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Server is a gRPC server whose every method is guarded by a policy.
type Server struct {
	cfg    Config
	health *health.Server
	// The *grpc.Server is built by the first Serve (start), not by New:
	// its stream workers start with it and stop only when it does, so a
	// server built by New and then dropped (a start-up that fails after
	// New) holds no goroutine. Until then grpcOpts and registered wait.
	mu         sync.Mutex
	grpc       *grpc.Server // nil until the first Serve
	grpcOpts   []grpc.ServerOption
	registered []registration
	drained    bool

	methods  map[string]*method // by full method, "/pkg.Svc/M"
	items    *queue.Queue
	limiter  *adaptive.Limiter
	requests *queue.Queue // request slots, one per request, fairly across clients
	budgets  *budget.Budgets
	service  *estimates
	unlisted unlistedFlows
	observer Observer
	identify func(context.Context) (string, error)
	claimed  bool // identify is claimedName: callers are trusted to name themselves
	services []string
	mem      *memory

	inflightItems atomic.Int64
	itemLimit     atomic.Int64 // the limiter's last limit, applied to items
}

// registration is one service waiting for the *grpc.Server to exist.
type registration struct {
	desc *grpc.ServiceDesc
	impl any
}

// method is what the interceptor knows of one registered method.
type method struct {
	policy Policy
	items  *itemField // nil when the request carries no items
	// joinable: the request's items are a list and the answer is one
	// list aligned with it, so the batch can be served in pieces.
	joinable bool
}

// Option adjusts a Server.
type Option func(*Server, *[]grpc.ServerOption)

// WithObserver reports every request's outcome to o (for metrics).
func WithObserver(o Observer) Option {
	return func(s *Server, _ *[]grpc.ServerOption) { s.observer = o }
}

// WithIdentity names callers with identify instead of trusting the name
// they claim in metadata (identity.FromIncoming). An error refuses the
// request with PermissionDenied, before its shape is checked.
func WithIdentity(identify func(context.Context) (string, error)) Option {
	return func(s *Server, _ *[]grpc.ServerOption) { s.identify, s.claimed = identify, false }
}

// WithGRPCOptions passes extra options (TLS credentials, stats handlers)
// to the underlying grpc.Server. Interceptors cannot be replaced.
func WithGRPCOptions(opts ...grpc.ServerOption) Option {
	return func(_ *Server, o *[]grpc.ServerOption) { *o = append(*o, opts...) }
}

// New validates cfg and returns a Server with every service reported
// NOT_SERVING until SetServing. Health, reflection and the services
// Register accepts are registered on the gRPC server when Serve first
// builds it.
func New(cfg Config, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	items, err := queue.New(cfg.queueConfig(), nil)
	if err != nil {
		return nil, err
	}
	requests, err := queue.New(cfg.requestQueueConfig(), nil)
	if err != nil {
		return nil, err
	}
	budgets, err := budget.New(cfg.Admission)
	if err != nil {
		return nil, err
	}
	limiter, err := adaptive.New(cfg.adaptiveConfig(), time.Now())
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		methods:  map[string]*method{},
		items:    items,
		limiter:  limiter,
		requests: requests,
		budgets:  budgets,
		service:  newEstimates(),
		observer: nopObserver{},
		identify: claimedName,
		claimed:  true,
		health:   health.NewServer(),
		mem:      newMemory(cfg),
	}
	codec, err := newCodec()
	if err != nil {
		return nil, err
	}
	grpcOpts := append([]grpc.ServerOption{grpc.MaxRecvMsgSize(cfg.MaxRecvMsgBytes), grpc.ForceServerCodecV2(codec),
		grpc.NumStreamWorkers(streamWorkers(cfg))},
		s.mem.grpcOptions(s)...)
	for _, opt := range opts {
		opt(s, &grpcOpts)
	}
	grpcOpts = append(grpcOpts,
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
	)
	s.itemLimit.Store(limiter.Limit())
	s.grpcOpts = grpcOpts
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return s, nil
}

// streamWorkers is how many long-lived goroutines serve streams: each
// keeps the stack it grew through the interceptor chain and the read
// path, where a goroutine per stream grows (copies) its stack on every
// request. A stream that finds every worker busy gets a goroutine of its
// own, as without workers, so the number bounds nothing and delays
// nothing; it is sized for the requests a busy server has in flight, at
// most max_inflight_requests. The goroutine bound (telemetry) leaves room
// for them.
func streamWorkers(cfg Config) uint32 {
	return uint32(min(cfg.MaxInflightRequests, int64(16*runtime.GOMAXPROCS(0)), 64))
}

// start builds the *grpc.Server on the first call and registers health,
// reflection and every service on it; it returns nil once Drain has run.
func (s *Server) start() *grpc.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.drained {
		return nil
	}
	if s.grpc == nil {
		s.grpc = grpc.NewServer(s.grpcOpts...)
		healthpb.RegisterHealthServer(s.grpc, s.health)
		reflection.Register(s.grpc)
		for _, r := range s.registered {
			s.grpc.RegisterService(r.desc, r.impl)
		}
		s.registered = nil
	}
	return s.grpc
}

// claimedName trusts the name the caller claims (no TLS).
func claimedName(ctx context.Context) (string, error) { return identity.FromIncoming(ctx), nil }

// Register serves impl as the service desc describes, after checking that
// every method has a policy and a unary shape. The error names every
// method that lacks a policy, so start-up stops with a clear reason.
func (s *Server) Register(desc *grpc.ServiceDesc, impl any) error {
	if len(desc.Streams) > 0 {
		return fmt.Errorf("guard: service %s has streaming method %s; the guard serves unary methods only", desc.ServiceName, desc.Streams[0].StreamName)
	}
	sd, err := serviceDescriptor(desc.ServiceName)
	if err != nil {
		return err
	}
	var missing []string
	registered := map[string]*method{}
	for _, m := range desc.Methods {
		name := desc.ServiceName + "/" + m.MethodName
		p, ok := s.cfg.Methods[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		md := sd.Methods().ByName(protoreflect.Name(m.MethodName))
		if md == nil {
			return fmt.Errorf("guard: method %s is not in the registered proto descriptor", name)
		}
		m := &method{policy: p, items: findItemField(md.Input())}
		m.joinable = joinable(m.items, md.Output())
		if err := checkSplittable(name, p, m.joinable, md.Output()); err != nil {
			return err
		}
		registered["/"+name] = m
	}
	if len(missing) > 0 {
		return fmt.Errorf("guard: refusing to serve %s: no policy for %s; add it under methods: in the config", desc.ServiceName, strings.Join(missing, ", "))
	}
	s.mu.Lock()
	if s.grpc != nil {
		s.mu.Unlock()
		// Checked before the method table changes: requests read it
		// without a lock once the server serves.
		return fmt.Errorf("guard: cannot register %s: the server is already serving", desc.ServiceName)
	}
	for full, m := range registered {
		s.methods[full] = m
	}
	s.registered = append(s.registered, registration{desc: s.countingFirst(desc, registered), impl: impl})
	s.mu.Unlock()
	s.services = append(s.services, desc.ServiceName)
	return nil
}

// countingFirst returns a copy of desc whose batch methods count their
// items before decoding a request (see countFirst).
func (s *Server) countingFirst(desc *grpc.ServiceDesc, methods map[string]*method) *grpc.ServiceDesc {
	out := *desc
	out.Methods = slices.Clone(desc.Methods)
	for i, md := range out.Methods {
		m := methods["/"+desc.ServiceName+"/"+md.MethodName]
		out.Methods[i].Handler = m.countFirst(md.Handler, s.limitOf(m))
	}
	return &out
}

func serviceDescriptor(name string) (protoreflect.ServiceDescriptor, error) {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return nil, fmt.Errorf("guard: service %s: %w", name, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("guard: %s is not a service", name)
	}
	return sd, nil
}

// Policy returns the policy registered for a full method name
// ("/pkg.Svc/M"), and whether there is one.
func (s *Server) Policy(fullMethod string) (Policy, bool) {
	m, ok := s.methods[fullMethod]
	if !ok {
		return Policy{}, false
	}
	return m.policy, true
}

// Services lists the registered services, in registration order.
func (s *Server) Services() []string { return slices.Clone(s.services) }

// SetServing reports every registered service, and the server as a whole,
// as SERVING (true) or NOT_SERVING (false) on the health service.
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	for _, name := range s.services {
		s.health.SetServingStatus(name, st)
	}
}

// Serve accepts connections on lis until Stop or GracefulStop, at most
// max_connections open at once.
func (s *Server) Serve(lis net.Listener) error {
	srv := s.start()
	if srv == nil {
		_ = lis.Close()
		return nil // drained before serving, as grpc.Server.Serve after Stop
	}
	capped := connlimit.New(lis, s.mem.plan.Connections)
	s.mem.listener.Store(capped)
	stop := make(chan struct{})
	defer close(stop)
	go s.mem.sweepSilent(stop)
	err := srv.Serve(answersListener{Listener: capped, conns: &s.mem.answers})
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Drain reports NOT_SERVING, then waits for in-flight requests to finish
// until ctx ends, when it stops the server hard.
func (s *Server) Drain(ctx context.Context) {
	s.SetServing(false)
	s.health.Shutdown()
	s.mu.Lock()
	s.drained = true
	srv := s.grpc
	s.mu.Unlock()
	if srv == nil {
		return // never served: no connection, no worker
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
		return
	case <-ctx.Done():
	}
	// Past the deadline: cancel every call still running, then give their
	// handlers up to HandlerGrace to return (GracefulStop returns once they
	// have), so that the stores and caches the caller closes next are not
	// closed under a write finishing its steps. A handler that ignores its
	// cancelled context is not waited for longer: the drain's deadline
	// holds, give or take the grace.
	go srv.Stop()
	select {
	case <-stopped:
	case <-time.After(HandlerGrace):
	}
}

// HandlerGrace is how long a forced Drain waits for the handlers of the
// calls it cancelled to return.
const HandlerGrace = 5 * time.Second

// InflightItems reports how many items are admitted right now.
func (s *Server) InflightItems() int64 { return s.inflightItems.Load() }

// SetBudgets replaces the per-client budgets while serving; requests in
// flight keep what they were charged. An invalid cfg changes nothing.
func (s *Server) SetBudgets(cfg budget.Config) error {
	if err := s.splitBudgetErrors(cfg); err != nil {
		return err
	}
	return s.budgets.SetConfig(cfg, time.Now())
}

// Budget returns the budget in force for a client name.
func (s *Server) Budget(client string) budget.Budget { return s.budgets.For(client) }

// Policies returns the policy of every registered method, by
// "pkg.Svc/M" name.
func (s *Server) Policies() map[string]Policy {
	out := make(map[string]Policy, len(s.methods))
	for full, m := range s.methods {
		out[methodName(full)] = m.policy
	}
	return out
}

// QueueStats reports the item queue's state.
func (s *Server) QueueStats() queue.Stats { return s.items.Stats() }
