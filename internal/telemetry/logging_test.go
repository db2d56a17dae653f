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
	h := NewLogHandler(&out, LogConfig{PerSecond: 20, Burst: 1})
	log := slog.New(h)
	for range 10 {
		log.Error("boom", LogComponent, "cache", LogKind, "timeout")
	}
	time.Sleep(120 * time.Millisecond) // at 20/s, one more token
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
// pipe or a stalled disk.
type blockedWriter struct{ release chan struct{} }

func (b blockedWriter) Write(p []byte) (int, error) {
	<-b.release
	return len(p), nil
}

// Tests that a stuck output never blocks the logger: lines beyond the
// buffer are dropped and counted, and logging stays fast.
func TestLogHandlerNeverBlocksOnAStuckOutput(t *testing.T) {
	out := blockedWriter{release: make(chan struct{})}
	h := NewLogHandler(out, LogConfig{Buffer: 8})
	log := slog.New(h)
	start := time.Now()
	for i := range 1000 {
		log.Info("line", "i", i)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("1000 lines took %v with a stuck output", took)
	}
	st := h.Stats()
	// One line may be held by the writer goroutine, eight by the buffer.
	if st.Dropped < 1000-9 {
		t.Errorf("dropped %d of 1000 lines with a buffer of 8; want at least 991", st.Dropped)
	}
	close(out.release)
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	log.Info("after close")
	if got := h.Stats().Dropped; got != st.Dropped+1 {
		t.Errorf("a line after Close was not counted as dropped: %d → %d", st.Dropped, got)
	}
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
