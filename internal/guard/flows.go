package guard

import (
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/guard/budget"
)

// Fair-queuing flows. A client named in the admission config has a flow
// of its own, weighted as the config says. Every other caller shares one
// of a fixed number of flows (admission.unlisted_flows) with the default
// budget's weight, so callers that invent names take at most that many
// shares between them, and the queue's state does not grow with the
// names it sees.
//
// An unlisted name is given a flow no other name holds while one is free
// (never used, or its holder unseen for unlistedIdle), starting with the
// one its name hashes to, and keeps it while it keeps calling; once every
// flow is held, further names share the flow they hash to. So up to
// unlisted_flows unlisted callers of equal weight get equal shares, not
// the lottery of a hash, and a flood of names still gets no more than
// unlisted_flows shares.

// unlistedPrefix starts the names of shared flows; it cannot begin a
// client name from metadata or a certificate.
const unlistedPrefix = "\x00unlisted/"

// unlistedIdle is how long an unlisted name keeps its flow without
// calling.
const unlistedIdle = 10 * time.Second

var flowSeed = maphash.MakeSeed()

// unlistedFlows assigns unlisted names to flows. Its state is one holder
// per flow, whatever the number of names. Safe for concurrent use.
type unlistedFlows struct {
	mu      sync.Mutex
	holders []holder       // by flow
	byName  map[string]int // the flow each holder holds
	names   []string       // the flows' names, by flow, built once per flow count
}

type holder struct {
	name string
	seen time.Time
}

// flow returns the name of the flow, among n, that name's requests count
// against at now.
func (u *unlistedFlows) flow(name string, n int, now time.Time) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.holders) != n { // first use, or the config changed
		u.holders, u.byName, u.names = make([]holder, n), make(map[string]int, n), flowNames(n)
	}
	return u.names[u.pick(name, n, now)]
}

// pick returns the index of the flow name holds, giving it one if it
// holds none; u.mu must be held.
func (u *unlistedFlows) pick(name string, n int, now time.Time) int {
	if i, ok := u.byName[name]; ok {
		u.holders[i].seen = now
		return i
	}
	hashed := int(maphash.String(flowSeed, name) % uint64(n))
	for k := range n {
		i := (hashed + k) % n
		h := &u.holders[i]
		if h.name != "" && now.Sub(h.seen) < unlistedIdle {
			continue
		}
		delete(u.byName, h.name)
		*h = holder{name: name, seen: now}
		u.byName[name] = i
		return i
	}
	return hashed
}

// flowNames are the names of n shared flows, built once so that a
// request names its flow without building a string.
func flowNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = unlistedPrefix + strconv.Itoa(i)
	}
	return names
}

// flowOf returns the flow and weight client's waiting requests count
// against under cfg.
func (u *unlistedFlows) flowOf(cfg budget.Config, client string, now time.Time) (name string, weight float64) {
	if b, ok := cfg.Clients[client]; ok {
		return client, b.FairWeight()
	}
	return u.flow(client, cfg.Flows(), now), cfg.Default.FairWeight()
}
