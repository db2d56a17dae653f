package guard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/connlimit"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"github.com/sluice-dev/sluice/internal/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Memory is bounded the way goroutines and sockets are: by caps checked
// against a budget at start-up, and by admission before the bytes exist.
//
// gRPC reads a request's whole message before any interceptor runs, and
// offers no hook between the message's length prefix and its body. So a
// stream is admitted at its start (grpc.InTapHandle, which runs on the
// HEADERS frame, before the body is read) by reserving the most it can
// make sluice hold: the largest message the transport accepts
// (max_recv_msg_bytes) plus, for a batch method, the largest valid request
// its policy allows (the decoded copy). The reservation comes from a
// process-wide ledger of request bytes with a per-caller share, and is
// given back the moment the message has been counted and dropped or
// decoded — microseconds for an ordinary request — or when the stream
// ends, whichever is first. For the reservation and the stream's slot,
// a unary stream ends when its handler returns (its answer is then
// queued whole, its bytes held in the response ledger); a stream whose
// handler never runs ends with its context. A stream that does not fit
// is refused at once, its body never buffered: Unavailable when the
// process is at its cap, ResourceExhausted when the caller is at its
// share, both with RetryInfo. Shrinking max_recv_msg_bytes was not the bound chosen: a
// 20,000-URI batch of ordinary URIs (1.5 MB) still reaches the count and
// its InvalidArgument, and a trusted caller's large batch still fits.
//
// Responses are counted from their wire size once the handler returns:
// the bytes are reserved from a second ledger before the response is
// marshalled, and given back when the transport has written them (the
// marshalled buffer is freed), so callers that do not read cannot pile
// responses up in the server. grpc-go drops the answers still queued on
// a connection that closes without freeing them; each connection's held
// answers are known (connanswers.go) and given back when it closes.
//
// Connections (package connlimit), streams per connection, streams across
// connections and keepalive pings are capped too.

// MemoryConfig is the guard's share of the memory budget. A zero field
// takes its default, derived from the limit.
type MemoryConfig struct {
	// MemoryLimit is the process's memory budget and the Go runtime's
	// soft limit. Default: membudget.DefaultLimit (GOMEMLIMIT, else 90 %
	// of the cgroup limit, else a quarter of the machine's memory up to
	// 4 GiB).
	MemoryLimit membudget.Bytes `yaml:"memory_limit"`
	// MaxRequestBytes caps request bytes being received, process-wide.
	// Default: 60 % of what the limit leaves after the fixed reserve,
	// connections and items.
	MaxRequestBytes membudget.Bytes `yaml:"max_request_bytes"`
	// MaxCallerRequestBytes caps one caller's share of MaxRequestBytes.
	// Default: half of it.
	MaxCallerRequestBytes membudget.Bytes `yaml:"max_caller_request_bytes"`
	// MaxResponseBytes caps response bytes marshalled and not yet
	// written. Default: 30 % of what the limit leaves (see above).
	MaxResponseBytes membudget.Bytes `yaml:"max_response_bytes"`
	// MaxConnections caps open gRPC connections. Default 256.
	MaxConnections int `yaml:"max_connections"`
	// MaxStreamsPerConnection is HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS.
	// Default 128.
	MaxStreamsPerConnection uint32 `yaml:"max_streams_per_connection"`
	// MaxStreams caps streams open across all connections. Default:
	// max_inflight_requests + max_queued_requests (more could only be
	// shed later).
	MaxStreams int64 `yaml:"max_streams"`
	// KeepaliveMinTime is the shortest interval between a client's
	// keepalive pings; a client pinging faster is sent GOAWAY. Default 10s.
	KeepaliveMinTime time.Duration `yaml:"keepalive_min_time"`
	// MaxConnectionAge is how long a connection serves before the server
	// sends it GOAWAY (gRPC adds ±10 % jitter); its calls in flight get a
	// minute to finish, and the client reconnects. It spreads long-lived
	// clients over replicas as they come and go, and bounds how long a
	// connection can hold response bytes the transport dropped without
	// freeing (docs/reliability.md). Default 30m.
	MaxConnectionAge time.Duration `yaml:"max_connection_age"`
	// GCPercent is the Go collector's GOGC: how far the heap grows past
	// the live heap before a collection. Default: GOGC when the
	// environment sets it, else membudget.DefaultGCPercent (400), which
	// the soft memory limit makes safe: the collector still runs harder
	// as the heap nears the budget.
	GCPercent int `yaml:"gc_percent"`
	// ReceiveTimeout is how long a stream may take, from its headers, to
	// deliver its request: a stream that has not is cancelled, so that
	// streams that send their headers and then nothing cannot hold the
	// stream slots and request bytes. Default 10s.
	ReceiveTimeout time.Duration `yaml:"receive_timeout"`
	// CacheBytes is what in-process caches outside the guard may hold
	// (the near cache's max_bytes): set by the program from their
	// config, not by the file, and counted among the fixed terms.
	CacheBytes membudget.Bytes `yaml:"-"`
}

// Fixed terms of the budget: what the process needs before any request
// (runtime, store and cache clients, telemetry), what one connection holds
// whatever it sends (transport read and write buffers, HPACK tables,
// three goroutines), and the working memory of one admitted item (its
// URI, cache key and a typical record while a batch is answered).
const (
	// maxBytes and maxCount bound the byte caps and the counts the plan
	// multiplies and adds, far above any machine's, so that its sums
	// cannot overflow and pass the check against the limit.
	maxBytes        = membudget.Bytes(1) << 50 // 1024 TiB
	maxCount        = 1 << 30
	baseReserve     = 64 * membudget.MiB
	connectionBytes = 256 * membudget.KiB
	itemBytes       = 2 * membudget.KiB
)

// Flow-control windows. Fixed windows turn off gRPC's bandwidth-delay
// estimate, which grows a stream's window to 16 MiB: a stream not yet
// read holds at most streamWindow, and a stream's body is let in only as
// its (admitted) handler reads it.
const (
	streamWindow     = 64 << 10
	connectionWindow = 1 << 20
)

// Bounds of receive_timeout, and its default.
const (
	defaultReceiveTimeout = 10 * time.Second
	minReceiveTimeout     = 10 * time.Millisecond
	maxReceiveTimeout     = 10 * time.Minute
)

// connectionAgeGrace is how long the calls in flight on a connection at
// its max_connection_age get to finish before it is closed: far more
// than any method's timeout.
const connectionAgeGrace = time.Minute

func (c MemoryConfig) merge(o MemoryConfig) MemoryConfig {
	pick := func(a, b membudget.Bytes) membudget.Bytes {
		if b != 0 {
			return b
		}
		return a
	}
	c.MemoryLimit = pick(c.MemoryLimit, o.MemoryLimit)
	c.MaxRequestBytes = pick(c.MaxRequestBytes, o.MaxRequestBytes)
	c.MaxCallerRequestBytes = pick(c.MaxCallerRequestBytes, o.MaxCallerRequestBytes)
	c.MaxResponseBytes = pick(c.MaxResponseBytes, o.MaxResponseBytes)
	if o.MaxConnections != 0 {
		c.MaxConnections = o.MaxConnections
	}
	if o.MaxStreamsPerConnection != 0 {
		c.MaxStreamsPerConnection = o.MaxStreamsPerConnection
	}
	if o.MaxStreams != 0 {
		c.MaxStreams = o.MaxStreams
	}
	if o.KeepaliveMinTime != 0 {
		c.KeepaliveMinTime = o.KeepaliveMinTime
	}
	if o.MaxConnectionAge != 0 {
		c.MaxConnectionAge = o.MaxConnectionAge
	}
	if o.GCPercent != 0 {
		c.GCPercent = o.GCPercent
	}
	if o.ReceiveTimeout != 0 {
		c.ReceiveTimeout = o.ReceiveTimeout
	}
	c.CacheBytes = pick(c.CacheBytes, o.CacheBytes)
	return c
}

// MemoryPlan is the memory budget with every cap resolved.
type MemoryPlan struct {
	Limit       membudget.Bytes
	LimitSource string // membudget.Source…
	// GCPercent is the collector's GOGC, and GCSource where it came from
	// (membudget.Source…); 0 when the environment's GOGC is left in force.
	GCPercent int
	GCSource  string
	// Requests, CallerRequests and Responses are the ledgers' caps.
	Requests, CallerRequests, Responses membudget.Bytes
	Connections                         int
	StreamsPerConnection                uint32
	Streams                             int64
	KeepaliveMinTime, MaxConnectionAge  time.Duration
	ReceiveTimeout                      time.Duration
	// LargestStream is the largest reservation one stream takes, and
	// the method that takes it.
	LargestStream       membudget.Bytes
	LargestStreamMethod string
	// Fixed is what the budget sets aside before the ledgers: the base
	// reserve, every connection's buffers, every item's working memory
	// and the in-process caches' cap (CacheBytes).
	Fixed membudget.Bytes
}

// Memory resolves the memory budget and its caps from c.
func (c Config) Memory() MemoryPlan {
	m := c.MemoryConfig
	p := MemoryPlan{Limit: m.MemoryLimit, LimitSource: membudget.SourceFlag,
		Connections: m.MaxConnections, StreamsPerConnection: m.MaxStreamsPerConnection,
		Streams: m.MaxStreams, KeepaliveMinTime: m.KeepaliveMinTime, MaxConnectionAge: m.MaxConnectionAge,
		ReceiveTimeout: cmp.Or(m.ReceiveTimeout, defaultReceiveTimeout)}
	if p.Limit == 0 {
		p.Limit, p.LimitSource = membudget.DefaultLimit()
	}
	p.GCPercent, p.GCSource = m.GCPercent, membudget.SourceFlag
	if p.GCPercent == 0 {
		p.GCPercent, p.GCSource = membudget.DefaultGCPercent()
	}
	if p.Connections == 0 {
		p.Connections = 256
	}
	if p.StreamsPerConnection == 0 {
		p.StreamsPerConnection = 128
	}
	if p.Streams == 0 {
		p.Streams = c.MaxInflightRequests + int64(c.MaxQueuedRequests)
	}
	if p.KeepaliveMinTime == 0 {
		p.KeepaliveMinTime = 10 * time.Second
	}
	if p.MaxConnectionAge == 0 {
		p.MaxConnectionAge = 30 * time.Minute
	}
	p.Fixed = baseReserve + membudget.Bytes(p.Connections)*connectionBytes + membudget.Bytes(c.MaxInflightItems)*itemBytes + m.CacheBytes
	left := max(p.Limit-p.Fixed, 0)
	p.Requests = cmpOr(m.MaxRequestBytes, left/10*6)
	p.CallerRequests = cmpOr(m.MaxCallerRequestBytes, p.Requests/2)
	p.Responses = cmpOr(m.MaxResponseBytes, left/10*3)
	p.LargestStream = membudget.Bytes(c.MaxRecvMsgBytes)
	// In name order, so that of methods with the same reservation the
	// plan (and the start-up error that names it) is always the same one.
	for _, name := range slices.Sorted(maps.Keys(c.Methods)) {
		pol := c.Methods[name]
		if w := streamReservation(c.MaxRecvMsgBytes, pol, pol.MaxItems); w > p.LargestStream {
			p.LargestStream, p.LargestStreamMethod = w, name
		}
		// A client the policy lets split may send max_split_items: its
		// streams reserve for that many, so its largest batch must fit
		// its share too.
		for _, client := range slices.Sorted(maps.Keys(pol.Oversize)) {
			o := pol.Oversize[client]
			if !o.splits() {
				continue
			}
			if w := streamReservation(c.MaxRecvMsgBytes, pol, o.MaxSplitItems); w > p.LargestStream {
				p.LargestStream = w
				p.LargestStreamMethod = fmt.Sprintf("%s (client %q, max_split_items %d)", name, client, o.MaxSplitItems)
			}
		}
	}
	return p
}

func cmpOr(a, b membudget.Bytes) membudget.Bytes {
	if a != 0 {
		return a
	}
	return b
}

// streamReservation is the most one request stream of a method with
// policy p, from a caller who may send maxItems items, can make the
// process hold: its message, as large as the transport accepts, and the
// decoded copy of the largest valid batch.
func streamReservation(maxRecv int, p Policy, maxItems int) membudget.Bytes {
	return membudget.Bytes(maxRecv) + validRequestBytes(p, maxItems)
}

// validRequestBytes is the wire size of the largest request of n items a
// policy admits: n URIs of MaxURILength bytes, each with a tag and a
// length prefix.
func validRequestBytes(p Policy, n int) membudget.Bytes {
	return membudget.Bytes(n) * membudget.Bytes(p.MaxURILength+1+varintLen(p.MaxURILength))
}

func varintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

// validate refuses a budget its caps cannot fit in, naming them.
func (p MemoryPlan) validate(c Config) error {
	var errs []error
	if p.Limit < 64*membudget.MiB {
		errs = append(errs, fmt.Errorf("guard: memory_limit %v is below the 64MiB the process needs before any request", p.Limit))
	}
	for _, b := range []struct {
		key string
		v   membudget.Bytes
	}{{"memory_limit", p.Limit}, {"max_request_bytes", p.Requests}, {"max_caller_request_bytes", p.CallerRequests}, {"max_response_bytes", p.Responses}} {
		if b.v > maxBytes {
			errs = append(errs, fmt.Errorf("guard: %s must be at most %v, got %v", b.key, maxBytes, b.v))
		}
	}
	if p.Connections < 1 || p.Connections > maxCount {
		errs = append(errs, fmt.Errorf("guard: max_connections must be between 1 and %d, got %d", maxCount, p.Connections))
	}
	if p.Streams < 1 || p.Streams > maxCount {
		errs = append(errs, fmt.Errorf("guard: max_streams must be between 1 and %d, got %d", maxCount, p.Streams))
	}
	if p.KeepaliveMinTime < 0 {
		errs = append(errs, fmt.Errorf("guard: keepalive_min_time must not be negative, got %v", p.KeepaliveMinTime))
	}
	if p.GCSource == membudget.SourceFlag && (p.GCPercent < membudget.MinGCPercent || p.GCPercent > membudget.MaxGCPercent) {
		errs = append(errs, fmt.Errorf("guard: gc_percent must be between %d and %d, got %d", membudget.MinGCPercent, membudget.MaxGCPercent, p.GCPercent))
	}
	if p.ReceiveTimeout < minReceiveTimeout || p.ReceiveTimeout > maxReceiveTimeout {
		errs = append(errs, fmt.Errorf("guard: receive_timeout must be between %v and %v, got %v", minReceiveTimeout, maxReceiveTimeout, p.ReceiveTimeout))
	}
	if p.MaxConnectionAge < time.Second {
		errs = append(errs, fmt.Errorf("guard: max_connection_age must be at least 1s, got %v", p.MaxConnectionAge))
	}
	if p.Responses < minResponseBytes {
		errs = append(errs, fmt.Errorf("guard: max_response_bytes must be at least %v, got %v: a caller's share is half of it, and an answer larger than its share is never sent", minResponseBytes, p.Responses))
	}
	if p.CallerRequests > p.Requests {
		errs = append(errs, fmt.Errorf("guard: max_caller_request_bytes %v exceeds max_request_bytes %v", p.CallerRequests, p.Requests))
	}
	if p.LargestStream > p.CallerRequests {
		what := "max_recv_msg_bytes " + membudget.Bytes(c.MaxRecvMsgBytes).String()
		if p.LargestStreamMethod != "" {
			what += fmt.Sprintf(" plus the largest valid %s request (%v)", p.LargestStreamMethod, p.LargestStream-membudget.Bytes(c.MaxRecvMsgBytes))
		}
		errs = append(errs, fmt.Errorf("guard: one request stream may hold %v (%s), more than max_caller_request_bytes %v (max_request_bytes %v, from memory_limit %v): no request could be admitted; raise memory_limit or the byte caps, or lower max_recv_msg_bytes",
			p.LargestStream, what, p.CallerRequests, p.Requests, p.Limit))
	}
	if total := p.Fixed + p.Requests + p.Responses; total > p.Limit {
		errs = append(errs, fmt.Errorf("guard: the caps' worst case is %v, over memory_limit %v (%s): %v reserve + max_connections %d × %v + max_inflight_items %d × %v + near_cache.max_bytes %v + max_request_bytes %v + max_response_bytes %v; raise memory_limit or lower the caps",
			total, p.Limit, p.LimitSource, baseReserve, p.Connections, connectionBytes, c.MaxInflightItems, itemBytes, c.CacheBytes, p.Requests, p.Responses))
	}
	return errors.Join(errs...)
}

// memory is the Server's admission by bytes, streams and connections.
type memory struct {
	plan      MemoryPlan
	maxRecv   int
	requests  *membudget.Ledger
	responses *membudget.Ledger
	retry     time.Duration
	listener  atomic.Pointer[connlimit.Listener]
	answers   sync.Map // connKey → *connAnswers, of every open connection

	streams        atomic.Int64
	peakStreams    atomic.Int64
	refusedStreams atomic.Int64
	pending        pendingStreams // admitted streams whose request has not arrived
}

func newMemory(cfg Config) *memory {
	plan := cfg.Memory()
	return &memory{
		plan:      plan,
		maxRecv:   cfg.MaxRecvMsgBytes,
		requests:  membudget.NewLedger("request bytes being received", plan.Requests, plan.CallerRequests),
		responses: membudget.NewLedger("response bytes not yet written", plan.Responses, plan.Responses/2),
		retry:     cfg.QueueInterval,
	}
}

// grpcOptions are the transport settings the budget depends on.
func (mem *memory) grpcOptions(s *Server) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(s.tapHandle),
		grpc.MaxConcurrentStreams(mem.plan.StreamsPerConnection),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connectionWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: mem.plan.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: mem.plan.MaxConnectionAge, MaxConnectionAgeGrace: connectionAgeGrace}),
	}
}

// receivingKey holds a stream's request-bytes reservation in its context.
type receivingKey struct{}

// tapHandle admits a stream at its start, before its body is read.
func (s *Server) tapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	mem := s.mem
	name := shortName(info.FullMethodName)
	n := mem.streams.Add(1)
	if n > mem.plan.Streams {
		mem.streams.Add(-1)
		mem.refusedStreams.Add(1)
		s.observer.Rejected(ctx, Request{Client: s.identifyStream(ctx, info.Header).tapName(), Method: s.observedMethod(info.FullMethodName)}, ReasonMemory)
		return nil, overloaded(name, fmt.Sprintf("%d streams are open, the process-wide cap (max_streams)", mem.plan.Streams), mem.retry)
	}
	for p := mem.peakStreams.Load(); n > p && !mem.peakStreams.CompareAndSwap(p, n); p = mem.peakStreams.Load() {
	}
	id := s.identifyStream(ctx, info.Header)
	client := id.tapName()
	w, ok := s.reservation(info.FullMethodName, client)
	if !ok {
		context.AfterFunc(ctx, func() { mem.streams.Add(-1) })
		return ctx, nil
	}
	res, refusal := mem.requests.Reserve(client, w)
	if refusal != nil {
		mem.streams.Add(-1)
		reason := ReasonMemory
		if refusal.PerCaller {
			reason = ReasonMemoryShare
		}
		s.observer.Rejected(ctx, Request{Client: client, Method: s.observedMethod(info.FullMethodName)}, reason)
		return nil, mem.refuse(name, beforeReading, refusal)
	}
	r := &receiving{mem: mem, res: res, caller: id, criticality: info.Header[CriticalityKey], server: s, method: info.FullMethodName}
	// A stream that sends its headers and then nothing would hold its
	// slot and reservation until the caller left: its request must
	// arrive within receive_timeout, or the stream is cancelled.
	r.ctx, r.cancel = context.WithCancel(ctx)
	mem.pending.add(r, time.Now())
	r.stopEnd = context.AfterFunc(ctx, r.end)
	return context.WithValue(r.ctx, receivingKey{}, r), nil
}

// identified is the caller's identity as s.identify gave it.
type identified struct {
	client string
	err    error
}

// tapName names the caller as the interceptor will; a caller that may
// not call is refused there, with PermissionDenied, and is counted in the
// tap as identity.Unknown.
func (id identified) tapName() string {
	if id.err != nil {
		return identity.Unknown
	}
	return id.client
}

// identifyOnce names the caller. The stream's tap names it first and
// keeps the answer in the stream's context, so the interceptor and the
// request decoder that come after it read it from there instead of
// reading the metadata again.
func (s *Server) identifyOnce(ctx context.Context) identified {
	if r := receivingOf(ctx); r != nil {
		return r.caller
	}
	client, err := s.identify(ctx)
	return identified{client: client, err: err}
}

// identifyStream names the caller of a stream at its start. A claimed
// name (no WithIdentity) is read from the stream's headers as the
// transport gives them, without copying the metadata.
func (s *Server) identifyStream(ctx context.Context, header metadata.MD) identified {
	if s.claimed {
		return identified{client: identity.FromMetadata(header)}
	}
	client, err := s.identify(ctx)
	return identified{client: client, err: err}
}

// reservation is what a stream of fullMethod reserves, and false for the
// streaming methods of health and reflection, which are counted as
// streams only (their messages are read one at a time, each at most
// max_recv_msg_bytes, on at most max_streams streams).
func (s *Server) reservation(fullMethod, client string) (membudget.Bytes, bool) {
	if m, ok := s.methods[fullMethod]; ok {
		return streamReservation(s.mem.maxRecv, m.policy, s.maxItemsFor(m, client)), true
	}
	for _, prefix := range streamServices {
		if strings.HasPrefix(fullMethod, prefix) && fullMethod != healthCheck {
			return 0, false
		}
	}
	return membudget.Bytes(s.mem.maxRecv), true
}

const healthCheck = "/grpc.health.v1.Health/Check"

// UnknownMethod is the method a stream refused at its start is reported
// under when its path names no method sluice serves: the path is the
// caller's to choose, and reported as it came, any bytes at all, it
// would make a metric series per path.
const UnknownMethod = "/unknown/unknown"

// observedMethod is fullMethod as a stream refused at its start is
// reported: itself for a registered method or the health check,
// UnknownMethod for any other path.
func (s *Server) observedMethod(fullMethod string) string {
	if _, ok := s.methods[fullMethod]; ok || fullMethod == healthCheck {
		return fullMethod
	}
	return UnknownMethod
}

// Observer reasons for a request refused at its stream's start.
const (
	// ReasonMemory: the process's request bytes or its streams were at
	// their cap (Unavailable).
	ReasonMemory = "memory"
	// ReasonMemoryShare: the caller held its whole share of the request
	// bytes (ResourceExhausted).
	ReasonMemoryShare = "memory_share"
)

// minResponseBytes is the least max_response_bytes: a caller's share,
// half of it, then holds a 1,000-record answer of 2 KiB records.
const minResponseBytes = 4 * membudget.MiB

// shareRetry is the wait advised to a caller at its share of the request
// bytes: it has that many worst-case messages arriving at once, and
// retrying sooner only sends more headers and first frames to refuse.
const shareRetry = time.Second

// refuse is the error for a reservation of request or response bytes
// the ledger refused; when says at which point the request was refused.
func (mem *memory) refuse(name, when string, r *membudget.Refusal) error {
	if r.PerCaller {
		return withRetryInfo(status.New(codes.ResourceExhausted,
			fmt.Sprintf("%s: refused %s: %v; send fewer requests at once or smaller ones", name, when, r)), max(mem.retry, shareRetry))
	}
	return overloaded(name, r.Error(), mem.retry)
}

// refuseAnswer is refuse for a split batch's answer, of which answered
// bytes are already reserved: an answer over the caller's whole share
// can never be sent, however long the caller waits, so that refusal
// carries no RetryInfo and says to ask for fewer items per batch.
func (mem *memory) refuseAnswer(name string, answered membudget.Bytes, r *membudget.Refusal) error {
	if r.PerCaller && answered+r.Need > r.Cap {
		return status.Errorf(codes.ResourceExhausted,
			"%s: refused %s: its answer passes %v, over the caller's whole share of %v response bytes; it can never be sent: split the batch into fewer items per request",
			name, whileAnswering, answered+r.Need, r.Cap)
	}
	return mem.refuse(name, whileAnswering, r)
}

// Points at which a reservation of bytes refuses a request (refuse).
const (
	beforeReading = "before the request was read"
	beforeAnswer  = "before its answer was sent"
	// whileAnswering: a split batch's answer, reserved piece by piece.
	whileAnswering = "while its pieces were answered"
)

// received gives back a stream's request-bytes reservation, all but
// keep bytes (held until the stream ends): its message has been counted
// and dropped, or decoded.
func received(ctx context.Context, keep membudget.Bytes) {
	receivingOf(ctx).received(keep)
}

// receiving is an admitted stream: its request-bytes reservation, kept
// once part of it is held until the stream ends, its slot among
// max_streams, and what the tap read from its headers.
type receiving struct {
	mem    *memory
	res    *membudget.Reservation
	kept   atomic.Bool
	caller identified // the tap's identification of the caller
	// criticality is the stream's CriticalityKey values, as the tap
	// read them from its headers.
	criticality []string
	// stopEnd stops the context.AfterFunc that runs end when the
	// stream's context ends; it reports whether it stopped it.
	stopEnd func() bool
	// link is the stream's place among those whose request has not
	// arrived (silent.go), which cancel it (ctx, with cancel) if it
	// waits receive_timeout; received and end take it out.
	link   pendingLink
	ctx    context.Context
	cancel context.CancelFunc
	server *Server
	method string // the stream's full method name
}

// notReceived ends a stream whose request did not arrive in time,
// counting it as refused for its deadline; a stream that ended meanwhile
// (end stops the timer, but may run as it fires) is left alone.
func (r *receiving) notReceived() {
	if r.ctx.Err() != nil {
		return
	}
	s := r.server
	s.observer.Rejected(r.ctx, Request{Client: r.caller.tapName(), Method: s.observedMethod(r.method)}, ReasonDeadline)
	r.cancel()
}

// receivingOf returns the stream's admission the tap recorded in ctx,
// or nil.
func receivingOf(ctx context.Context) *receiving {
	r, _ := ctx.Value(receivingKey{}).(*receiving)
	return r
}

// received is the function received on r; a nil r does nothing.
func (r *receiving) received(keep membudget.Bytes) {
	if r == nil {
		return
	}
	r.mem.pending.remove(r)
	switch {
	case keep > 0:
		r.kept.Store(true)
		r.res.Shrink(keep)
	case !r.kept.Load():
		r.res.Release()
	}
}

// end gives back the stream's reservation and its slot: the stream has
// ended, or its handler has returned (handled).
func (r *receiving) end() {
	r.mem.pending.remove(r)
	r.res.Release()
	r.mem.streams.Add(-1)
}

// handled ends the stream's admission when its unary handler has
// returned: nothing the stream holds is needed any more but the answer,
// whose bytes the response ledger holds, and writing it does not wait
// for the caller (a unary answer is queued whole). Ending it here, in
// the handler's goroutine, spares every stream the goroutine that
// context.AfterFunc starts when the stream's context ends; that
// callback stays for the streams whose handler never runs (a message
// that fails to arrive, an unknown encoding), and runs end instead if
// the context ended first. A nil r does nothing.
func (r *receiving) handled() {
	if r != nil && r.stopEnd() {
		r.end()
	}
}

// decodedBytes is what a decoded request of n items held in wire bytes
// takes: the strings' bytes and one string header each.
func decodedBytes(wire, n int) membudget.Bytes {
	return membudget.Bytes(wire + n*16)
}

// MemoryStats is the state of the memory budget's caps.
type MemoryStats struct {
	Plan                 MemoryPlan
	Requests, Responses  membudget.Stats
	Streams, PeakStreams int64
	RefusedStreams       int64
	Connections          connlimit.Stats
}

// MemoryStats reports bytes in flight, streams and connections.
func (s *Server) MemoryStats() MemoryStats {
	st := MemoryStats{Plan: s.mem.plan, Requests: s.mem.requests.Stats(), Responses: s.mem.responses.Stats(),
		Streams: s.mem.streams.Load(), PeakStreams: s.mem.peakStreams.Load(), RefusedStreams: s.mem.refusedStreams.Load()}
	if l := s.mem.listener.Load(); l != nil {
		st.Connections = l.Stats()
	} else {
		st.Connections.Max = int64(s.mem.plan.Connections)
	}
	return st
}
