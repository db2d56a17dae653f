// Package scenario describes what a load run sends: a list of clients,
// each with a name (sent as x-client-id), an open-loop arrival rate
// (constant or in steps), a batch-size distribution, a source of URIs
// with a share that do not exist, a method and a duration.
//
// It parses scenarios from YAML, validates them with messages that name
// the field and the limit, holds the built-in presets (steady, incident)
// and turns a description into deterministic draws: send offsets (Pacer),
// batch sizes (Sizer) and URIs (Picker). It sends nothing and measures
// nothing; package loadgen does.
package scenario

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Methods a client may call.
const (
	GetPostRecords = "GetPostRecords"
	GetPostRecord  = "GetPostRecord"
)

// Distributions of batch sizes.
const (
	Fixed   = "fixed"
	Uniform = "uniform"
	Zipf    = "zipf"
	Exact   = "exact"
)

// Limits on what a scenario may ask for, so that a typo cannot make the
// harness itself the overload.
const (
	MaxBatch = 1_000_000
	MaxRate  = 100_000
	MaxSkew  = 10
)

// Scenario is one load run.
type Scenario struct {
	// Name labels the run in reports.
	Name string `yaml:"name"`
	// Duration is how long each client sends unless it says otherwise.
	Duration time.Duration `yaml:"duration"`
	// URIs is where clients draw URIs from unless they say otherwise.
	URIs URISource `yaml:"uris"`
	// Seed makes the draws (sizes, URIs) repeatable. Default 1.
	Seed uint64 `yaml:"seed"`
	// Clients are the callers, sending concurrently.
	Clients []Client `yaml:"clients"`
}

// Client is one caller of the server.
type Client struct {
	// Name is sent as the x-client-id metadata.
	Name string `yaml:"name"`
	// Method is GetPostRecords (default) or GetPostRecord.
	Method string `yaml:"method"`
	// Rate is the constant arrival rate in requests/s. Exactly one of
	// Rate and Steps is set.
	Rate float64 `yaml:"rate"`
	// Steps are consecutive constant rates; the client's duration is
	// their sum unless Duration is set, in which case the last step's
	// rate holds until then.
	Steps []Step `yaml:"steps"`
	// Batch is the distribution of URIs per request.
	Batch Batch `yaml:"batch"`
	// URIs overrides the scenario's URI source.
	URIs *URISource `yaml:"uris"`
	// Duration overrides the scenario's duration.
	Duration time.Duration `yaml:"duration"`
	// Start delays the client's first request from the run's start.
	Start time.Duration `yaml:"start"`
	// Timeout is each request's deadline. Default 10s.
	Timeout time.Duration `yaml:"timeout"`
	// MaxOutstanding bounds the requests in flight; a request due while
	// the bound is reached is not sent and is counted as dropped.
	// Default 1000.
	MaxOutstanding int `yaml:"max_outstanding"`
}

// Step is one constant rate held for a while.
type Step struct {
	Rate float64       `yaml:"rate"`
	For  time.Duration `yaml:"for"`
}

// Batch is a distribution of batch sizes.
//
//	fixed:   size
//	uniform: min..max, every size equally likely
//	zipf:    min..max, small sizes most likely; s > 1 is the exponent
//	exact:   sizes, used in order and repeated
type Batch struct {
	Dist  string  `yaml:"dist"`
	Size  int     `yaml:"size"`
	Min   int     `yaml:"min"`
	Max   int     `yaml:"max"`
	S     float64 `yaml:"s"`
	Sizes []int   `yaml:"sizes"`
}

// URISource is a file of existing URIs, one per line (what
// `sluice seed --uris-out` writes), the share of drawn URIs that are
// replaced by well-formed URIs of posts that do not exist, and how the
// existing ones are drawn: uniformly (Skew 0) or zipf-distributed over
// the file's order with exponent Skew (> 1; 1.1 is a viral-post-heavy
// feed: the first URI of 50,000 is drawn about 14 % of the time).
type URISource struct {
	File    string  `yaml:"file"`
	Missing float64 `yaml:"missing"`
	Skew    float64 `yaml:"skew"`
}

// Defaults applied by Normalize.
const (
	DefaultTimeout        = 10 * time.Second
	DefaultMaxOutstanding = 1000
)

// Parse reads a scenario from YAML; unknown keys are an error.
func Parse(r io.Reader) (Scenario, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return Scenario{}, fmt.Errorf("scenario: %w", err)
	}
	var s Scenario
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil && !errors.Is(err, io.EOF) {
		return Scenario{}, fmt.Errorf("scenario: %w", err)
	}
	return s, nil
}

// Load reads the scenario file at path.
func Load(path string) (Scenario, error) {
	f, err := os.Open(path)
	if err != nil {
		return Scenario{}, fmt.Errorf("scenario: %w", err)
	}
	defer f.Close()
	s, err := Parse(f)
	if err != nil {
		return Scenario{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Normalize fills defaults: the method, timeout and outstanding bound of
// every client, and the seed.
func (s *Scenario) Normalize() {
	if s.Seed == 0 {
		s.Seed = 1
	}
	for i := range s.Clients {
		c := &s.Clients[i]
		if c.Method == "" {
			c.Method = GetPostRecords
		}
		if c.Timeout == 0 {
			c.Timeout = DefaultTimeout
		}
		if c.MaxOutstanding == 0 {
			c.MaxOutstanding = DefaultMaxOutstanding
		}
	}
}

// ClientDuration is how long client c sends.
func (s Scenario) ClientDuration(c Client) time.Duration {
	if c.Duration > 0 {
		return c.Duration
	}
	if len(c.Steps) > 0 {
		var total time.Duration
		for _, st := range c.Steps {
			total += st.For
		}
		return total
	}
	return s.Duration
}

// ClientURIs is the URI source of client c.
func (s Scenario) ClientURIs(c Client) URISource {
	if c.URIs != nil {
		return *c.URIs
	}
	return s.URIs
}

// Validate reports every problem, each naming the client, the field and
// the limit.
func (s Scenario) Validate() error {
	var errs []error
	if len(s.Clients) == 0 {
		errs = append(errs, errors.New("scenario: no clients; list at least one under the clients key"))
	}
	seen := map[string]bool{}
	for i, c := range s.Clients {
		where := fmt.Sprintf("scenario: clients[%d] (%s)", i, c.Name)
		if seen[c.Name] {
			errs = append(errs, fmt.Errorf("%s: name is used twice; client names must be unique", where))
		}
		seen[c.Name] = true
		for _, err := range s.validateClient(c) {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
	}
	return errors.Join(errs...)
}

func (s Scenario) validateClient(c Client) []error {
	var errs []error
	if c.Name == "" || strings.ContainsFunc(c.Name, func(r rune) bool { return r <= ' ' || r > '~' }) {
		errs = append(errs, fmt.Errorf("name %q must be non-empty printable ASCII without spaces (it is sent as x-client-id)", c.Name))
	}
	if c.Method != GetPostRecords && c.Method != GetPostRecord {
		errs = append(errs, fmt.Errorf("method %q is not one of %s, %s", c.Method, GetPostRecords, GetPostRecord))
	}
	errs = append(errs, validateRate(c)...)
	if d := s.ClientDuration(c); d <= 0 {
		errs = append(errs, fmt.Errorf("duration must be positive (set duration: on the scenario or the client, or give steps), got %v", d))
	}
	if c.Start < 0 {
		errs = append(errs, fmt.Errorf("start must not be negative, got %v", c.Start))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout must not be negative, got %v", c.Timeout))
	}
	if c.MaxOutstanding < 0 {
		errs = append(errs, fmt.Errorf("max_outstanding must not be negative, got %d", c.MaxOutstanding))
	}
	if err := c.Batch.Validate(); err != nil {
		errs = append(errs, err)
	} else if c.Method == GetPostRecord && c.Batch.MaxSize() != 1 {
		errs = append(errs, fmt.Errorf("method %s takes one URI, but batch allows up to %d; use batch: {dist: fixed, size: 1}", GetPostRecord, c.Batch.MaxSize()))
	}
	if src := s.ClientURIs(c); src.File == "" {
		errs = append(errs, errors.New("no URI file; set uris.file (the file `sluice seed --uris-out` wrote) or pass --uris"))
	} else if !(src.Missing >= 0 && src.Missing <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("uris.missing must be a share between 0 and 1, got %v", src.Missing))
	}
	if src := s.ClientURIs(c); src.Skew != 0 && !(src.Skew > 1 && src.Skew <= MaxSkew) { // NaN too
		errs = append(errs, fmt.Errorf("uris.skew (the zipf exponent over the URI file) must be 0 (uniform) or above 1 and at most %v, got %v", float64(MaxSkew), src.Skew))
	}
	return errs
}

func validateRate(c Client) []error {
	switch {
	case c.Rate != 0 && len(c.Steps) > 0:
		return []error{errors.New("set either rate or steps, not both")}
	case c.Rate == 0 && len(c.Steps) == 0:
		return []error{errors.New("no arrival rate; set rate (requests/s) or steps")}
	case c.Rate != 0:
		if !(c.Rate > 0 && c.Rate <= MaxRate) { // NaN too
			return []error{fmt.Errorf("rate must be in (0, %d] requests/s, got %v", MaxRate, c.Rate)}
		}
	}
	var errs []error
	for i, st := range c.Steps {
		if !(st.Rate >= 0 && st.Rate <= MaxRate) { // NaN too
			errs = append(errs, fmt.Errorf("steps[%d].rate must be in [0, %d] requests/s, got %v", i, MaxRate, st.Rate))
		}
		if st.For <= 0 {
			errs = append(errs, fmt.Errorf("steps[%d].for must be positive, got %v", i, st.For))
		}
	}
	return errs
}

// Validate reports a distribution that cannot be drawn from.
func (b Batch) Validate() error {
	inRange := func(field string, v int) error {
		if v < 1 || v > MaxBatch {
			return fmt.Errorf("batch.%s must be in [1, %d], got %d", field, MaxBatch, v)
		}
		return nil
	}
	switch b.Dist {
	case Fixed:
		return inRange("size", b.Size)
	case Uniform, Zipf:
		if err := errors.Join(inRange("min", b.Min), inRange("max", b.Max)); err != nil {
			return err
		}
		if b.Min > b.Max {
			return fmt.Errorf("batch.min %d exceeds batch.max %d", b.Min, b.Max)
		}
		if b.Dist == Zipf && !(b.S > 1) { // NaN too
			return fmt.Errorf("batch.s (the zipf exponent) must be > 1, got %v", b.S)
		}
		return nil
	case Exact:
		if len(b.Sizes) == 0 {
			return errors.New("batch.sizes is empty; list the sizes to send in order")
		}
		for i, n := range b.Sizes {
			if err := inRange(fmt.Sprintf("sizes[%d]", i), n); err != nil {
				return err
			}
		}
		return nil
	case "":
		return errors.New("batch.dist is missing; use fixed, uniform, zipf or exact")
	}
	return fmt.Errorf("batch.dist %q is not one of fixed, uniform, zipf, exact", b.Dist)
}

// MaxSize is the largest batch the distribution can draw.
func (b Batch) MaxSize() int {
	switch b.Dist {
	case Fixed:
		return b.Size
	case Exact:
		return maxOf(b.Sizes)
	}
	return b.Max
}

func maxOf(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
