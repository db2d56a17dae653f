package guard

import (
	"hash/maphash"
	"strconv"

	"github.com/sluice-dev/sluice/internal/guard/budget"
)

// Fair-queuing flows. A client named in the admission config has a flow
// of its own, weighted as the config says. Every other caller is hashed
// onto one of a fixed number of shared flows (admission.unlisted_flows)
// with the default budget's weight, so callers that invent names take at
// most that many shares between them, and the queue's state does not
// grow with the names it sees.

// unlistedPrefix starts the names of shared flows; it cannot begin a
// client name from metadata or a certificate.
const unlistedPrefix = "\x00unlisted/"

var flowSeed = maphash.MakeSeed()

// flowOf returns the flow and weight client's waiting requests count
// against under cfg.
func flowOf(cfg budget.Config, client string) (name string, weight float64) {
	if b, ok := cfg.Clients[client]; ok {
		return client, b.FairWeight()
	}
	bucket := maphash.String(flowSeed, client) % uint64(cfg.Flows())
	return unlistedPrefix + strconv.FormatUint(bucket, 10), cfg.Default.FairWeight()
}
