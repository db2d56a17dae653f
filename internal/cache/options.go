package cache

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/spans"
)

// Option adjusts a Cache's instrumentation, or turns on distrust.
type Option func(*options)

type options struct {
	tracer   spans.Tracer
	log      *slog.Logger
	distrust bool
}

// WithDistrust makes a server read a key as a miss, and Fill skip it,
// while the key's tombstone is owed there, and makes SuspectAll (or too
// many owed keys) distrust the whole server until Trust (see Distrust).
// Only a caller that calls RetryTombstones and replays the store's
// journal onto suspects before calling Trust should turn it on;
// otherwise a key or server distrusted once is never read again.
func WithDistrust() Option {
	return func(o *options) { o.distrust = true }
}

func defaultOptions() options {
	return options{
		log: slog.New(slog.DiscardHandler),
	}
}

const tracerName = "github.com/sluice-dev/sluice/internal/cache"

// WithTracerProvider makes each memcached get a span, a child of the
// request's span, with its server, key count and hit count. Default: no
// spans.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracer = spans.New(tp, tracerName) }
}

// WithLogger logs breaker state changes (warn) and failed memcached calls
// (error), with component=cache and a kind naming the failure. A failed
// call can happen for every request while memcached is down, so the
// logger must rate-limit (telemetry.LogHandler does). Default: no logs.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.log = l.With("component", "cache") }
}

// errorKind names a failed call's cause with a small fixed vocabulary, for
// log rate-limiting and reading.
func errorKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection_reset"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &ne):
		return "network"
	}
	return "server_error"
}
