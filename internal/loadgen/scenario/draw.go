package scenario

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/synth"
)

// Pacer yields the send offsets of an open-loop client, measured from
// the client's start. Offsets are computed from the step's start and the
// request's index, so they never drift, whatever happens to the sends.
// A Pacer is not safe for concurrent use.
type Pacer struct {
	steps    []Step
	step     int
	stepFrom time.Duration // offset where the current step began
	n        int64         // requests already due in the current step
}

// NewPacer returns the pacer of client c of s (Rate or Steps, up to the
// client's duration).
func NewPacer(s Scenario, c Client) *Pacer {
	d := s.ClientDuration(c)
	steps := c.Steps
	if len(steps) == 0 {
		steps = []Step{{Rate: c.Rate, For: d}}
	}
	var total time.Duration
	for _, st := range steps {
		total += st.For
	}
	if total < d { // the last rate holds until the duration
		last := steps[len(steps)-1]
		steps = append(append([]Step(nil), steps...), Step{Rate: last.Rate, For: d - total})
	}
	// Cut the steps at the duration.
	var cut []Step
	var at time.Duration
	for _, st := range steps {
		if at >= d {
			break
		}
		st.For = min(st.For, d-at)
		cut = append(cut, st)
		at += st.For
	}
	return &Pacer{steps: cut}
}

// Next returns the next send offset, or false when the client is done.
func (p *Pacer) Next() (time.Duration, bool) {
	for p.step < len(p.steps) {
		st := p.steps[p.step]
		if st.Rate > 0 {
			off := time.Duration(float64(p.n) * float64(time.Second) / st.Rate)
			if off < st.For {
				p.n++
				return p.stepFrom + off, true
			}
		}
		p.stepFrom += st.For
		p.step++
		p.n = 0
	}
	return 0, false
}

// Sizer draws batch sizes. It is not safe for concurrent use.
type Sizer struct {
	b    Batch
	rng  *rand.Rand
	zipf *rand.Zipf
	next int // index into Sizes for exact
}

// NewSizer returns a sizer for b, which must be valid.
func NewSizer(b Batch, seed uint64) *Sizer {
	s := &Sizer{b: b, rng: rand.New(rand.NewPCG(seed, seed^0x5eed))}
	if b.Dist == Zipf {
		s.zipf = rand.NewZipf(s.rng, b.S, 1, uint64(b.Max-b.Min))
	}
	return s
}

// Next draws one batch size.
func (s *Sizer) Next() int {
	switch s.b.Dist {
	case Fixed:
		return s.b.Size
	case Uniform:
		return s.b.Min + s.rng.IntN(s.b.Max-s.b.Min+1)
	case Zipf:
		return s.b.Min + int(s.zipf.Uint64())
	case Exact:
		n := s.b.Sizes[s.next%len(s.b.Sizes)]
		s.next++
		return n
	}
	panic("scenario: Sizer of an invalid batch " + s.b.Dist)
}

// Picker draws URIs: existing ones from a list, uniformly or (WithSkew)
// zipf-distributed over the list's order, each replaced with probability
// Missing by a well-formed URI of a post that does not exist. It is not
// safe for concurrent use.
type Picker struct {
	uris    []string
	missing float64
	rng     *rand.Rand
	zipf    *rand.Zipf // nil: uniform
	gen     *synth.Generator
}

// NewPicker returns a picker over uris (at least one).
func NewPicker(uris []string, missing float64, seed uint64) *Picker {
	return &Picker{
		uris:    uris,
		missing: missing,
		rng:     rand.New(rand.NewPCG(seed, seed^0x0e1f)),
		gen:     synth.New(seed^0xdead, 16),
	}
}

// WithSkew makes p draw the list's i-th URI with probability
// proportional to 1/(i+1)^s; s must be above 1. It returns p.
func (p *Picker) WithSkew(s float64) *Picker {
	p.zipf = rand.NewZipf(p.rng, s, 1, uint64(len(p.uris)-1))
	return p
}

// Pick returns n URIs.
func (p *Picker) Pick(n int) []string {
	out := make([]string, n)
	for i := range out {
		if p.missing > 0 && p.rng.Float64() < p.missing {
			out[i] = p.gen.MissingURI()
			continue
		}
		if p.zipf != nil {
			out[i] = p.uris[p.zipf.Uint64()]
			continue
		}
		out[i] = p.uris[p.rng.IntN(len(p.uris))]
	}
	return out
}

// ReadURIs reads a URI file: one URI per line, blank lines and lines
// starting with # ignored.
func ReadURIs(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("scenario: URI file: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scenario: read %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("scenario: URI file %s holds no URIs; write one with `sluice seed --uris-out`", path)
	}
	return out, nil
}
