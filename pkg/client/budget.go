package client

import "sync"

// retryBudget keeps retries to a share of requests, as in the SRE book's
// per-client retry budget: every first attempt earns ratio of a token,
// up to burst tokens; a retry spends a whole one. With ratio 0.1, retries
// stay under about 10% of requests once the saved burst is spent.
type retryBudget struct {
	mu           sync.Mutex
	tokens       float64
	ratio, burst float64
}

func newRetryBudget(ratio, burst float64) *retryBudget {
	return &retryBudget{tokens: burst, ratio: ratio, burst: burst}
}

func (b *retryBudget) earn() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.tokens+b.ratio, b.burst)
}

// spend takes a token for one retry, reporting whether there was one.
func (b *retryBudget) spend() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1-1e-9 { // ten earns of 0.1 add up to 0.999…

		return false
	}
	b.tokens = max(b.tokens-1, 0)
	return true
}
