package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/guard/queue"
	"github.com/sluice-dev/sluice/internal/identity"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Rejection reasons reported to the Observer; a fixed set, so metrics
// labels stay bounded.
const (
	ReasonShape    = "shape"    // the request broke its method's shape limits
	ReasonOverload = "overload" // no process-wide capacity before the deadline
	ReasonDeadline = "deadline" // too little of the deadline was left to do the work
	ReasonQuota    = "quota"    // the client was over its budget
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
	stream := receivingOf(ctx)
	stream.received(0) // the request is decoded: its stream's bytes are gone
	defer stream.handled()
	m, ok := s.methods[info.FullMethod]
	if !ok {
		// Health and reflection are not item work; everything else was
		// registered through Register and has a policy.
		return handler(ctx, req)
	}
	start := time.Now()
	id := s.identifyOnce(ctx)
	client, err := id.client, id.err
	if err != nil {
		s.observer.Rejected(ctx, Request{Client: identity.Unknown, Method: info.FullMethod}, ReasonIdentity)
		return nil, status.Errorf(codes.PermissionDenied, "%s: %v", shortName(info.FullMethod), err)
	}
	ctx = identity.WithClient(ctx, client)
	r := Request{Client: client, Method: info.FullMethod, Items: 1}

	shape := m.policy
	split, splits := s.splitFor(m, client)
	if splits {
		shape.MaxItems = split.MaxSplitItems
	}
	if n, ok := counted(ctx); ok {
		r.Items = n
		s.observer.Rejected(ctx, r, ReasonShape)
		return nil, tooManyItems(shortName(info.FullMethod), m.items, n, shape)
	}
	var items []string
	if m.items != nil {
		items = m.items.items(req.(proto.Message))
		r.Items = len(items)
		if err := checkShape(shortName(info.FullMethod), m.items, items, shape); err != nil {
			s.observer.Rejected(ctx, r, ReasonShape)
			return nil, err
		}
	}

	batch, err := criticalityOf(ctx, stream)
	if err != nil {
		s.observer.Rejected(ctx, r, ReasonShape)
		return nil, err
	}
	if len(items) > m.policy.MaxItems {
		// Only a client whose batches split gets here (checkShape).
		joined, err := s.serveSplit(ctx, info.FullMethod, client, m, split, req.(proto.Message), len(items), handler)
		resp, err := s.holdResponse(ctx, info.FullMethod, client, joined, err)
		s.observer.Finished(ctx, r, status.Code(err), time.Since(start))
		return resp, err
	}
	if m.joinable && len(items) > s.cfg.PieceItems {
		return s.servePieces(ctx, r, m, req.(proto.Message), batch, handler)
	}
	ctx, cancel := context.WithTimeout(ctx, m.policy.Timeout)
	defer cancel()
	cost := int64(max(r.Items, 1))
	admitted, reason, err := s.admit(ctx, info.FullMethod, client, cost, batch)
	if err != nil {
		s.observer.Rejected(ctx, r, reason)
		return nil, err
	}
	defer admitted.release()

	began := time.Now()
	ctx, _ = withAnswerSlot(ctx)
	resp, err := handler(fanout.WithLimit(ctx, m.policy.Concurrency), req)
	err = deadlineToStatus(ctx, err)
	if err == nil {
		took := time.Since(began)
		s.service.observe(info.FullMethod, cost, took)
		s.observeCapacity(cost, took)
	}
	resp, err = s.holdResponse(ctx, info.FullMethod, client, resp, err)
	s.observer.Finished(ctx, r, status.Code(err), time.Since(start))
	return resp, err
}

// admit runs the checks that precede any work, cheapest refusal first:
// the deadline against the expected service time, the client's budget,
// then the process-wide request slots and item queue.
func (s *Server) admit(ctx context.Context, fullMethod, client string, cost int64, batch bool) (admission, string, error) {
	request, reason, err := s.admitRequest(ctx, fullMethod, client, cost, batch)
	if err != nil {
		return admission{}, reason, err
	}
	items, reason, err := s.admitItems(ctx, fullMethod, client, cost, cost, batch, false)
	if err != nil {
		request.refund()
		return admission{}, reason, err
	}
	return admission{request: request, items: items}, "", nil
}

// admission is what an admitted request holds until it is done.
type admission struct {
	request admittedRequest
	items   admittedItems
}

// release gives back the request's items, then its request slot and
// budget charge. It must be called exactly once.
func (a admission) release() {
	a.items.release()
	a.request.release()
}

// admitRequest checks the deadline against the time requests of cost
// items take now, charges cost to the client's budget, and takes one of
// the process-wide request slots.
func (s *Server) admitRequest(ctx context.Context, fullMethod, client string, cost int64, batch bool) (admittedRequest, string, error) {
	name := shortName(fullMethod)
	deadline, _ := ctx.Deadline()
	expected := s.service.expect(fullMethod, cost)
	if left := time.Until(deadline); ctx.Err() != nil || left < expected {
		return admittedRequest{}, ReasonDeadline, status.Errorf(codes.DeadlineExceeded,
			"%s: %v of deadline left, shorter than the %v that requests of %d items take now; send a longer deadline or a smaller batch",
			name, max(left, 0).Round(time.Microsecond), expected.Round(time.Microsecond), cost)
	}
	spent, refusal := s.budgets.Spend(client, cost, time.Now())
	if refusal != nil {
		return admittedRequest{}, ReasonQuota, overBudget(name, refusal, max(refusal.RetryAfter, expected, minRetryDelay))
	}
	slot, err := s.takeRequestSlot(ctx, fullMethod, client, cost, batch)
	if err != nil {
		spent.Refund(time.Now())
		if ctx.Err() != nil && !errors.Is(err, queue.ErrShed) {
			return admittedRequest{}, ReasonDeadline, status.Errorf(codes.DeadlineExceeded, "%s: the deadline passed while waiting for a request slot", name)
		}
		return admittedRequest{}, ReasonOverload, overloaded(name, fmt.Sprintf("all %d request slots stayed busy (%v)", s.cfg.MaxInflightRequests, err), s.cfg.QueueInterval)
	}
	return admittedRequest{slot: slot, spent: spent}, "", nil
}

// admittedRequest is a request's process-wide request slot and its
// charge to the client's budget. A value, not a closure, so that
// admission allocates nothing for its release.
type admittedRequest struct {
	slot  queue.Grant
	spent budget.Spent
}

// release gives back the request slot, then the budget charge. It must
// be called exactly once.
func (a admittedRequest) release() {
	a.slot.Release()
	a.spent.Release()
}

// refund is release for a request shed before any work: its items go
// back to the client's budget too (budget.Spent.Refund).
func (a admittedRequest) refund() {
	a.slot.Release()
	a.spent.Refund(time.Now())
}

// takeRequestSlot takes one of the process-wide request slots for a
// request of cost items. With every slot taken it waits in client's
// flow of the request slots' fair queue, so that the next slot freed
// goes to the caller furthest under its share, not to whoever waited
// longest, for as long as the controlled-delay rule allows and no later
// than it could wait for items (latestStart).
func (s *Server) takeRequestSlot(ctx context.Context, fullMethod, client string, cost int64, batch bool) (queue.Grant, error) {
	flow, weight := s.unlisted.flowOf(s.budgets.Config(), client, time.Now())
	return s.requests.Take(ctx, queue.Request{Cost: 1, Batch: batch, StartBy: s.latestStart(ctx, fullMethod, cost), Flow: flow, Weight: weight})
}

// latestStart is the latest time a request of fullMethod, left items of
// which are still to be served, may wait until: the admission deadline
// (admissionDeadline), and never later than its deadline minus the start
// margin of left items, so that one that starts has room to finish.
// Zero without a deadline.
func (s *Server) latestStart(ctx context.Context, fullMethod string, left int64) time.Time {
	deadline, ok := ctx.Deadline()
	if !ok {
		return time.Time{}
	}
	startBy := deadline.Add(-s.service.startMargin(fullMethod, left))
	if waitUntil := admissionDeadline(deadline); waitUntil.Before(startBy) {
		startBy = waitUntil
	}
	return startBy
}

// admitItems waits in the fair queue for cost items of the process-wide
// capacity, in client's flow; left is the items of the request still to
// be served from here on, which must start in time to finish by the
// deadline. continues marks a later piece of a request already started
// (queue.Request.Continues).
func (s *Server) admitItems(ctx context.Context, fullMethod, client string, cost, left int64, batch, continues bool) (admittedItems, string, error) {
	name := shortName(fullMethod)
	startBy := s.latestStart(ctx, fullMethod, left) // zero: no deadline, so no latest start
	flow, weight := s.unlisted.flowOf(s.budgets.Config(), client, time.Now())
	grant, err := s.items.Take(ctx, queue.Request{Cost: cost, Batch: batch, StartBy: startBy, Flow: flow, Weight: weight, Continues: continues})
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, queue.ErrShed) {
			return admittedItems{}, ReasonDeadline, status.Errorf(codes.DeadlineExceeded, "%s: the deadline passed while waiting for capacity", name)
		}
		return admittedItems{}, ReasonOverload, overloaded(name, fmt.Sprintf("%d items were needed and the process-wide cap of %d in-flight items (adaptive, at most %d) stayed full (%v)", cost, s.itemLimit.Load(), s.cfg.MaxInflightItems, err), s.cfg.QueueInterval)
	}
	s.inflightItems.Add(cost)
	return admittedItems{s: s, grant: grant, cost: cost}, "", nil
}

// admittedItems is cost items of the process-wide capacity, granted by
// the item queue. A value, not a closure, so that admission allocates
// nothing for its release.
type admittedItems struct {
	s     *Server
	grant queue.Grant
	cost  int64
}

// release gives the items back. It must be called exactly once.
func (a admittedItems) release() {
	a.s.inflightItems.Add(-a.cost)
	a.grant.Release()
}

// admissionDeadline is when the wait for capacity ends for a request
// whose deadline is deadline: a little before it, a fifth of the time
// left, at most 100ms. The caller's deadline starts before the server's,
// so a guard that waited to the very end would always lose the race and
// the caller would see DeadlineExceeded, never the Unavailable that says
// the server is at capacity.
func admissionDeadline(deadline time.Time) time.Time {
	margin := min(time.Until(deadline)/5, 100*time.Millisecond)
	return deadline.Add(-margin)
}

// minRetryDelay is the shortest wait a refusal advises.
const minRetryDelay = 10 * time.Millisecond

func overloaded(name, why string, retry time.Duration) error {
	msg := fmt.Sprintf("%s: server at capacity, request shed before any work: %s; retry after the advised delay with backoff, or send smaller batches", name, why)
	return withRetryInfo(status.New(codes.Unavailable, msg), retry)
}

// overBudget is the ResourceExhausted answer to a client over its
// budget. A request larger than the client's burst can never fit, so it
// carries no RetryInfo.
func overBudget(name string, r *budget.Refusal, retry time.Duration) error {
	st := status.New(codes.ResourceExhausted, name+": over budget: "+r.Error())
	violation := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     "client:" + r.Client,
		Description: r.Error(),
	}}}
	if d, err := st.WithDetails(violation); err == nil {
		st = d
	}
	if r.Reason == budget.OverBurst {
		return st.Err()
	}
	return withRetryInfo(st, retry)
}

// withRetryInfo adds a google.rpc.RetryInfo saying how long to wait.
func withRetryInfo(st *status.Status, retry time.Duration) error {
	d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	if err != nil {
		return st.Err()
	}
	return d.Err()
}

// CriticalityKey is the metadata key by which a caller marks a request
// "interactive" (the default) or "batch"; batch work is shed first.
const CriticalityKey = "x-criticality"

// criticalityOf reports whether the request is batch work, from the
// values the stream's tap read from its headers, or from the incoming
// metadata when there is no tap record.
func criticalityOf(ctx context.Context, stream *receiving) (batch bool, err error) {
	if stream == nil {
		return criticality(metadata.ValueFromIncomingContext(ctx, CriticalityKey))
	}
	return criticality(stream.criticality)
}

// criticality reports whether a request whose CriticalityKey values are
// vals is batch work.
func criticality(vals []string) (batch bool, err error) {
	if len(vals) == 0 {
		return false, nil
	}
	switch strings.ToLower(strings.TrimSpace(vals[0])) {
	case "", "interactive":
		return false, nil
	case "batch":
		return true, nil
	}
	return false, InvalidArgument(CriticalityKey, fmt.Sprintf("metadata %s is %q; use interactive (the default) or batch", CriticalityKey, vals[0]))
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
