package cputime

import (
	"os"
	"testing"
	"time"
)

// Tests that utime and stime are read from the right fields even when the
// command name holds spaces and parentheses.
func TestParseStat(t *testing.T) {
	line := "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 8 0 123 456 789\n"
	got, err := parseStat(line)
	if err != nil || got != 3800*time.Millisecond {
		t.Fatalf("parseStat = %v, %v; want 3.8s (250 + 130 ticks)", got, err)
	}
	if _, err := parseStat("4242 (short) S 1 2"); err == nil {
		t.Error("a truncated stat line parsed")
	}
}

// Tests that CPU this process burns shows up in its CPU time read through
// /proc as it does through getrusage: the loop runs until getrusage has
// counted 300ms more (however busy the machine), then /proc must agree
// within a few ticks.
func TestOfAndSelfAgree(t *testing.T) {
	m := NewMeter(0, os.Getpid())
	before, err := m.Sample()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); Self()-before[0] < 300*time.Millisecond && time.Now().Before(deadline); {
	}
	after, err := m.Sample()
	if err != nil {
		t.Fatal(err)
	}
	used := Since(before, after)
	if used[0] < 300*time.Millisecond {
		t.Fatalf("getrusage counted only %v of CPU in 10s of busy looping", used[0])
	}
	if diff := used[0] - used[1]; diff > 50*time.Millisecond || diff < -50*time.Millisecond {
		t.Errorf("getrusage %v and /proc %v disagree by more than 50ms", used[0], used[1])
	}
}
