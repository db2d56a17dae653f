package scenario

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// PresetDuration is how long a preset runs unless told otherwise.
const PresetDuration = 30 * time.Second

// presets builds the built-in scenarios. Both use the URI file given by
// the caller.
var presets = map[string]func() Scenario{
	// steady: the normal clients of a read path — small batches (1–50
	// URIs) at a few hundred requests/s in total, 2% of URIs missing.
	"steady": func() Scenario {
		return Scenario{Name: "steady", Duration: PresetDuration, Clients: normalClients()}
	},
	// incident: steady plus one quiet client sending 15,000–20,000-URI
	// batches at 3 requests/s, as in the April 2026 outage.
	"incident": func() Scenario {
		clients := append(normalClients(), Client{
			Name: "bulk", Rate: 3,
			Batch: Batch{Dist: Uniform, Min: 15_000, Max: 20_000},
		})
		return Scenario{Name: "incident", Duration: PresetDuration, Clients: clients}
	},
	// fair-share: steady plus eight heavy callers, each under its own name
	// and each far within the default budget (10 requests/s of 1,000
	// URIs), that together offer about 80,000 items/s: 110–150% of what a
	// 2-core machine serves from cache. Their deadline is 2s, the
	// method's timeout.
	"fair-share": func() Scenario {
		clients := normalClients()
		for i := range HeavyCallers {
			clients = append(clients, Client{
				Name: fmt.Sprintf("heavy-%d", i+1), Rate: 10, Timeout: 2 * time.Second,
				Batch: Batch{Dist: Fixed, Size: 1000},
			})
		}
		return Scenario{Name: "fair-share", Duration: PresetDuration, Clients: clients}
	},
	// split: steady plus one trusted caller, "indexer", sending
	// 20,000-URI batches at 2 requests/s (40,000 items/s, about half of
	// what a 2-core machine serves from cache) with a 10s deadline. The
	// server must let indexer split (oversize: split under the method's
	// policy, as config/bench.yaml does); any other server refuses every
	// such batch with InvalidArgument.
	"split": func() Scenario {
		clients := append(normalClients(), Client{
			Name: SplitCaller, Rate: 2, Timeout: 10 * time.Second,
			Batch: Batch{Dist: Fixed, Size: SplitBatch},
		})
		return Scenario{Name: "split", Duration: PresetDuration, Clients: clients}
	},
}

// SplitCaller and SplitBatch are the split preset's trusted caller and
// its batch size.
const (
	SplitCaller = "indexer"
	SplitBatch  = 20_000
)

// HeavyCallers is how many heavy callers the fair-share preset runs.
const HeavyCallers = 8

func normalClients() []Client {
	return []Client{
		{Name: "feed", Rate: 120, Batch: Batch{Dist: Uniform, Min: 1, Max: 50}},
		{Name: "thread", Rate: 80, Batch: Batch{Dist: Zipf, Min: 1, Max: 50, S: 1.3}},
		{Name: "notifications", Rate: 60, Batch: Batch{Dist: Uniform, Min: 1, Max: 25}},
		{Name: "search", Rate: 40, Batch: Batch{Dist: Exact, Sizes: []int{1, 10, 25, 50}}},
	}
}

// Preset returns the built-in scenario name reading URIs from uriFile,
// with 2% of them missing.
func Preset(name, uriFile string) (Scenario, error) {
	build, ok := presets[name]
	if !ok {
		return Scenario{}, fmt.Errorf("scenario: no preset %q; presets are %s", name, strings.Join(PresetNames(), ", "))
	}
	s := build()
	s.URIs = URISource{File: uriFile, Missing: 0.02}
	return s, nil
}

// PresetNames lists the built-in scenarios.
func PresetNames() []string {
	var names []string
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
