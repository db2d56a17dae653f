package guard_test

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/guard/budget"
	"github.com/sluice-dev/sluice/internal/identity"
)

// BenchmarkUnaryOverhead measures what the guard adds to one unary call:
// the same GetPostRecord handler (it answers the URI asked, with no cache
// or store behind it) served by a bare grpc.Server and through the guard,
// over loopback TCP, client and servers in this process, taking turns in
// blocks of calls. It reports each side's time and heap allocations per
// call (client and server together: the client's are the same on both
// sides, so the difference is the guard's), and the ratios.
//
// Allocations are counted, not sampled, so allocs/call is the same from
// run to run on any machine; the times are a ratio in the same run.
func BenchmarkUnaryOverhead(b *testing.B) {
	bare := serveBare(b)
	guarded := serveGuarded(b)
	ctx := metadata.AppendToOutgoingContext(context.Background(), identity.ClientIDKey, "bench")
	req := &sluicev1.GetPostRecordRequest{Uri: "at://did:plc:abcdefghijklmnopqrstuvwx/app.bsky.feed.post/3kabcdefghijk"}
	sides := []*overheadSide{{name: "bare", client: bare}, {name: "guarded", client: guarded}}
	for _, s := range sides { // warm both connections and pools
		for range 200 {
			s.call(b, ctx, req)
		}
	}
	const block = 100
	b.ResetTimer()
	for done := 0; done < b.N; done += block {
		for _, s := range sides {
			s.measure(b, ctx, req, min(block, b.N-done))
		}
	}
	b.StopTimer()
	base, g := sides[0], sides[1]
	b.ReportMetric(base.nsPerCall(), "bare-ns/call")
	b.ReportMetric(g.nsPerCall(), "guarded-ns/call")
	b.ReportMetric(g.nsPerCall()/base.nsPerCall(), "guarded/bare-time")
	b.ReportMetric(base.allocsPerCall(), "bare-allocs/call")
	b.ReportMetric(g.allocsPerCall(), "guarded-allocs/call")
	b.ReportMetric(g.allocsPerCall()-base.allocsPerCall(), "guard-allocs/call")
	b.ReportMetric(g.bytesPerCall()-base.bytesPerCall(), "guard-B/call")
}

// overheadSide is one server of BenchmarkUnaryOverhead and what its calls
// cost so far.
type overheadSide struct {
	name          string
	client        sluicev1.PostRecordsClient
	calls         int
	elapsed       time.Duration
	allocs, bytes uint64
}

func (s *overheadSide) call(b *testing.B, ctx context.Context, req *sluicev1.GetPostRecordRequest) {
	rec, err := s.client.GetPostRecord(ctx, req)
	if err != nil {
		b.Fatalf("%s: %v", s.name, err)
	}
	if rec.GetUri() != req.GetUri() {
		b.Fatalf("%s answered %q for %q", s.name, rec.GetUri(), req.GetUri())
	}
}

// measure makes n calls and adds their time and allocations.
func (s *overheadSide) measure(b *testing.B, ctx context.Context, req *sluicev1.GetPostRecordRequest, n int) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	for range n {
		s.call(b, ctx, req)
	}
	s.elapsed += time.Since(start)
	runtime.ReadMemStats(&after)
	s.calls += n
	s.allocs += after.Mallocs - before.Mallocs
	s.bytes += after.TotalAlloc - before.TotalAlloc
}

func (s *overheadSide) nsPerCall() float64 {
	return float64(s.elapsed.Nanoseconds()) / float64(s.calls)
}

func (s *overheadSide) allocsPerCall() float64 { return float64(s.allocs) / float64(s.calls) }

func (s *overheadSide) bytesPerCall() float64 { return float64(s.bytes) / float64(s.calls) }

// serveBare serves the test handler on a grpc.Server with no options.
func serveBare(b *testing.B) sluicev1.PostRecordsClient {
	srv := grpc.NewServer()
	sluicev1.RegisterPostRecordsServer(srv, newPostRecords())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(lis)
	b.Cleanup(srv.Stop)
	return sluicev1.NewPostRecordsClient(dial(b, lis.Addr().String()))
}

// serveGuarded serves the test handler through the guard, with a budget
// for the benchmark's caller that the calls never reach.
func serveGuarded(b *testing.B) sluicev1.PostRecordsClient {
	cfg := testConfig()
	cfg.Admission.Clients = map[string]budget.Budget{"bench": {ItemsPerSecond: 1e9, Burst: 1e6, MaxInflightItems: 1e6}}
	srv, err := guard.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return sluicev1.NewPostRecordsClient(serveImpl(b, srv, newPostRecords()))
}
