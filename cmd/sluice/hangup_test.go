package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Tests that a SIGHUP arriving while serve is still starting (here, while
// the CQL store's contact point accepts and never answers) does not kill
// the process: SIGHUP's default action is to terminate.
func TestHangupDuringStartupDoesNotKill(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	dialed := make(chan struct{}, 1)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
			select {
			case dialed <- struct{}{}:
			default:
			}
		}
	}()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "serve",
		"--cql-hosts", lis.Addr().String(), "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--memcached", "127.0.0.1:1")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	select { // serve is waiting on the store
	case <-dialed:
	case <-exited:
		t.Fatal("sluice serve exited before dialing the store")
	case <-time.After(time.Minute):
		t.Fatal("sluice serve did not dial the store within a minute")
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGHUP {
			t.Fatal("SIGHUP during start-up killed sluice serve")
		}
	case <-time.After(time.Second):
	}
}
