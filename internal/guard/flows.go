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
//
// Nor more than admission.unlisted_weight shares: each flow in use (its
// holder seen within unlistedIdle) has the default budget's weight while
// their sum stays within unlisted_weight, and an even part of it beyond.
// So with the defaults (64 flows, a weight of 8) eight unnamed callers
// weigh as much each as a listed client, and a flood holding all 64
// flows weighs eight listed clients together, not 64.

// unlistedPrefix starts the names of shared flows; it cannot begin a
// client name from metadata or a certificate.
const unlistedPrefix = "\x00unlisted/"

// unlistedIdle is how long an unlisted name keeps its flow without
// calling.
const unlistedIdle = 10 * time.Second

// recountEvery is how often the flows in use are counted afresh; between
// counts a flow newly given to a name adds one.
const recountEvery = 100 * time.Millisecond

var flowSeed = maphash.MakeSeed()

// unlistedFlows assigns unlisted names to flows. Its state is one holder
// per flow, whatever the number of names. Safe for concurrent use.
type unlistedFlows struct {
	mu      sync.Mutex
	holders []holder       // by flow
	byName  map[string]int // the flow each holder holds
	names   []string       // the flows' names, by flow, built once per flow count

	inUse     int       // flows whose holder was seen within unlistedIdle, as of countedAt (and given since)
	countedAt time.Time // when inUse was last counted
}

type holder struct {
	name string
	seen time.Time
}

// flow returns the name of the flow, among n, that name's requests count
// against at now, and how many flows are in use.
func (u *unlistedFlows) flow(name string, n int, now time.Time) (flow string, inUse int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.holders) != n { // first use, or the config changed
		u.holders, u.byName, u.names = make([]holder, n), make(map[string]int, n), flowNames(n)
		u.countedAt = time.Time{}
	}
	i := u.pick(name, n, now)
	if now.Sub(u.countedAt) >= recountEvery || now.Before(u.countedAt) {
		u.inUse, u.countedAt = u.countInUse(now), now
	}
	return u.names[i], max(u.inUse, 1)
}

// countInUse counts the flows whose holder was seen within unlistedIdle
// of now; u.mu must be held.
func (u *unlistedFlows) countInUse(now time.Time) int {
	n := 0
	for _, h := range u.holders {
		if h.name != "" && now.Sub(h.seen) < unlistedIdle {
			n++
		}
	}
	return n
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
		u.inUse++ // counted afresh within recountEvery
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
	name, inUse := u.flow(client, cfg.Flows(), now)
	return name, unlistedWeight(cfg, inUse)
}

// unlistedWeight is each unlisted flow's weight while inUse of them are in
// use: the default budget's, or an even part of unlisted_weight when
// inUse flows at the default would weigh more together.
func unlistedWeight(cfg budget.Config, inUse int) float64 {
	return min(cfg.Default.FairWeight(), cfg.UnlistedShare()/float64(max(inUse, 1)))
}
