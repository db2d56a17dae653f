package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/synth"
	"github.com/sluice-dev/sluice/internal/testenv"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The flood of the memory issue: GetPostRecords messages of 20,000 URIs of
// about 500 bytes (10 MB each, under the 16 MiB max_recv_msg_bytes), up
// to 400 in flight, against the real binary under a 512 MiB budget.
const (
	floodBudget   = "512MiB"
	floodLimit    = 512 << 20
	floodURIs     = 20_000
	floodInFlight = 400
	// floodRequests bounds each run by count (and floodFor by time), so
	// that the test costs the same on a fast machine and a busy one.
	floodRequests = 6_000
	floodFor      = 5 * time.Second
	floodDeadline = 30 * time.Second
	normalClients = 4
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// sluiceBinary builds cmd/sluice once per test run.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "sluice")
		if out, err := exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// server is a running `sluice serve`.
type server struct {
	cmd      *exec.Cmd
	grpcAddr string
	httpAddr string
	stderr   *syncBuffer
	exited   chan error
}

func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	mc := testenv.SharedMemcached(t)
	dir := t.TempDir()
	s := &server{
		grpcAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		httpAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		stderr:   &syncBuffer{},
		exited:   make(chan error, 1),
	}
	args = append([]string{"serve", "--data-dir", filepath.Join(dir, "data"), "--grpc-addr", s.grpcAddr,
		"--http-addr", s.httpAddr, "--memcached", mc, "--drain-timeout", "2s"}, args...)
	s.cmd = exec.Command(sluiceBinary(t), args...)
	s.cmd.Stderr = s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.exited
	})
	if err := testenv.WaitTCP(s.grpcAddr, 30*time.Second); err != nil {
		t.Fatalf("sluice serve did not start: %v\n%s", err, s.stderr.String())
	}
	return s
}

// procStatus reads a field of the server's /proc/<pid>/status, in bytes;
// it reports a field it cannot read as an error (it may run off the
// test's goroutine) and returns 0.
func (s *server) procStatus(t *testing.T, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		t.Error(err)
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Error(err)
				return 0
			}
			return kb << 10
		}
	}
	t.Errorf("no %s in /proc/%d/status", field, s.cmd.Process.Pid)
	return 0
}

// metric returns the value of an unlabelled series on /metrics.
func (s *server) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no series %s on /metrics", name)
	return 0
}

// rawCodec sends pre-encoded request bytes, so that 400 flood callers
// share one 10 MB message instead of marshalling it for every request.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return proto.Marshal(v.(proto.Message))
}
func (rawCodec) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func uris(n, length int) []string {
	g := synth.New(1, 64)
	out := make([]string, n)
	for i := range out {
		u := g.MissingURI()
		out[i] = u + strings.Repeat("a", max(length-len(u), 0))
	}
	return out
}

// retryDelay is the RetryInfo delay a refusal advises, at most 1s.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return min(ri.GetRetryDelay().AsDuration(), time.Second)
		}
	}
	return 0
}

// flood is one run's outcome.
type flood struct {
	mu      sync.Mutex
	codes   map[codes.Code]int
	unclear []string // refusals that do not say why
	sent    atomic.Int64
}

func (f *flood) record(err error) {
	st := status.Convert(err)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.codes[st.Code()]++
	clear := false
	switch st.Code() {
	case codes.InvalidArgument:
		clear = strings.Contains(st.Message(), "20000 uris exceeds the limit of 1000")
	case codes.ResourceExhausted, codes.Unavailable:
		clear = strings.Contains(st.Message(), "refused") || strings.Contains(st.Message(), "at capacity") || strings.Contains(st.Message(), "connection")
	}
	if !clear && len(f.unclear) < 5 {
		f.unclear = append(f.unclear, st.Code().String()+": "+st.Message())
	}
}

// runFlood sends the flood over conns connections, inFlight requests at
// once, while normal clients send legal batches on their own connections;
// it returns the flood's outcome and the normal clients' errors.
func runFlood(t *testing.T, s *server, conns int) (*flood, int64, []string) {
	t.Helper()
	msg, err := proto.Marshal(&sluicev1.GetPostRecordsRequest{Uris: uris(floodURIs, 500)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("flood message: %d URIs, %.1f MB", floodURIs, float64(len(msg))/1e6)
	ctx, cancel := context.WithTimeout(context.Background(), floodFor)
	defer cancel()

	var normalOK, normalErrs atomic.Int64
	var firstErrs sync.Map
	var wg sync.WaitGroup
	normalBatch := uris(50, 90)
	for c := range normalClients {
		rpc := sluicev1.NewPostRecordsClient(dial(t, s.grpcAddr))
		wg.Go(func() {
			callCtx := metadata.AppendToOutgoingContext(context.Background(), "x-client-id", fmt.Sprintf("normal-%d", c))
			for ctx.Err() == nil {
				reqCtx, cancel := context.WithTimeout(callCtx, 5*time.Second)
				_, err := rpc.GetPostRecords(reqCtx, &sluicev1.GetPostRecordsRequest{Uris: normalBatch})
				cancel()
				if err != nil {
					normalErrs.Add(1)
					firstErrs.LoadOrStore(c, err.Error())
				} else {
					normalOK.Add(1)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}

	f := &flood{codes: map[codes.Code]int{}}
	var peak atomic.Int64
	wg.Go(func() {
		for ctx.Err() == nil {
			peak.Store(max(peak.Load(), s.procStatus(t, "VmRSS")))
			time.Sleep(50 * time.Millisecond)
		}
	})
	floodConns := make([]*grpc.ClientConn, conns)
	for i := range floodConns {
		floodConns[i] = dial(t, s.grpcAddr)
	}
	// Each flood request has its own deadline, far beyond the run's: it
	// must end in a refusal from the server, not in the caller giving up.
	floodCtx := metadata.AppendToOutgoingContext(context.Background(), "x-client-id", "flood")
	var budget atomic.Int64
	budget.Store(floodRequests)
	for w := range floodInFlight {
		conn := floodConns[w%conns]
		wg.Go(func() {
			for budget.Add(-1) >= 0 && ctx.Err() == nil {
				var resp sluicev1.GetPostRecordsResponse
				reqCtx, cancel := context.WithTimeout(floodCtx, floodDeadline)
				err := conn.Invoke(reqCtx, "/sluice.v1.PostRecords/GetPostRecords", msg, &resp, grpc.ForceCodec(rawCodec{}))
				cancel()
				f.sent.Add(1)
				f.record(err)
				// The flood's callers honour RetryInfo, as the Go client
				// does; without it they spin on refusals and the run
				// measures the machine's CPU, not sluice's memory.
				time.Sleep(retryDelay(err))
			}
		})
	}
	wg.Wait()
	var first []string
	firstErrs.Range(func(_, v any) bool { first = append(first, v.(string)); return true })
	t.Logf("normal clients: %d ok, %d errors", normalOK.Load(), normalErrs.Load())
	if normalOK.Load() == 0 {
		t.Errorf("normal clients completed no request")
	}
	return f, peak.Load(), first
}

// Tests that no caller, however many connections and messages it sends,
// grows sluice past its memory budget: the flood of 10 MB messages over 8
// connections, and over 64 small ones, against the real binary started
// with --memory-limit 512MiB. Peak RSS stays under the budget, every flood
// request is refused with a code and a message that says why, four
// normal clients see no error, and the heap after the flood is within the
// budget.
func TestFloodStaysWithinMemoryBudget(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conns int
	}{{"8 connections", 8}, {"64 connections", 64}} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, "--memory-limit", floodBudget)
			f, peakSampled, normalErrs := runFlood(t, s, tc.conns)
			hwm := s.procStatus(t, "VmHWM")
			time.Sleep(500 * time.Millisecond)
			heap := s.metric(t, "go_memstats_heap_inuse_bytes")
			rssAfter := s.procStatus(t, "VmRSS")
			f.mu.Lock()
			byCode := maps.Clone(f.codes)
			f.mu.Unlock()
			var summary []string
			for _, c := range slices.Sorted(maps.Keys(byCode)) {
				summary = append(summary, fmt.Sprintf("%v %d", c, byCode[c]))
			}
			t.Logf("%s: %d flood requests: %s; peak RSS %.0f MiB (sampled %.0f MiB), budget %s; after the flood: heap in use %.0f MiB, RSS %.0f MiB",
				tc.name, f.sent.Load(), strings.Join(summary, ", "), float64(hwm)/(1<<20), float64(peakSampled)/(1<<20), floodBudget, heap/(1<<20), float64(rssAfter)/(1<<20))
			if hwm >= floodLimit {
				t.Errorf("peak RSS %d bytes, over the %s budget", hwm, floodBudget)
			}
			if heap >= floodLimit {
				t.Errorf("heap in use %.0f bytes after the flood, over the %s budget", heap, floodBudget)
			}
			if byCode[codes.OK] != 0 {
				t.Errorf("%d flood requests succeeded, want every one refused", byCode[codes.OK])
			}
			if len(f.unclear) != 0 {
				t.Errorf("flood refusals that do not say why: %q", f.unclear)
			}
			if byCode[codes.InvalidArgument] == 0 {
				t.Errorf("no flood request reached the count (InvalidArgument): %v", summary)
			}
			if byCode[codes.ResourceExhausted]+byCode[codes.Unavailable] == 0 {
				t.Errorf("no flood request was refused before its body was read: %v", summary)
			}
			if len(normalErrs) != 0 {
				t.Errorf("normal clients saw errors: %q", normalErrs)
			}
		})
	}
}

// Tests that start-up refuses a memory budget its caps cannot fit in,
// naming the caps and the budget.
func TestStartupRefusesCapsOverBudget(t *testing.T) {
	mc := testenv.SharedMemcached(t)
	dir := t.TempDir()
	cmd := exec.Command(sluiceBinary(t), "serve", "--memory-limit", "160MiB", "--data-dir", filepath.Join(dir, "data"),
		"--grpc-addr", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), "--http-addr", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		"--memcached", mc)
	done := make(chan struct{})
	timer := time.AfterFunc(30*time.Second, func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
		}
	})
	out, err := cmd.CombinedOutput()
	close(done)
	timer.Stop()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("sluice serve with caps over the budget: %v, want a non-zero exit\n%s", err, out)
	}
	for _, want := range []string{"memory_limit 160MiB", "max_caller_request_bytes", "max_recv_msg_bytes 16MiB"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("start-up error does not name %q:\n%s", want, out)
		}
	}
}
