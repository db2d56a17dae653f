package faults

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/promtext"
	"github.com/sluice-dev/sluice/internal/sockets"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// sluiceBinary builds cmd/sluice once per test run.
var sluiceBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sluice-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "sluice")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/sluice-dev/sluice/cmd/sluice").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// proc is one `sluice serve` process.
type proc struct {
	cmd      *exec.Cmd
	grpcAddr string
	adminURL string
	stderr   *bytes.Buffer
	done     chan struct{}
	err      error
}

// cluster is what a restart test runs: a built binary, a seeded data
// directory, fixed ports reused across restarts.
type cluster struct {
	t         *testing.T
	bin, dir  string
	uris      []string
	grpcAddr  string
	httpAddr  string
	memcached string
	extra     []string
}

func newCluster(t *testing.T, memcached string, posts int, extra ...string) *cluster {
	t.Helper()
	bin, err := sluiceBinary()
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, bin: bin, dir: t.TempDir(), memcached: memcached, extra: extra,
		grpcAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t))),
		httpAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))}
	urisFile := filepath.Join(c.dir, "uris.txt")
	out, err := exec.Command(bin, "seed", "--data-dir", c.dir, "--posts", strconv.Itoa(posts), "--uris-out", urisFile).CombinedOutput()
	if err != nil {
		t.Fatalf("sluice seed: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(urisFile)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		c.uris = append(c.uris, sc.Text())
	}
	return c
}

// start runs `sluice serve` on the cluster's ports; the process is killed
// when the test ends if it is still running.
func (c *cluster) start() *proc {
	c.t.Helper()
	args := append([]string{"serve", "--data-dir", c.dir, "--memcached", c.memcached,
		"--grpc-addr", c.grpcAddr, "--http-addr", c.httpAddr}, c.extra...)
	p := &proc{cmd: exec.Command(c.bin, args...), grpcAddr: c.grpcAddr, adminURL: "http://" + c.httpAddr,
		stderr: &bytes.Buffer{}, done: make(chan struct{})}
	p.cmd.Stderr = &lockedWriter{w: p.stderr}
	if err := p.cmd.Start(); err != nil {
		c.t.Fatalf("start sluice: %v", err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	c.t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// waitReady polls /readyz until it answers 200, returning how long that
// took from since.
func (p *proc) waitReady(t *testing.T, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	for time.Since(since) < within {
		if readyz(p.adminURL) == http.StatusOK {
			return time.Since(since)
		}
		select {
		case <-p.done:
			t.Fatalf("sluice exited before it was ready: %v\n%s", p.err, p.stderr)
		case <-time.After(5 * time.Millisecond):
		}
	}
	t.Fatalf("sluice not ready after %v\n%s", within, p.stderr)
	return 0
}

// readyz returns /readyz's status code, or 0 when nothing answers.
func readyz(adminURL string) int {
	client := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := client.Get(adminURL + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// call is one request of a restart test's load.
type call struct {
	start, end time.Time
	code       codes.Code
	msg        string
}

// hammer sends batches of 100 URIs from clients goroutines, back to back,
// until stop is closed, and returns every call.
func hammer(t *testing.T, addr string, uris []string, clients int, stop <-chan struct{}) func() []call {
	// Reconnect quickly (gRPC's default backoff starts at 1s), as a
	// client of a restarting server would be configured to.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	client := sluicev1.NewPostRecordsClient(conn)
	var mu sync.Mutex
	var calls []call
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				from := (c*131 + i*97) % (len(uris) - 100)
				ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-client-id", fmt.Sprintf("client-%d", c)), 3*time.Second)
				cl := call{start: time.Now()}
				resp, err := client.GetPostRecords(ctx, &sluicev1.GetPostRecordsRequest{Uris: uris[from : from+100]})
				cancel()
				cl.end = time.Now()
				st := status.Convert(err)
				cl.code, cl.msg = st.Code(), st.Message()
				if err == nil && (len(resp.GetRecords()) != 100 || !resp.GetRecords()[0].GetFound()) {
					cl.code, cl.msg = codes.DataLoss, "incomplete answer"
				}
				mu.Lock()
				calls = append(calls, cl)
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond) // a refused caller backs off a little
				}
			}
		}()
	}
	return func() []call {
		wg.Wait()
		conn.Close()
		return calls
	}
}

// Tests SIGTERM under load against the real binary: readiness drops
// while in-flight requests are still being answered; every request in
// flight at the signal finishes OK; requests after it get Unavailable;
// the process exits 0 within the drain deadline. memcached answers
// through a 300ms latency toxic so that requests are in flight long
// enough to see all of it. Which requests were in flight and which came
// after is read from the drain as the server showed it (its /readyz),
// not from when the signal was sent, which a busy machine delivers late.
func TestSIGTERMUnderLoad(t *testing.T) {
	mc := testenv.StartMemcached(t)
	p := proxyTo(t, mc.Addr())
	cfgFile := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfgFile, []byte("cache:\n  timeout: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const drain = 5 * time.Second
	c := newCluster(t, p.Listen, 2000, "--config", cfgFile, "--drain-timeout", drain.String())
	sl := c.start()
	sl.waitReady(t, time.Now(), 10*time.Second)
	rewire(t, p, toxic{"slow", "latency", "downstream", 1, toxiclient.Attributes{"latency": 300}})

	stop := make(chan struct{})
	wait := hammer(t, c.grpcAddr, c.uris, 8, stop)
	var notReadyAt time.Time
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		for {
			code := readyz(sl.adminURL)
			if code == http.StatusServiceUnavailable && notReadyAt.IsZero() {
				notReadyAt = time.Now()
			}
			if code == 0 {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	termAt := time.Now()
	if err := sl.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sl.done:
	case <-time.After(drain + 10*time.Second):
		t.Fatalf("sluice still running %v after SIGTERM", drain+10*time.Second)
	}
	exitedAt := time.Now()
	time.Sleep(200 * time.Millisecond)
	close(stop)
	calls := wait()
	<-pollDone

	// In flight: sent a third of the toxic's 300ms before the signal, so
	// that it reached the server before its drain began. After: sent once
	// /readyz said 503 (the server refuses new calls right after).
	inflightBefore := termAt.Add(-100 * time.Millisecond)
	afterFrom := termAt
	if notReadyAt.After(afterFrom) {
		afterFrom = notReadyAt
	}
	afterFrom = afterFrom.Add(50 * time.Millisecond)
	var inflight, inflightOK, after, afterUnavailable, other int
	var lastOK time.Time
	var otherMsg string
	for _, cl := range calls {
		if cl.code == codes.OK && cl.end.After(lastOK) {
			lastOK = cl.end
		}
		switch {
		case cl.start.Before(inflightBefore) && cl.end.After(termAt):
			inflight++
			if cl.code == codes.OK {
				inflightOK++
			}
		case cl.start.After(afterFrom):
			after++
			if cl.code == codes.Unavailable {
				afterUnavailable++
			}
		}
		if cl.code != codes.OK && cl.code != codes.Unavailable {
			other++
			otherMsg = cmp.Or(otherMsg, fmt.Sprintf("%s %q", cl.code, cl.msg))
		}
	}
	exitCode := sl.cmd.ProcessState.ExitCode()
	t.Logf("SIGTERM under 8 clients × 100-URI batches: %d calls; %d in flight at the signal, %d of them OK; /readyz 503 %v after the signal, last OK answer %v after; exit %d %v after the signal (drain deadline %v); %d calls after the signal, %d Unavailable; %d other codes %s",
		len(calls), inflight, inflightOK, notReadyAt.Sub(termAt).Round(time.Millisecond), lastOK.Sub(termAt).Round(time.Millisecond),
		exitCode, exitedAt.Sub(termAt).Round(time.Millisecond), drain, after, afterUnavailable, other, otherMsg)
	if exitCode != 0 {
		t.Errorf("exit code %d, want 0; stderr:\n%s", exitCode, sl.stderr)
	}
	// The drain deadline, and room for a busy machine to deliver the
	// signal and end the process.
	if exitedAt.Sub(termAt) > drain+2*time.Second {
		t.Errorf("exited %v after SIGTERM, over the %v drain deadline", exitedAt.Sub(termAt), drain)
	}
	if inflight == 0 || inflightOK != inflight {
		t.Errorf("%d of %d requests in flight at SIGTERM finished OK, want all (and some)", inflightOK, inflight)
	}
	if notReadyAt.IsZero() || !notReadyAt.Before(lastOK) {
		t.Errorf("/readyz went 503 at %v, want before the last in-flight answer at %v", notReadyAt.Sub(termAt), lastOK.Sub(termAt))
	}
	if after == 0 || afterUnavailable != after {
		t.Errorf("%d of %d requests sent after SIGTERM got Unavailable, want all", afterUnavailable, after)
	}
	if other != 0 {
		t.Errorf("%d requests ended with another code: %s", other, otherMsg)
	}
	if !strings.Contains(sl.stderr.String(), "sluice draining") {
		t.Errorf("no drain logged:\n%s", sl.stderr)
	}
}

// Tests SIGKILL under load, then an immediate restart on the same ports
// and data directory: the new process is ready within 2s (the bbolt file
// lock died with the old one; no slower than twice the first start-up,
// + 1s, measured in the same test) and rebuilds its memcached pool within the
// cap. Each process closes a connection only after a failed call or when
// its breaker opens (dropping the idle ones), never per request; and the
// sockets in TIME_WAIT toward memcached are only those: before the kill,
// what the first process closed; the kill adds at most the pool cap; the
// restart adds only what the new process closed.
//
// TIME_WAIT sockets belong to no process, so the counts are taken beyond
// those already toward memcached's address before sluice starts. The
// memcached timeout is 1s here, not 250ms: on a loaded machine under the
// race detector a short timeout closes connections during the cold
// start, which this test is not about. (CI once counted 65 in TIME_WAIT
// before the kill, without the pool figures that would say whose.)
func TestSIGKILLThenRestart(t *testing.T) {
	const capConns = 16
	mc := testenv.StartMemcached(t)
	mcAddr := netip.MustParseAddrPort(mc.Addr())
	twLeftOver := timeWait(t, mcAddr)
	conf := filepath.Join(t.TempDir(), "sluice.yaml")
	// Each client's budget is far above what it can send: on an idle
	// machine one closed-loop client reads more than the default 20,000
	// items/s, and a refusal for rate is not what this test is about.
	settings := "cache:\n  timeout: 1s\nadmission:\n  default:\n    items_per_second: 1000000\n    burst: 5000\n    max_inflight_items: 5000\n"
	if err := os.WriteFile(conf, []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, mc.Addr(), 2000, "--memcached-max-conns", strconv.Itoa(capConns), "--config", conf)
	firstStart := time.Now()
	first := c.start()
	firstReadyIn := first.waitReady(t, firstStart, 30*time.Second)

	stop := make(chan struct{})
	wait := hammer(t, c.grpcAddr, c.uris, 8, stop)
	time.Sleep(1500 * time.Millisecond)
	firstPool := scrapePool(t, first.adminURL)
	twBefore := timeWait(t, mcAddr) - twLeftOver
	firstConns := openTo(t, mcAddr)
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.done
	killedAt := time.Now()
	twAfterKill := timeWait(t, mcAddr) - twLeftOver
	second := c.start()
	readyIn := second.waitReady(t, killedAt, 30*time.Second)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	calls := wait()
	// The new process serves from the first answer it gave: the clients
	// share one connection, so from then on none of them may fail. (How
	// soon they reconnect is the client's backoff, not sluice.)
	servedFrom, served := time.Now(), false
	for _, cl := range calls {
		if cl.code == codes.OK && cl.start.After(killedAt) && cl.end.Before(servedFrom) {
			servedFrom, served = cl.end, true
		}
	}
	twAfterRestart := timeWait(t, mcAddr) - twLeftOver
	// The killed connections still closing when twAfterKill was taken
	// (memcached closes its end when it next reads) reach TIME_WAIT while
	// the new process serves: their local ends say they were the kill's.
	twKilled := timeWaitOf(t, mcAddr, firstConns)
	secondPool := scrapePool(t, second.adminURL)

	var ok, failedAfter int
	var failMsg string
	for _, cl := range calls {
		if cl.code == codes.OK {
			ok++
		} else if cl.start.After(servedFrom) {
			failedAfter++
			failMsg = cmp.Or(failMsg, fmt.Sprintf("%s %q", cl.code, cl.msg))
		}
	}
	t.Logf("SIGKILL under 8 clients × 100-URI batches, pool cap %d: first process ready %v after its start, new process ready %v after the kill, first answer %v after it; TIME_WAIT toward memcached beyond the %d left over from earlier tests: %d before the kill, %d after it, %d after the restart served load (%d of them the killed process's %d connections); first process %s; new process %s; %d calls OK, %d failed once the new process served (%s)",
		capConns, firstReadyIn.Round(time.Millisecond), readyIn.Round(time.Millisecond), servedFrom.Sub(killedAt).Round(time.Millisecond), twLeftOver, twBefore, twAfterKill, twAfterRestart, twKilled, len(firstConns), firstPool, secondPool, ok, failedAfter, failMsg)
	if bound := 2*firstReadyIn + time.Second; readyIn > bound {
		t.Errorf("the restarted process was ready %v after the kill, want ≤ %v (twice the first start-up's %v, + 1s)", readyIn, bound, firstReadyIn)
	}
	if !served {
		t.Errorf("no call was answered by the new process")
	}
	// The test's own readiness probe of memcached may add one more.
	const probes = 2
	if twBefore > firstPool.closed()+probes {
		t.Errorf("%d sockets in TIME_WAIT toward memcached before the kill, want at most the %d the first process closed (%s)", twBefore, firstPool.closed(), firstPool)
	}
	if killed := max(twAfterKill-twBefore, twKilled); killed > capConns+probes {
		t.Errorf("the kill left %d more sockets in TIME_WAIT toward memcached, want at most the pool cap %d", killed, capConns)
	}
	if restarted := twAfterRestart - twBefore - twKilled; restarted > secondPool.closed()+probes {
		t.Errorf("the restarted process left %d more sockets in TIME_WAIT toward memcached, want at most the %d it closed (%s)", restarted, secondPool.closed(), secondPool)
	}
	for name, p := range map[string]pool{"first": firstPool, "new": secondPool} {
		if !p.withinCap(capConns) {
			t.Errorf("the %s process's memcached pool: %s; want at most %d open, and a connection closed only after a failed call or a breaker trip", name, p, capConns)
		}
	}
	if secondPool.hits == 0 {
		t.Errorf("the new process never hit the cache (%s)", secondPool)
	}
	if failedAfter != 0 {
		t.Errorf("%d requests failed after the new process was ready: %s", failedAfter, failMsg)
	}
}

// pool is a process's memcached pool as its /metrics tell it.
type pool struct{ dials, open, errors, breakerOpens, hits float64 }

func scrapePool(t *testing.T, adminURL string) pool {
	t.Helper()
	fams, err := promtext.Scrape(context.Background(), nil, adminURL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return pool{
		dials:        fams.Sum("sluice_memcached_dials_total", nil),
		open:         fams.Sum("sluice_memcached_connections_open", nil),
		errors:       fams.Sum("sluice_cache_errors_total", nil),
		breakerOpens: fams.Sum("sluice_cache_breaker_opens_total", nil),
		hits:         fams.Sum("sluice_cache_hits_total", nil),
	}
}

// closed is how many connections the process has closed.
func (p pool) closed() int { return int(p.dials - p.open) }

// withinCap: no more than capConns open, and no connection closed but
// after a failed call (which closes its own) or a breaker trip (which
// closes the idle ones, at most capConns).
func (p pool) withinCap(capConns int) bool {
	return p.open <= float64(capConns) && float64(p.closed()) <= p.errors+p.breakerOpens*float64(capConns)
}

func (p pool) String() string {
	return fmt.Sprintf("%v connections open, %v dials, %v cache errors, %v breaker trips, %v hits", p.open, p.dials, p.errors, p.breakerOpens, p.hits)
}

// openTo returns the local ends of the connections toward addr that are
// open now, any process's.
func openTo(t *testing.T, addr netip.AddrPort) map[netip.AddrPort]bool {
	t.Helper()
	all, err := sockets.All()
	if err != nil {
		t.Fatal(err)
	}
	local := map[netip.AddrPort]bool{}
	for _, s := range all {
		if s.Remote == addr && s.State == sockets.Established {
			local[s.Local] = true
		}
	}
	return local
}

// timeWaitOf counts sockets in TIME_WAIT toward addr whose local end is
// one of local.
func timeWaitOf(t *testing.T, addr netip.AddrPort, local map[netip.AddrPort]bool) int {
	t.Helper()
	all, err := sockets.All()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range all {
		if s.Remote == addr && s.State == sockets.TimeWait && local[s.Local] {
			n++
		}
	}
	return n
}

// timeWait counts sockets in TIME_WAIT toward addr (any process's: the
// kernel owns them).
func timeWait(t *testing.T, addr netip.AddrPort) int {
	t.Helper()
	counts, err := sockets.To(addr)
	if err != nil {
		t.Fatal(err)
	}
	return counts[sockets.TimeWait]
}
