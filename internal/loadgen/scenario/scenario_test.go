package scenario

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const example = `
name: example
duration: 10s
uris: {file: uris.txt, missing: 0.05}
clients:
  - name: feed
    rate: 100
    batch: {dist: uniform, min: 1, max: 50}
  - name: ramp
    steps: [{rate: 10, for: 2s}, {rate: 50, for: 3s}]
    batch: {dist: zipf, min: 1, max: 100, s: 1.5}
  - name: exact
    rate: 4
    duration: 2s
    batch: {dist: exact, sizes: [1, 7, 20000]}
    timeout: 30s
    max_outstanding: 10
  - name: one
    method: GetPostRecord
    rate: 5
    batch: {dist: fixed, size: 1}
`

// Tests that a scenario using every distribution and both rate forms
// parses, validates, and yields the right number of sends.
func TestParseExample(t *testing.T) {
	s, err := Parse(strings.NewReader(example))
	if err != nil {
		t.Fatal(err)
	}
	s.Normalize()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"feed": 1000, "ramp": 10*2 + 50*3, "exact": 8, "one": 50}
	for _, c := range s.Clients {
		p := NewPacer(s, c)
		n := 0
		var last time.Duration
		for {
			off, ok := p.Next()
			if !ok {
				break
			}
			if off < last || off >= s.ClientDuration(c) {
				t.Fatalf("%s: offset %v after %v, duration %v", c.Name, off, last, s.ClientDuration(c))
			}
			last = off
			n++
		}
		if n != want[c.Name] {
			t.Errorf("%s: %d sends, want %d", c.Name, n, want[c.Name])
		}
	}
	if c := s.Clients[2]; c.Timeout != 30*time.Second || c.MaxOutstanding != 10 || s.Clients[0].MaxOutstanding != DefaultMaxOutstanding {
		t.Errorf("defaults and overrides: %+v / %+v", c, s.Clients[0])
	}
}

// Tests that bad scenarios are refused with a message naming the field
// and the limit.
func TestValidateNamesTheProblem(t *testing.T) {
	base := func() Scenario {
		return Scenario{Duration: time.Second, URIs: URISource{File: "u"}, Clients: []Client{{Name: "a", Rate: 1, Batch: Batch{Dist: Fixed, Size: 1}}}}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Scenario)
		want   string
	}{
		{"no clients", func(s *Scenario) { s.Clients = nil }, "no clients"},
		{"duplicate", func(s *Scenario) { s.Clients = append(s.Clients, s.Clients[0]) }, "used twice"},
		{"space in name", func(s *Scenario) { s.Clients[0].Name = "a b" }, "printable ASCII"},
		{"method", func(s *Scenario) { s.Clients[0].Method = "PutPostRecords" }, "is not one of"},
		{"no rate", func(s *Scenario) { s.Clients[0].Rate = 0 }, "no arrival rate"},
		{"both rates", func(s *Scenario) { s.Clients[0].Steps = []Step{{Rate: 1, For: time.Second}} }, "either rate or steps"},
		{"rate too high", func(s *Scenario) { s.Clients[0].Rate = 1e9 }, "rate must be in (0, 100000]"},
		{"batch too big", func(s *Scenario) { s.Clients[0].Batch.Size = 2_000_000 }, "batch.size must be in [1, 1000000]"},
		{"zipf exponent", func(s *Scenario) { s.Clients[0].Batch = Batch{Dist: Zipf, Min: 1, Max: 5, S: 1} }, "must be > 1"},
		{"uri skew", func(s *Scenario) { s.URIs.Skew = 1 }, "uris.skew (the zipf exponent over the URI file) must be 0 (uniform) or above 1 and at most 10, got 1"},
		{"min over max", func(s *Scenario) { s.Clients[0].Batch = Batch{Dist: Uniform, Min: 9, Max: 5} }, "exceeds batch.max"},
		{"unknown dist", func(s *Scenario) { s.Clients[0].Batch = Batch{Dist: "normal"} }, `"normal" is not one of`},
		{"single method", func(s *Scenario) {
			s.Clients[0].Method = GetPostRecord
			s.Clients[0].Batch.Size = 5
		}, "takes one URI"},
		{"no file", func(s *Scenario) { s.URIs.File = "" }, "no URI file"},
		{"missing share", func(s *Scenario) { s.URIs.Missing = 1.5 }, "between 0 and 1"},
		{"NaN missing share", func(s *Scenario) { s.URIs.Missing = math.NaN() }, "between 0 and 1"},
		{"NaN rate", func(s *Scenario) { s.Clients[0].Rate = math.NaN() }, "rate must be in (0, 100000]"},
		{"NaN step rate", func(s *Scenario) {
			s.Clients[0].Rate = 0
			s.Clients[0].Steps = []Step{{Rate: math.NaN(), For: time.Second}}
		}, "steps[0].rate must be in [0, 100000]"},
		{"NaN zipf exponent", func(s *Scenario) { s.Clients[0].Batch = Batch{Dist: Zipf, Min: 1, Max: 5, S: math.NaN()} }, "must be > 1"},
		{"NaN uri skew", func(s *Scenario) { s.URIs.Skew = math.NaN() }, "uris.skew"},
		{"no duration", func(s *Scenario) { s.Duration = 0 }, "duration must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			s.Normalize()
			tc.mutate(&s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := Parse(strings.NewReader("clients: [{name: a, rat: 5}]")); err == nil || !strings.Contains(err.Error(), "rat") {
		t.Errorf("unknown key: %v", err)
	}
}

// Tests that each distribution draws only sizes it allows, with the
// shape it promises.
func TestSizer(t *testing.T) {
	const n = 20_000
	draw := func(b Batch) []int {
		s := NewSizer(b, 3)
		out := make([]int, n)
		for i := range out {
			out[i] = s.Next()
		}
		return out
	}
	uni := draw(Batch{Dist: Uniform, Min: 15_000, Max: 20_000})
	var sum float64
	for _, v := range uni {
		if v < 15_000 || v > 20_000 {
			t.Fatalf("uniform drew %d", v)
		}
		sum += float64(v)
	}
	if mean := sum / n; math.Abs(mean-17_500) > 100 {
		t.Errorf("uniform mean %.0f, want ≈ 17,500", mean)
	}
	zipf := draw(Batch{Dist: Zipf, Min: 1, Max: 50, S: 1.3})
	small := 0
	for _, v := range zipf {
		if v < 1 || v > 50 {
			t.Fatalf("zipf drew %d", v)
		}
		if v <= 5 {
			small++
		}
	}
	if small < n/2 {
		t.Errorf("zipf: only %d of %d draws ≤ 5; small batches should dominate", small, n)
	}
	ex := draw(Batch{Dist: Exact, Sizes: []int{1, 10, 25}})
	for i, v := range ex[:9] {
		if want := []int{1, 10, 25}[i%3]; v != want {
			t.Fatalf("exact draw %d = %d, want %d", i, v, want)
		}
	}
}

// Tests that the picker replaces the configured share of URIs by
// well-formed URIs that are not in the list.
func TestPickerMissingShare(t *testing.T) {
	uris := []string{"at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3k2yihcrp6f2c"}
	p := NewPicker(uris, 0.1, 9)
	got := p.Pick(20_000)
	missing := 0
	for _, u := range got {
		if u != uris[0] {
			missing++
			if !strings.HasPrefix(u, "at://did:plc:") || !strings.Contains(u, "/app.bsky.feed.post/") {
				t.Fatalf("missing URI %q is not a post AT-URI", u)
			}
		}
	}
	if share := float64(missing) / 20_000; math.Abs(share-0.1) > 0.01 {
		t.Errorf("missing share %.3f, want 0.10", share)
	}
}

// Tests that a skewed picker draws the list's i-th URI with probability
// about (i+1)^-s / H, and (the control) that a uniform one does not favour
// the first.
func TestPickerSkew(t *testing.T) {
	uris := make([]string, 50_000)
	for i := range uris {
		uris[i] = fmt.Sprintf("u%d", i)
	}
	const s, draws = 1.1, 200_000
	var h float64
	for k := 1; k <= len(uris); k++ {
		h += math.Pow(float64(k), -s)
	}
	share := func(p *Picker, uri string) float64 {
		n := 0
		for _, u := range p.Pick(draws) {
			if u == uri {
				n++
			}
		}
		return float64(n) / draws
	}
	for _, rank := range []int{0, 9} {
		want := math.Pow(float64(rank+1), -s) / h
		if got := share(NewPicker(uris, 0, 3).WithSkew(s), uris[rank]); math.Abs(got-want) > want*0.1 {
			t.Errorf("skew %v: URI of rank %d drawn %.4f of the time, want %.4f", s, rank, got, want)
		}
	}
	if got := share(NewPicker(uris, 0, 3), uris[0]); got > 0.001 {
		t.Errorf("uniform: the first URI drawn %.4f of the time, want about %.5f", got, 1.0/float64(len(uris)))
	}
}

// Tests that the presets are valid and that incident is steady plus one
// bulk client of 15,000–20,000-URI batches at 3 requests/s, fair-share
// steady plus eight heavy callers under their own names, each sending
// 1,000-URI batches at 10 requests/s with a 2s deadline (80,000 items/s
// in all), and split steady plus the trusted caller's 20,000-URI batches.
func TestPresets(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "uris.txt")
	if err := os.WriteFile(file, []byte("at://did:plc:x/app.bsky.feed.post/3k\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	steady, err := Preset("steady", file)
	if err != nil {
		t.Fatal(err)
	}
	incident, err := Preset("incident", file)
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, s := range []Scenario{steady, incident} {
		s.Normalize()
		if err := s.Validate(); err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
	}
	for _, c := range steady.Clients {
		total += c.Rate
		if c.Batch.MaxSize() > 50 {
			t.Errorf("steady client %s sends up to %d URIs", c.Name, c.Batch.MaxSize())
		}
	}
	if total < 200 || total > 500 {
		t.Errorf("steady sends %v req/s in total, want a few hundred", total)
	}
	if len(incident.Clients) != len(steady.Clients)+1 {
		t.Fatalf("incident has %d clients", len(incident.Clients))
	}
	bulk := incident.Clients[len(incident.Clients)-1]
	if bulk.Name != "bulk" || bulk.Rate != 3 || bulk.Batch.Min != 15_000 || bulk.Batch.Max != 20_000 {
		t.Errorf("bulk client %+v", bulk)
	}
	split, err := Preset("split", file)
	if err != nil {
		t.Fatal(err)
	}
	split.Normalize()
	if err := split.Validate(); err != nil {
		t.Fatalf("split: %v", err)
	}
	if trusted := split.Clients[len(split.Clients)-1]; len(split.Clients) != len(steady.Clients)+1 || trusted.Name != SplitCaller || trusted.Batch.MaxSize() != 20_000 {
		t.Errorf("split preset: %d clients, last %+v; want steady plus %s sending 20,000 URIs", len(split.Clients), trusted, SplitCaller)
	}
	fair, err := Preset("fair-share", file)
	if err != nil {
		t.Fatal(err)
	}
	fair.Normalize()
	if err := fair.Validate(); err != nil {
		t.Fatalf("fair-share: %v", err)
	}
	if len(fair.Clients) != len(steady.Clients)+HeavyCallers || HeavyCallers != 8 {
		t.Fatalf("fair-share has %d clients, want steady's %d plus %d heavy callers (8)", len(fair.Clients), len(steady.Clients), HeavyCallers)
	}
	var heavyItems float64
	for i, c := range fair.Clients[len(steady.Clients):] {
		if want := fmt.Sprintf("heavy-%d", i+1); c.Name != want || c.Rate != 10 || c.Timeout != 2*time.Second || c.Batch.Dist != Fixed || c.Batch.MaxSize() != 1000 {
			t.Errorf("fair-share heavy caller %d: %+v; want %s sending 1,000 URIs at 10 requests/s with a 2s deadline", i+1, c, want)
		}
		heavyItems += c.Rate * float64(c.Batch.MaxSize())
	}
	if heavyItems != 80_000 {
		t.Errorf("fair-share's heavy callers offer %v items/s in all, want 80,000", heavyItems)
	}
	if _, err := Preset("outage", file); err == nil || !strings.Contains(err.Error(), "fair-share, incident, split, steady") {
		t.Errorf("unknown preset: %v", err)
	}
}
