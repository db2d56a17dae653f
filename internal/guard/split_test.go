package guard_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/guard/membudget"
)

// splitConfig lets the client "indexer", which has a budget of its own,
// send GetPostRecords batches of up to 25,000 URIs, split into pieces of
// the method's 1,000.
func splitConfig(b budget.Budget) guard.Config {
	cfg := testConfig()
	cfg.Admission = budget.DefaultConfig()
	cfg.Admission.Clients = map[string]budget.Budget{"indexer": b, "feed": budget.DefaultConfig().Default}
	p := cfg.Methods[getMany]
	p.Oversize = map[string]guard.Oversize{"indexer": {Mode: guard.OversizeSplit, MaxSplitItems: 25_000}}
	cfg.Methods[getMany] = p
	return cfg
}

func as(t *testing.T, client string) *metadataCtx {
	return &metadataCtx{t: t, client: client}
}

type metadataCtx struct {
	t      *testing.T
	client string
}

// context is a 30 s context that names the client, if it has a name.
func (m *metadataCtx) context() context.Context {
	ctx := testContext(m.t, 30*time.Second)
	if m.client != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-client-id", m.client)
	}
	return ctx
}

func (m *metadataCtx) get(f *fixture, n int) (*sluicev1.GetPostRecordsResponse, error) {
	return f.client.GetPostRecords(m.context(), &sluicev1.GetPostRecordsRequest{Uris: uris(n)}, grpc.MaxCallRecvMsgSize(64<<20))
}

// Tests that a listed client's 20,000-URI batch is answered whole and in
// order, served as twenty pieces of at most max_items, while the same
// batch from a caller without a name, or from a listed client the policy
// does not name, is refused as before without reaching the handler.
func TestSplitOversizedBatch(t *testing.T) {
	f := start(t, splitConfig(budget.Budget{ItemsPerSecond: 1e6, Burst: 5_000, MaxInflightItems: 5_000}), newPostRecords())
	resp, err := as(t, "indexer").get(f, 20_000)
	if err != nil {
		t.Fatalf("indexer's 20,000 URIs: %v", err)
	}
	want := uris(20_000)
	if got := len(resp.GetRecords()); got != len(want) {
		t.Fatalf("got %d records, want %d", got, len(want))
	}
	for i, r := range resp.GetRecords() {
		if r.GetUri() != want[i] {
			t.Fatalf("record %d is %q, want %q: the answer is not in request order", i, r.GetUri(), want[i])
		}
	}
	if got := f.impl.calls.Load(); got != 20 {
		t.Errorf("handler ran %d times, want 20 pieces of 1,000", got)
	}
	if peak := f.impl.peak.Load(); peak > 4*50 {
		t.Errorf("peak fan-out %d, over 4 pieces × concurrency 50", peak)
	}
	// The joined answer is reserved in the response ledger like any
	// other, and given back once written.
	if size, peak := proto.Size(resp), f.srv.MemoryStats().Responses.Peak; int(peak) < size {
		t.Errorf("response ledger peak %d bytes, below the answer's %d: the split answer was not reserved", peak, size)
	}
	waitFor(t, func() string {
		return fmt.Sprintf("the response ledger still holds %v after the split answer was written", f.srv.MemoryStats().Responses.Held)
	}, func() bool { return f.srv.MemoryStats().Responses.Held == 0 })

	for _, caller := range []string{"", "unknown", "feed", "stranger"} {
		before := f.impl.calls.Load()
		_, err := as(t, caller).get(f, 20_000)
		st := wantCode(t, err, codes.InvalidArgument)
		if !strings.Contains(st.Message(), "limit of 1000") {
			t.Errorf("caller %q: message %q does not name the limit of 1000", caller, st.Message())
		}
		if got := f.impl.calls.Load(); got != before {
			t.Errorf("caller %q: the handler ran %d times for a refused batch", caller, got-before)
		}
	}
	_, err = as(t, "indexer").get(f, 25_001)
	st := wantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(st.Message(), "limit of 25000") {
		t.Errorf("over max_split_items: message %q does not name the limit of 25000", st.Message())
	}
}

// Tests that every piece is charged to the caller's budget: a budget
// that refills 2,000 items/s cannot pay for 20,000 items within a 2s
// timeout, so the batch ends ResourceExhausted with RetryInfo after the
// pieces it could pay for, never DeadlineExceeded; a budget that pays
// for a few pieces at a time gets the whole answer, its pieces waiting
// for tokens.
func TestSplitPiecesChargeBudget(t *testing.T) {
	cfg := splitConfig(budget.Budget{ItemsPerSecond: 2_000, Burst: 2_000, MaxInflightItems: 5_000})
	p := cfg.Methods[getMany]
	p.Timeout = 2 * time.Second
	cfg.Methods[getMany] = p
	f := start(t, cfg, newPostRecords())
	_, err := as(t, "indexer").get(f, 20_000)
	st := wantCode(t, err, codes.ResourceExhausted)
	var retry bool
	for _, d := range st.Details() {
		_, retry = d.(*errdetails.RetryInfo)
		if retry {
			break
		}
	}
	if !retry {
		t.Errorf("the refusal carries no RetryInfo: %v", st.Details())
	}
	if got := f.impl.calls.Load(); got < 2 || got >= 20 {
		t.Errorf("handler ran %d times, want the pieces the burst and the refill paid for (2 to 19)", got)
	}

	g := start(t, splitConfig(budget.Budget{ItemsPerSecond: 40_000, Burst: 3_000, MaxInflightItems: 5_000}), newPostRecords())
	resp, err := as(t, "indexer").get(g, 10_000)
	if err != nil {
		t.Fatalf("10,000 URIs on a budget of 3,000 at once and 40,000/s: %v", err)
	}
	if got := len(resp.GetRecords()); got != 10_000 {
		t.Errorf("got %d records, want 10,000", got)
	}
}

// Tests that start-up refuses a split no caller could be trusted with or
// no answer could be joined for.
func TestSplitConfigRefused(t *testing.T) {
	listed := budget.DefaultConfig().Default
	for name, tc := range map[string]struct {
		method string
		client string
		o      guard.Oversize
		want   string
	}{
		"unnamed":       {getMany, "unknown", guard.Oversize{Mode: guard.OversizeSplit, MaxSplitItems: 5000}, "without a name"},
		"empty name":    {getMany, "", guard.Oversize{Mode: guard.OversizeSplit, MaxSplitItems: 5000}, "without a name"},
		"not listed":    {getMany, "stranger", guard.Oversize{Mode: guard.OversizeSplit, MaxSplitItems: 5000}, "budget of its own"},
		"bad mode":      {getMany, "indexer", guard.Oversize{Mode: "chunk", MaxSplitItems: 5000}, `got "chunk"`},
		"no ceiling":    {getMany, "indexer", guard.Oversize{Mode: guard.OversizeSplit}, "max_split_items must be above max_items 1000"},
		"over ceiling":  {getMany, "indexer", guard.Oversize{Mode: guard.OversizeSplit, MaxSplitItems: guard.MaxSplitCeiling + 1}, "at most 100000"},
		"writes":        {put, "indexer", guard.Oversize{Mode: guard.OversizeSplit, MaxSplitItems: 5000}, "one list aligned"},
		"single record": {getOne, "indexer", guard.Oversize{Mode: guard.OversizeSplit, MaxSplitItems: 5000}, "list of items"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Admission = budget.DefaultConfig()
			cfg.Admission.Clients = map[string]budget.Budget{"indexer": listed}
			p := cfg.Methods[tc.method]
			p.Oversize = map[string]guard.Oversize{tc.client: tc.o}
			cfg.Methods[tc.method] = p
			srv, err := guard.New(cfg)
			if err == nil {
				err = srv.Register(&sluicev1.PostRecords_ServiceDesc, newPostRecords())
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// Tests that a split batch's answer is reserved in the response ledger
// piece by piece as the pieces finish: a batch whose answer is over the
// caller's share of response bytes (half of max_response_bytes) is
// refused at the piece that would pass it, not after every piece has been
// served, and the bytes reserved for the pieces already answered are
// given back. An answer over the caller's whole share could never be
// sent, so the refusal (ResourceExhausted) says so and carries no
// RetryInfo: a caller that follows RetryInfo would retry it forever.
func TestSplitAnswerReservedAsPiecesFinish(t *testing.T) {
	cfg := splitConfig(budget.Budget{ItemsPerSecond: 1e6, Burst: 5_000, MaxInflightItems: 5_000})
	cfg.MaxResponseBytes = 4 * membudget.MiB // a 2 MiB share; the answer is about 3 MB
	p := cfg.Methods[getMany]
	p.Oversize["indexer"] = guard.Oversize{Mode: guard.OversizeSplit, MaxSplitItems: 100_000}
	cfg.Methods[getMany] = p
	f := start(t, cfg, newPostRecords())
	const n, pieces = 60_000, 60
	_, err := as(t, "indexer").get(f, n)
	st := wantCode(t, err, codes.ResourceExhausted)
	if !strings.Contains(st.Message(), "while its pieces were answered") || !strings.Contains(st.Message(), "can never be sent") || retryDelay(st) != 0 {
		t.Errorf("refusal %q (details %v): want it to say it came while the pieces were answered and can never be sent, without RetryInfo", st.Message(), st.Details())
	}
	if calls := f.impl.calls.Load(); calls >= pieces {
		t.Errorf("the handler ran for %d of %d pieces: the batch was served whole before its answer was refused", calls, pieces)
	}
	waitFor(t, func() string {
		return fmt.Sprintf("the response ledger still holds %v after the refused split batch", f.srv.MemoryStats().Responses.Held)
	}, func() bool { return f.srv.MemoryStats().Responses.Held == 0 })
}

// Tests that start-up refuses split for a client whose burst or in-flight
// cap is smaller than a piece: each piece is charged to its budget whole,
// so every piece would be refused for good (ResourceExhausted, with no
// retry that could help); both at exactly one piece are accepted.
func TestSplitNeedsABurstOfAPiece(t *testing.T) {
	for b, want := range map[budget.Budget]string{
		{ItemsPerSecond: 1000, Burst: 99, MaxInflightItems: 1000}: "burst of at least one piece (100 items",
		{ItemsPerSecond: 1000, Burst: 1000, MaxInflightItems: 99}: "max_inflight_items of at least one piece (100 items",
		{ItemsPerSecond: 1000, Burst: 100, MaxInflightItems: 100}: "",
	} {
		cfg := testConfig()
		cfg.PieceItems = 100
		cfg.Admission = budget.DefaultConfig()
		cfg.Admission.Clients = map[string]budget.Budget{"indexer": b}
		p := cfg.Methods[getMany]
		p.Oversize = map[string]guard.Oversize{"indexer": {Mode: guard.OversizeSplit, MaxSplitItems: 5000}}
		cfg.Methods[getMany] = p
		srv, err := guard.New(cfg)
		if err == nil {
			err = srv.Register(&sluicev1.PostRecords_ServiceDesc, newPostRecords())
		}
		switch {
		case want == "" && err != nil:
			t.Errorf("%v: %v, want accepted", b, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%v: got %v, want an error containing %q", b, err, want)
		}
	}
}

// Tests that a split batch yields to interactive work instead of failing
// whole: while one interactive batch holds all the item capacity and
// another waits for it, the indexer's pieces (batch work) are shed on
// arrival; they retry after the advised delay and the indexer still gets
// its whole answer once the interactive work is done.
func TestSplitPiecesRetryWhenShed(t *testing.T) {
	cfg := splitConfig(budget.Budget{ItemsPerSecond: 1e6, Burst: 5_000, MaxInflightItems: 5_000})
	cfg.MaxInflightItems, cfg.MinInflightItems = 1000, 1000
	cfg.QueueTarget, cfg.QueueInterval = time.Second, time.Second
	p := cfg.Methods[getMany]
	p.Oversize["indexer"] = guard.Oversize{Mode: guard.OversizeSplit, MaxSplitItems: 25_000, Timeout: 30 * time.Second}
	cfg.Methods[getMany] = p
	impl := newPostRecords()
	impl.block = make(chan struct{})
	f := start(t, cfg, impl)

	errs := make(chan error, 2)
	go func() { _, err := as(t, "feed").get(f, 1000); errs <- err }()
	<-impl.entered // holds all 1,000 items
	go func() { _, err := as(t, "feed").get(f, 1000); errs <- err }()
	for f.srv.QueueStats().Waiting == 0 {
		time.Sleep(time.Millisecond)
	}
	split := make(chan error, 1)
	var resp *sluicev1.GetPostRecordsResponse
	go func() {
		var err error
		resp, err = as(t, "indexer").get(f, 2000)
		split <- err
	}()
	for f.srv.QueueStats().Shed == 0 {
		time.Sleep(time.Millisecond)
	}
	close(impl.block)
	// The first interactive batch is served; the waiting one is served
	// too unless a slow machine kept it waiting past its 1s bound (then
	// it is shed, which is not what this test is about).
	shed := 0
	for range 2 {
		if err := <-errs; err != nil {
			if status.Code(err) != codes.Unavailable || shed > 0 {
				t.Errorf("interactive batch: %v", err)
			}
			shed++
		}
	}
	if err := <-split; err != nil {
		t.Fatalf("split batch after its pieces were shed: %v", err)
	}
	if got := len(resp.GetRecords()); got != 2000 {
		t.Errorf("got %d records, want 2,000", got)
	}
}
