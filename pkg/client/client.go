// Package client is the Go client for sluice's sluice.v1.PostRecords
// service, for services that read post records in batches of any size.
//
// A Client names its caller on every request (metadata x-client-id), asks
// the server for its limits (GetLimits) at start, again once they are a
// minute old and at once when a chunk is refused as larger than the
// budget (budgets can be reloaded while the server runs), and splits each
// batch into chunks that fit both the method's max_items and the caller's
// budget. Chunks are sent with bounded parallelism, within the caller's
// in-flight items across all of the Client's calls, paced to the budget's
// items per second, and reassembled in request order. Neither a retry
// delay nor the pace is waited out past the caller's deadline.
//
// Unavailable and ResourceExhausted answers are retried after the delay
// their google.rpc.RetryInfo gives (jittered exponential backoff when it
// gives none), at most MaxAttempts times per chunk and only while the
// retry budget allows: retries stay under about a tenth of requests, so a
// struggling server is not buried under them. A ResourceExhausted without
// RetryInfo (a chunk larger than the budget could ever admit) is not
// retried. Every other error fails the call at once.
//
// The package records its own OpenTelemetry metrics (requests, chunks,
// retries, throttled time) on the MeterProvider it is given. It does not
// cache, and it does not hide a server's refusal once retries are spent.
package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health" // client-side health checking for DialReplicas
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
)

// Metadata keys the server reads.
const (
	clientIDKey    = "x-client-id"
	criticalityKey = "x-criticality"
)

const getPostRecords = "sluice.v1.PostRecords/GetPostRecords"

// paceHeadroom is the share of the budget's rate the client paces to.
const paceHeadroom = 0.95

// limitsMaxAge is how long fetched limits are used before a call asks
// for them again, so that budgets reloaded on the server are followed.
const limitsMaxAge = time.Minute

// Criticality tells the server which work to shed first.
type Criticality string

// Criticalities.
const (
	Interactive Criticality = "interactive" // the default; someone waits for the answer
	Batch       Criticality = "batch"       // shed first under overload
)

// options is the Client's configuration; defaults() gives every field.
type options struct {
	parallelism   int
	maxAttempts   int
	baseBackoff   time.Duration
	maxBackoff    time.Duration
	retryRatio    float64
	retryBurst    float64
	criticality   Criticality
	meterProvider metric.MeterProvider
	dialOptions   []grpc.DialOption
	rand          *rand.Rand
	sleep         func(context.Context, time.Duration) error
}

func defaults() options {
	return options{
		parallelism:   4,
		maxAttempts:   3,
		baseBackoff:   50 * time.Millisecond,
		maxBackoff:    2 * time.Second,
		retryRatio:    0.1,
		retryBurst:    10,
		criticality:   Interactive,
		meterProvider: otel.GetMeterProvider(),
		dialOptions:   []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		rand:          rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		sleep:         sleepCtx,
	}
}

// Option changes one default.
type Option func(*options)

// WithParallelism sets how many chunks of one call are in flight at once
// (default 4). The chunk size shrinks so that parallelism × chunk size
// stays within the budget's in-flight items.
func WithParallelism(n int) Option { return func(o *options) { o.parallelism = max(n, 1) } }

// WithMaxAttempts sets the attempts per chunk, the first included
// (default 3).
func WithMaxAttempts(n int) Option { return func(o *options) { o.maxAttempts = max(n, 1) } }

// WithBackoff sets the exponential backoff used when a refusal carries no
// RetryInfo (default 50ms doubling up to 2s), before jitter.
func WithBackoff(base, maxDelay time.Duration) Option {
	return func(o *options) { o.baseBackoff, o.maxBackoff = base, max(maxDelay, base) }
}

// WithRetryBudget sets the retry budget: each first attempt earns ratio
// of a retry, up to burst saved retries (default 0.1 and 10).
func WithRetryBudget(ratio, burst float64) Option {
	return func(o *options) { o.retryRatio, o.retryBurst = ratio, max(burst, 1) }
}

// WithCriticality marks every request of the Client (default
// Interactive).
func WithCriticality(c Criticality) Option { return func(o *options) { o.criticality = c } }

// WithMeterProvider records the Client's metrics on mp (default the
// global provider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.meterProvider = mp }
}

// WithDialOptions replaces Dial's gRPC options (default: plaintext).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = opts }
}

// WithRandSeed makes backoff jitter reproducible.
func WithRandSeed(seed uint64) Option {
	return func(o *options) { o.rand = rand.New(rand.NewPCG(seed, seed)) }
}

// Limits are the server's limits as this Client uses them.
type Limits struct {
	MaxItems         int     // per GetPostRecords request
	MaxURILength     int     // bytes per URI
	ItemsPerSecond   float64 // the caller's budget
	Burst            int     // the caller's largest request
	MaxInflightItems int     // the caller's items in flight
	ChunkSize        int     // URIs per request this Client sends
	Parallelism      int     // requests of one call in flight at once
	Client           string  // the caller's name as the server sees it
}

// Client reads post records from sluice. It is safe for concurrent use.
type Client struct {
	name    string
	opts    options
	conn    *grpc.ClientConn // owned when Dial made it
	rpc     sluicev1.PostRecordsClient
	pace    *rate.Limiter
	retries *retryBudget
	metrics *metrics

	randMu sync.Mutex // opts.rand is not safe for concurrent use

	mu         sync.Mutex // guards the fields below
	limits     Limits
	fetched    time.Time           // when limits were last asked for
	refreshing chan struct{}       // closed when the GetLimits under way ends; nil when none is
	inflight   *semaphore.Weighted // the caller's in-flight items, shared by all calls
}

// Dial connects to the sluice at target as the caller name and fetches
// its limits. Close releases the connection.
func Dial(ctx context.Context, target, name string, opts ...Option) (*Client, error) {
	return dial(ctx, target, name, nil, opts)
}

// replicasScheme names the resolver DialReplicas builds.
const replicasScheme = "sluice-replicas"

// DialReplicas connects to several sluice replicas (host:port each) as one
// client: calls go round robin over the replicas that are ready (gRPC's
// round_robin balancer over a fixed address list, with client-side health
// checking: a replica is ready while its gRPC health service reports
// SERVING), a replica that drains (it reports NOT_SERVING first), is not
// yet caught up or goes away is left out until it is back, and a call
// refused with Unavailable — a draining replica's answer — is retried
// under the retry budget, usually on another replica. Close releases
// every connection.
func DialReplicas(ctx context.Context, addrs []string, name string, opts ...Option) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("client: DialReplicas needs at least one replica address")
	}
	r := manual.NewBuilderWithScheme(replicasScheme)
	state := resolver.State{}
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	r.InitialState(state)
	extra := []grpc.DialOption{grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}}`)}
	return dial(ctx, replicasScheme+":///sluice", name, extra, opts)
}

func dial(ctx context.Context, target, name string, extra []grpc.DialOption, opts []Option) (*Client, error) {
	o := defaults()
	for _, opt := range opts {
		opt(&o)
	}
	conn, err := grpc.NewClient(target, append(append([]grpc.DialOption(nil), o.dialOptions...), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", target, err)
	}
	c, err := newClient(ctx, conn, name, o)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.conn = conn
	return c, nil
}

// New uses an existing connection (which the caller keeps owning) as the
// caller name and fetches the server's limits.
func New(ctx context.Context, conn grpc.ClientConnInterface, name string, opts ...Option) (*Client, error) {
	o := defaults()
	for _, opt := range opts {
		opt(&o)
	}
	return newClient(ctx, conn, name, o)
}

func newClient(ctx context.Context, conn grpc.ClientConnInterface, name string, o options) (*Client, error) {
	if name == "" {
		return nil, errors.New("client: a caller name is required; the server gives unnamed callers the default budget")
	}
	m, err := newMetrics(o.meterProvider, name)
	if err != nil {
		return nil, err
	}
	c := &Client{name: name, opts: o, rpc: sluicev1.NewPostRecordsClient(conn), metrics: m,
		retries: newRetryBudget(o.retryRatio, o.retryBurst)}
	l, err := c.fetchLimits(ctx)
	if err != nil {
		return nil, err
	}
	// The local pace follows the server's bucket (which GetLimits itself
	// was charged one item from) with a little headroom, since requests
	// sent on time may still reach the server bunched up.
	c.pace = rate.NewLimiter(rate.Limit(l.ItemsPerSecond*paceHeadroom), l.Burst)
	c.pace.ReserveN(time.Now(), 1)
	c.limits, c.fetched, c.inflight = l, time.Now(), semaphore.NewWeighted(int64(l.MaxInflightItems))
	return c, nil
}

func (c *Client) fetchLimits(ctx context.Context) (Limits, error) {
	resp, err := c.rpc.GetLimits(c.outgoing(ctx), &sluicev1.GetLimitsRequest{})
	if err != nil {
		return Limits{}, fmt.Errorf("client: fetch limits: %w", err)
	}
	return chooseLimits(resp, c.opts.parallelism)
}

// currentLimits returns the limits, fetched again first when they are
// older than limitsMaxAge.
func (c *Client) currentLimits(ctx context.Context) Limits {
	c.mu.Lock()
	l, fetched := c.limits, c.fetched
	c.mu.Unlock()
	if time.Since(fetched) < limitsMaxAge {
		return l
	}
	return c.refreshLimits(ctx, fetched)
}

// refreshLimits asks the server for the limits again, unless they were
// asked for after since, and puts them in force. When the server does not
// answer, the limits in force stay (and are asked for again only after
// limitsMaxAge). One GetLimits is made at a time: a call that finds one
// under way waits for it only as long as its own context lets it, and
// then goes on with the limits in force, so a refresh hung on another
// caller's context never holds it past its deadline.
func (c *Client) refreshLimits(ctx context.Context, since time.Time) Limits {
	c.mu.Lock()
	if c.fetched.After(since) {
		defer c.mu.Unlock()
		return c.limits
	}
	if under := c.refreshing; under != nil {
		l := c.limits
		c.mu.Unlock()
		select {
		case <-under:
			return c.Limits()
		case <-ctx.Done():
			return l
		}
	}
	done := make(chan struct{})
	c.refreshing = done
	c.mu.Unlock()
	l, err := c.fetchLimits(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshing = nil
	close(done)
	c.fetched = time.Now()
	if err != nil {
		return c.limits
	}
	if l.ItemsPerSecond != c.limits.ItemsPerSecond || l.Burst != c.limits.Burst {
		now := time.Now()
		c.pace.SetLimitAt(now, rate.Limit(l.ItemsPerSecond*paceHeadroom))
		c.pace.SetBurstAt(now, l.Burst)
	}
	if l.MaxInflightItems != c.limits.MaxInflightItems {
		c.inflight = semaphore.NewWeighted(int64(l.MaxInflightItems))
	}
	c.limits = l
	return l
}

// chooseLimits picks the chunk size and parallelism that fit the method's
// limit and the budget's burst and in-flight cap.
func chooseLimits(resp *sluicev1.GetLimitsResponse, parallelism int) (Limits, error) {
	var l Limits
	for _, m := range resp.GetMethods() {
		if m.GetMethod() == getPostRecords {
			l.MaxItems, l.MaxURILength = int(m.GetMaxItems()), int(m.GetMaxUriLength())
		}
	}
	b := resp.GetBudget()
	l.Client, l.ItemsPerSecond, l.Burst, l.MaxInflightItems = b.GetClient(), b.GetItemsPerSecond(), int(b.GetBurst()), int(b.GetMaxInflightItems())
	if l.MaxItems < 1 || l.Burst < 1 || l.MaxInflightItems < 1 || l.ItemsPerSecond <= 0 {
		return l, fmt.Errorf("client: the server reported unusable limits %+v", l)
	}
	l.ChunkSize = min(l.MaxItems, l.Burst, l.MaxInflightItems)
	l.Parallelism = max(1, min(parallelism, l.MaxInflightItems/l.ChunkSize))
	if l.Parallelism < parallelism {
		l.ChunkSize = max(1, min(l.ChunkSize, l.MaxInflightItems/parallelism))
		l.Parallelism = max(1, min(parallelism, l.MaxInflightItems/l.ChunkSize))
	}
	return l, nil
}

// Limits returns the limits last fetched and the chunking chosen.
func (c *Client) Limits() Limits {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limits
}

// Close closes the connection Dial made; it does nothing after New.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// outgoing is ctx with the Client's name and criticality as the request's
// metadata, in place of any the caller's context carries (the server
// reads a key's first value, so an appended one would not count).
func (c *Client) outgoing(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx) // a copy
	if md == nil {
		md = metadata.MD{}
	}
	md.Set(clientIDKey, c.name)
	md.Set(criticalityKey, string(c.opts.criticality))
	return metadata.NewOutgoingContext(ctx, md)
}

// GetPostRecords returns one record per URI, in the order of uris,
// however many there are. It fails whole if any chunk fails after its
// retries; the error says which chunk and why.
func (c *Client) GetPostRecords(ctx context.Context, uris []string) (records []*sluicev1.PostRecord, err error) {
	start := time.Now()
	defer func() { c.metrics.request(ctx, time.Since(start), len(uris), err) }()
	if len(uris) == 0 {
		return nil, nil
	}
	records = make([]*sluicev1.PostRecord, len(uris))
	l := c.currentLimits(ctx)
	size := l.ChunkSize
	chunks := (len(uris) + size - 1) / size
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(l.Parallelism)
	launched := 0
	for i := range chunks {
		if gctx.Err() != nil {
			break // a chunk failed, or the caller left: send no more
		}
		launched++
		from, to := i*size, min((i+1)*size, len(uris))
		g.Go(func() error {
			got, err := c.chunk(gctx, uris[from:to])
			if err != nil {
				return fmt.Errorf("client: chunk %d of %d (uris[%d:%d]): %w", i+1, chunks, from, to, err)
			}
			copy(records[from:to], got)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if launched < chunks { // the caller left between chunks
		return nil, fmt.Errorf("client: %d of %d chunks not sent: %w", chunks-launched, chunks, context.Cause(gctx))
	}
	return records, nil
}

// chunk sends one request, paced to the budget, retrying as allowed. A
// chunk larger than the limits now allow (the budget was lowered on the
// server) is sent as smaller ones, one after another.
func (c *Client) chunk(ctx context.Context, uris []string) ([]*sluicev1.PostRecord, error) {
	if size := c.Limits().ChunkSize; len(uris) > size {
		return c.split(ctx, uris, size)
	}
	if err := ctx.Err(); err != nil {
		return nil, err // never sent: it earns no retries
	}
	c.retries.earn()
	for attempt := 1; ; attempt++ {
		sent := time.Now()
		resp, err := c.send(ctx, uris)
		if errors.Is(err, errOverLocalBurst) {
			// The limits changed since the chunk was cut (another chunk
			// of the call was refused and fetched them again).
			if size := c.Limits().ChunkSize; len(uris) > size {
				return c.split(ctx, uris, size)
			}
			return nil, err
		}
		if err == nil {
			if len(resp.GetRecords()) != len(uris) {
				return nil, fmt.Errorf("server answered %d records for %d uris", len(resp.GetRecords()), len(uris))
			}
			return resp.GetRecords(), nil
		}
		delay, retryable := c.retryDelay(err, attempt)
		switch {
		case overBurst(err):
			// Larger than the budget admits: if the budget changed, the
			// limits fetched again say how to split the chunk.
			if size := c.refreshLimits(ctx, sent).ChunkSize; len(uris) > size {
				return c.split(ctx, uris, size)
			}
			return nil, err
		case !retryable:
			return nil, err
		case attempt >= c.opts.maxAttempts:
			return nil, fmt.Errorf("gave up after %d attempts: %w", attempt, err)
		case pastDeadline(ctx, delay):
			return nil, fmt.Errorf("not retried: the advised wait of %v runs past the deadline: %w", delay.Round(time.Millisecond), err)
		case !c.retries.spend():
			return nil, fmt.Errorf("retry budget spent (retries are kept under %.0f%% of requests): %w", c.opts.retryRatio*100, err)
		}
		c.metrics.retry(ctx, status.Code(err))
		if err := c.throttle(ctx, delay); err != nil {
			return nil, err
		}
	}
}

// split sends uris as chunks of at most size, in order.
func (c *Client) split(ctx context.Context, uris []string, size int) ([]*sluicev1.PostRecord, error) {
	out := make([]*sluicev1.PostRecord, 0, len(uris))
	for from := 0; from < len(uris); from += size {
		to := min(from+size, len(uris))
		got, err := c.chunk(ctx, uris[from:to])
		if err != nil {
			return nil, fmt.Errorf("part uris[%d:%d] of the chunk: %w", from, to, err)
		}
		out = append(out, got...)
	}
	return out, nil
}

// send makes one attempt: it waits for room in the caller's in-flight
// items, shared by every call of the Client, and for the pace.
func (c *Client) send(ctx context.Context, uris []string) (*sluicev1.GetPostRecordsResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // the call failed or ended: spend no budget on it
	}
	c.mu.Lock()
	inflight, maxInflight := c.inflight, c.limits.MaxInflightItems
	c.mu.Unlock()
	n := int64(min(len(uris), maxInflight))
	if err := inflight.Acquire(ctx, n); err != nil {
		return nil, err
	}
	defer inflight.Release(n)
	if err := c.waitForBudget(ctx, len(uris)); err != nil {
		return nil, err
	}
	c.metrics.chunk(ctx)
	return c.rpc.GetPostRecords(c.outgoing(ctx), &sluicev1.GetPostRecordsRequest{Uris: uris})
}

// errOverLocalBurst reports a chunk larger than the local pace's burst.
var errOverLocalBurst = errors.New("larger than the budget's burst")

// overBurst reports a ResourceExhausted without RetryInfo: a request
// larger than the caller's budget could ever admit.
func overBurst(err error) bool {
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		return false
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			return false
		}
	}
	return true
}

// pastDeadline reports whether waiting d would end after ctx's deadline.
func pastDeadline(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return ok && time.Until(deadline) < d
}

// waitForBudget waits until the local pace allows n more items, so the
// server rarely has to refuse them.
func (c *Client) waitForBudget(ctx context.Context, n int) error {
	r := c.pace.ReserveN(time.Now(), n)
	if !r.OK() {
		return fmt.Errorf("%w: a chunk of %d items exceeds the burst of %d", errOverLocalBurst, n, c.Limits().Burst)
	}
	if d := r.Delay(); d > 0 {
		if pastDeadline(ctx, d) {
			r.Cancel()
			return status.Errorf(codes.DeadlineExceeded, "the budget's pace admits %d more items only in %v, past the deadline; send a longer deadline or a smaller batch", n, d.Round(time.Millisecond))
		}
		if err := c.throttle(ctx, d); err != nil {
			r.Cancel()
			return err
		}
	}
	return nil
}

func (c *Client) throttle(ctx context.Context, d time.Duration) error {
	c.metrics.throttled(ctx, d)
	return c.opts.sleep(ctx, d)
}

// retryDelay decides whether err is worth retrying and after how long:
// the server's RetryInfo delay plus up to a fifth more, or jittered
// exponential backoff when it gives none.
func (c *Client) retryDelay(err error, attempt int) (time.Duration, bool) {
	st := status.Convert(err)
	var advised time.Duration
	hasInfo := false
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			advised, hasInfo = ri.GetRetryDelay().AsDuration(), true
		}
	}
	switch {
	case st.Code() == codes.ResourceExhausted && !hasInfo:
		return 0, false // too large for the budget, ever; or a transport limit
	case st.Code() != codes.Unavailable && st.Code() != codes.ResourceExhausted:
		return 0, false
	}
	if hasInfo {
		return advised + c.jitter(advised/5), true
	}
	backoff := c.opts.maxBackoff
	if shift := attempt - 1; shift < 62 && c.opts.baseBackoff <= c.opts.maxBackoff>>shift {
		backoff = c.opts.baseBackoff << shift
	}
	return backoff/2 + c.jitter(backoff/2), true
}

func (c *Client) jitter(upTo time.Duration) time.Duration {
	if upTo <= 0 {
		return 0
	}
	c.randMu.Lock()
	defer c.randMu.Unlock()
	return time.Duration(c.opts.rand.Int64N(int64(upTo)))
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
