package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/procs"
	"github.com/sluice-dev/sluice/internal/synth"
)

// saturatingConfig fixes the item limit at one 1,000-URI batch, so that
// with every store read slowed a second caller's batch waits.
const saturatingConfig = `guard:
  max_inflight_items: 1000
  min_inflight_items: 1000
  piece_items: 1000
admission:
  default: {items_per_second: 10000000, burst: 100000, max_inflight_items: 100000}
`

// Tests that `sluice serve` runs Go with twice its processors while
// requests wait for items, and with its own number again once calm: the
// real binary, its store reads slowed by 100ms, four callers sending
// 1,000-URI batches of URIs never read before, and GOMAXPROCS read from
// the go_sched_gomaxprocs_threads gauge, against the server's own number
// when calm. Where there is to be no raise (GOMAXPROCS set in the
// environment, a CPU quota), the test checks that the server says so and
// keeps its processors.
func TestProcessorsFollowSaturation(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte(saturatingConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--config", cfgPath, "--store-read-delay", "100ms")
	base := s.metric(t, "go_sched_gomaxprocs_threads")
	want, raises := procs.SaturatedProcs(procs.DefaultPerCPU, int(base), runtime.NumCPU())
	off := "a CPU quota"
	if _, envOff := procs.Plan(procs.DefaultPerCPU, os.Getenv("GOMAXPROCS")); envOff != "" {
		raises, off = false, envOff
	}
	if !raises {
		want = int(base)
		waitForLog(t, s, off)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := sluicev1.NewPostRecordsClient(dial(t, s.grpcAddr))
	load, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopLoad()
	for caller := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := synth.New(uint64(caller+100), 64)
			for load.Err() == nil {
				batch := make([]string, 1000)
				for i := range batch {
					batch[i] = g.MissingURI()
				}
				_, _ = client.GetPostRecords(load, &sluicev1.GetPostRecordsRequest{Uris: batch})
			}
		}()
	}
	if !raises {
		time.Sleep(2 * time.Second) // time enough to have raised them, were it planned
	}
	waitForProcs(ctx, t, s, float64(want), "while four callers' batches wait for items")
	if got := s.metric(t, "sluice_guard_queue_waiting"); !raises && got == 0 && s.metric(t, "sluice_guard_queue_shed_total") == 0 {
		t.Fatalf("the load never saturated the server (waiting %v, none shed)", got)
	}
	stopLoad()
	wg.Wait()
	waitForProcs(ctx, t, s, base, "after the load stopped")
}

// waitForLog waits up to 10s for the server's log to hold text.
func waitForLog(t *testing.T, s *server, text string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(s.stderr.String(), text); {
		if time.Now().After(deadline) {
			t.Fatalf("this machine plans no raise (%s), and the server's log does not say so:\n%s", text, s.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitForProcs polls the server's GOMAXPROCS until it is want, failing
// when ctx ends first.
func waitForProcs(ctx context.Context, t *testing.T, s *server, want float64, when string) {
	t.Helper()
	for {
		got := s.metric(t, "go_sched_gomaxprocs_threads")
		if got == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: the server runs %v processors, want %v", when, got, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
