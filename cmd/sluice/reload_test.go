package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/testenv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// syncBuffer is a bytes.Buffer safe to write from the child's pipe while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func budgetYAML(burst int) string {
	return fmt.Sprintf("admission:\n  clients:\n    reloaded:\n      items_per_second: 1000\n      burst: %d\n      max_inflight_items: 5000\n", burst)
}

// Tests that `sluice serve` reloads the admission budgets on SIGHUP
// without restarting: the real binary is built and started, its config
// file rewritten, and the new budget shows in GetLimits on the same
// connection; an invalid file keeps the budgets in force and says why.
func TestSIGHUPReloadsBudgets(t *testing.T) {
	mc := testenv.SharedMemcached(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "sluice")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cfgPath := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte(budgetYAML(300)), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd := exec.Command(bin, "serve", "--config", cfgPath, "--data-dir", filepath.Join(dir, "data"),
		"--grpc-addr", grpcAddr, "--http-addr", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		"--memcached", mc, "--drain-timeout", "2s")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			cmd.Process.Kill()
			<-exited
		}
	}()
	if err := testenv.WaitTCP(grpcAddr, 30*time.Second); err != nil {
		t.Fatalf("sluice serve did not start: %v\n%s", err, stderr.String())
	}

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rpc := sluicev1.NewPostRecordsClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-client-id", "reloaded")
	burst := func() uint32 {
		t.Helper()
		resp, err := rpc.GetLimits(ctx, &sluicev1.GetLimitsRequest{})
		if err != nil {
			t.Fatalf("GetLimits: %v\n%s", err, stderr.String())
		}
		return resp.GetBudget().GetBurst()
	}
	if got := burst(); got != 300 {
		t.Fatalf("burst %d at start, want 300 from the file", got)
	}

	hangup := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	hangup(budgetYAML(700))
	deadline := time.Now().Add(10 * time.Second)
	for burst() != 700 {
		if time.Now().After(deadline) {
			t.Fatalf("burst still %d 10s after SIGHUP, want 700\n%s", burst(), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	hangup("admission:\n  clients:\n    reloaded: {items_per_second: -1, burst: 1, max_inflight_items: 1}\n")
	for !strings.Contains(stderr.String(), "keeping the budgets in force") {
		if time.Now().After(deadline) {
			t.Fatalf("no log line about the invalid file\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := burst(); got != 700 {
		t.Errorf("burst %d after an invalid reload, want 700 kept", got)
	}
	if !strings.Contains(stderr.String(), "items_per_second must be a positive number") {
		t.Errorf("the log does not say what was wrong:\n%s", stderr.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Errorf("sluice serve exited with %v after SIGTERM\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sluice serve did not exit after SIGTERM")
	}
}
