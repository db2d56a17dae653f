package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/time/rate"
)

// Attribute keys the log handler reads to rate-limit a line. Callers set
// them on their logger (logger.With(telemetry.LogComponent, "cache")) or
// on the line itself; a line without a kind uses its message as the kind.
const (
	LogComponent  = "component"
	LogKind       = "kind"
	LogSuppressed = "suppressed"
)

// LogConfig configures the logger. The zero value uses the defaults.
type LogConfig struct {
	// PerSecond is the sustained rate of warning and error lines written
	// per (component, kind). Default 2.
	PerSecond float64
	// Burst is how many such lines may be written at once before the rate
	// applies. Default 3.
	Burst int
	// Buffer is how many lines may wait for the writer; lines beyond it
	// are dropped and counted. Default 1024.
	Buffer int
	// JSON writes JSON lines instead of logfmt text.
	JSON bool
	// Level is the lowest level written. Default Info.
	Level slog.Level
}

func (c LogConfig) perSecond() float64 {
	if c.PerSecond <= 0 {
		return 2
	}
	return c.PerSecond
}

func (c LogConfig) burst() int {
	if c.Burst <= 0 {
		return 3
	}
	return c.Burst
}

func (c LogConfig) buffer() int {
	if c.Buffer <= 0 {
		return 1024
	}
	return c.Buffer
}

// maxLogKeys bounds the distinct (component, kind) pairs tracked; the
// rest share one limiter.
const maxLogKeys = 256

// LogHandler is a slog.Handler that never blocks its caller on a write
// and keeps an error storm from becoming a log storm.
//
// Warning and error lines are rate-limited per (component, kind): at most
// Burst at once and PerSecond sustained; the next line written for that
// pair carries suppressed=N, the number dropped since the last one. Every
// line is formatted in the caller's goroutine and handed to a bounded
// buffer drained by one writer goroutine; when the buffer is full the
// line is dropped and counted. So a slow or stuck output costs lines,
// never a request's latency, and the process's writes to the output are
// serialised on one thread.
//
// Close flushes the buffer and stops the writer. A LogHandler is safe for
// concurrent use; handlers derived with WithAttrs and WithGroup share its
// limits, buffer and counters.
type LogHandler struct {
	inner     slog.Handler
	st        *logState
	component string
	kind      string
	grouped   bool
}

// logState is what a LogHandler and the handlers derived from it share.
type logState struct {
	cfg LogConfig
	w   *asyncWriter

	mu   sync.Mutex
	keys map[logKey]*logLimit
}

type logKey struct{ component, kind string }

type logLimit struct {
	lim        *rate.Limiter
	suppressed atomic.Int64 // since the last line written
	total      atomic.Int64 // since start
}

// NewLogHandler returns a handler writing to out through a buffer of
// cfg.Buffer lines, and starts its writer goroutine.
func NewLogHandler(out io.Writer, cfg LogConfig) *LogHandler {
	w := newAsyncWriter(out, cfg.buffer())
	opts := &slog.HandlerOptions{Level: cfg.Level}
	var inner slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.JSON {
		inner = slog.NewJSONHandler(w, opts)
	}
	return &LogHandler{inner: inner, st: &logState{cfg: cfg, w: w, keys: map[logKey]*logLimit{}}}
}

// Enabled implements slog.Handler.
func (h *LogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

// Handle implements slog.Handler. It returns without waiting for the line
// to be written.
func (h *LogHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.inner.Handle(ctx, r)
	}
	key := h.key(r)
	l := h.st.limit(key)
	if !l.lim.Allow() {
		l.suppressed.Add(1)
		l.total.Add(1)
		return nil
	}
	if n := l.suppressed.Swap(0); n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int64(LogSuppressed, n))
	}
	return h.inner.Handle(ctx, r)
}

// key finds the line's component and kind: its own attributes first, then
// the logger's, then the message as the kind.
func (h *LogHandler) key(r slog.Record) logKey {
	k := logKey{component: h.component, kind: h.kind}
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case LogComponent:
			k.component = a.Value.String()
		case LogKind:
			k.kind = a.Value.String()
		}
		return true
	})
	if k.kind == "" {
		k.kind = r.Message
	}
	return k
}

// WithAttrs implements slog.Handler.
func (h *LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.inner = h.inner.WithAttrs(attrs)
	if !h.grouped {
		for _, a := range attrs {
			switch a.Key {
			case LogComponent:
				c.component = a.Value.String()
			case LogKind:
				c.kind = a.Value.String()
			}
		}
	}
	return &c
}

// WithGroup implements slog.Handler.
func (h *LogHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.inner = h.inner.WithGroup(name)
	c.grouped = true
	return &c
}

// Close writes what is buffered and stops the writer, waiting no longer
// than ctx allows. Lines logged afterwards are dropped and counted.
func (h *LogHandler) Close(ctx context.Context) error { return h.st.w.close(ctx) }

// LogStats are a LogHandler's counters since it was made.
type LogStats struct {
	// Written counts lines handed to the output; Dropped lines lost
	// because the buffer was full or the handler closed.
	Written, Dropped int64
	// Suppressed counts warning and error lines held back by the rate
	// limit, per component and kind.
	Suppressed map[[2]string]int64
}

// Stats returns the handler's counters.
func (h *LogHandler) Stats() LogStats {
	s := LogStats{Written: h.st.w.written.Load(), Dropped: h.st.w.dropped.Load(), Suppressed: map[[2]string]int64{}}
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	for k, l := range h.st.keys {
		s.Suppressed[[2]string{k.component, k.kind}] = l.total.Load()
	}
	return s
}

// limit returns the limiter of key, creating it on first use.
func (s *logState) limit(key logKey) *logLimit {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.keys[key]; ok {
		return l
	}
	if len(s.keys) >= maxLogKeys {
		key = logKey{component: Other, kind: Other}
		if l, ok := s.keys[key]; ok {
			return l
		}
	}
	l := &logLimit{lim: rate.NewLimiter(rate.Limit(s.cfg.perSecond()), s.cfg.burst())}
	s.keys[key] = l
	return l
}

// ObserveLogs exports the handler's counters: lines written, dropped by
// the full buffer, and suppressed by the rate limit per component and
// kind.
func (t *Telemetry) ObserveLogs(h *LogHandler) error {
	m := t.meter
	written, err := m.Int64ObservableCounter("sluice.log.lines.written",
		metric.WithDescription("Log lines handed to the output by the writer goroutine."))
	if err != nil {
		return err
	}
	dropped, err := m.Int64ObservableCounter("sluice.log.lines.dropped",
		metric.WithDescription("Log lines dropped because the log buffer was full (the output is slower than the logging)."))
	if err != nil {
		return err
	}
	suppressed, err := m.Int64ObservableCounter("sluice.log.lines.suppressed",
		metric.WithDescription("Warning and error lines held back by the per (component, kind) rate limit."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := h.Stats()
		o.ObserveInt64(written, s.Written)
		o.ObserveInt64(dropped, s.Dropped)
		for k, n := range s.Suppressed {
			o.ObserveInt64(suppressed, n, metric.WithAttributes(attribute.String("component", k[0]), attribute.String("kind", k[1])))
		}
		return nil
	}, written, dropped, suppressed)
	return err
}

// asyncWriter hands each Write to one goroutine through a bounded
// channel, dropping what does not fit.
type asyncWriter struct {
	out   io.Writer
	lines chan []byte
	done  chan struct{}

	mu     sync.RWMutex // held for writing only by close
	closed bool

	written, dropped atomic.Int64
}

func newAsyncWriter(out io.Writer, size int) *asyncWriter {
	w := &asyncWriter{out: out, lines: make(chan []byte, size), done: make(chan struct{})}
	go w.run()
	return w
}

// Write queues a copy of p, or drops it when the queue is full. It never
// waits for the output and never fails.
func (w *asyncWriter) Write(p []byte) (int, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		w.dropped.Add(1)
		return len(p), nil
	}
	select {
	case w.lines <- append([]byte(nil), p...):
	default:
		w.dropped.Add(1)
	}
	return len(p), nil
}

func (w *asyncWriter) run() {
	defer close(w.done)
	for line := range w.lines {
		_, _ = w.out.Write(line)
		w.written.Add(1)
	}
}

var errLogFlush = errors.New("telemetry: log writer did not finish before the deadline")

func (w *asyncWriter) close(ctx context.Context) error {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.lines)
	}
	w.mu.Unlock()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %d lines left: %w", errLogFlush, len(w.lines), ctx.Err())
	}
}

// logFlushTimeout bounds how long Close waits by default for the output.
const logFlushTimeout = 2 * time.Second

// CloseWithTimeout is Close with a short default deadline, for defer.
func (h *LogHandler) CloseWithTimeout() error {
	ctx, cancel := context.WithTimeout(context.Background(), logFlushTimeout)
	defer cancel()
	return h.Close(ctx)
}
