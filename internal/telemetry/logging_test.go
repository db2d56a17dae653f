package telemetry

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lockedBuffer is a bytes.Buffer safe for the writer goroutine and the
// test to share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

// Tests that error lines are limited per (component, kind), that the next
// line written says how many were held back, and that other pairs and
// info lines are not affected.
func TestLogHandlerRateLimitsPerComponentAndKind(t *testing.T) {
	var out lockedBuffer
	h := NewLogHandler(&out, LogConfig{PerSecond: 0.001, Burst: 2})
	cache := slog.New(h).With(LogComponent, "cache")
	for range 50 {
		cache.Error("memcached call failed", LogKind, "timeout")
	}
	cache.Error("memcached call failed", LogKind, "connection_refused")
	slog.New(h).Error("store read failed", LogComponent, "store")
	slog.New(h).Info("serving")
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := out.lines()
	if len(lines) != 5 {
		t.Fatalf("got %d lines, want 2 timeouts + 1 refused + 1 store + 1 info:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	st := h.Stats()
	if got := st.Suppressed[[2]string{"cache", "timeout"}]; got != 48 {
		t.Errorf("suppressed cache/timeout = %d, want 48", got)
	}
	if st.Written != 5 || st.Dropped != 0 {
		t.Errorf("written=%d dropped=%d, want 5 and 0", st.Written, st.Dropped)
	}
	if _, ok := st.Suppressed[[2]string{"store", "store read failed"}]; !ok {
		t.Errorf("a line without a kind is not keyed by its message: %v", st.Suppressed)
	}
}

// Tests that the first line allowed after a suppressed run carries
// suppressed=N.
func TestLogHandlerReportsSuppressedCount(t *testing.T) {
	var out lockedBuffer
	// 2/s: the ten lines fit in the half second before a second token
	// even on a loaded machine.
	h := NewLogHandler(&out, LogConfig{PerSecond: 2, Burst: 1})
	log := slog.New(h)
	for range 10 {
		log.Error("boom", LogComponent, "cache", LogKind, "timeout")
	}
	time.Sleep(600 * time.Millisecond) // at 2/s, one more token
	log.Error("boom", LogComponent, "cache", LogKind, "timeout")
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := out.lines()
	if len(lines) != 2 || !strings.Contains(lines[1], "suppressed=9") {
		t.Fatalf("want 2 lines, the second with suppressed=9; got:\n%s", strings.Join(lines, "\n"))
	}
}

// blockedWriter never returns from Write until released, like a full
// pipe or a stalled disk. entered, when set, receives a value as a
// Write starts if it has room.
type blockedWriter struct {
	release chan struct{}
	entered chan struct{}
}

func (b blockedWriter) Write(p []byte) (int, error) {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-b.release
	return len(p), nil
}

// Tests that a stuck output never blocks the logger: once the writer is
// stuck on one line and the buffer of 8 is full, every further line is
// dropped and counted at once, and Close after the output recovers
// writes what was buffered.
func TestLogHandlerNeverBlocksOnAStuckOutput(t *testing.T) {
	out := blockedWriter{release: make(chan struct{}), entered: make(chan struct{}, 1)}
	h := NewLogHandler(out, LogConfig{Buffer: 8})
	log := slog.New(h)
	log.Info("line", "i", -1)
	<-out.entered // the writer goroutine now holds that line, stuck
	for i := range 8 {
		log.Info("line", "i", i)
	}
	if st := h.Stats(); st.Dropped != 0 {
		t.Fatalf("dropped %d lines that fit in the buffer of 8", st.Dropped)
	}
	// A logger that waits for room would never return from these calls
	// while the output is stuck; the goroutine lets the test report that
	// instead of hanging until the test binary's timeout.
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for i := range 1000 {
			log.Info("line", "i", i)
		}
	}()
	select {
	case <-logged:
	case <-time.After(time.Minute):
		close(out.release)
		<-logged
		t.Fatal("logging blocked on a stuck output")
	}
	// Nor may it wait a little for room before dropping: dropping a line
	// must cost about what writing one to a free output does. Rounds of
	// each alternate, and the fastest round of each is compared, so a
	// busy machine's stalls (which hit some rounds, not every one) do not
	// count; a wait per line slows every round.
	free := NewLogHandler(io.Discard, LogConfig{Buffer: 8})
	defer func() { _ = free.Close(context.Background()) }()
	stuckRound, freeRound := timeRound(slog.New(h)), timeRound(slog.New(free))
	for range 10 {
		stuckRound, freeRound = min(stuckRound, timeRound(slog.New(h))), min(freeRound, timeRound(slog.New(free)))
	}
	t.Logf("fastest of 11 rounds of 100 lines: %v dropped with the output stuck, %v written to a free output", stuckRound, freeRound)
	if stuckRound > 20*freeRound {
		t.Errorf("100 lines took %v to drop with the output stuck, %v to write to a free output; want under 20×", stuckRound, freeRound)
	}
	st := h.Stats()
	if st.Dropped != 1000+11*100 || st.Written != 0 {
		t.Errorf("with the output stuck and the buffer full: dropped %d, written %d; want %d and 0", st.Dropped, st.Written, 1000+11*100)
	}
	close(out.release)
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := h.Stats().Written; got != 9 {
		t.Errorf("written %d after the output recovered, want the 9 lines held", got)
	}
	log.Info("after close")
	if got := h.Stats().Dropped; got != st.Dropped+1 {
		t.Errorf("a line after Close was not counted as dropped: %d → %d", st.Dropped, got)
	}
}

// timeRound logs 100 lines and returns how long that took.
func timeRound(log *slog.Logger) time.Duration {
	start := time.Now()
	for i := range 100 {
		log.Info("line", "i", i)
	}
	return time.Since(start)
}

// Tests that Close gives up at its deadline when the output is stuck.
func TestLogHandlerCloseHonoursDeadline(t *testing.T) {
	out := blockedWriter{release: make(chan struct{})}
	h := NewLogHandler(out, LogConfig{})
	slog.New(h).Info("stuck")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h.Close(ctx); err == nil {
		t.Errorf("Close returned nil with a stuck output")
	}
	close(out.release)
	_ = h.Close(context.Background())
}

var _ io.Writer = (*asyncWriter)(nil)
