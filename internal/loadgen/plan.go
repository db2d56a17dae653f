package loadgen

import (
	"fmt"
	"slices"
	"time"

	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
	"github.com/sluice-dev/sluice/internal/loadgen/trace"
)

// buildPlans turns the scenario, or the replayed trace, into one schedule
// per client.
func buildPlans(opts Options) ([]plan, error) {
	s := opts.Scenario
	s.Normalize()
	files := uriFiles{}
	if opts.Replay != nil {
		return replayPlans(opts, s, files)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	var plans []plan
	for i, c := range s.Clients {
		src := s.ClientURIs(c)
		uris, err := files.read(src.File)
		if err != nil {
			return nil, err
		}
		seed := s.Seed*1_000_003 + uint64(i)
		pacer := scenario.NewPacer(s, c)
		sizer := scenario.NewSizer(c.Batch, seed)
		picker := newPicker(uris, src, seed)
		plans = append(plans, plan{client: c, next: func() (request, bool) {
			off, ok := pacer.Next()
			if !ok {
				return request{}, false
			}
			return request{offset: c.Start + off, method: c.Method, uris: picker.Pick(sizer.Next())}, true
		}})
	}
	return plans, nil
}

// replayPlans groups a trace by client, in order of first appearance.
func replayPlans(opts Options, s scenario.Scenario, files uriFiles) ([]plan, error) {
	speed := opts.Speed
	if speed <= 0 {
		return nil, fmt.Errorf("loadgen: replay speed must be positive, got %v", speed)
	}
	if len(opts.Replay) == 0 {
		return nil, fmt.Errorf("loadgen: the trace to replay is empty")
	}
	byClient := map[string][]trace.Entry{}
	var order []string
	for _, e := range opts.Replay {
		if _, ok := byClient[e.Client]; !ok {
			order = append(order, e.Client)
		}
		byClient[e.Client] = append(byClient[e.Client], e)
	}
	var plans []plan
	for i, name := range order {
		entries := byClient[name]
		slices.SortStableFunc(entries, func(a, b trace.Entry) int { return cmpFloat(a.OffsetMS, b.OffsetMS) })
		c := replayClient(s, name, entries[0].Method)
		picker, err := replayPicker(s, c, entries, files, s.Seed*1_000_003+uint64(i))
		if err != nil {
			return nil, err
		}
		next := 0
		plans = append(plans, plan{client: c, next: func() (request, bool) {
			if next >= len(entries) {
				return request{}, false
			}
			e := entries[next]
			next++
			uris := e.URIs
			if len(uris) == 0 {
				uris = picker.Pick(e.Batch)
			}
			off := time.Duration(e.OffsetMS / speed * float64(time.Millisecond))
			return request{offset: off, method: e.Method, uris: uris}, true
		}})
	}
	return plans, nil
}

// replayClient takes a client's settings from the scenario when it names
// the client, or the defaults.
func replayClient(s scenario.Scenario, name, method string) scenario.Client {
	for _, c := range s.Clients {
		if c.Name == name {
			c.Method = method
			return c
		}
	}
	return scenario.Client{Name: name, Method: method, Timeout: scenario.DefaultTimeout, MaxOutstanding: scenario.DefaultMaxOutstanding}
}

// replayPicker is needed only for entries that carry a size but no URIs.
func replayPicker(s scenario.Scenario, c scenario.Client, entries []trace.Entry, files uriFiles, seed uint64) (*scenario.Picker, error) {
	if !slices.ContainsFunc(entries, func(e trace.Entry) bool { return len(e.URIs) == 0 }) {
		return nil, nil
	}
	src := s.ClientURIs(c)
	if src.File == "" {
		return nil, fmt.Errorf("loadgen: the trace gives only batch sizes for client %s; pass --uris FILE to draw its URIs from", c.Name)
	}
	uris, err := files.read(src.File)
	if err != nil {
		return nil, err
	}
	return newPicker(uris, src, seed), nil
}

func newPicker(uris []string, src scenario.URISource, seed uint64) *scenario.Picker {
	p := scenario.NewPicker(uris, src.Missing, seed)
	if src.Skew != 0 {
		p.WithSkew(src.Skew)
	}
	return p
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// uriFiles reads each URI file once.
type uriFiles map[string][]string

func (f uriFiles) read(path string) ([]string, error) {
	if uris, ok := f[path]; ok {
		return uris, nil
	}
	uris, err := scenario.ReadURIs(path)
	if err != nil {
		return nil, err
	}
	f[path] = uris
	return uris, nil
}
