// Package testenv starts and finds the real servers that sluice's
// integration tests run against.
//
// Tests never fake memcached: they either use the shared server that
// scripts/test-deps.sh started (SLUICE_TEST_MEMCACHED) or start a private
// memcached process with StartMemcached when they need to stop and restart
// it. When a server cannot be had, RequireDeps decides: under `make test`
// and in CI (CI or SLUICE_REQUIRE_DEPS set) the test fails; elsewhere it is
// skipped with a message saying what is missing. Cassandra is never
// started by a test: scripts/test-deps.sh starts one node for the whole run
// and tests find it with Cassandra.
package testenv

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Required reports whether missing servers must fail tests instead of
// skipping them: true in CI and under `make test`.
func Required() bool {
	return os.Getenv("CI") != "" || os.Getenv("SLUICE_REQUIRE_DEPS") != ""
}

// Missing fails or skips t because a server is absent, saying which and how
// to get it.
func Missing(t testing.TB, what, how string) {
	t.Helper()
	if Required() {
		t.Fatalf("%s is required here (CI or SLUICE_REQUIRE_DEPS set) but missing: %s", what, how)
	}
	t.Skipf("skipping: %s is missing (%s); run scripts/test-deps.sh up or make test", what, how)
}

// MemcachedBinary returns the memcached executable: $MEMCACHED_BIN, then
// PATH, then /usr/bin/memcached.
func MemcachedBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("MEMCACHED_BIN"); p != "" {
		return p
	}
	if p, err := exec.LookPath("memcached"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/memcached"); err == nil {
		return "/usr/bin/memcached"
	}
	Missing(t, "memcached", "no memcached binary in MEMCACHED_BIN, PATH or /usr/bin")
	return ""
}

// SharedMemcached returns the address of the memcached started by
// scripts/test-deps.sh, or a private one when that is not set.
func SharedMemcached(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv("SLUICE_TEST_MEMCACHED"); addr != "" {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return addr
		}
		Missing(t, "memcached at "+addr, "SLUICE_TEST_MEMCACHED is set but nothing answers there")
	}
	return StartMemcached(t).Addr()
}

// Memcached is a private memcached process owned by one test.
type Memcached struct {
	t       testing.TB
	bin     string
	addr    string
	options []string // after the defaults
	cmd     *exec.Cmd
}

// StartMemcached starts a memcached on a free loopback port and stops it
// when the test ends.
func StartMemcached(t testing.TB) *Memcached {
	return StartMemcachedWith(t)
}

// StartMemcachedWith is StartMemcached with more command-line options,
// which override the defaults (e.g. "-m", "2", "-M": 2 MB, refuse stores
// when full instead of evicting).
func StartMemcachedWith(t testing.TB, options ...string) *Memcached {
	t.Helper()
	m := &Memcached{t: t, bin: MemcachedBinary(t), addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t))), options: options}
	m.Start()
	t.Cleanup(m.Stop)
	return m
}

// Addr is the server's host:port.
func (m *Memcached) Addr() string { return m.addr }

// Start (re)starts the server on its port and waits until it accepts.
func (m *Memcached) Start() {
	m.t.Helper()
	if m.cmd != nil {
		return
	}
	_, port, _ := net.SplitHostPort(m.addr)
	args := []string{"-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "256", "-c", "4096", "-t", "2"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root")
	}
	args = append(args, m.options...)
	cmd := exec.Command(m.bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("start memcached: %v", err)
	}
	m.cmd = cmd
	if err := WaitTCP(m.addr, 10*time.Second); err != nil {
		m.Stop()
		m.t.Fatalf("memcached on %s: %v", m.addr, err)
	}
}

// Stop kills the server; Start brings it back on the same port.
func (m *Memcached) Stop() {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
	m.cmd = nil
}

// WaitTCP waits until addr accepts a TCP connection or timeout passes.
func WaitTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not accepting after %v: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago, chosen
// below the kernel's ephemeral range. A port from that range (what
// listening on port 0 gives) can be taken as the local end of any
// outgoing connection — a driver's dial, a client's — between this call
// and the server's bind, and a test that seeds data before starting its
// server leaves seconds for that; below the range only another listener
// can take it.
func FreePort(t testing.TB) int {
	t.Helper()
	high := ephemeralLow()
	if high-freePortFloor < 1000 {
		return anyFreePort(t) // no room below the ephemeral range
	}
	for range 100 {
		port := freePortFloor + rand.IntN(high-freePortFloor)
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			l.Close()
			return port
		}
	}
	t.Fatalf("find free port: 100 ports between %d and %d were taken", freePortFloor, high)
	return 0
}

// freePortFloor is the lowest port FreePort returns: above the fixed
// ports of the servers tests use (Cassandra 9042, Prometheus 9090).
const freePortFloor = 10000

// ephemeralLow is the first port of the kernel's ephemeral range
// (32768 when it cannot be read), read once.
var ephemeralLow = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return low
})

// anyFreePort is a port the kernel picks, from its ephemeral range.
func anyFreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ArtifactDir returns a directory for files a test leaves for people to
// look at (screenshots, reports): $SLUICE_ARTIFACTS or test-artifacts/
// at the module root.
func ArtifactDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SLUICE_ARTIFACTS")
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			t.Fatalf("artifact dir: %v", err)
		}
		dir = filepath.Join(root, "test-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("artifact dir: %v", err)
	}
	return dir
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Pause freezes the server (SIGSTOP): connections stay open but nothing
// is answered until Resume, as when memcached stalls.
func (m *Memcached) Pause() {
	m.t.Helper()
	if m.cmd == nil {
		m.t.Fatal("Pause: memcached is not running")
	}
	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		m.t.Fatalf("pause memcached: %v", err)
	}
	// A signal is delivered asynchronously: wait until the kernel reports
	// the process stopped, so a call made after Pause meets a frozen server.
	stat := fmt.Sprintf("/proc/%d/stat", m.cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if b, err := os.ReadFile(stat); err != nil || stoppedState(b) {
			return
		}
	}
	m.t.Fatalf("pause memcached: still running 5s after SIGSTOP")
}

// stoppedState reports whether a /proc/PID/stat line says the process is
// stopped: the state letter follows the command name's closing paren.
func stoppedState(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && (stat[i+2] == 'T' || stat[i+2] == 't')
}

// Resume lets a paused server answer again (SIGCONT).
func (m *Memcached) Resume() {
	m.t.Helper()
	if m.cmd == nil {
		return
	}
	if err := m.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		m.t.Fatalf("resume memcached: %v", err)
	}
}

// Cassandra returns the address of the CQL server that
// scripts/test-deps.sh started (CASSANDRA_ADDR, host:port), after checking
// that it accepts connections.
func Cassandra(t testing.TB) string {
	t.Helper()
	addr := os.Getenv("CASSANDRA_ADDR")
	if addr == "" {
		Missing(t, "Cassandra", "CASSANDRA_ADDR is not set")
		return ""
	}
	if err := WaitTCP(addr, 5*time.Second); err != nil {
		Missing(t, "Cassandra at "+addr, "CASSANDRA_ADDR is set but nothing answers there: "+err.Error())
	}
	return addr
}
