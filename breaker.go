package failover

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/circuitbreaker"
)

// BreakerConfig sets when the circuit of an upstream opens and closes.
//
// By default a circuit opens after FailureThreshold consecutive failures.
// Real providers fail a fraction of a percent of requests on a good day; a
// rule that counts failures within a period trips on that noise alone at a
// few hundred requests per second, while consecutive failures at that rate
// are vanishingly rare. Set FailureRate for partial outages, where an
// upstream fails often but not every time.
type BreakerConfig struct {
	// FailureThreshold is how many consecutive failures open the circuit.
	// Zero means 5. Ignored when FailureRate is set.
	FailureThreshold uint

	// FailureRate, when set (0 < rate <= 1), opens the circuit when at
	// least that fraction of at least MinRequests requests within
	// FailurePeriod failed.
	FailureRate float64

	// MinRequests is the fewest requests within FailurePeriod for
	// FailureRate to apply. Zero means 20.
	MinRequests uint

	// FailurePeriod is the sliding window of FailureRate. Zero means 10s.
	FailurePeriod time.Duration

	// Cooldown is how long a circuit stays open before one probe request
	// is let through. Zero means 30s.
	Cooldown time.Duration

	// SuccessThreshold is how many consecutive probe successes close the
	// circuit; probes go one at a time. Zero means 1.
	SuccessThreshold uint
}

// Defaults of BreakerConfig.
const (
	defaultFailureThreshold = 5
	defaultMinRequests      = 20
	defaultFailurePeriod    = 10 * time.Second
	defaultBreakerCooldown  = 30 * time.Second
)

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
	if c.SuccessThreshold == 0 {
		c.SuccessThreshold = 1
	}
	return c
}

func (c BreakerConfig) validate() error {
	switch {
	case c.FailureRate < 0 || c.FailureRate > 1 || c.FailureRate != c.FailureRate:
		return configError("Breaker.FailureRate", "must be within [0, 1]")
	case c.FailurePeriod < 0:
		return configError("Breaker.FailurePeriod", "must not be negative")
	case c.Cooldown < 0:
		return configError("Breaker.Cooldown", "must not be negative")
	}
	return nil
}

// State is the state of a circuit.
type State int32

// States of a circuit.
const (
	Closed   State = iota // requests flow
	Open                  // requests are refused until the cooldown ends
	HalfOpen              // one probe at a time decides
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

// breaker is the circuit of one upstream: failsafe-go's circuit breaker
// counts and decides, and this type adds what a RoundTripper needs around
// it:
//
//   - A lock-free fast path: while the circuit is closed, allow reads one
//     atomic and takes no lock.
//   - A single-flight probe whatever SuccessThreshold is: failsafe-go's
//     half-open state admits SuccessThreshold requests at once, so the
//     probe gate here lets one through at a time, and a probe that ends
//     with no verdict (the caller canceled, a 429) hands the gate on
//     without recording anything (failsafe-go has no neutral outcome).
//     A probe still out after Cooldown is presumed hung and the next
//     request probes instead; Reset frees the gate.
//   - A generation that drops results of requests admitted before the
//     last state change, so a slow success from before the circuit opened
//     can never close it.
type breaker struct {
	cb    circuitbreaker.CircuitBreaker[*http.Response]
	state atomic.Int32 // State; mirrors cb, written under mu
	gen   atomic.Uint64
	trips atomic.Uint64

	// The probe gate: the token of the probe in flight (0: none) and
	// when it started. Tokens come from probeSeq, under mu.
	probe      atomic.Uint64
	probeStart atomic.Int64
	probeSeq   uint64
	probeTTL   time.Duration

	// clean is true while the circuit is closed and its window holds no
	// failure, under the consecutive-failure rule (counting): a success
	// then changes nothing, and done skips both locks.
	clean     atomic.Bool
	counting  bool
	threshold int // FailureThreshold

	since atomic.Int64 // unix nanoseconds of the last state change; 0: never changed

	// With Config.Shared: openUntil, when not 0, is when the open
	// circuit's cooldown ends (unix nanoseconds), as the fleet said,
	// instead of cb's delay; mayProbe says whether this process may send
	// the half-open probe (it holds the fleet's probe lease).
	openUntil atomic.Int64
	mayProbe  func(now time.Time) bool
	failing   atomic.Bool // the last attempt that counted failed

	// onChange, when set, is called after every state change, outside
	// mu (for logs, metrics and Config.OnStateChange).
	onChange func(stateChange)

	// mu serializes the calls that can change cb's state, so that
	// state and gen follow cb's changes in order; changes collects
	// them for onChange.
	mu      sync.Mutex
	changes []stateChange
	remote  bool // the changes under way come from the fleet (Config.Shared)
}

type stateChange struct {
	from, to State
	at       time.Time
	remote   bool // made to follow the fleet, not by this process's requests
}

func newBreaker(c BreakerConfig) *breaker {
	b := &breaker{probeTTL: c.Cooldown, counting: c.FailureRate == 0, threshold: int(min(c.FailureThreshold, 1000))}
	b.clean.Store(b.counting)
	builder := circuitbreaker.NewBuilder[*http.Response]().
		WithDelay(c.Cooldown).
		WithSuccessThreshold(c.SuccessThreshold).
		OnStateChanged(b.changed)
	if c.FailureRate > 0 {
		builder = builder.WithFailureRateThreshold(c.FailureRate, c.MinRequests, c.FailurePeriod)
	} else {
		builder = builder.WithFailureThreshold(c.FailureThreshold)
	}
	b.cb = builder.Build()
	return b
}

// changed is failsafe-go's listener. It runs on the goroutine that caused
// the change, after failsafe-go released its own lock, while b.mu is held.
func (b *breaker) changed(e circuitbreaker.StateChangedEvent) {
	from, to := State(e.OldState), State(e.NewState)
	at := time.Now()
	b.state.Store(int32(to))
	b.since.Store(at.UnixNano())
	b.gen.Add(1)
	b.openUntil.Store(0)
	b.failing.Store(false)
	if from == Closed && to == Open {
		b.trips.Add(1)
	}
	b.changes = append(b.changes, stateChange{from, to, at, b.remote})
}

// permit is the right to send one request, to be settled with done.
type permit struct {
	gen   uint64
	probe uint64 // the probe's token; 0 for a request through a closed circuit
}

// allow reports whether a request may go to the upstream now, and the
// permit to settle with done when it did.
func (b *breaker) allow() (permit, bool) {
	gen := b.gen.Load() // before the state, as gobreaker reads them
	if State(b.state.Load()) == Closed {
		return permit{gen: gen}, true
	}
	now := time.Now()
	if b.probeInFlight(now) {
		return permit{}, false
	}
	b.mu.Lock()
	switch b.cb.State() {
	case circuitbreaker.ClosedState:
		p := permit{gen: b.gen.Load()} // closed since the atomic was read
		b.mu.Unlock()
		return p, true
	case circuitbreaker.OpenState:
		if b.openLeft(now) > 0 || (b.mayProbe != nil && !b.mayProbe(now)) {
			b.mu.Unlock()
			return permit{}, false
		}
		b.cb.HalfOpen()
	case circuitbreaker.HalfOpenState:
		// Another request took the probe meanwhile, or another process
		// of the fleet holds it.
		if b.probeInFlight(now) || (b.mayProbe != nil && !b.mayProbe(now)) {
			b.mu.Unlock()
			return permit{}, false
		}
	}
	b.probeSeq++
	p := permit{gen: b.gen.Load(), probe: b.probeSeq}
	b.probeStart.Store(now.UnixNano())
	b.probe.Store(p.probe)
	changes := b.takeChanges()
	b.mu.Unlock()
	if len(changes) > 0 {
		defer func() {
			if r := recover(); r != nil { // a hook panicked: the probe never goes
				b.releaseProbe(p)
				panic(r)
			}
		}()
		b.notify(changes)
	}
	return p, true
}

// probeInFlight reports whether a probe holds the gate at now. A probe
// older than probeTTL is presumed hung (no AttemptTimeout and a caller
// without a deadline) and the next request takes over.
func (b *breaker) probeInFlight(now time.Time) bool {
	return b.probe.Load() != 0 && now.UnixNano()-b.probeStart.Load() < int64(b.probeTTL)
}

// releaseProbe hands the probe gate on, if p still holds it.
func (b *breaker) releaseProbe(p permit) {
	if p.probe != 0 {
		b.probe.CompareAndSwap(p.probe, 0)
	}
}

// done settles a permit with the attempt's outcome. Outcomes that say
// nothing of the upstream's health (Canceled, AuthFailed, RateLimited)
// record nothing; a probe that ends with one of them hands the probe to
// the next request.
func (b *breaker) done(p permit, o Outcome) {
	var success bool
	switch o {
	case Success, Rejected:
		success = true
		if p.probe == 0 && b.clean.Load() {
			return // the hot path: nothing to count
		}
	case Failed:
	default:
		b.releaseProbe(p)
		return
	}
	b.mu.Lock()
	if b.gen.Load() == p.gen {
		if success {
			b.cb.RecordSuccess()
		} else {
			b.cb.RecordFailure()
		}
		b.failing.Store(!success)
		b.clean.Store(b.counting && State(b.state.Load()) == Closed && b.cb.Metrics().Failures() == 0)
	}
	b.releaseProbe(p)
	changes := b.takeChanges()
	b.mu.Unlock()
	b.notify(changes)
}

// probed records the verdict of an active probe: a failure counts like a
// failed request (it reopens a half-open circuit), and a success moves an
// open circuit to half-open at once, so that the next request probes it.
func (b *breaker) probed(o Outcome) {
	b.mu.Lock()
	switch st := b.cb.State(); {
	case o == Failed && st != circuitbreaker.OpenState:
		b.cb.RecordFailure()
	case (o == Success || o == Rejected) && st == circuitbreaker.OpenState:
		b.cb.HalfOpen()
	case (o == Success || o == Rejected) && st == circuitbreaker.ClosedState:
		b.cb.RecordSuccess()
	}
	b.clean.Store(b.counting && State(b.state.Load()) == Closed && b.cb.Metrics().Failures() == 0)
	changes := b.takeChanges()
	b.mu.Unlock()
	b.notify(changes)
}

// reset closes the circuit by hand, and frees the probe gate of a probe
// that may hang.
func (b *breaker) reset() {
	b.mu.Lock()
	b.cb.Close()
	b.probe.Store(0)
	b.clean.Store(b.counting && b.cb.Metrics().Failures() == 0)
	changes := b.takeChanges()
	b.mu.Unlock()
	b.notify(changes)
}

// remaining returns how long the circuit stays open (0 unless open).
func (b *breaker) remaining() time.Duration {
	if State(b.state.Load()) != Open {
		return 0
	}
	return b.openLeft(time.Now())
}

// openLeft is what is left of an open circuit's cooldown: the fleet's,
// when it set one, else cb's.
func (b *breaker) openLeft(now time.Time) time.Duration {
	if u := b.openUntil.Load(); u != 0 {
		return max(0, time.Duration(u-now.UnixNano()))
	}
	return b.cb.RemainingDelay()
}

// status returns the state as callers see it: an open circuit whose
// cooldown is over reads half-open, since the next request will probe.
func (b *breaker) status() State {
	s := State(b.state.Load())
	if s == Open && b.openLeft(time.Now()) == 0 {
		return HalfOpen
	}
	return s
}

// holdOpen opens the circuit until at least until, as another process of
// the fleet saw it open. An open circuit's cooldown only grows.
func (b *breaker) holdOpen(until time.Time) {
	now := time.Now()
	if !until.After(now) {
		return
	}
	b.mu.Lock()
	end := until.UnixNano()
	if b.cb.State() == circuitbreaker.OpenState {
		end = max(end, now.Add(b.openLeft(now)).UnixNano())
	} else {
		b.remote = true
		b.cb.Open()
		b.remote = false
	}
	b.openUntil.Store(end)
	b.clean.Store(false)
	changes := b.takeChanges()
	b.mu.Unlock()
	b.notify(changes)
}

// trip opens a closed circuit on the fleet's evidence (see
// fleet.failure). It is this process's change: the fleet hears of it.
func (b *breaker) trip() {
	if State(b.state.Load()) != Closed {
		return
	}
	b.mu.Lock()
	if b.cb.State() == circuitbreaker.ClosedState {
		b.cb.Open()
		b.clean.Store(false)
	}
	changes := b.takeChanges()
	b.mu.Unlock()
	b.notify(changes)
}

// closeRemote closes the circuit, as the fleet's probe found the upstream
// well.
func (b *breaker) closeRemote() {
	b.mu.Lock()
	if b.cb.State() != circuitbreaker.ClosedState {
		b.remote = true
		b.cb.Close()
		b.remote = false
		b.clean.Store(b.counting && b.cb.Metrics().Failures() == 0)
	}
	changes := b.takeChanges()
	b.mu.Unlock()
	b.notify(changes)
}

// Requires that b.mu is held.
func (b *breaker) takeChanges() []stateChange {
	if len(b.changes) == 0 {
		return nil
	}
	c := b.changes
	b.changes = nil
	return c
}

func (b *breaker) notify(changes []stateChange) {
	if b.onChange == nil {
		return
	}
	for _, c := range changes {
		b.onChange(c)
	}
}

// breakerOutcome is what an attempt counts for on the breaker: a request
// that no upstream could send (Rejected with an error) says nothing of the
// upstream.
func breakerOutcome(o Outcome, err error) Outcome {
	if o == Rejected && err != nil {
		return Canceled
	}
	return o
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
//
// A Breaker is safe for concurrent use by multiple goroutines.
type Breaker struct {
	next     http.RoundTripper
	classify Classifier
	b        *breaker
}

// NewBreaker returns a Breaker in front of next (http.DefaultTransport when
// nil) that judges attempts with classify ([DefaultClassifier] when nil). It
// returns an error naming the field of a config that can never work.
func NewBreaker(next http.RoundTripper, cfg BreakerConfig, classify Classifier) (*Breaker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if next == nil {
		next = http.DefaultTransport
	}
	if classify == nil {
		classify = DefaultClassifier
	}
	return &Breaker{next: next, classify: classify, b: newBreaker(cfg.withDefaults())}, nil
}

// RoundTrip implements http.RoundTripper.
func (br *Breaker) RoundTrip(req *http.Request) (*http.Response, error) {
	p, ok := br.b.allow()
	if !ok {
		closeBody(req)
		return nil, &unavailableError{err: ErrCircuitOpen, retryAfter: br.b.remaining()}
	}
	if p.probe != 0 {
		defer br.b.releaseProbe(p) // even if next panics
	}
	resp, err := br.next.RoundTrip(req)
	o := Canceled
	if req.Context().Err() == nil {
		o = br.classify(resp, err)
	}
	br.b.done(p, breakerOutcome(o, err))
	return resp, err
}

// State returns the circuit's state.
func (br *Breaker) State() State { return br.b.status() }

// Reset closes the circuit by hand.
func (br *Breaker) Reset() { br.b.reset() }
