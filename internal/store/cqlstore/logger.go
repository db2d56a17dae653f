package cqlstore

import (
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// driverLogInterval is the least time between two driver log lines.
const driverLogInterval = time.Second

// driverLogger passes the driver's log lines (dial failures, control
// connection reconnects) to slog at most once per driverLogInterval, and
// counts the lines it dropped in between, so an outage cannot flood the
// log. It implements gocql.StdLogger.
type driverLogger struct {
	log *slog.Logger

	mu      sync.Mutex
	last    time.Time
	dropped int
}

func newDriverLogger(log *slog.Logger) *driverLogger {
	if log == nil {
		log = slog.Default()
	}
	return &driverLogger{log: log}
}

func (l *driverLogger) Print(v ...any)                 { l.emit(fmt.Sprint(v...)) }
func (l *driverLogger) Printf(format string, v ...any) { l.emit(fmt.Sprintf(format, v...)) }
func (l *driverLogger) Println(v ...any)               { l.emit(fmt.Sprintln(v...)) }

func (l *driverLogger) emit(msg string) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.last) < driverLogInterval {
		l.dropped++
		l.mu.Unlock()
		return
	}
	dropped := l.dropped
	l.last, l.dropped = now, 0
	l.mu.Unlock()
	l.log.Warn("cql driver", "msg", msg, "dropped_since_last", dropped)
}
