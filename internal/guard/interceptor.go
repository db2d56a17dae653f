package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Rejection reasons reported to the Observer; a fixed set, so metrics
// labels stay bounded.
const (
	ReasonShape    = "shape"    // the request broke its method's shape limits
	ReasonOverload = "overload" // no process-wide capacity before the deadline
	ReasonDeadline = "deadline" // the deadline had passed before work could start
	ReasonIdentity = "identity" // the caller may not call (mutual TLS)
)

// Request describes one guarded request to an Observer.
type Request struct {
	Client string
	Method string // full method, "/pkg.Svc/M"
	Items  int    // items the request carries (its cost)
}

// Observer learns the outcome of every guarded request. Implementations
// must not block.
type Observer interface {
	// Rejected is called when the guard refuses a request before its
	// handler runs.
	Rejected(ctx context.Context, r Request, reason string)
	// Finished is called when a handler returns.
	Finished(ctx context.Context, r Request, code codes.Code, elapsed time.Duration)
}

type nopObserver struct{}

func (nopObserver) Rejected(context.Context, Request, string)                    {}
func (nopObserver) Finished(context.Context, Request, codes.Code, time.Duration) {}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m, ok := s.methods[info.FullMethod]
	if !ok {
		// Health and reflection are not item work; everything else was
		// registered through Register and has a policy.
		return handler(ctx, req)
	}
	start := time.Now()
	client, err := s.identify(ctx)
	if err != nil {
		s.observer.Rejected(ctx, Request{Client: identity.Unknown, Method: info.FullMethod}, ReasonIdentity)
		return nil, status.Errorf(codes.PermissionDenied, "%s: %v", shortName(info.FullMethod), err)
	}
	ctx = identity.WithClient(ctx, client)
	r := Request{Client: client, Method: info.FullMethod, Items: 1}

	var items []string
	if m.items != nil {
		items = m.items.items(req.(proto.Message))
		r.Items = len(items)
		if err := checkShape(shortName(info.FullMethod), m.items, items, m.policy); err != nil {
			s.observer.Rejected(ctx, r, ReasonShape)
			return nil, err
		}
	}

	ctx, cancel := context.WithTimeout(ctx, m.policy.Timeout)
	defer cancel()
	release, reason, err := s.admit(ctx, info.FullMethod, int64(max(r.Items, 1)))
	if err != nil {
		s.observer.Rejected(ctx, r, reason)
		return nil, err
	}
	defer release()

	resp, err := handler(fanout.WithLimit(ctx, m.policy.Concurrency), req)
	err = deadlineToStatus(ctx, err)
	s.observer.Finished(ctx, r, status.Code(err), time.Since(start))
	return resp, err
}

// admit takes one request slot and cost item slots from the process-wide
// caps, waiting until shortly before ctx's deadline.
func (s *Server) admit(ctx context.Context, fullMethod string, cost int64) (release func(), reason string, err error) {
	if ctx.Err() != nil {
		return nil, ReasonDeadline, status.Errorf(codes.DeadlineExceeded, "%s: the deadline passed before the request could start", shortName(fullMethod))
	}
	ctx, cancel := admissionContext(ctx)
	defer cancel()
	if err := s.requests.Acquire(ctx, 1); err != nil {
		return nil, ReasonOverload, overloaded(fullMethod, fmt.Sprintf("all %d request slots are busy", s.cfg.MaxInflightRequests))
	}
	if err := s.items.Acquire(ctx, cost); err != nil {
		s.requests.Release(1)
		return nil, ReasonOverload, overloaded(fullMethod, fmt.Sprintf("%d items are needed and the process-wide cap of %d in-flight items stayed full", cost, s.cfg.MaxInflightItems))
	}
	s.inflightItems.Add(cost)
	return func() {
		s.inflightItems.Add(-cost)
		s.items.Release(cost)
		s.requests.Release(1)
	}, "", nil
}

// admissionContext ends the wait for capacity a little before ctx's
// deadline: a fifth of the time left, at most 100ms. The caller's deadline
// starts before the server's, so a guard that waited to the very end would
// always lose the race and the caller would see DeadlineExceeded, never
// the Unavailable that says the server is at capacity.
func admissionContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	margin := min(time.Until(deadline)/5, 100*time.Millisecond)
	return context.WithDeadline(ctx, deadline.Add(-margin))
}

func overloaded(fullMethod, why string) error {
	return status.Errorf(codes.Unavailable, "%s: server at capacity until the deadline: %s; retry with backoff or send smaller batches", shortName(fullMethod), why)
}

// deadlineToStatus turns a bare context error from a handler into the
// matching status, so callers see DeadlineExceeded rather than Unknown.
func deadlineToStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "%v", err)
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return status.Errorf(codes.Canceled, "%v", err)
	}
	return err
}

// streamServices are the services registered by New whose methods
// stream (health Watch, reflection); they carry no item work.
var streamServices = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	// Register refuses streaming methods, so only health and reflection
	// stream. Anything else arrives through a handler for unknown methods
	// (grpc.UnknownServiceHandler passed in WithGRPCOptions) and has no
	// policy, so it is not served.
	for _, prefix := range streamServices {
		if strings.HasPrefix(info.FullMethod, prefix) {
			return handler(srv, ss)
		}
	}
	return status.Errorf(codes.Unimplemented, "%s: no such method; only methods registered with a policy are served", info.FullMethod)
}
