// Binary sluice-load is sluice's load-test harness: it sends open-loop
// load from several named clients (from a YAML scenario, a built-in
// preset or a recorded trace), samples the server's vital signs from its
// /metrics, and reports per-client latency and errors as a table, JSON or
// a self-contained HTML page; it compares two JSON reports and checks
// service-level targets.
//
//	sluice-load --preset incident --uris .data/uris.txt --html incident.html
//	sluice-load --scenario my.yaml --json run.json --slo 'client=feed,p99<50ms,errors=0'
//	sluice-load --replay trace.jsonl --speed 2
//	sluice-load --compare before.json after.json
//
// Exit status: 0 on success, 1 on a usage or run error, 3 when a --slo
// target was missed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-dev/sluice/internal/loadgen"
	"github.com/sluice-dev/sluice/internal/loadgen/probe"
	"github.com/sluice-dev/sluice/internal/loadgen/report"
	"github.com/sluice-dev/sluice/internal/loadgen/scenario"
	"github.com/sluice-dev/sluice/internal/loadgen/slo"
	"github.com/sluice-dev/sluice/internal/loadgen/trace"
	"github.com/sluice-dev/sluice/internal/loadgen/vitals"
)

// Exit codes.
const (
	exitOK        = 0
	exitError     = 1
	exitSLOMissed = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// sloFlags collects repeated --slo values.
type sloFlags []string

func (s *sloFlags) String() string     { return strings.Join(*s, " ") }
func (s *sloFlags) Set(v string) error { *s = append(*s, v); return nil }

// flags are the parsed command line.
type flags struct {
	target, scenarioFile, preset, uris string
	missing, skew                      float64
	duration                           time.Duration
	without                            string
	rates                              string
	maxOutstanding                     int
	replay                             string
	speed                              float64
	record                             string
	recordURIs                         bool
	metrics                            string
	serverPID                          int
	memcached                          string
	probe                              string
	probeEvery                         time.Duration
	sampleEvery, progress              time.Duration
	warm                               bool
	warmBatch, warmConcurrency         int
	jsonOut, htmlOut                   string
	compare                            bool
	slos                               sloFlags
	compareArgs                        []string
}

func parseFlags(args []string, stderr io.Writer) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("sluice-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.target, "target", "127.0.0.1:50051", "sluice gRPC address")
	fs.StringVar(&f.scenarioFile, "scenario", "", "YAML scenario file")
	fs.StringVar(&f.preset, "preset", "", "built-in scenario: "+strings.Join(scenario.PresetNames(), ", "))
	fs.StringVar(&f.uris, "uris", "", "URI file (from `sluice seed --uris-out`); overrides the scenario's")
	fs.Float64Var(&f.missing, "missing", -1, "share of URIs replaced by URIs that do not exist (0..1); overrides the scenario's")
	fs.DurationVar(&f.duration, "duration", 0, "how long every client sends; overrides the scenario's")
	fs.StringVar(&f.without, "without", "", "comma-separated clients to leave out of the scenario (e.g. bulk)")
	fs.StringVar(&f.rates, "rate", "", "comma-separated CLIENT=REQUESTS_PER_S overriding those clients' rates; CLIENT may end in * to match a prefix (e.g. 'heavy-*=2.5')")
	fs.IntVar(&f.maxOutstanding, "max-outstanding", 0, "bound on each client's requests in flight; overrides the scenario's (default 1000)")
	fs.StringVar(&f.replay, "replay", "", "JSONL trace to send instead of the scenario's schedule")
	fs.Float64Var(&f.speed, "speed", 1, "replay speed factor (2 sends twice as fast)")
	fs.StringVar(&f.record, "record", "", "write every scheduled request to this JSONL trace")
	fs.Float64Var(&f.skew, "skew", -1, "draw URIs zipf-distributed over the URI file's order with this exponent (> 1, e.g. 1.1: hot keys), 0 uniformly; overrides the scenario's")
	fs.BoolVar(&f.recordURIs, "record-uris", true, "keep URIs in the recorded trace (false: batch sizes only)")
	fs.StringVar(&f.metrics, "metrics", "http://127.0.0.1:8080/metrics", "server /metrics URL for vital signs (empty: none)")
	fs.IntVar(&f.serverPID, "server-pid", 0, "server pid on this machine: read OS threads and RSS from /proc")
	fs.StringVar(&f.memcached, "memcached", "", "memcached addresses for the TIME_WAIT count (default: from the server's metrics)")
	fs.StringVar(&f.probe, "probe", "", "memcached address to time a bare get at beside the clients: the machine's floor for a round trip (empty: none)")
	fs.DurationVar(&f.probeEvery, "probe-every", 5*time.Millisecond, "time between the probe's gets")
	fs.DurationVar(&f.sampleEvery, "sample-every", 500*time.Millisecond, "vital signs sampling interval")
	fs.DurationVar(&f.progress, "progress", 2*time.Second, "progress line interval (0: none)")
	fs.BoolVar(&f.warm, "warm", false, "read every URI of the URI file once before the run")
	fs.IntVar(&f.warmBatch, "warm-batch", 1000, "URIs per warm-up request")
	fs.IntVar(&f.warmConcurrency, "warm-concurrency", 4, "warm-up requests in flight")
	fs.StringVar(&f.jsonOut, "json", "", "write the report as JSON to this file")
	fs.StringVar(&f.htmlOut, "html", "", "write the report as a self-contained HTML page to this file")
	fs.BoolVar(&f.compare, "compare", false, "compare two JSON reports given as arguments: --compare A.json B.json")
	fs.Var(&f.slos, "slo", "target, e.g. 'client=feed,p99<50ms,errors=0' (repeatable); exit 3 when missed")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	f.compareArgs = fs.Args()
	switch {
	case f.compare && len(f.compareArgs) != 2:
		return nil, fmt.Errorf("--compare takes two JSON reports, got %d arguments", len(f.compareArgs))
	case !f.compare && len(f.compareArgs) > 0:
		return nil, fmt.Errorf("unexpected arguments %q", f.compareArgs)
	case f.scenarioFile != "" && f.preset != "":
		return nil, errors.New("give --scenario or --preset, not both")
	case !f.compare && f.scenarioFile == "" && f.preset == "" && f.replay == "":
		return nil, errors.New("nothing to send: give --scenario FILE, --preset NAME or --replay TRACE")
	}
	if err := checkOverrides(fs, f); err != nil {
		return nil, err
	}
	return f, nil
}

// checkOverrides refuses an overriding flag given with a value out of
// its range, which would otherwise read as "not given" (the defaults of
// --missing and --skew are -1) or fail later under the scenario field's
// name.
func checkOverrides(fs *flag.FlagSet, f *flags) error {
	var errs []error
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "missing":
			if !(f.missing >= 0 && f.missing <= 1) {
				errs = append(errs, fmt.Errorf("--missing %v: want a share between 0 and 1", f.missing))
			}
		case "skew":
			if !(f.skew == 0 || f.skew > 1 && f.skew <= scenario.MaxSkew) {
				errs = append(errs, fmt.Errorf("--skew %v: want 0 (uniform) or an exponent above 1 and at most %d", f.skew, scenario.MaxSkew))
			}
		case "duration":
			if f.duration <= 0 {
				errs = append(errs, fmt.Errorf("--duration %v: want a positive duration", f.duration))
			}
		case "probe-every":
			if f.probeEvery < time.Millisecond {
				errs = append(errs, fmt.Errorf("--probe-every %v: want at least 1ms", f.probeEvery))
			}
		case "max-outstanding":
			if f.maxOutstanding < 1 {
				errs = append(errs, fmt.Errorf("--max-outstanding %d: want at least 1", f.maxOutstanding))
			}
		}
	})
	return errors.Join(errs...)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice-load:", err)
		return exitError
	}
	if f.compare {
		return compare(f, stdout, stderr)
	}
	code, err := load(ctx, f, stdout, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "sluice-load:", err)
		return exitError
	}
	return code
}

func compare(f *flags, stdout, stderr io.Writer) int {
	a, err := report.ReadJSON(f.compareArgs[0])
	if err == nil {
		var b *report.Report
		if b, err = report.ReadJSON(f.compareArgs[1]); err == nil {
			err = report.Compare(stdout, a, b, f.compareArgs[0], f.compareArgs[1])
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice-load:", err)
		return exitError
	}
	return exitOK
}

func load(ctx context.Context, f *flags, stdout, stderr io.Writer) (int, error) {
	targets, err := parseSLOs(f.slos)
	if err != nil {
		return exitError, err
	}
	opts, closeRecord, err := buildOptions(f, stderr)
	if err != nil {
		return exitError, err
	}
	if f.warm {
		if err := warm(ctx, f, opts.Scenario, stderr); err != nil {
			return exitError, err
		}
	}
	r, err := loadgen.Run(ctx, opts)
	if cerr := closeRecord(); err == nil {
		err = cerr
	}
	if err != nil {
		return exitError, err
	}
	for _, t := range targets {
		r.SLO = append(r.SLO, slo.Check(t, r)...)
	}
	if err := writeOutputs(f, r, stdout); err != nil {
		return exitError, err
	}
	if !slo.Met(r.SLO) {
		return exitSLOMissed, nil
	}
	return exitOK, nil
}

func parseSLOs(specs []string) ([]slo.Target, error) {
	var out []slo.Target
	for _, s := range specs {
		t, err := slo.Parse(s)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

func writeOutputs(f *flags, r *report.Report, stdout io.Writer) error {
	if err := report.WriteTable(stdout, r); err != nil {
		return err
	}
	if f.jsonOut != "" {
		if err := report.WriteFile(f.jsonOut, r, report.WriteJSON); err != nil {
			return err
		}
	}
	if f.htmlOut != "" {
		if err := report.WriteFile(f.htmlOut, r, report.WriteHTML); err != nil {
			return err
		}
	}
	return nil
}

// buildOptions assembles the run from the flags; the returned function
// flushes and closes the recorded trace.
func buildOptions(f *flags, stderr io.Writer) (loadgen.Options, func() error, error) {
	noop := func() error { return nil }
	s, err := buildScenario(f)
	if err != nil {
		return loadgen.Options{}, noop, err
	}
	opts := loadgen.Options{Target: f.target, Scenario: s, Speed: f.speed}
	if f.progress > 0 {
		opts.Progress, opts.ProgressEvery = stderr, f.progress
	}
	if f.metrics != "" {
		opts.Vitals = &vitals.Config{MetricsURL: f.metrics, PID: f.serverPID, Interval: f.sampleEvery}
		if f.memcached != "" {
			opts.Vitals.Memcached = strings.Split(f.memcached, ",")
		}
	}
	if f.probe != "" {
		opts.Probe = &probe.Config{Addr: f.probe, Every: f.probeEvery}
	}
	if f.replay != "" {
		if opts.Replay, err = readTrace(f.replay); err != nil {
			return loadgen.Options{}, noop, err
		}
	}
	if f.record == "" {
		return opts, noop, nil
	}
	file, err := os.Create(f.record)
	if err != nil {
		return loadgen.Options{}, noop, fmt.Errorf("--record: %w", err)
	}
	opts.Record = trace.NewWriter(file, f.recordURIs)
	return opts, func() error {
		err := opts.Record.Flush()
		return errors.Join(err, file.Close())
	}, nil
}

func readTrace(path string) ([]trace.Entry, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--replay: %w", err)
	}
	defer file.Close()
	entries, err := trace.Read(file)
	if err != nil {
		return nil, fmt.Errorf("--replay %s: %w", path, err)
	}
	return entries, nil
}

// buildScenario loads the scenario or preset and applies the overriding
// flags.
func buildScenario(f *flags) (scenario.Scenario, error) {
	var s scenario.Scenario
	var err error
	switch {
	case f.preset != "":
		s, err = scenario.Preset(f.preset, f.uris)
	case f.scenarioFile != "":
		s, err = scenario.Load(f.scenarioFile)
	default:
		s = scenario.Scenario{Name: "replay of " + f.replay}
	}
	if err != nil {
		return s, err
	}
	if f.without != "" {
		if s.Clients, err = without(s.Clients, strings.Split(f.without, ",")); err != nil {
			return s, err
		}
		s.Name += " without " + f.without
	}
	if f.uris != "" {
		s.URIs.File = f.uris
	}
	if f.rates != "" {
		if err := setRates(s.Clients, f.rates); err != nil {
			return s, err
		}
	}
	for i := range s.Clients {
		c := &s.Clients[i]
		if f.duration > 0 {
			c.Duration = f.duration
		}
		if f.maxOutstanding > 0 {
			c.MaxOutstanding = f.maxOutstanding
		}
		if c.URIs != nil && f.uris != "" {
			c.URIs.File = f.uris
		}
	}
	if f.duration > 0 {
		s.Duration = f.duration
	}
	if f.missing >= 0 {
		s.URIs.Missing = f.missing
		for i := range s.Clients {
			if c := &s.Clients[i]; c.URIs != nil {
				c.URIs.Missing = f.missing
			}
		}
	}
	if f.skew >= 0 {
		s.URIs.Skew = f.skew
		for i := range s.Clients {
			if c := &s.Clients[i]; c.URIs != nil {
				c.URIs.Skew = f.skew
			}
		}
	}
	return s, nil
}

// setRates applies --rate: each CLIENT=R gives the matching clients the
// constant rate R (replacing any steps). A pattern that matches no
// client is an error, so a typo is not a silent no-op.
func setRates(clients []scenario.Client, spec string) error {
	for _, kv := range strings.Split(spec, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		rate, err := strconv.ParseFloat(val, 64)
		if !ok || err != nil || !(rate > 0) {
			return fmt.Errorf("--rate %q: want CLIENT=REQUESTS_PER_S with a positive rate", kv)
		}
		prefix, wild := strings.CutSuffix(name, "*")
		matched := false
		for i := range clients {
			if c := &clients[i]; c.Name == name || (wild && strings.HasPrefix(c.Name, prefix)) {
				c.Rate, c.Steps, matched = rate, nil, true
			}
		}
		if !matched {
			return fmt.Errorf("--rate %q: no client of the scenario is named %s", kv, name)
		}
	}
	return nil
}

// without applies --without: the clients not named. A name that matches
// no client is an error, so a typo does not leave that client in.
func without(clients []scenario.Client, names []string) ([]scenario.Client, error) {
	for _, n := range names {
		if !slices.ContainsFunc(clients, func(c scenario.Client) bool { return c.Name == strings.TrimSpace(n) }) {
			return nil, fmt.Errorf("--without %q: no client of the scenario is named %s", n, strings.TrimSpace(n))
		}
	}
	var out []scenario.Client
	for _, c := range clients {
		keep := true
		for _, n := range names {
			keep = keep && c.Name != strings.TrimSpace(n)
		}
		if keep {
			out = append(out, c)
		}
	}
	return out, nil
}

func warm(ctx context.Context, f *flags, s scenario.Scenario, stderr io.Writer) error {
	if s.URIs.File == "" {
		return errors.New("--warm needs a URI file (--uris)")
	}
	uris, err := scenario.ReadURIs(s.URIs.File)
	if err != nil {
		return err
	}
	return loadgen.Warm(ctx, f.target, uris, f.warmBatch, f.warmConcurrency, stderr)
}
