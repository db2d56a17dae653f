//go:build cluster

// Package cluster runs sluice against a real cluster: three Cassandra nodes
// at replication factor 3 (scripts/cassandra-cluster.sh), three memcached
// servers and two sluice replicas, and takes one of each away under load.
// It is built only with -tags cluster: `make test-cluster` starts the
// cluster and runs it (CI runs it after the fault suite).
package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocql/gocql"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/promtext"
	"github.com/sluice-dev/sluice/internal/testenv"
)

// nodes returns the cluster's CQL addresses, in node order.
func nodes(t *testing.T) []string {
	t.Helper()
	v := os.Getenv("SLUICE_TEST_CLUSTER")
	if v == "" {
		t.Fatal("SLUICE_TEST_CLUSTER is not set: run `make test-cluster`, which starts the cluster (scripts/cassandra-cluster.sh up) and sets it")
	}
	return strings.Split(v, ",")
}

// clusterScript runs scripts/cassandra-cluster.sh with args and returns
// how long it took.
func clusterScript(t *testing.T, args ...string) time.Duration {
	t.Helper()
	path := os.Getenv("SLUICE_TEST_CLUSTER_SCRIPT")
	if path == "" {
		t.Fatal("SLUICE_TEST_CLUSTER_SCRIPT is not set: run `make test-cluster`")
	}
	start := time.Now()
	out, err := exec.Command(path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(path), strings.Join(args, " "), err, out)
	}
	t.Logf("%s %s: %s", filepath.Base(path), strings.Join(args, " "), lastLine(out))
	return time.Since(start)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// sluiceBinary builds cmd/sluice once per test run.
var sluiceBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sluice-cluster-bin-")
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

func binary(t *testing.T) string {
	t.Helper()
	bin, err := sluiceBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// run runs the sluice binary with args and fails the test on error.
func run(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(binary(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("sluice %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// keyspace is one fresh keyspace on the cluster holding seeded posts.
type keyspace struct {
	name  string
	hosts []string
	uris  []string
}

// newKeyspace drops name, migrates it at replication factor rf and seeds
// posts into it through `sluice seed`.
func newKeyspace(t *testing.T, name string, rf, posts int) *keyspace {
	t.Helper()
	hosts := nodes(t)
	s := session(t, hosts, gocql.Quorum)
	defer s.Close()
	if err := s.Query("DROP KEYSPACE IF EXISTS " + name).Exec(); err != nil {
		t.Fatalf("drop %s: %v", name, err)
	}
	cql := []string{"--cql-hosts", strings.Join(hosts, ","), "--cql-keyspace", name}
	run(t, append([]string{"migrate", "--replication", strconv.Itoa(rf)}, cql...)...)
	urisFile := filepath.Join(t.TempDir(), "uris.txt")
	run(t, append([]string{"seed", "--posts", strconv.Itoa(posts), "--uris-out", urisFile, "--parallel", "16"}, cql...)...)
	raw, err := os.ReadFile(urisFile)
	if err != nil {
		t.Fatal(err)
	}
	ks := &keyspace{name: name, hosts: hosts}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		ks.uris = append(ks.uris, sc.Text())
	}
	if len(ks.uris) != posts {
		t.Fatalf("seed wrote %d URIs, want %d", len(ks.uris), posts)
	}
	return ks
}

// session connects to the cluster at consistency cl; hosts may be a
// single node with lookup off, to ask that node about itself.
func session(t *testing.T, hosts []string, cl gocql.Consistency) *gocql.Session {
	t.Helper()
	c := gocql.NewCluster(hosts...)
	c.Consistency = cl
	// Schema changes (DROP KEYSPACE) wait for every node to agree, which
	// takes tens of seconds on a busy machine.
	c.Timeout, c.ConnectTimeout = 60*time.Second, 10*time.Second
	if len(hosts) == 1 {
		c.DisableInitialHostLookup = true
		c.HostFilter = gocql.WhiteListHostFilter(hosts[0])
	}
	s, err := c.CreateSession()
	if err != nil {
		t.Fatalf("connect to %v: %v", hosts, err)
	}
	return s
}

// replica is one `sluice serve` process.
type replica struct {
	cmd      *exec.Cmd
	grpcAddr string
	adminURL string
	stderr   *lockedBuffer
	done     chan struct{}
	conn     *grpc.ClientConn
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// clusterConfig is the config file of every replica: a one-second record
// TTL, so reads keep reaching the store while nodes come and go, and the
// callers the tests name.
//
// The methods get a patient 5 s timeout: three Cassandra nodes, three
// memcached servers, two replicas and the load share two cores, where a
// node's JVM was seen to pause for tens of seconds; a call that fails
// must fail for what the fault did, not for the machine.
const clusterConfig = `
guard:
  methods:
    sluice.v1.PostRecords/GetPostRecords:
      timeout: 5s
    sluice.v1.PostRecords/PutPostRecords:
      timeout: 5s
cache:
  ttl: 1s
  negative_ttl: 1s
  tombstone_ttl: 7s
telemetry:
  clients: [feed, writer, checker]
`

// fleetConfig keeps records cached for the default ten minutes, so a pass
// over the key set shows which keys a memcached server held. The near
// cache is off: it would answer a record the pass before read from one
// server for up to its TTL after the key moved to another, and a pass
// would count that as a hit of neither.
const fleetConfig = `
near_cache:
  ttl: 0s
guard:
  methods:
    sluice.v1.PostRecords/GetPostRecords:
      timeout: 5s
    sluice.v1.PostRecords/PutPostRecords:
      timeout: 5s
cache:
  tombstone_ttl: 7s
telemetry:
  clients: [feed, writer, checker]
`

// startReplica runs `sluice serve` on the keyspace with the memcached
// servers given and clusterConfig; it is killed when the test ends if
// still running.
func startReplica(t *testing.T, ks *keyspace, memcached []string, extra ...string) *replica {
	t.Helper()
	return startReplicaWith(t, clusterConfig, ks, memcached, extra...)
}

// startReplicaWith is startReplica with the config file's text.
func startReplicaWith(t *testing.T, config string, ks *keyspace, memcached []string, extra ...string) *replica {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &replica{
		grpcAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t))),
		stderr:   &lockedBuffer{}, done: make(chan struct{}),
	}
	httpAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
	r.adminURL = "http://" + httpAddr
	args := append([]string{"serve", "--config", cfg, "--data-dir", dir,
		"--cql-hosts", strings.Join(ks.hosts, ","), "--cql-keyspace", ks.name,
		"--memcached", strings.Join(memcached, ","),
		"--grpc-addr", r.grpcAddr, "--http-addr", httpAddr}, extra...)
	r.cmd = exec.Command(binary(t), args...)
	r.cmd.Stderr = r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start sluice: %v", err)
	}
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
		if t.Failed() {
			t.Logf("sluice %s stderr (tail):\n%s", r.grpcAddr, tail(r.stderr.String(), 30))
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(r.adminURL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-r.done:
			t.Fatalf("sluice exited during start-up:\n%s", tail(r.stderr.String(), 30))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice not ready within 60s:\n%s", tail(r.stderr.String(), 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
	conn, err := grpc.NewClient(r.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.conn = conn
	return r
}

func (r *replica) client() sluicev1.PostRecordsClient { return sluicev1.NewPostRecordsClient(r.conn) }

// metrics scrapes the replica's /metrics.
func (r *replica) metrics(t *testing.T) promtext.Families {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := promtext.Scrape(ctx, nil, r.adminURL+"/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", r.adminURL, err)
	}
	return f
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// verdict repeats a test's failures once everything else it logs on the
// way out (replicas' stderr tails) has been printed, so the reason stays
// in sight at the end of a long log.
type verdict struct {
	t    *testing.T
	mu   sync.Mutex
	msgs []string
}

// newVerdict must be called before the test starts anything whose
// cleanup logs: cleanups run last-registered first, so this one runs last.
func newVerdict(t *testing.T) *verdict {
	v := &verdict{t: t}
	t.Cleanup(func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if len(v.msgs) > 0 {
			t.Logf("%s failed because:\n  %s", t.Name(), strings.Join(v.msgs, "\n  "))
		}
	})
	return v
}

func (v *verdict) note(format string, args ...any) string {
	msg := fmt.Sprintf(format, args...)
	v.mu.Lock()
	v.msgs = append(v.msgs, msg)
	v.mu.Unlock()
	return msg
}

// Errorf is t.Errorf, repeated at the end.
func (v *verdict) Errorf(format string, args ...any) {
	v.t.Helper()
	v.t.Error(v.note(format, args...))
}

// Fatalf is t.Fatalf, repeated at the end.
func (v *verdict) Fatalf(format string, args ...any) {
	v.t.Helper()
	v.t.Fatal(v.note(format, args...))
}
