package failover

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/failover-go/failover/internal/circuit"
)

// BreakerConfig sets when the circuit of an upstream opens and closes. By
// default it opens after FailureThreshold consecutive failures: providers
// fail a fraction of a percent of requests on a good day, which a count of
// failures per period would trip on at high traffic. Set FailureRate for
// partial outages, where an upstream fails often but not every time.
//
// An open circuit lets one probe through after its open time: Cooldown at
// first, then (f/24s)^1.5 seconds for an upstream failing for f, a curve
// steeper than f so that a blip is probed every second and a long outage
// about once a minute, less up to 10 % of jitter and at most MaxCooldown.
// f counts from when this process first saw the circuit open (its own trip
// or the fleet's); once the circuit closes, each healthy moment takes a
// share of f off, so that an upstream that fails again soon keeps its long
// open time and one healthy for as long as its last open time starts again
// at Cooldown.
type BreakerConfig struct {
	// FailureThreshold is how many consecutive failures open the circuit,
	// at most 1000. Zero means 5. Ignored when FailureRate is set.
	FailureThreshold uint

	// FailureRate, when set (0 < rate <= 1), opens the circuit when at
	// least that fraction of at least MinRequests requests within
	// FailurePeriod failed.
	FailureRate float64

	// MinRequests is the fewest requests within FailurePeriod for
	// FailureRate to apply. Zero means 20.
	MinRequests uint

	// FailurePeriod is the sliding window of FailureRate, at least 10ms.
	// Zero means 10s.
	FailurePeriod time.Duration

	// Cooldown is the shortest time a circuit stays open before one
	// probe request is let through, the open time of a first trip. Zero
	// means 1s.
	Cooldown time.Duration

	// MaxCooldown is the longest time a circuit stays open, however long
	// its upstream has been failing. Zero means 5m; less than Cooldown
	// means Cooldown, a fixed open time.
	MaxCooldown time.Duration

	// SuccessThreshold is how many consecutive probe successes close the
	// circuit, at most 1000; probes go one at a time. Zero means 1.
	SuccessThreshold uint
}

// Defaults of BreakerConfig.
const (
	defaultFailureThreshold   = 5
	defaultMinRequests        = 20
	defaultFailurePeriod      = 10 * time.Second
	defaultBreakerCooldown    = time.Second
	defaultBreakerMaxCooldown = 5 * time.Minute
)

// minProbeLife is the shortest time a half-open probe may take before the
// next request presumes it hung and probes instead: LLM requests take
// seconds, longer than the shortest open times.
const minProbeLife = 30 * time.Second

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.FailureThreshold == 0 {
		c.FailureThreshold = defaultFailureThreshold
	}
	if c.MinRequests == 0 {
		c.MinRequests = defaultMinRequests
	}
	if c.FailurePeriod == 0 {
		c.FailurePeriod = defaultFailurePeriod
	}
	if c.Cooldown == 0 {
		c.Cooldown = defaultBreakerCooldown
	}
	if c.MaxCooldown == 0 {
		c.MaxCooldown = defaultBreakerMaxCooldown
	}
	c.MaxCooldown = max(c.MaxCooldown, c.Cooldown)
	if c.SuccessThreshold == 0 {
		c.SuccessThreshold = 1
	}
	return c
}

// Bounds of BreakerConfig: failsafe-go keeps a bit per counted execution,
// and splits FailurePeriod into 10 buckets of whole nanoseconds.
const (
	maxBreakerCount  = 1000
	minFailurePeriod = 10 * time.Millisecond
)

func (c BreakerConfig) validate() error {
	switch {
	case c.FailureThreshold > maxBreakerCount:
		return configError("Breaker.FailureThreshold", "must be at most 1000")
	case c.FailureRate < 0 || c.FailureRate > 1 || c.FailureRate != c.FailureRate:
		return configError("Breaker.FailureRate", "must be within [0, 1]")
	case c.FailurePeriod < 0:
		return configError("Breaker.FailurePeriod", "must not be negative")
	case c.FailurePeriod > 0 && c.FailurePeriod < minFailurePeriod:
		return configError("Breaker.FailurePeriod", "must be at least 10ms (a time.Duration counts nanoseconds: 5 is 5ns)")
	case c.Cooldown < 0:
		return configError("Breaker.Cooldown", "must not be negative")
	case c.MaxCooldown < 0:
		return configError("Breaker.MaxCooldown", "must not be negative")
	case c.SuccessThreshold > maxBreakerCount:
		return configError("Breaker.SuccessThreshold", "must be at most 1000")
	}
	return nil
}

// State is the state of a circuit.
type State int32

// States of a circuit.
const (
	Closed   = State(circuit.Closed)   // requests flow
	Open     = State(circuit.Open)     // requests are refused until the open time ends
	HalfOpen = State(circuit.HalfOpen) // one probe at a time decides
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "unknown"
}

// MarshalText encodes the state as its [State.String] name.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// newCircuit returns the circuit of c (with defaults filled in), with the
// fleet's lease and the listener of hooks. A probe holds the gate for at
// least probeHang, the longest its attempt may take (0: none known).
func newCircuit(c BreakerConfig, probeHang time.Duration, lease func(time.Time, bool) bool, onChange func(circuit.Change)) *circuit.Circuit {
	return circuit.New(circuit.Config{
		FailureThreshold: c.FailureThreshold,
		FailureRate:      c.FailureRate,
		MinRequests:      c.MinRequests,
		FailurePeriod:    c.FailurePeriod,
		Cooldown:         c.Cooldown,
		MaxCooldown:      c.MaxCooldown,
		ProbeLife:        max(c.Cooldown, minProbeLife),
		ProbeHang:        probeHang,
		SuccessThreshold: c.SuccessThreshold,
		Lease:            lease,
		OnChange:         onChange,
	})
}

// Breaker is an http.RoundTripper that guards its next RoundTripper with one
// circuit breaker, the breaker layer of [Transport] on its own. Put it
// around the transport of one upstream: every request through it counts
// toward the same circuit.
//
// While the circuit is open, RoundTrip sends nothing and returns an error
// that matches [ErrCircuitOpen] and says how long is left
// ([RetryAfterError]). Responses and errors of the next RoundTripper are
// returned as they are; the classifier only decides what they count for.
// A next that returns neither gets an error, counted as a failure. The
// caller's cancellation, or an error its own body caused, counts for
// nothing.
//
// A Breaker is safe for concurrent use by multiple goroutines.
type Breaker struct {
	next     http.RoundTripper
	classify Classifier
	c        *circuit.Circuit
}

// NewBreaker returns a Breaker in front of next (http.DefaultTransport when
// nil) that judges attempts with classify ([DefaultClassifier] when nil). It
// returns an error naming the field of a config that can never work.
func NewBreaker(next http.RoundTripper, cfg BreakerConfig, classify Classifier) (*Breaker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if nilValue(next) {
		return nil, fmt.Errorf("failover: NewBreaker: next is a nil %T: leave it nil for http.DefaultTransport", next)
	}
	if next == nil {
		next = http.DefaultTransport
	}
	classify = checkedClassifier(classify)
	return &Breaker{next: next, classify: classify, c: newCircuit(cfg.withDefaults(), 0, nil, nil)}, nil
}

// RoundTrip implements http.RoundTripper.
func (br *Breaker) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	p, v := br.c.Allow(time.Now())
	if v.Refusal != circuit.None {
		closeBody(req)
		return nil, &unavailableError{err: ErrCircuitOpen, retryAfter: v.Wait}
	}
	defer br.c.Release(p) // even if next panics
	// Watched, as the Transport's attempts are: a bad body is the
	// caller's fault, not the upstream's.
	body, watch := watchBody(nil, req.Body, req.ContentLength)
	if orig := req; body != req.Body || watch != nil {
		req = watch.traced(req.WithContext(req.Context())) // a copy: the caller's request is not modified
		req.Body = body
		defer func() {
			if resp != nil && resp.Request == req {
				resp.Request = orig
			}
		}()
	}
	resp, err = br.next.RoundTrip(req)
	if resp == nil && err == nil {
		err = errNextNoResponse // a next that breaks the RoundTripper contract
	}
	o := Canceled
	if !canceled(req) && (err == nil || watch == nil || !watch.faulted(err)) {
		o = br.classify(resp, err)
	}
	br.c.Done(p, circuitResult(o, err), time.Now())
	return resp, err
}

// errNextNoResponse is what a [Breaker] or a [RateLimiter] returns for a
// next RoundTripper that returned neither a response nor an error.
var errNextNoResponse = errors.New("failover: next RoundTripper returned no response and no error")

// State returns the circuit's state.
func (br *Breaker) State() State { return State(br.c.Status(time.Now())) }

// Reset closes the circuit by hand.
func (br *Breaker) Reset() { br.c.Reset(time.Now()) }

// failing reports whether u's circuit counts failures in a row and, with
// the requests in flight at u, has as many as would open it if those
// failed too ([ReasonFailing]), so that no more requests reach u than open
// its circuit. One failure alone is background noise and holds nothing
// back, unless the next would open the circuit.
func (u *upstream) failing() bool {
	f := u.circuit.Streak()
	if f == 0 {
		return false
	}
	threshold := u.circuit.Threshold()
	return f >= min(2, threshold-1) && f+int(u.live.inflight.Load()) >= threshold
}
