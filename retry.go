package failover

import (
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// The retry policy: when a request goes once more to the upstream that
// just failed it rather than on to the next (call.again, in failover.go,
// asks plan.switching whether moving on costs anything), and the budget
// that bounds every retry the Transport makes.

// RetryConfig says when a request that failed at an upstream goes there
// once more after a short wait, rather than on to the next upstream: when
// the next would serve another model (Upstream.Models) or cost more
// (Upstream.Cost), or no other upstream takes the request. It does so
// after a 408, a 5xx but 501, a reset or refused connection, or a 429 or
// 5xx whose wait is at most MaxRetryAfter; never after a timeout, never
// past the caller's deadline, never into a circuit the failure opened, and
// once per upstream and request. Every retry (those of Config.Retries
// too) takes a place in a budget, so that an outage never multiplies the
// load; a retry the budget refuses is not made.
type RetryConfig struct {
	// Off turns off the retry at the same upstream. The budget still
	// bounds the rounds of Config.Retries.
	Off bool

	// MaxRetryAfter is the longest wait a request waits out at the same
	// upstream: a 429's cooldown, or a 5xx's Retry-After, each plus up
	// to 10 % of jitter. A wait unsaid is RetryWaitMin/2 to RetryWaitMin.
	// Zero means 5s.
	MaxRetryAfter time.Duration

	// BudgetRatio is the most retries in flight at once, as a fraction
	// (0 to 1) of the Transport's requests in flight. Zero means 0.2.
	BudgetRatio float64

	// BudgetMin is how many retries may be in flight whatever
	// BudgetRatio. Zero means 3.
	BudgetMin int
}

// Defaults of RetryConfig.
const (
	defaultMaxRetryAfter = 5 * time.Second
	defaultBudgetRatio   = 0.2
	defaultBudgetMin     = 3
)

func (c RetryConfig) validate() error {
	switch {
	case c.MaxRetryAfter < 0:
		return configError("Retry.MaxRetryAfter", "must not be negative")
	case !(c.BudgetRatio >= 0 && c.BudgetRatio <= 1):
		return configError("Retry.BudgetRatio", "must be from 0 to 1")
	case c.BudgetMin < 0:
		return configError("Retry.BudgetMin", "must not be negative")
	}
	return nil
}

// retryPolicy is RetryConfig with its defaults, and the budget.
type retryPolicy struct {
	off      bool
	maxAfter time.Duration
	budget   retryBudget
}

func (p *retryPolicy) init(c RetryConfig) {
	p.off = c.Off
	p.maxAfter = c.MaxRetryAfter
	if p.maxAfter == 0 {
		p.maxAfter = defaultMaxRetryAfter
	}
	p.budget.ratio = c.BudgetRatio
	if p.budget.ratio == 0 {
		p.budget.ratio = defaultBudgetRatio
	}
	p.budget.floor = int64(c.BudgetMin)
	if p.budget.floor == 0 {
		p.budget.floor = defaultBudgetMin
	}
}

// retryBudget bounds the retries in flight to a share of the requests in
// flight, with a floor (Envoy's retry budget).
type retryBudget struct {
	ratio    float64
	floor    int64
	active   atomic.Int64 // requests in the failover loop
	retrying atomic.Int64 // retries taken and not done
	denied   *metrics.Counter
}

// take takes a place for one retry, if the budget has one.
func (b *retryBudget) take() bool {
	for {
		n := b.retrying.Load()
		if n >= max(b.floor, int64(b.ratio*float64(b.active.Load()))) {
			b.denied.Inc()
			return false
		}
		if b.retrying.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// done gives back n places.
func (b *retryBudget) done(n int) {
	if n != 0 {
		b.retrying.Add(-int64(n))
	}
}

// retryWait returns how long a request waits at now before it goes again to
// a.u, whose attempt a failed it, and whether it may at all (see
// RetryConfig).
func (t *Transport) retryWait(a *attempt, now time.Time) (time.Duration, bool) {
	bound := t.retry.maxAfter
	switch {
	case a.o == RateLimited:
		// The cooldown its 429 set (its Retry-After, else the default;
		// an exhausted quota's is MaxCooldown), or a longer one.
		if d := a.u.cooling(now); d <= bound {
			return after(d), true
		}
		return 0, false
	case a.o != Failed:
		return 0, false
	case a.resp != nil:
		if code := a.resp.StatusCode; code != http.StatusRequestTimeout && (code < 500 || code == http.StatusNotImplemented) {
			return 0, false
		}
		if d, ok := RetryAfter(a.resp.Header, now); ok {
			return after(d), d <= bound
		}
	case a.err == nil || timedOut(a.err) || !errors.Is(a.err, syscall.ECONNRESET) && !errors.Is(a.err, syscall.ECONNREFUSED):
		return 0, false
	}
	return t.waitMin/2 + rand.N(t.waitMin-t.waitMin/2+1), true
}

// after is a wait of d that the upstream asked for, plus up to 10 %.
func after(d time.Duration) time.Duration {
	d = max(d, 0)
	return d + rand.N(min(d/10, math.MaxInt64-d)+1)
}

// retryMargin is how long, beyond its wait, a retry at u needs before the
// caller's deadline: u's recent median latency, at least RetryWaitMin.
func (t *Transport) retryMargin(u *upstream, now time.Time) time.Duration {
	return max(t.waitMin, u.recent.get(&u.window, now).p50)
}
