// Package trace reads and writes load traces: JSONL files with one line
// per request — its offset from the start of the run, the client, the
// method, and either the URIs themselves or only the batch size.
//
//	{"offset_ms":12.5,"client":"feed","method":"GetPostRecords","batch":3,"uris":["at://…","at://…","at://…"]}
//	{"offset_ms":333.3,"client":"bulk","method":"GetPostRecords","batch":18211}
//
// `sluice-load --record` writes this format from a live run and
// `sluice-load --replay` sends it again at a speed factor. The package
// only encodes; scheduling is package loadgen's.
package trace

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Entry is one request of a trace.
type Entry struct {
	// OffsetMS is when the request was scheduled, in milliseconds from
	// the start of the run.
	OffsetMS float64 `json:"offset_ms"`
	Client   string  `json:"client"`
	Method   string  `json:"method"`
	// Batch is the number of URIs; when URIs is empty the replay draws
	// that many from its URI source.
	Batch int      `json:"batch"`
	URIs  []string `json:"uris,omitempty"`
}

// Validate reports an entry that cannot be replayed.
func (e Entry) Validate() error {
	switch {
	case e.OffsetMS < 0:
		return fmt.Errorf("offset_ms must not be negative, got %v", e.OffsetMS)
	case e.Client == "":
		return errors.New("client is empty")
	case e.Method == "":
		return errors.New("method is empty")
	case e.Batch < 1 && len(e.URIs) == 0:
		return errors.New("neither batch (≥ 1) nor uris is given")
	case len(e.URIs) > 0 && e.Batch != 0 && e.Batch != len(e.URIs):
		return fmt.Errorf("batch %d does not match the %d uris given", e.Batch, len(e.URIs))
	}
	return nil
}

// Size is the number of URIs the entry sends.
func (e Entry) Size() int {
	if len(e.URIs) > 0 {
		return len(e.URIs)
	}
	return e.Batch
}

// Writer appends entries to a JSONL stream. It is safe for concurrent
// use; call Flush at the end.
type Writer struct {
	mu       sync.Mutex
	w        *bufio.Writer
	enc      *json.Encoder
	withURIs bool
	err      error
}

// NewWriter writes to w; withURIs keeps the URIs of each request,
// otherwise only batch sizes are written.
func NewWriter(w io.Writer, withURIs bool) *Writer {
	bw := bufio.NewWriterSize(w, 1<<20)
	return &Writer{w: bw, enc: json.NewEncoder(bw), withURIs: withURIs}
}

// Write appends e. The first error is kept and returned by Flush.
func (w *Writer) Write(e Entry) {
	if !w.withURIs {
		e.Batch, e.URIs = e.Size(), nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		if err := w.enc.Encode(e); err != nil {
			w.err = fmt.Errorf("trace: write: %w", err)
		}
	}
}

// Flush writes buffered entries and returns the first error.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("trace: flush: %w", err)
	}
	return nil
}

// Read parses a whole trace, naming the first bad line.
func Read(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("trace: line %d: %w", line, err)
		}
		if err := e.Validate(); err != nil {
			return nil, fmt.Errorf("trace: line %d: %w", line, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace: read: %w", err)
	}
	return out, nil
}
