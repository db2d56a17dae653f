package guard

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

const getPostRecords = "/sluice.v1.PostRecords/GetPostRecords"

func memoryConfig(limit membudget.Bytes) Config {
	cfg := DefaultConfig()
	cfg.Methods = map[string]Policy{
		"sluice.v1.PostRecords/GetPostRecords":    DefaultPolicy(),
		"sluice.v1.PostRecords/GetPostRecord":     {MaxItems: 1, MaxURILength: 512, Concurrency: 1, Timeout: time.Second},
		"sluice.v1.PostRecords/PutPostRecords":    DefaultPolicy(),
		"sluice.v1.PostRecords/DeletePostRecords": DefaultPolicy(),
		"sluice.v1.PostRecords/GetLimits":         {MaxItems: 1, MaxURILength: 512, Concurrency: 1, Timeout: time.Second},
	}
	cfg.MemoryLimit = limit
	return cfg
}

// Tests how the caps are derived from the budget and that start-up
// refuses a budget they cannot fit in, naming the caps and the budget.
func TestMemoryPlanFitsTheBudget(t *testing.T) {
	cfg := memoryConfig(512 * membudget.MiB)
	p := cfg.Memory()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("512MiB with the default caps: %v", err)
	}
	wantStream := 16*membudget.MiB + 1000*(512+1+2)
	if p.LargestStream != wantStream {
		t.Errorf("largest stream reservation %v, want 16MiB + 1000 × 515 bytes", p.LargestStream)
	}
	if total := p.Fixed + p.Requests + p.Responses; total > p.Limit || p.CallerRequests != p.Requests/2 {
		t.Errorf("plan %+v does not fit its limit", p)
	}
	t.Logf("512MiB: request bytes %v (caller %v, %d worst-case streams), response bytes %v, fixed %v",
		p.Requests, p.CallerRequests, p.Requests/p.LargestStream, p.Responses, p.Fixed)

	small := memoryConfig(160 * membudget.MiB)
	err := small.Validate()
	// Three methods share the largest reservation; the first by name is
	// the one named.
	for _, want := range []string{"memory_limit 160MiB", "max_caller_request_bytes", "max_recv_msg_bytes 16MiB", "largest valid sluice.v1.PostRecords/DeletePostRecords request"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("160MiB: error %v, want it to name %q", err, want)
		}
	}

	tiny := memoryConfig(512 * membudget.MiB)
	tiny.MaxResponseBytes = membudget.KiB
	if err := tiny.Validate(); err == nil || !strings.Contains(err.Error(), "max_response_bytes must be at least 4MiB, got 1KiB") {
		t.Errorf("max_response_bytes 1KiB: error %v, want it refused with the least", err)
	}

	over := memoryConfig(512 * membudget.MiB)
	over.MaxRequestBytes = 400 * membudget.MiB
	over.MaxConnections = 1000
	err = over.Validate()
	for _, want := range []string{"over memory_limit 512MiB", "max_request_bytes 400MiB", "max_connections 1000", "max_response_bytes"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("caps over the budget: error %v, want it to name %q", err, want)
		}
	}
}

// Tests where the collector's GOGC comes from: the config, else the
// environment's GOGC (left in force), else the default; and that a
// configured one out of range is refused, naming the key and the range.
func TestMemoryPlanSetsGCPercent(t *testing.T) {
	t.Setenv("GOGC", "")
	cfg := memoryConfig(512 * membudget.MiB)
	if p := cfg.Memory(); p.GCPercent != 400 || p.GCSource != membudget.SourceDefault {
		t.Errorf("no gc_percent, no GOGC: %d from %q, want 400 from %q", p.GCPercent, p.GCSource, membudget.SourceDefault)
	}
	t.Setenv("GOGC", "150")
	if p := cfg.Memory(); p.GCPercent != 0 || p.GCSource != membudget.SourceGOGC {
		t.Errorf("GOGC=150: %d from %q, want 0 (left in force) from %q", p.GCPercent, p.GCSource, membudget.SourceGOGC)
	}
	cfg.GCPercent = 200
	if p := cfg.Memory(); p.GCPercent != 200 || p.GCSource != membudget.SourceFlag {
		t.Errorf("gc_percent 200 with GOGC=150: %d from %q, want 200 from %q", p.GCPercent, p.GCSource, membudget.SourceFlag)
	}
	for _, bad := range []int{-1, 10, 5000} {
		cfg.GCPercent = bad
		err := cfg.Validate()
		if want := fmt.Sprintf("gc_percent must be between 25 and 2000, got %d", bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("gc_percent %d: error %v, want it to say %q", bad, err, want)
		}
	}
}

func newMemoryServer(t *testing.T, cfg Config, opts ...Option) *Server {
	t.Helper()
	s, err := New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(&sluicev1.PostRecords_ServiceDesc, sluicev1.UnimplementedPostRecordsServer{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // drains the server, as its owner does
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Drain(ctx)
	})
	return s
}

func tapAs(s *Server, client string) (context.Context, context.CancelFunc, error) {
	md := metadata.Pairs("x-client-id", client)
	ctx, cancel := context.WithCancel(metadata.NewIncomingContext(context.Background(), md))
	got, err := s.tapHandle(ctx, &tap.Info{FullMethodName: getPostRecords, Header: md})
	if err != nil {
		cancel()
		return nil, func() {}, err
	}
	return got, cancel, nil
}

// Tests admission at the stream's start: a stream reserves its worst case
// before its body is read; a caller over its share gets ResourceExhausted
// and the process over its cap Unavailable, both with RetryInfo and
// saying what is held; the reservation comes back when the message is
// counted (received) or when the stream ends, whichever is first.
func TestTapReservesWorstCaseAtStreamStart(t *testing.T) {
	cfg := memoryConfig(1 * membudget.GiB)
	w := streamReservation(cfg.MaxRecvMsgBytes, DefaultPolicy(), DefaultPolicy().MaxItems)
	cfg.MaxRequestBytes = 3 * w
	cfg.MaxCallerRequestBytes = 2 * w
	s := newMemoryServer(t, cfg)

	a1, endA1, err := tapAs(s, "a")
	if err != nil {
		t.Fatal(err)
	}
	a2, endA2, err := tapAs(s, "a")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = tapAs(s, "a")
	assertRefusal(t, "a's third stream", err, codes.ResourceExhausted, `caller "a" holds`)
	_, endB, err := tapAs(s, "b")
	if err != nil {
		t.Fatalf("b's first stream: %v", err)
	}
	_, _, err = tapAs(s, "c")
	assertRefusal(t, "c with the process at its cap", err, codes.Unavailable, "of the process-wide cap")

	received(a1, 0) // a1's message was counted and dropped
	if _, endC, err := tapAs(s, "c"); err != nil {
		t.Errorf("c after a1's message was counted: %v", err)
	} else {
		defer endC()
	}
	endA1()
	endA2() // a2 ended before its handler ran
	waitFor(t, func() bool { return s.mem.requests.Held("a") == 0 }, "a's reservations back after its streams ended")
	_ = a2
	endB()
	st := s.MemoryStats()
	if st.Requests.RefusedCaller != 1 || st.Requests.RefusedTotal != 1 {
		t.Errorf("refusals %+v, want one of each", st.Requests)
	}
}

// Tests the process-wide cap on open streams.
func TestTapCapsStreams(t *testing.T) {
	cfg := memoryConfig(1 * membudget.GiB)
	cfg.MaxStreams = 2
	s := newMemoryServer(t, cfg)
	_, end1, err := tapAs(s, "a")
	if err != nil {
		t.Fatal(err)
	}
	_, end2, err := tapAs(s, "b")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = tapAs(s, "c")
	assertRefusal(t, "a third stream over max_streams 2", err, codes.Unavailable, "2 streams are open")
	end1()
	waitFor(t, func() bool { return s.MemoryStats().Streams == 1 }, "a stream's slot back after it ended")
	if _, end3, err := tapAs(s, "c"); err != nil {
		t.Errorf("after one ended: %v", err)
	} else {
		end3()
	}
	end2()
}

// Tests that a stream refused at its start is reported under its method
// when its path names one sluice serves, and under UnknownMethod for any
// other path: the path is the caller's to choose, and made-up ones, valid
// UTF-8 or not, must add no metric series.
func TestTapReportsUnservedPathsAsUnknown(t *testing.T) {
	cfg := memoryConfig(1 * membudget.GiB)
	cfg.MaxStreams = 1
	seen := &methodsSeen{}
	s := newMemoryServer(t, cfg, WithObserver(seen))
	_, end, err := tapAs(s, "a") // holds the one stream there is
	if err != nil {
		t.Fatal(err)
	}
	defer end()
	md := metadata.Pairs("x-client-id", "b")
	ctx := metadata.NewIncomingContext(context.Background(), md)
	paths := []string{getPostRecords, "/no.such.Service/Method", "/\xff\xfe/x"}
	for _, path := range paths {
		if _, err := s.tapHandle(ctx, &tap.Info{FullMethodName: path, Header: md}); status.Code(err) != codes.Unavailable {
			t.Fatalf("%q over max_streams: %v, want Unavailable", path, err)
		}
	}
	if want := []string{getPostRecords, UnknownMethod, UnknownMethod}; !slices.Equal(seen.methods, want) {
		t.Errorf("reported methods %q, want %q", seen.methods, want)
	}
}

// methodsSeen records the method of every request refused.
type methodsSeen struct {
	nopObserver
	methods []string
}

func (o *methodsSeen) Rejected(_ context.Context, r Request, _ string) {
	o.methods = append(o.methods, r.Method)
}

func assertRefusal(t *testing.T, what string, err error, code codes.Code, says string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.Contains(st.Message(), says) || !strings.Contains(st.Message(), "GetPostRecords") {
		t.Errorf("%s: %v %q, want %v saying %q", what, st.Code(), st.Message(), code, says)
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
			return
		}
	}
	if err != nil {
		t.Errorf("%s: no RetryInfo in %v", what, st.Details())
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Tests that a caller the policy lets split reserves for its largest
// batch (max_split_items), not max_items, and keeps the decoded batch
// reserved until its stream ends; that other callers reserve as before;
// and that start-up refuses a split batch that could never fit the
// caller's share, naming the client and max_split_items.
func TestSplitCallerReservesItsLargestBatch(t *testing.T) {
	split := func(maxSplit int, share membudget.Bytes) Config {
		cfg := memoryConfig(512 * membudget.MiB)
		cfg.MaxCallerRequestBytes = share
		cfg.Admission = budget.DefaultConfig()
		cfg.Admission.Clients = map[string]budget.Budget{"indexer": budget.DefaultConfig().Default}
		p := cfg.Methods["sluice.v1.PostRecords/GetPostRecords"]
		p.Oversize = map[string]Oversize{"indexer": {Mode: OversizeSplit, MaxSplitItems: maxSplit}}
		cfg.Methods["sluice.v1.PostRecords/GetPostRecords"] = p
		return cfg
	}
	cfg := split(20_000, 40*membudget.MiB)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("20,000-item split in a 40MiB share: %v", err)
	}
	wantSplit := 16*membudget.MiB + 20_000*(512+1+2)
	if p := cfg.Memory(); p.LargestStream != wantSplit || !strings.Contains(p.LargestStreamMethod, `"indexer"`) {
		t.Errorf("largest stream %v (%s), want %v for indexer's split batch", p.LargestStream, p.LargestStreamMethod, wantSplit)
	}
	s := newMemoryServer(t, cfg)
	ctx, end, err := tapAs(s, "indexer")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.mem.requests.Held("indexer"); got != wantSplit {
		t.Errorf("indexer's stream reserved %v, want %v", got, wantSplit)
	}
	received(ctx, decodedBytes(1_500_000, 20_000))
	received(ctx, 0) // the interceptor's call: the decoded batch stays reserved
	if got, want := s.mem.requests.Held("indexer"), decodedBytes(1_500_000, 20_000); got != want {
		t.Errorf("after decoding indexer holds %v, want the decoded batch's %v until the stream ends", got, want)
	}
	end()
	waitHeld(t, s, "indexer")
	_, endFeed, err := tapAs(s, "feed")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.mem.requests.Held("feed"), 16*membudget.MiB+1000*(512+1+2); got != want {
		t.Errorf("feed's stream reserved %v, want %v", got, want)
	}
	endFeed()

	err = split(100_000, 40*membudget.MiB).Validate()
	for _, want := range []string{`client "indexer", max_split_items 100000`, "max_caller_request_bytes 40MiB"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("100,000-item split in a 40MiB share: %v, want it to name %q", err, want)
		}
	}
}

// waitHeld waits until client holds no request bytes (a stream's end is
// seen by an AfterFunc).
func waitHeld(t *testing.T, s *Server, client string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.mem.requests.Held(client) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds %v after its stream ended", client, s.mem.requests.Held(client))
		}
		time.Sleep(time.Millisecond)
	}
}

// Tests that a stream whose unary handler has returned gives back its
// slot and reservation at once, in the handler's goroutine (handled),
// and that the end of its context then gives back nothing more; and
// that a stream whose context ends first is ended by it, once, whether
// or not its handler returns later.
func TestHandledEndsStreamOnce(t *testing.T) {
	s := newMemoryServer(t, memoryConfig(1*membudget.GiB))
	ctx, cancel, err := tapAs(s, "a")
	if err != nil {
		t.Fatal(err)
	}
	receivingOf(ctx).handled()
	if st := s.MemoryStats(); st.Streams != 0 || s.mem.requests.Held("a") != 0 {
		t.Fatalf("after the handler returned: %d streams open, %d bytes held, want none", st.Streams, s.mem.requests.Held("a"))
	}
	cancel()
	time.Sleep(10 * time.Millisecond) // time for a callback that should not run
	if st := s.MemoryStats(); st.Streams != 0 {
		t.Fatalf("after the stream ended too: %d streams open, want 0 (the slot given back once)", st.Streams)
	}

	ctx, cancel, err = tapAs(s, "b")
	if err != nil {
		t.Fatal(err)
	}
	cancel() // the stream ends before its handler returns
	waitFor(t, func() bool { return s.MemoryStats().Streams == 0 }, "the slot back when the stream ended")
	receivingOf(ctx).handled()
	if st := s.MemoryStats(); st.Streams != 0 || s.mem.requests.Held("b") != 0 {
		t.Fatalf("after the handler returned late: %d streams open, %d bytes held, want none", st.Streams, s.mem.requests.Held("b"))
	}
}

// Tests that the tap reads the request's criticality from the stream's
// headers, as the interceptor would from the incoming metadata.
func TestTapReadsCriticality(t *testing.T) {
	s := newMemoryServer(t, memoryConfig(1*membudget.GiB))
	for _, tc := range []struct {
		md        metadata.MD
		batch, ok bool
	}{
		{md: metadata.Pairs("x-client-id", "a"), ok: true},
		{md: metadata.Pairs("x-client-id", "a", CriticalityKey, " Batch "), batch: true, ok: true},
		{md: metadata.Pairs(CriticalityKey, "interactive"), ok: true},
		{md: metadata.Pairs(CriticalityKey, "urgent"), ok: false},
	} {
		ctx, cancel := context.WithCancel(metadata.NewIncomingContext(context.Background(), tc.md))
		got, err := s.tapHandle(ctx, &tap.Info{FullMethodName: getPostRecords, Header: tc.md})
		if err != nil {
			t.Fatal(err)
		}
		batch, err := criticalityOf(got, receivingOf(got))
		if batch != tc.batch || (err == nil) != tc.ok {
			t.Errorf("%v: batch %v, error %v; want batch %v, ok %v", tc.md, batch, err, tc.batch, tc.ok)
		}
		wantBatch, wantErr := criticalityOf(ctx, nil)
		if batch != wantBatch || (err == nil) != (wantErr == nil) {
			t.Errorf("%v: from the tap batch %v, error %v; from the metadata batch %v, error %v", tc.md, batch, err, wantBatch, wantErr)
		}
		cancel()
	}
}

// Tests that a caller whose answer is over its share of response bytes
// is told the request was refused before its answer was sent (its work
// was done), not before it was read.
func TestResponseShareRefusalSaysWhen(t *testing.T) {
	cfg := memoryConfig(1 * membudget.GiB)
	cfg.MaxResponseBytes = minResponseBytes
	s := newMemoryServer(t, cfg)
	big := &sluicev1.PostRecord{Uri: "at://did:plc:a/app.bsky.feed.post/b", Record: bytes.Repeat([]byte("x"), int(minResponseBytes/2)+1)}
	_, err := s.holdResponse(context.Background(), getPostRecords, "a", big, nil)
	assertRefusal(t, "answer over the caller's share", err, codes.ResourceExhausted, "GetPostRecords: refused before its answer was sent: response bytes not yet written")
}
