package guard

import (
	"math/bits"
	"sync"
	"time"
)

// Service-time estimates: for each method and each size class of request
// (1 item, 2–3, 4–7, … by powers of two), an exponentially weighted
// moving average of how long the handler took for successful requests.
// The guard refuses a request whose remaining deadline is shorter than
// its estimate, since it would only time out after doing the work.
const (
	sizeClasses = 16   // 1 … 32,768+ items
	ewmaWeight  = 0.2  // weight of the newest sample
	minSamples  = 8    // samples a class needs before it is trusted
	slackFactor = 0.75 // refuse only below this share of the estimate
	startFactor = 2.0  // start only with this multiple of the estimate left
)

type estimates struct {
	mu      sync.Mutex
	methods map[string]*[sizeClasses]ewma
}

type ewma struct {
	mean    float64 // seconds
	samples int
}

func newEstimates() *estimates { return &estimates{methods: map[string]*[sizeClasses]ewma{}} }

func sizeClass(cost int64) int {
	return min(bits.Len64(uint64(max(cost, 1)))-1, sizeClasses-1)
}

// observe records one successful request's service time.
func (e *estimates) observe(method string, cost int64, took time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	classes, ok := e.methods[method]
	if !ok {
		classes = new([sizeClasses]ewma)
		e.methods[method] = classes
	}
	c := &classes[sizeClass(cost)]
	if c.samples == 0 {
		c.mean = took.Seconds()
	} else {
		c.mean += ewmaWeight * (took.Seconds() - c.mean)
	}
	c.samples++
}

// expect returns the service time to expect for a request of cost items
// (scaled down by slackFactor so that only hopeless requests are
// refused), or 0 when there is not enough history.
func (e *estimates) expect(method string, cost int64) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	classes, ok := e.methods[method]
	if !ok {
		return 0
	}
	c := classes[sizeClass(cost)]
	if c.samples < minSamples {
		return 0
	}
	return time.Duration(c.mean * slackFactor * float64(time.Second))
}

// startMargin returns how much of its deadline a request of cost items
// should have left when it starts: startFactor times the estimate, so
// that one admitted on a busy machine still finishes before its deadline
// rather than ending DeadlineExceeded after holding capacity; 0 when
// there is not enough history.
func (e *estimates) startMargin(method string, cost int64) time.Duration {
	return time.Duration(float64(e.expect(method, cost)) / slackFactor * startFactor)
}
