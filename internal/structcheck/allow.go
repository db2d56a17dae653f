package structcheck

// Allowed is the allow-list: the only functions of the module that may
// start goroutines or hold an errgroup. A key is the package directory
// relative to the module root and the function's name as a stack trace
// prints it; the value says what kind of site it is and why its work is
// bounded. Keep each entry to one line, and keep the list short: a site
// belongs here only when its goroutines are part of the process's
// lifecycle or a client-side fan-out with a configured limit.
var Allowed = map[string]Site{
	// Server lifecycle.
	"internal/app.(*App).Serve":               lifecycle("server start: the gRPC server, the admin server, the drain watcher and the journal follower's two loops, joined before Serve returns"),
	"internal/guard.(*Server).Drain":          lifecycle("drain: one goroutine runs GracefulStop and is joined before Drain returns; past the deadline one more runs Stop, joined with it unless a handler outlives HandlerGrace"),
	"internal/guard.(*Server).Serve":          lifecycle("the silent-stream sweep: one goroutine, stopped when Serve returns"),
	"internal/telemetry.newAsyncWriter":       lifecycle("the log writer: one goroutine per writer, ends when the writer is closed"),
	"cmd/sluice.serve":                        lifecycle("SIGHUP reload loop: one goroutine, ends with the serve context"),
	"cmd/sluice.followSaturation":             lifecycle("the processors follower (package procs): one goroutine, ends with the serve context"),
	"internal/store/cqlstore.(*Store).reopen": lifecycle("replaces stuck CQL sessions: one goroutine at a time (it holds the healer's lock), at most once per stuckAfter; Close waits for it"),

	// Stream end: one context.AfterFunc per admitted stream, at most max_streams; a unary stream's handler stops it on return, so it runs only for a stream that ends first.
	"internal/guard.(*Server).tapHandle": lifecycle("gives back an admitted stream's byte reservation and slot when the stream ends"),

	// Timers of the item queue: one per waiter, and the queue bounds waiters.
	"internal/guard/queue.SystemClock.AfterFunc": spawner("the queue's clock; only the queue may call it"),

	// The one server-side fan-out: its limit is the method's policy.
	"internal/guard/fanout.Each": errgroupSite("bounded fan-out under the policy's per-request concurrency"),

	// Client side: the Go client, the load harness and the benchmarks.
	"pkg/client.(*Client).GetPostRecords": errgroupSite("chunks in parallel, at most Limits.Parallelism at once"),
	"internal/loadgen.Run":                errgroupSite("one sampler and one progress printer, then one driver per plan"),
	"internal/loadgen.driver.run":         errgroupSite("sends at most the client's MaxOutstanding at once"),
	"internal/loadgen.Warm":               errgroupSite("cache warm-up at the configured concurrency"),
	"bench/throughput.loop":               errgroupSite("benchmark workers at the run's concurrency"),
	"bench/throughput.StoreRead":          errgroupSite("benchmark store reads at the run's fan-out"),
	"bench/throughput.WritePath":          errgroupSite("benchmark writers and readers, as many as the run names"),

	// Benchmark baselines, unguarded on purpose: they are what the benchmarks measure sluice against.
	"bench/naive.(*Service).GetPostRecords": unguarded("the naive baseline's one goroutine per URI, the design sluice replaces"),
	"bench/naive/cmd/sluice-naive.run":      lifecycle("the naive baseline's admin server and drain watcher"),
	"bench/peer.NewServer":                  unguarded("the bare peer: a plain gRPC server, no policies"),
	"bench/peer.(*Service).getMulti":        errgroupSite("the bare peer's GetMulti chunks under a constant limit"),
	"bench/peer/cmd/sluice-peer.run":        unguarded("the bare peer's server and its drain watcher"),
}

// ErrgroupDirs are the only package directories (with what lies below
// them) where an errgroup site may be listed: the server's one fan-out,
// and the client side — the Go client, the load harness and its command,
// and the benchmarks.
var ErrgroupDirs = []string{
	"internal/guard/fanout",
	"pkg",
	"internal/loadgen",
	"cmd/sluice-load",
	"bench",
}

// TestSupport lists the packages whose non-test files count as test code:
// they may start goroutines and use errgroups freely, and only test files
// and other test-support packages may import them.
var TestSupport = []string{
	"internal/testenv",
	"internal/app/apptest",
	"internal/store/storetest",
	"internal/store/cqlstore/cqltest",
}

// MaxConstLimit is the largest constant an errgroup limit may be; a larger
// one is as good as none.
const MaxConstLimit = 1024

// Site is one allow-listed function: what it may do and why.
type Site struct {
	Kind   Kind
	Reason string
}

// Kind says what an allow-listed site may do.
type Kind int

const (
	// Lifecycle sites start goroutines of fixed work; they carry no fact,
	// so their callers are not refused.
	Lifecycle Kind = iota + 1
	// Spawner sites run a function their caller passes; they keep their
	// fact, so callers outside their own package are refused.
	Spawner
	// ErrgroupSite sites hold errgroups under the limit rule and may call
	// their Go and TryGo; they carry no fact.
	ErrgroupSite
	// Unguarded sites are benchmark baselines, unguarded on purpose: they
	// may register services and start goroutines, hold errgroups under the
	// limit rule, and carry no fact; only packages under bench/ may import
	// their packages, so nothing sluice serves can reach them.
	Unguarded
)

func lifecycle(reason string) Site    { return Site{Lifecycle, reason} }
func spawner(reason string) Site      { return Site{Spawner, reason} }
func errgroupSite(reason string) Site { return Site{ErrgroupSite, reason} }

func unguarded(reason string) Site { return Site{Unguarded, reason} }
