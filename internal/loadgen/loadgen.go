// Package loadgen drives a sluice server with open-loop load and reports
// what each client saw, beside the server's vital signs.
//
// Open loop: every client has a schedule of send times (from its rate or
// from a replayed trace) and sends each request at its time whether or
// not earlier ones have returned. Latency is measured from the scheduled
// time, not from the moment the request left, so a stall of the server —
// or of the harness — shows in the percentiles instead of hiding behind
// fewer requests (coordinated omission).
//
// The harness must not become the overload it measures: each client has
// a bound on requests in flight (scenario.Client.MaxOutstanding). A
// request due while the bound is reached is not sent and is counted as
// dropped; one sent more than report.LateThreshold after its time is
// counted as late. Sends run through an errgroup whose limit is that
// bound, so the harness's own goroutines are bounded too.
//
// Each client has its own gRPC connection, as separate services would,
// so one client's large responses do not queue behind another's on the
// same HTTP/2 connection.
package loadgen

import (
	"context"
	"fmt"
	"io"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/loadgen/probe"
	"github.com/sluice-dev/sluice/internal/loadgen/recorder"
	"github.com/sluice-dev/sluice/internal/loadgen/report"
	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
	"github.com/sluice-dev/sluice/internal/loadgen/trace"
	"github.com/sluice-dev/sluice/internal/loadgen/vitals"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Options configure one run.
type Options struct {
	// Target is the server's gRPC address, host:port.
	Target string
	// Scenario is what to send. With Replay set it only supplies the
	// URI source and per-client settings (timeout, outstanding bound)
	// of clients it names.
	Scenario scenario.Scenario
	// Replay, when not nil, is sent instead of the scenario's schedule,
	// at Speed times its original pace (Speed 2 halves every offset).
	Replay []trace.Entry
	Speed  float64
	// Record, when not nil, receives every scheduled request.
	Record *trace.Writer
	// Progress, when not nil, receives a line per client every
	// ProgressEvery (default 2s).
	Progress      io.Writer
	ProgressEvery time.Duration
	// Vitals, when not nil, is sampled during the run.
	Vitals *vitals.Config
	// Probe, when not nil, times a bare memcached get during the run
	// (package probe), the machine's floor for a round trip.
	Probe *probe.Config
	// MaxRecvBytes bounds one response. Default 512 MiB (a 20,000-URI
	// batch of 3 KB posts is about 60 MB).
	MaxRecvBytes int
}

// request is one scheduled call.
type request struct {
	offset time.Duration // from the run's start
	method string
	uris   []string
}

// plan is one client's schedule.
type plan struct {
	client scenario.Client
	next   func() (request, bool)
}

// startLead is how long after Run is called the schedule begins, so that
// connections are up and every client starts at the same instant.
const startLead = 200 * time.Millisecond

// Run sends the load and returns the report. It returns early, with what
// was measured so far, when ctx ends.
func Run(ctx context.Context, opts Options) (*report.Report, error) {
	plans, err := buildPlans(opts)
	if err != nil {
		return nil, err
	}
	var prober *probe.Prober
	if opts.Probe != nil { // before any client starts: a probe that cannot start fails the run at once
		if prober, err = probe.Start(*opts.Probe); err != nil {
			return nil, err
		}
	}
	conns, err := dial(opts, len(plans))
	if err != nil {
		if prober != nil {
			prober.Close()
		}
		return nil, err
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	start := time.Now().Add(startLead)
	recs := make([]*recorder.Recorder, len(plans))
	for i, p := range plans {
		recs[i] = recorder.New(p.client.Name, p.client.Method, start)
	}

	bgCtx, stopBackground := context.WithCancel(ctx)
	var sampler *vitals.Sampler
	bg := new(errgroup.Group)
	bg.SetLimit(3)
	if opts.Vitals != nil {
		sampler = vitals.New(*opts.Vitals)
		bg.Go(func() error { sampler.Run(bgCtx); return nil })
	}
	var probed report.Client
	if prober != nil {
		bg.Go(func() error { probed = prober.Run(bgCtx, start); return nil })
	}
	if opts.Progress != nil {
		bg.Go(func() error { printProgress(bgCtx, opts, plans, recs, start); return nil })
	}

	clients := new(errgroup.Group)
	clients.SetLimit(len(plans))
	for i, p := range plans {
		d := driver{client: sluicev1.NewPostRecordsClient(conns[i]), plan: p, rec: recs[i], start: start, record: opts.Record}
		clients.Go(func() error { d.run(ctx); return nil })
	}
	_ = clients.Wait()
	finished := time.Now()
	stopBackground()
	_ = bg.Wait()

	r := &report.Report{
		Scenario:       opts.Scenario.Name,
		Target:         opts.Target,
		Started:        start,
		ElapsedSeconds: finished.Sub(start).Seconds(),
	}
	for _, rec := range recs {
		r.Clients = append(r.Clients, rec.Result())
	}
	if sampler != nil {
		r.Vitals = sampler.Result()
	}
	if prober != nil {
		r.Probe = &probed
	}
	return r, nil
}

func dial(opts Options, n int) ([]*grpc.ClientConn, error) {
	maxRecv := opts.MaxRecvBytes
	if maxRecv <= 0 {
		maxRecv = 512 << 20
	}
	var conns []*grpc.ClientConn
	for range n {
		c, err := grpc.NewClient(opts.Target,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecv), grpc.MaxCallSendMsgSize(maxRecv)))
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("loadgen: connect to %s: %w", opts.Target, err)
		}
		c.Connect()
		conns = append(conns, c)
	}
	return conns, nil
}

// driver sends one client's schedule.
type driver struct {
	client sluicev1.PostRecordsClient
	plan   plan
	rec    *recorder.Recorder
	start  time.Time
	record *trace.Writer
}

// run fires every request at its time, never waiting for earlier ones,
// up to the client's outstanding bound; then waits for those in flight.
func (d driver) run(ctx context.Context) {
	sends := new(errgroup.Group)
	sends.SetLimit(d.plan.client.MaxOutstanding)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		req, ok := d.plan.next()
		if !ok {
			break
		}
		at := d.start.Add(req.offset)
		if !sleepUntil(ctx, timer, at) {
			break
		}
		d.rec.Scheduled(at)
		if d.record != nil {
			d.record.Write(trace.Entry{OffsetMS: float64(req.offset) / float64(time.Millisecond), Client: d.plan.client.Name, Method: req.method, URIs: req.uris, Batch: len(req.uris)})
		}
		if !sends.TryGo(func() error { d.send(ctx, req, at); return nil }) {
			d.rec.Dropped()
		}
	}
	_ = sends.Wait()
}

// sleepUntil waits for at; false when ctx ended first.
func sleepUntil(ctx context.Context, timer *time.Timer, at time.Time) bool {
	wait := time.Until(at)
	if wait <= 0 {
		return ctx.Err() == nil
	}
	timer.Reset(wait)
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// send makes one call and records it, its latency counted from at.
func (d driver) send(ctx context.Context, req request, at time.Time) {
	d.rec.Sent(time.Since(at))
	ctx, cancel := context.WithTimeout(ctx, d.plan.client.Timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-client-id", d.plan.client.Name)
	code, message := call(ctx, d.client, req)
	done := time.Now()
	d.rec.Done(done, done.Sub(at), code, message, len(req.uris))
}

// call returns the gRPC code name of one request and, when it failed,
// the error's message; WrongCount when a successful batch response is
// not aligned with the request.
func call(ctx context.Context, c sluicev1.PostRecordsClient, req request) (code, message string) {
	var err error
	if req.method == scenario.GetPostRecord {
		_, err = c.GetPostRecord(ctx, &sluicev1.GetPostRecordRequest{Uri: req.uris[0]})
	} else {
		var resp *sluicev1.GetPostRecordsResponse
		resp, err = c.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: req.uris})
		if err == nil && len(resp.GetRecords()) != len(req.uris) {
			return "WrongCount", fmt.Sprintf("%d records for %d URIs", len(resp.GetRecords()), len(req.uris))
		}
	}
	if err != nil {
		return status.Code(err).String(), status.Convert(err).Message()
	}
	return "OK", ""
}
