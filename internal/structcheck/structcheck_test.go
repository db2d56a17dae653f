package structcheck_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/sluice-dev/sluice/internal/structcheck"
)

// fixtureAllowed is the allow-list of the fixtures under testdata.
var fixtureAllowed = map[string]structcheck.Site{
	"internal/guard.(*Server).Drain":             {Kind: structcheck.Lifecycle, Reason: "drain"},
	"internal/guard/queue.SystemClock.AfterFunc": {Kind: structcheck.Spawner, Reason: "the queue's clock"},
	"internal/guard/fanout.Each":                 {Kind: structcheck.ErrgroupSite, Reason: "the fan-out"},
	"internal/app.(*App).Serve":                  {Kind: structcheck.Lifecycle, Reason: "server start"},
	"internal/app.Gone":                          {Kind: structcheck.Lifecycle, Reason: "stale: no such function"},
	"internal/app.Idle":                          {Kind: structcheck.Lifecycle, Reason: "stale: starts nothing"},
	"cmd/tool.main":                              {Kind: structcheck.Lifecycle, Reason: "signal watcher"},
	"pkg/client.Plain":                           {Kind: structcheck.ErrgroupSite, Reason: "stale: creates no group"},
	"internal/rpc.Fan":                           {Kind: structcheck.ErrgroupSite, Reason: "a server package's errgroup"},
	"bench/baseline.NewServer":                   {Kind: structcheck.Unguarded, Reason: "the baseline's server"},
	"bench/cmd/runner.main":                      {Kind: structcheck.Unguarded, Reason: "runs the baseline"},
}

func init() {
	for _, name := range []string{
		"(*Client).GetPostRecords", "NoLimit", "Complement", "MinusOne", "MaxInt", "Zero", "IfFalse",
		"Unreachable", "Unset", "Raised", "LocalLimit", "(*Client).Arithmetic", "(*pool).Run",
		"Aliased", "Escapes", "Returned",
	} {
		fixtureAllowed["pkg/client."+name] = structcheck.Site{Kind: structcheck.ErrgroupSite, Reason: "fixture"}
	}
}

// Tests every rule on fixtures with one case per known evasion, each
// marked with the diagnostic or fact it must produce, and cases that must
// stay allowed (no marks).
func TestAnalyzer(t *testing.T) {
	a := structcheck.New(fixtureAllowed, []string{"internal/testenv"})
	analysistest.Run(t, analysistest.TestData(), a, "github.com/sluice-dev/sluice/...")
}
