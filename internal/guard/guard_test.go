package guard_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/identity"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	getMany = "sluice.v1.PostRecords/GetPostRecords"
	getOne  = "sluice.v1.PostRecords/GetPostRecord"
	put     = "sluice.v1.PostRecords/PutPostRecords"
	del     = "sluice.v1.PostRecords/DeletePostRecords"
	limits  = "sluice.v1.PostRecords/GetLimits"
)

// testConfig has a policy for every PostRecords method: batches of up to
// 1000 URIs of up to 512 bytes, single reads of one.
func testConfig() guard.Config {
	batch := guard.Policy{MaxItems: 1000, MaxURILength: 512, Concurrency: 50, Timeout: 5 * time.Second}
	single := guard.Policy{MaxItems: 1, MaxURILength: 512, Concurrency: 1, Timeout: 5 * time.Second}
	cfg := guard.DefaultConfig()
	cfg.Methods = map[string]guard.Policy{getMany: batch, getOne: single, put: batch, del: batch, limits: single}
	// The adaptive item limit never shrinks here, so tests of other rules
	// do not depend on how busy the machine is; capacity_test.go tests it.
	cfg.AdaptiveTolerance = 1e9
	// Whole batches are admitted at once, so a batch holds its items
	// until it is answered; pieces_test.go serves them in pieces.
	cfg.PieceItems = 1000
	return cfg
}

// postRecords is a PostRecordsServer that counts its calls and, in
// GetPostRecords, fans out over the URIs with fanout.Each, measuring how
// many tasks run at once.
type postRecords struct {
	sluicev1.UnimplementedPostRecordsServer

	calls        atomic.Int64
	active, peak atomic.Int64

	// wantPeak, when positive, holds each fan-out task until that many
	// tasks have run at once, so the measured peak does not depend on
	// scheduling luck.
	wantPeak    int64
	reached     chan struct{}
	reachedOnce sync.Once

	// block, when set, holds GetPostRecords until it is closed or the
	// request's context ends.
	block chan struct{}
	// entered receives a value each time GetPostRecords starts.
	entered chan struct{}
	// clients receives the caller's name each time GetPostRecord runs.
	clients chan string
	// blockWrites, when set, holds each PutPostRecords call until it
	// receives from it (or it is closed) or the request's context ends.
	blockWrites chan struct{}
	// failURI, when set, fails any GetPostRecords call that asks for it.
	failURI string
	// recordBytes, when positive, gives each record that many bytes.
	recordBytes int
	// deadlines, when set, receives how much deadline GetPostRecords had
	// left when it started (an hour if none).
	deadlines chan time.Duration
	// finish, when set, holds a blocked GetPostRecords whose context
	// ended until it is closed (a write completing its steps, or a
	// handler that ignores its context); returned counts those that have
	// returned.
	finish   chan struct{}
	returned atomic.Int64

	mu    sync.Mutex
	sizes []int // the URIs of each GetPostRecords call, in the order they started
}

// started reports the sizes of the GetPostRecords calls so far.
func (p *postRecords) started() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sizes)
}

func newPostRecords() *postRecords {
	return &postRecords{
		reached: make(chan struct{}),
		entered: make(chan struct{}, 16),
		clients: make(chan string, 16),
	}
}

func (p *postRecords) GetPostRecords(ctx context.Context, req *sluicev1.GetPostRecordsRequest) (*sluicev1.GetPostRecordsResponse, error) {
	p.calls.Add(1)
	p.mu.Lock()
	p.sizes = append(p.sizes, len(req.GetUris()))
	p.mu.Unlock()
	select {
	case p.entered <- struct{}{}:
	default:
	}
	if p.deadlines != nil {
		left := time.Hour
		if d, ok := ctx.Deadline(); ok {
			left = time.Until(d)
		}
		select {
		case p.deadlines <- left:
		default:
		}
	}
	if p.block != nil {
		select {
		case <-p.block:
		case <-ctx.Done():
			if p.finish != nil {
				<-p.finish
			}
			p.returned.Add(1)
			return nil, ctx.Err()
		}
	}
	uris := req.GetUris()
	if p.failURI != "" && slices.Contains(uris, p.failURI) {
		return nil, status.Errorf(codes.Internal, "test store failed reading %s", p.failURI)
	}
	records := make([]*sluicev1.PostRecord, len(uris))
	err := fanout.Each(ctx, len(uris), func(ctx context.Context, i int) error {
		cur := p.active.Add(1)
		defer p.active.Add(-1)
		for {
			old := p.peak.Load()
			if cur <= old || p.peak.CompareAndSwap(old, cur) {
				break
			}
		}
		if p.wantPeak > 0 {
			if cur >= p.wantPeak {
				p.reachedOnce.Do(func() { close(p.reached) })
			}
			select {
			case <-p.reached:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		records[i] = &sluicev1.PostRecord{Uri: uris[i]}
		if p.recordBytes > 0 {
			records[i].Record = make([]byte, p.recordBytes)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &sluicev1.GetPostRecordsResponse{Records: records}, nil
}

func (p *postRecords) GetPostRecord(ctx context.Context, req *sluicev1.GetPostRecordRequest) (*sluicev1.PostRecord, error) {
	p.calls.Add(1)
	select {
	case p.clients <- identity.Client(ctx):
	default:
	}
	return &sluicev1.PostRecord{Uri: req.GetUri()}, nil
}

func (p *postRecords) PutPostRecords(ctx context.Context, req *sluicev1.PutPostRecordsRequest) (*sluicev1.PutPostRecordsResponse, error) {
	p.calls.Add(1)
	if p.blockWrites != nil {
		select {
		case <-p.blockWrites:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &sluicev1.PutPostRecordsResponse{Written: uint32(len(req.GetRecords()))}, nil
}

func (p *postRecords) DeletePostRecords(_ context.Context, req *sluicev1.DeletePostRecordsRequest) (*sluicev1.DeletePostRecordsResponse, error) {
	p.calls.Add(1)
	return &sluicev1.DeletePostRecordsResponse{Deleted: uint32(len(req.GetUris()))}, nil
}

// observer records the guard's reports.
type observer struct {
	mu       sync.Mutex
	rejected []string // reasons
	finished []codes.Code
}

func (o *observer) Rejected(_ context.Context, _ guard.Request, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rejected = append(o.rejected, reason)
}

func (o *observer) Finished(_ context.Context, _ guard.Request, code codes.Code, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finished = append(o.finished, code)
}

func (o *observer) codes() []codes.Code {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.finished)
}

func (o *observer) reasons() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.rejected)
}

// fixture is a guarded server on a loopback port and a client of it.
type fixture struct {
	srv    *guard.Server
	impl   *postRecords
	addr   string
	conn   *grpc.ClientConn
	client sluicev1.PostRecordsClient
	served chan error
}

// start serves impl through guard with cfg until the test ends.
func start(t *testing.T, cfg guard.Config, impl *postRecords, opts ...guard.Option) *fixture {
	t.Helper()
	srv, err := guard.New(cfg, opts...)
	if err != nil {
		t.Fatalf("guard.New: %v", err)
	}
	if err := srv.Register(&sluicev1.PostRecords_ServiceDesc, impl); err != nil {
		t.Fatalf("Register: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{srv: srv, impl: impl, addr: lis.Addr().String(), served: make(chan error, 1)}
	go func() { f.served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		// An ended context stops the server at once.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		srv.Drain(ctx)
		if err := <-f.served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	f.conn = dial(t, f.addr)
	f.client = sluicev1.NewPostRecordsClient(f.conn)
	return f
}

// dial connects to addr until the test ends.
func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// uris returns n distinct AT-URIs.
func uris(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("at://did:plc:test/app.bsky.feed.post/3k%07d", i)
	}
	return out
}

// wantCode fails the test unless err is a status with code c.
func wantCode(t *testing.T, err error, c codes.Code) *status.Status {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v is not a gRPC status", err)
	}
	if st.Code() != c {
		t.Fatalf("code = %v (%q), want %v", st.Code(), st.Message(), c)
	}
	return st
}

// badRequestFields returns the fields of st's BadRequest detail.
func badRequestFields(st *status.Status) []string {
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	return fields
}

// Tests that Register refuses a service unless every method has a policy,
// naming every missing method, and registers nothing when it refuses.
func TestRegisterRequiresEveryPolicy(t *testing.T) {
	cfg := testConfig()
	cfg.Methods = map[string]guard.Policy{getMany: guard.DefaultPolicy()}
	srv, err := guard.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Drain(context.Background()) })

	err = srv.Register(&sluicev1.PostRecords_ServiceDesc, newPostRecords())
	if err == nil {
		t.Fatal("Register succeeded with methods lacking a policy")
	}
	// Every method of the service but getMany, read from the descriptor
	// so that a method added to the proto is covered too.
	var want []string
	for _, m := range sluicev1.PostRecords_ServiceDesc.Methods {
		if name := sluicev1.PostRecords_ServiceDesc.ServiceName + "/" + m.MethodName; name != getMany {
			want = append(want, name)
		}
	}
	// The names are compared as a list, not as substrings: getOne is a
	// prefix of getMany.
	_, list, ok := strings.Cut(err.Error(), "no policy for ")
	list, _, _ = strings.Cut(list, ";")
	if got := strings.Split(list, ", "); !ok || !slices.Equal(sorted(got), sorted(want)) {
		t.Errorf("error %q names %q as lacking a policy, want exactly %q", err, got, want)
	}
	if got := srv.Services(); len(got) != 0 {
		t.Errorf("Services() = %v after a refused Register, want none", got)
	}
	if _, ok := srv.Policy("/" + getMany); ok {
		t.Errorf("Policy(%s) is set after a refused Register", getMany)
	}

	// Streaming methods are refused whatever the config says.
	cfg.Methods = map[string]guard.Policy{
		"grpc.health.v1.Health/Check": guard.DefaultPolicy(),
		"grpc.health.v1.Health/Watch": guard.DefaultPolicy(),
		"grpc.health.v1.Health/List":  guard.DefaultPolicy(),
	}
	srv2, err := guard.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv2.Drain(context.Background()) })
	if err := srv2.Register(&healthpb.Health_ServiceDesc, health.NewServer()); err == nil || !strings.Contains(err.Error(), "streaming") {
		t.Errorf("Register(health) error = %v, want a refusal of its streaming method", err)
	}

	// With every policy, Register succeeds and reports the policies.
	srv3, err := guard.New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv3.Drain(context.Background()) })
	if err := srv3.Register(&sluicev1.PostRecords_ServiceDesc, newPostRecords()); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if got, want := srv3.Services(), []string{"sluice.v1.PostRecords"}; !slices.Equal(got, want) {
		t.Errorf("Services() = %v, want %v", got, want)
	}
	if p, ok := srv3.Policy("/" + getOne); !ok || p.MaxItems != 1 {
		t.Errorf("Policy(%s) = %+v, %v; want the single-read policy", getOne, p, ok)
	}
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

// Tests that Config.Validate names each unusable field and the method it
// belongs to, and that New refuses such a config.
func TestConfigValidate(t *testing.T) {
	withPolicy := func(edit func(*guard.Policy)) guard.Config {
		cfg := testConfig()
		p := cfg.Methods[getMany]
		edit(&p)
		cfg.Methods[getMany] = p
		return cfg
	}
	for _, tc := range []struct {
		name string
		cfg  guard.Config
		want []string // substrings of the error; none for a valid config
	}{
		{name: "valid", cfg: testConfig()},
		{name: "zero config", cfg: guard.Config{}, want: []string{"max_inflight_items", "max_inflight_requests", "max_recv_msg_bytes"}},
		{name: "zero max_items", cfg: withPolicy(func(p *guard.Policy) { p.MaxItems = 0 }), want: []string{getMany, "max_items must be at least 1"}},
		{name: "zero max_uri_length", cfg: withPolicy(func(p *guard.Policy) { p.MaxURILength = 0 }), want: []string{getMany, "max_uri_length"}},
		{name: "zero concurrency", cfg: withPolicy(func(p *guard.Policy) { p.Concurrency = 0 }), want: []string{getMany, "concurrency"}},
		{name: "zero timeout", cfg: withPolicy(func(p *guard.Policy) { p.Timeout = 0 }), want: []string{getMany, "timeout"}},
		{name: "zero policy", cfg: withPolicy(func(p *guard.Policy) { *p = guard.Policy{} }), want: []string{getMany}},
		{
			name: "max_items above max_inflight_items",
			cfg: func() guard.Config {
				cfg := testConfig()
				cfg.MaxInflightItems = 999
				return cfg
			}(),
			want: []string{getMany, "max_items 1000 exceeds max_inflight_items 999"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted the config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if _, err := guard.New(tc.cfg); err == nil {
				t.Error("New accepted the config")
			}
		})
	}
}

// Tests that a batch over the item limit is refused before the handler
// runs, with a message that says the limit and how to comply.
func TestTooManyURIs(t *testing.T) {
	obs := &observer{}
	f := start(t, testConfig(), newPostRecords(), guard.WithObserver(obs))
	_, err := f.client.GetPostRecords(testContext(t, 5*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(20_000)})
	st := wantCode(t, err, codes.InvalidArgument)
	for _, w := range []string{"20000 uris exceeds the limit of 1000 per request", "split"} {
		if !strings.Contains(st.Message(), w) {
			t.Errorf("message %q does not contain %q", st.Message(), w)
		}
	}
	if fields := badRequestFields(st); !slices.Equal(fields, []string{"uris"}) {
		t.Errorf("BadRequest fields = %v, want [uris]", fields)
	}
	if n := f.impl.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times, want 0", n)
	}
	if got := obs.reasons(); !slices.Equal(got, []string{guard.ReasonShape}) {
		t.Errorf("observer rejections = %v, want [%s]", got, guard.ReasonShape)
	}
}

// Tests that malformed batches and URIs are refused with InvalidArgument
// naming the offending field and the limit, before the handler runs.
func TestShapeRefusals(t *testing.T) {
	f := start(t, testConfig(), newPostRecords())
	long := "at://did:plc:test/app.bsky.feed.post/" + strings.Repeat("x", 600-len("at://did:plc:test/app.bsky.feed.post/"))
	withLong := uris(5)
	withLong[3] = long
	for _, tc := range []struct {
		name      string
		call      func(context.Context) error
		wantField string
		wantMsg   []string
	}{
		{
			name: "empty batch",
			call: func(ctx context.Context) error {
				_, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{})
				return err
			},
			wantField: "uris",
			wantMsg:   []string{"no uris", "between 1 and 1000"},
		},
		{
			name: "long URI in a batch",
			call: func(ctx context.Context) error {
				_, err := f.client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: withLong})
				return err
			},
			wantField: "uris[3]",
			wantMsg:   []string{"uris[3]", "600 bytes", "512"},
		},
		{
			name: "long URI in a record",
			call: func(ctx context.Context) error {
				_, err := f.client.PutPostRecords(ctx, &sluicev1.PutPostRecordsRequest{Records: []*sluicev1.PostRecord{
					{Uri: uris(1)[0]}, {Uri: long},
				}})
				return err
			},
			wantField: "records[1].uri",
			wantMsg:   []string{"records[1].uri", "512"},
		},
		{
			name: "empty single URI",
			call: func(ctx context.Context) error {
				_, err := f.client.GetPostRecord(ctx, &sluicev1.GetPostRecordRequest{Uri: ""})
				return err
			},
			wantField: "uri",
			wantMsg:   []string{"uri is empty"},
		},
		{
			name: "empty URI in a batch",
			call: func(ctx context.Context) error {
				_, err := f.client.DeletePostRecords(ctx, &sluicev1.DeletePostRecordsRequest{Uris: []string{uris(1)[0], ""}})
				return err
			},
			wantField: "uris[1]",
			wantMsg:   []string{"uris[1] is empty"},
		},
		{
			name: "delete over the limit",
			call: func(ctx context.Context) error {
				_, err := f.client.DeletePostRecords(ctx, &sluicev1.DeletePostRecordsRequest{Uris: uris(1001)})
				return err
			},
			wantField: "uris",
			wantMsg:   []string{"1001 uris exceeds the limit of 1000"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := wantCode(t, tc.call(testContext(t, 5*time.Second)), codes.InvalidArgument)
			for _, w := range tc.wantMsg {
				if !strings.Contains(st.Message(), w) {
					t.Errorf("message %q does not contain %q", st.Message(), w)
				}
			}
			if fields := badRequestFields(st); !slices.Equal(fields, []string{tc.wantField}) {
				t.Errorf("BadRequest fields = %v, want [%s]", fields, tc.wantField)
			}
		})
	}
	if n := f.impl.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times, want 0", n)
	}
}

// Tests that the policy's concurrency bounds the handler's fan-out: with
// Concurrency 7, 500 URIs never run more than 7 tasks at once, and do
// reach 7.
func TestFanoutFollowsPolicy(t *testing.T) {
	cfg := testConfig()
	p := cfg.Methods[getMany]
	p.Concurrency = 7
	p.Timeout = 2 * time.Second
	cfg.Methods[getMany] = p
	impl := newPostRecords()
	impl.wantPeak = 7
	f := start(t, cfg, impl)

	resp, err := f.client.GetPostRecords(testContext(t, 5*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(500)})
	if err != nil {
		t.Fatalf("GetPostRecords: %v", err)
	}
	if n := len(resp.GetRecords()); n != 500 {
		t.Errorf("got %d records, want 500", n)
	}
	if got := impl.peak.Load(); got != 7 {
		t.Errorf("peak fan-out concurrency = %d, want 7", got)
	}
}

// Tests that the policy's timeout ends a request whose handler would run
// forever, and the caller sees DeadlineExceeded.
func TestPolicyTimeout(t *testing.T) {
	cfg := testConfig()
	p := cfg.Methods[getMany]
	p.Timeout = 100 * time.Millisecond
	cfg.Methods[getMany] = p
	impl := newPostRecords()
	impl.block = make(chan struct{}) // never closed
	f := start(t, cfg, impl)

	impl.deadlines = make(chan time.Duration, 1)
	// The caller allows 30s: the deadline the handler sees must be the
	// policy's, whatever the machine's speed.
	_, err := f.client.GetPostRecords(testContext(t, 30*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(3)})
	wantCode(t, err, codes.DeadlineExceeded)
	if left := <-impl.deadlines; left > p.Timeout {
		t.Errorf("handler started with %v of deadline left, want at most the %v policy timeout", left, p.Timeout)
	}
}

// Tests that the process-wide item cap holds a second request back while a
// full batch is in flight, refusing it with Unavailable at its deadline,
// and admits new work once the first request finishes.
func TestInflightItemCap(t *testing.T) {
	cfg := testConfig()
	cfg.MaxInflightItems = 1000
	obs := &observer{}
	impl := newPostRecords()
	impl.block = make(chan struct{})
	f := start(t, cfg, impl, guard.WithObserver(obs))

	first := make(chan error, 1)
	go func() {
		_, err := f.client.GetPostRecords(testContext(t, 5*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(1000)})
		first <- err
	}()
	select {
	case <-impl.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the full batch never reached its handler")
	}
	if got := f.srv.InflightItems(); got != 1000 {
		t.Errorf("InflightItems() = %d with a full batch in flight, want 1000", got)
	}

	_, err := f.client.GetPostRecords(testContext(t, 5*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(1)})
	st := wantCode(t, err, codes.Unavailable)
	if !strings.Contains(st.Message(), "process-wide cap of 1000 in-flight items") {
		t.Errorf("message %q does not mention the process-wide cap", st.Message())
	}
	if n := impl.calls.Load(); n != 1 {
		t.Errorf("handler ran %d times, want only the first request", n)
	}

	close(impl.block)
	if err := <-first; err != nil {
		t.Fatalf("first request: %v", err)
	}
	if _, err := f.client.GetPostRecords(testContext(t, 5*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(1000)}); err != nil {
		t.Fatalf("request after the cap freed: %v", err)
	}
	if got := f.srv.InflightItems(); got != 0 {
		t.Errorf("InflightItems() = %d when idle, want 0", got)
	}
	if got := obs.reasons(); !slices.Contains(got, guard.ReasonOverload) {
		t.Errorf("observer rejections = %v, want %q among them", got, guard.ReasonOverload)
	}
}

// Tests that the handler sees the caller's name from the metadata.
func TestIdentity(t *testing.T) {
	f := start(t, testConfig(), newPostRecords())
	for _, tc := range []struct {
		md   []string
		want string
	}{
		{md: []string{identity.ClientIDKey, "feed"}, want: "feed"},
		{md: []string{identity.AtlantisCallerKey, "appview"}, want: "appview"},
		{md: nil, want: identity.Unknown},
	} {
		t.Run(tc.want, func(t *testing.T) {
			ctx := testContext(t, 5*time.Second)
			if tc.md != nil {
				ctx = metadata.AppendToOutgoingContext(ctx, tc.md...)
			}
			if _, err := f.client.GetPostRecord(ctx, &sluicev1.GetPostRecordRequest{Uri: uris(1)[0]}); err != nil {
				t.Fatalf("GetPostRecord: %v", err)
			}
			select {
			case got := <-f.impl.clients:
				if got != tc.want {
					t.Errorf("handler saw client %q, want %q", got, tc.want)
				}
			default:
				t.Fatal("the handler did not report a client")
			}
		})
	}
}

// Tests that health reports NOT_SERVING until SetServing(true), and that
// server reflection lists the guarded service.
func TestHealthAndReflection(t *testing.T) {
	f := start(t, testConfig(), newPostRecords())
	hc := healthpb.NewHealthClient(f.conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := hc.Check(testContext(t, 5*time.Second), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("Check(%q): %v", service, err)
		}
		return resp.GetStatus()
	}
	if got := check(""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("before SetServing: status = %v, want NOT_SERVING", got)
	}
	f.srv.SetServing(true)
	for _, svc := range []string{"", "sluice.v1.PostRecords"} {
		if got := check(svc); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("after SetServing(true): Check(%q) = %v, want SERVING", svc, got)
		}
	}
	f.srv.SetServing(false)
	if got := check("sluice.v1.PostRecords"); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("after SetServing(false): status = %v, want NOT_SERVING", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(f.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("ServerReflectionInfo: %v", err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatalf("send: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !slices.Contains(names, "sluice.v1.PostRecords") {
		t.Errorf("reflection lists %v, want sluice.v1.PostRecords among them", names)
	}
}

// Tests that Drain lets an in-flight request finish when it does so in
// time, while new requests are refused with Unavailable.
func TestDrain(t *testing.T) {
	impl := newPostRecords()
	impl.block = make(chan struct{})
	f := start(t, testConfig(), impl)
	f.srv.SetServing(true)

	// Deadlines here only stop a broken server from hanging the test;
	// they are far longer than anything takes on a busy machine, so the
	// drain ends because the request finished, never because they ran out.
	inflight := make(chan error, 1)
	go func() {
		_, err := f.client.GetPostRecords(testContext(t, 30*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(10)})
		inflight <- err
	}()
	select {
	case <-impl.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached its handler")
	}

	drained := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		f.srv.Drain(ctx)
		close(drained)
	}()

	// Once the drain starts, new requests are refused. A fresh connection
	// has no stream in flight, so it sees the listener gone at once.
	fresh := sluicev1.NewPostRecordsClient(dial(t, f.addr))
	var refused error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		_, err := fresh.GetPostRecord(testContext(t, time.Second), &sluicev1.GetPostRecordRequest{Uri: uris(1)[0]})
		if err != nil {
			refused = err
			break
		}
	}
	if refused == nil {
		t.Fatal("new requests were still served 10s after Drain started")
	}
	wantCode(t, refused, codes.Unavailable)
	// The in-flight request is still held, so Drain must still wait.
	select {
	case <-drained:
		t.Fatal("Drain returned while a request was in flight")
	default:
	}

	close(impl.block)
	if err := <-inflight; err != nil {
		t.Errorf("in-flight request: %v, want it to finish", err)
	}
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not return after the last request finished")
	}
	if err := <-f.served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	f.served <- nil // for the fixture's cleanup
}

// Tests that Drain stops the server hard when its context ends first,
// ending a request that would otherwise run forever.
func TestDrainDeadline(t *testing.T) {
	impl := newPostRecords()
	impl.block = make(chan struct{}) // never closed
	f := start(t, testConfig(), impl)

	// The caller's deadline is long: had Drain waited for the request
	// instead of stopping at its own deadline, the request would end by
	// that deadline (DeadlineExceeded), not by the server going away.
	inflight := make(chan error, 1)
	go func() {
		_, err := f.client.GetPostRecords(testContext(t, 20*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(10)})
		inflight <- err
	}()
	<-impl.entered

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	f.srv.Drain(ctx)
	if err := <-inflight; status.Code(err) != codes.Unavailable {
		t.Errorf("the held request ended with %v, want Unavailable from the hard stop", err)
	}
}

// Tests that a forced Drain returns only once the handlers it cancelled
// have returned, so that what the caller closes next (the store, the
// caches) is not closed under them, but no later than HandlerGrace after
// its deadline when a handler does not return.
func TestDrainDeadlineWaitsForHandlersWithinTheGrace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		finish time.Duration // after the drain's deadline; 0: never
	}{{"handler returns", 300 * time.Millisecond}, {"handler stuck", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			impl := newPostRecords()
			impl.block = make(chan struct{}) // never closed
			impl.finish = make(chan struct{})
			var finishOnce sync.Once
			finish := func() { finishOnce.Do(func() { close(impl.finish) }) }
			f := start(t, testConfig(), impl)
			t.Cleanup(finish) // before the fixture's own clean-up
			go func() {
				_, _ = f.client.GetPostRecords(testContext(t, 20*time.Second), &sluicev1.GetPostRecordsRequest{Uris: uris(10)})
			}()
			<-impl.entered
			if tc.finish > 0 {
				time.AfterFunc(tc.finish, finish)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			f.srv.Drain(ctx)
			want := int64(1)
			if tc.finish == 0 {
				want = 0
			}
			if n := impl.returned.Load(); n != want {
				t.Errorf("Drain returned with %d cancelled handlers returned, want %d", n, want)
			}
		})
	}
}

// Tests that a request larger than MaxRecvMsgBytes is refused by the
// transport before its handler runs.
func TestMaxRecvMsgBytes(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRecvMsgBytes = 64 << 10
	f := start(t, cfg, newPostRecords())

	// 400 URIs of 512 bytes: about 200 KiB, each URI within its policy.
	big := make([]string, 400)
	for i := range big {
		big[i] = fmt.Sprintf("at://did:plc:test/app.bsky.feed.post/%0475d", i)
	}
	req := &sluicev1.GetPostRecordsRequest{Uris: big}
	if n := proto.Size(req); n < 200<<10 {
		t.Fatalf("request is %d bytes, want at least 200 KiB", n)
	}
	_, err := f.client.GetPostRecords(testContext(t, 5*time.Second), req)
	wantCode(t, err, codes.ResourceExhausted)
	if n := f.impl.calls.Load(); n != 0 {
		t.Errorf("handler ran %d times, want 0", n)
	}
}

// Tests that a method without a policy cannot be served even through a
// gRPC option that handles unknown methods.
func TestUnknownMethodsAreNotServed(t *testing.T) {
	var called atomic.Bool
	f := start(t, testConfig(), newPostRecords(), guard.WithGRPCOptions(grpc.UnknownServiceHandler(
		func(any, grpc.ServerStream) error {
			called.Store(true)
			return nil
		})))
	for _, method := range []string{"/sluice.v1.Other/Do", "/sluice.v1.PostRecords/Undeclared"} {
		err := f.conn.Invoke(testContext(t, 5*time.Second), method, &sluicev1.GetPostRecordRequest{Uri: uris(1)[0]}, &sluicev1.PostRecord{})
		wantCode(t, err, codes.Unimplemented)
	}
	if called.Load() {
		t.Error("the unknown-service handler ran without a policy")
	}
}

// Tests that a server built and never served holds no goroutine (its
// stream workers start with its first Serve), that Serve after Drain
// returns at once, and that a service cannot be registered once serving.
func TestUnservedServerHoldsNoGoroutine(t *testing.T) {
	before := goleak.IgnoreCurrent()
	srv, err := guard.New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Register(&sluicev1.PostRecords_ServiceDesc, newPostRecords()); err != nil {
		t.Fatal(err)
	}
	// A start-up that fails after New drops the server as it is.
	if err := goleak.Find(before); err != nil {
		t.Errorf("a server never served left goroutines running: %v", err)
	}
	srv.Drain(context.Background())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(lis); err != nil {
		t.Errorf("Serve after Drain: %v, want nil", err)
	}

	served, err := guard.New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	lis2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- served.Serve(lis2) }()
	conn, err := grpc.NewClient(lis2.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Once health answers, the server is built and serving.
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("health check: %v", err)
	}
	if err := served.Register(&sluicev1.PostRecords_ServiceDesc, newPostRecords()); err == nil {
		t.Error("Register succeeded on a server already serving")
	}
	served.Drain(context.Background())
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// Tests that a stream which sends its headers and never its request is
// cancelled once receive_timeout has passed, giving back its stream slot
// and request-bytes reservation and counting a deadline refusal, so that
// such streams cannot hold every slot: a caller that comes afterwards is
// served.
func TestSilentStreamsCancelled(t *testing.T) {
	cfg := testConfig()
	cfg.ReceiveTimeout = 200 * time.Millisecond
	cfg.MaxStreams = 4
	obs := &observer{}
	f := start(t, cfg, newPostRecords(), guard.WithObserver(obs))
	ctx := testContext(t, 30*time.Second)
	silent := make([]grpc.ClientStream, 4)
	for i := range silent {
		sctx := metadata.AppendToOutgoingContext(ctx, "x-client-id", fmt.Sprintf("silent-%d", i))
		s, err := f.conn.NewStream(sctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/sluice.v1.PostRecords/GetPostRecord")
		if err != nil {
			t.Fatal(err)
		}
		silent[i] = s
	}
	waitFor(t, func() string { return fmt.Sprintf("%d streams reached the server", f.srv.MemoryStats().PeakStreams) },
		func() bool { return f.srv.MemoryStats().PeakStreams == 4 })
	waitFor(t, func() string { return fmt.Sprintf("%d streams open", f.srv.MemoryStats().Streams) },
		func() bool { return f.srv.MemoryStats().Streams == 0 })
	for i, s := range silent {
		if err := s.RecvMsg(new(sluicev1.PostRecord)); err == nil {
			t.Errorf("silent stream %d: answered, want it ended", i)
		}
	}
	if held := f.srv.MemoryStats().Requests.Held; held != 0 {
		t.Errorf("request bytes held after the silent streams ended: %v", held)
	}
	if got := obs.reasons(); !slices.Equal(got, []string{guard.ReasonDeadline, guard.ReasonDeadline, guard.ReasonDeadline, guard.ReasonDeadline}) {
		t.Errorf("refusals = %v, want deadline for each silent stream", got)
	}
	if _, err := f.client.GetPostRecord(ctx, &sluicev1.GetPostRecordRequest{Uri: uris(1)[0]}); err != nil {
		t.Errorf("a call after the silent streams: %v", err)
	}
}

// Tests that a stream which ended before its request arrived — a path
// sluice does not serve, answered Unimplemented at once, or a caller
// that gave up — is not counted again as a deadline refusal when
// receive_timeout passes.
func TestEndedStreamsNotReportedAsSilent(t *testing.T) {
	cfg := testConfig()
	cfg.ReceiveTimeout = 100 * time.Millisecond
	obs := &observer{}
	f := start(t, cfg, newPostRecords(), guard.WithObserver(obs))
	ctx := testContext(t, 10*time.Second)
	err := f.conn.Invoke(ctx, "/no.such.Service/Method", &sluicev1.GetPostRecordRequest{}, new(sluicev1.PostRecord))
	wantCode(t, err, codes.Unimplemented)
	open := func(n int64) func() bool { return func() bool { return f.srv.MemoryStats().Streams == n } }
	what := func() string { return fmt.Sprintf("%d streams open", f.srv.MemoryStats().Streams) }
	waitFor(t, what, open(0))
	gone, cancel := context.WithCancel(ctx)
	if _, err := f.conn.NewStream(gone, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/sluice.v1.PostRecords/GetPostRecord"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, what, open(1))
	cancel()
	waitFor(t, what, open(0))
	time.Sleep(5 * cfg.ReceiveTimeout)
	if got := obs.reasons(); len(got) != 0 {
		t.Errorf("refusals = %v, want none: both streams ended before receive_timeout", got)
	}
}
