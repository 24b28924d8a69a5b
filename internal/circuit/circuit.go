// Package circuit is the circuit breaker of one upstream: failsafe-go's
// breaker counts failures and decides when to trip and close, and this
// package adds what a RoundTripper needs around it, with the time passed in
// as golang.org/x/time/rate takes it: a two-step Allow/Done with a
// lock-free path while closed, a single-flight half-open probe, a
// generation that drops results from before the last state change, the
// open state's deadline on the monotonic clock, and HoldOpen, CloseRemote,
// Trip and a Lease hook for a fleet that shares circuits. State changes go
// to OnChange after the lock is released, on the goroutine that made them.
// docs/design.md has the details.
package circuit

import (
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/circuitbreaker"

	"github.com/failover-go/failover/internal/mono"
)

// State is the state of a circuit; its values are those of failover.State.
type State int32

// States of a circuit.
const (
	Closed State = iota
	Open
	HalfOpen
)

// Result is what an attempt says of the upstream's health.
type Result int

// Results of an attempt.
const (
	// Neutral says nothing of the upstream: the caller canceled, a 401,
	// a 429. A probe that ends so hands the gate on.
	Neutral Result = iota
	Success
	Failure
)

// Refusal is why Allow or Check refuses a request.
type Refusal int

// Refusals.
const (
	// None: the circuit takes the request.
	None Refusal = iota
	// Opened: the circuit is open; Verdict.Wait says for how long.
	Opened
	// Probing: a half-open probe of this process is in flight.
	Probing
	// Elsewhere: the circuit is ready to probe, but another process of
	// the fleet holds the probe's lease (Config.Lease said no).
	Elsewhere
)

// Verdict is the circuit's answer to "may a request go now?".
type Verdict struct {
	Refusal Refusal
	// Wait is how long the circuit stays open, with Opened; 0 otherwise
	// (a probe may end at any moment).
	Wait time.Duration
}

// Config configures a Circuit. Zero values are not defaults here: the
// caller (package failover) fills them in.
type Config struct {
	FailureThreshold uint          // consecutive failures that trip; ignored with FailureRate
	FailureRate      float64       // when > 0: the failure rate that trips
	MinRequests      uint          // with FailureRate
	FailurePeriod    time.Duration // with FailureRate
	Cooldown         time.Duration // the shortest open time (see OpenTime)
	MaxCooldown      time.Duration // the longest open time; at least Cooldown
	ProbeLife        time.Duration // a probe's lifetime, and how long a closed circuit is Recovering; at least Cooldown
	ProbeHang        time.Duration // how long a probe in flight holds the gate before it is presumed hung; at least ProbeLife
	SuccessThreshold uint          // consecutive probe successes that close

	// Lease, when set, reports whether this process may send the
	// half-open probe at now (it holds the fleet's lease). With ask, it
	// may ask for the lease, without waiting for it; Check calls it
	// without. Nil means always.
	Lease func(now time.Time, ask bool) bool

	// OnChange, when set, is called after every state change, outside
	// the circuit's lock, on the goroutine that made it.
	OnChange func(Change)
}

// Change is one change of a circuit's state.
type Change struct {
	From, To State
	At       time.Time
	Remote   bool // made to follow the fleet (HoldOpen, CloseRemote)
}

// Permit is the right to send one request, to be settled with Done.
type Permit struct {
	gen   uint64
	probe uint64    // the probe's token; 0 for a request through a closed circuit
	start mono.Time // when it was given: how new its result's evidence is
}

// Probe reports whether the permit is the half-open probe.
func (p Permit) Probe() bool { return p.probe != 0 }

// Start is when the permit was given, on the monotonic clock (the now
// Allow was given, converted); zero for the zero Permit.
func (p Permit) Start() mono.Time { return p.start }

// Circuit is the breaker of one upstream. It is safe for concurrent use.
type Circuit struct {
	cfg Config
	cb  circuitbreaker.CircuitBreaker[*http.Response]

	// state is cb's state as its listener last reported it, and gen
	// counts those reports: both are written only under mu, by the
	// listener, and read without it on the fast path.
	state atomic.Int32
	gen   atomic.Uint64
	trips atomic.Uint64
	since atomic.Int64 // mono.Time of the last state change; 0: never changed

	// The probe gate: the token of the probe in flight (0: none) and
	// when it started (a mono.Time).
	probe      atomic.Uint64
	probeStart atomic.Int64

	// openUntil is when the open state ends (a mono.Time), while open.
	// held says it was set by the fleet (HoldOpen), not by a trip here.
	openUntil atomic.Int64
	held      atomic.Bool

	// episode is when the upstream's failing episode began (a mono.Time;
	// 0: none yet): the open time grows with its age. lastOpen is how
	// long the circuit last opened for. Both are written under mu.
	episode  atomic.Int64
	lastOpen atomic.Int64

	// clean is true while the circuit is closed and its window holds no
	// failure under the consecutive-failure rule: a success then changes
	// nothing, and Done takes no lock.
	clean atomic.Bool

	// succ lets Done count a success without mu while clean is false:
	// it adds to a pending count, which the next holder of mu hands to
	// cb first (lock). It also holds whether the last attempt that
	// counted failed. See the succ* constants.
	succ atomic.Uint64

	// streak is how many failures in a row a closed circuit counts under
	// the consecutive-failure rule; 0 otherwise. Written under mu, read
	// without it (Streak).
	streak atomic.Int32

	// lastFailure is when the attempt of the latest counted failure
	// started (a mono.Time): a success of an attempt that started before
	// it is older evidence and resets nothing.
	lastFailure atomic.Int64

	// mu serializes every call into cb, so that state, gen and the
	// changes follow cb in order.
	mu       sync.Mutex
	probeSeq uint64
	now      time.Time // the now of the call under way, for the listener
	remote   bool      // the call under way follows the fleet
	changes  []Change
}

// The bits of Circuit.succ: the successes pending (at most
// FailureThreshold-1); an epoch that each release of mu advances, so that
// a success that read the circuit before a holder of mu changed it fails
// its compare-and-swap; whether mu is held; and whether the last attempt
// that counted failed.
const (
	succPending uint64 = 1<<16 - 1
	succEpoch   uint64 = 1 << 16 // its unit; the epoch has bits 16-61
	succEpochs  uint64 = (1<<62 - 1) &^ succPending
	succFailing uint64 = 1 << 62
	succLocked  uint64 = 1 << 63
)

// New returns a closed circuit.
func New(cfg Config) *Circuit {
	cfg.MaxCooldown = max(cfg.MaxCooldown, cfg.Cooldown)
	cfg.ProbeLife = max(cfg.ProbeLife, cfg.Cooldown)
	cfg.ProbeHang = max(cfg.ProbeHang, cfg.ProbeLife)
	c := &Circuit{cfg: cfg}
	c.clean.Store(c.Counting())
	b := circuitbreaker.NewBuilder[*http.Response]().
		WithDelay(cfg.Cooldown). // never consulted: openUntil rules
		WithSuccessThreshold(cfg.SuccessThreshold).
		OnStateChanged(c.changed)
	if cfg.FailureRate > 0 {
		b = b.WithFailureRateThreshold(cfg.FailureRate, cfg.MinRequests, cfg.FailurePeriod)
	} else {
		b = b.WithFailureThreshold(cfg.FailureThreshold)
	}
	c.cb = b.Build()
	return c
}

// Counting reports whether the circuit trips on consecutive failures (not
// on a failure rate).
func (c *Circuit) Counting() bool { return c.cfg.FailureRate == 0 }

// Threshold is FailureThreshold, at most 1000.
func (c *Circuit) Threshold() int { return int(min(c.cfg.FailureThreshold, 1000)) }

// ProbeLife is how long a probe may take before the next request takes
// over, and how long a closed circuit is Recovering.
func (c *Circuit) ProbeLife() time.Duration { return c.cfg.ProbeLife }

// MaxCooldown is the longest an open circuit stays open.
func (c *Circuit) MaxCooldown() time.Duration { return c.cfg.MaxCooldown }

// changed is failsafe-go's listener. It runs on the goroutine that caused
// the change, after failsafe-go released its own lock, while c.mu is held.
func (c *Circuit) changed(e circuitbreaker.StateChangedEvent) {
	from, to := State(e.OldState), State(e.NewState)
	at := mono.Of(c.now)
	prev := mono.Time(c.since.Load())
	c.state.Store(int32(to))
	c.since.Store(int64(at))
	c.gen.Add(1)
	c.succ.And(^succFailing) // mu is held: no success is being added
	c.held.Store(false)
	c.openUntil.Store(0)
	c.streak.Store(0)
	if to == Open {
		if from == Closed {
			c.trips.Add(1)
			c.episode.Store(int64(c.resume(at, prev)))
		}
		d := OpenTime(at.Sub(mono.Time(c.episode.Load())), c.cfg.Cooldown, c.cfg.MaxCooldown, rand.Float64())
		c.openUntil.Store(int64(at.Add(d)))
		c.lastOpen.Store(int64(d))
	}
	c.changes = append(c.changes, Change{From: from, To: to, At: c.now, Remote: c.remote})
}

// resume returns when the failing episode of a circuit that trips at at,
// closed since closed (0: never opened), began: a new one at at, or the
// last one, resumed (see resumed). Requires that c.mu is held.
func (c *Circuit) resume(at, closed mono.Time) mono.Time {
	ep := mono.Time(c.episode.Load())
	if ep == 0 || closed == 0 {
		return at
	}
	age := resumed(closed.Sub(ep), at.Sub(closed), time.Duration(c.lastOpen.Load()))
	if age <= 0 {
		return at
	}
	return at.Add(-age)
}

// lock starts a call into cb at now; unlock ends it. It hands cb the
// successes that Done counted without mu (see succ) first.
func (c *Circuit) lock(now time.Time) {
	c.mu.Lock()
	c.now = now
	var w uint64
	for {
		w = c.succ.Load()
		if c.succ.CompareAndSwap(w, w&^succPending|succLocked) {
			break
		}
	}
	if n := w & succPending; n > 0 {
		for range n {
			c.recordSuccess() // closed since each was counted: no state change
		}
		c.settleClean()
	}
}

// unlock releases c.mu, then hands the changes made under it to
// OnChange. It is the only place that does either after lock, and callers
// defer it, so that a panic in failsafe-go leaves the circuit usable.
func (c *Circuit) unlock() {
	changes := c.changes
	c.changes = nil
	c.remote = false
	for {
		w := c.succ.Load()
		next := w&^(succLocked|succEpochs) | (w+succEpoch)&succEpochs
		if c.succ.CompareAndSwap(w, next) {
			break
		}
	}
	c.mu.Unlock()
	if c.cfg.OnChange != nil {
		for _, ch := range changes {
			c.cfg.OnChange(ch)
		}
	}
}

// Requires that c.mu is held.
func (c *Circuit) settleClean() {
	c.clean.Store(c.Counting() && State(c.state.Load()) == Closed && c.cb.Metrics().Failures() == 0)
}

// recordSuccess and recordFailure count a result in cb, and in streak.
// Requires that c.mu is held.
func (c *Circuit) recordSuccess() {
	c.streak.Store(0)
	c.cb.RecordSuccess()
}

func (c *Circuit) recordFailure() {
	if c.Counting() && State(c.state.Load()) == Closed {
		c.streak.Store(min(c.streak.Load()+1, 1<<30))
	}
	c.cb.RecordFailure() // a trip sets streak back to 0 (changed)
}

// Streak is how many failures in a row the circuit counts while closed,
// under the consecutive-failure rule; 0 when it is not closed, or trips
// on a failure rate. It takes no lock: a success counted without mu and
// still pending (see succ) is newer than every failure of the streak, so
// it ends the streak already.
func (c *Circuit) Streak() int {
	if c.succ.Load()&succPending != 0 {
		return 0
	}
	return int(c.streak.Load())
}

// Check is Allow without taking anything: what Allow would say at now.
func (c *Circuit) Check(now time.Time) Verdict { return c.verdict(now, false) }

// verdict is the circuit's one decision, for Check and Allow. With ask,
// the fleet's Lease may ask for the probe's lease.
func (c *Circuit) verdict(now time.Time, ask bool) Verdict {
	st := State(c.state.Load())
	if st == Closed {
		return Verdict{}
	}
	m := mono.Of(now)
	if c.probing(m) {
		return Verdict{Refusal: Probing}
	}
	if st == Open {
		if left := mono.Time(c.openUntil.Load()).Until(m); left > 0 {
			return Verdict{Refusal: Opened, Wait: left}
		}
	}
	if c.cfg.Lease != nil && !c.cfg.Lease(now, ask) {
		return Verdict{Refusal: Elsewhere}
	}
	return Verdict{}
}

// probing reports whether a probe holds the gate at now. A probe older
// than ProbeHang, longer than its attempt may take, is presumed hung and
// the next request takes over.
func (c *Circuit) probing(now mono.Time) bool {
	return c.probe.Load() != 0 && now.Sub(mono.Time(c.probeStart.Load())) < c.cfg.ProbeHang
}

// Allow returns a permit to send a request at now, or why not. The permit
// is valid when the verdict's Refusal is None, and must then be settled
// with Done (or, when the request is never sent, Done with Neutral).
func (c *Circuit) Allow(now time.Time) (Permit, Verdict) {
	gen := c.gen.Load() // before the state, as gobreaker reads them
	if State(c.state.Load()) == Closed {
		return Permit{gen: gen, start: mono.Of(now)}, Verdict{}
	}
	if v := c.verdict(now, true); v.Refusal != None {
		return Permit{}, v
	}
	return c.takeProbe(now)
}

// takeProbe takes the probe gate, moving an open circuit to half-open.
func (c *Circuit) takeProbe(now time.Time) (p Permit, v Verdict) {
	c.lock(now)
	taken := false
	defer func() {
		if !taken {
			c.unlock()
			return
		}
		// A listener that panics leaves the probe unsent: hand the
		// gate back before the panic goes on.
		defer func() {
			if r := recover(); r != nil {
				c.Release(p)
				panic(r)
			}
		}()
		c.unlock()
	}()
	m := mono.Of(now)
	switch State(c.state.Load()) {
	case Closed: // closed since the verdict
		return Permit{gen: c.gen.Load(), start: m}, Verdict{}
	case Open:
		if left := mono.Time(c.openUntil.Load()).Until(m); left > 0 {
			return Permit{}, Verdict{Refusal: Opened, Wait: left}
		}
		c.cb.HalfOpen()
	}
	if c.probing(m) { // another request took the probe meanwhile
		return Permit{}, Verdict{Refusal: Probing}
	}
	c.probeSeq++
	p = Permit{gen: c.gen.Load(), probe: c.probeSeq, start: m}
	c.probeStart.Store(int64(m))
	c.probe.Store(p.probe)
	taken = true
	return p, Verdict{}
}

// Release hands the probe gate on, if p still holds it. It may be called
// any number of times, and after Done.
func (c *Circuit) Release(p Permit) {
	if p.probe != 0 {
		c.probe.CompareAndSwap(p.probe, 0)
	}
}

// Done settles a permit with the attempt's result at now. A Neutral
// result records nothing and hands a probe on. A result of a permit from
// before the last state change is dropped, and so is a success of a permit
// given before the latest counted failure: requests sent before a fault
// reset no count.
func (c *Circuit) Done(p Permit, r Result, now time.Time) {
	switch r {
	case Success:
		if p.probe == 0 && (c.clean.Load() || c.countSuccess(p)) {
			return // the hot path: nothing to count, or counted without mu
		}
	case Failure:
	default:
		c.Release(p)
		return
	}
	c.settle(p, r, now)
}

// settle is Done's work under mu, for a Success or a Failure.
func (c *Circuit) settle(p Permit, r Result, now time.Time) {
	c.lock(now)
	defer c.unlock()
	defer c.Release(p)
	if c.gen.Load() != p.gen {
		return
	}
	if r == Success {
		if p.probe == 0 && c.Counting() && p.start < mono.Time(c.lastFailure.Load()) {
			// Sent before a failure already counted: it says nothing
			// of the upstream since then, and must not reset the count
			// of failures that are newer evidence.
			return
		}
		c.recordSuccess()
	} else {
		if p.start > mono.Time(c.lastFailure.Load()) {
			c.lastFailure.Store(int64(p.start))
		}
		c.recordFailure()
	}
	if r == Failure {
		c.succ.Or(succFailing) // mu is held: no success is being added
	} else {
		c.succ.And(^succFailing)
	}
	c.settleClean()
}

// countSuccess settles p, a permit given while closed, with a success
// without taking mu when it can: it drops a success Done would drop and
// adds any other to succ's pending count, as if it had held mu at the
// moment of its compare-and-swap (the epoch says no holder came between).
// It reports whether it settled p; if not, Done takes mu, as the
// FailureThreshold-th success in a row does, which cleans the window.
func (c *Circuit) countSuccess(p Permit) bool {
	if !c.Counting() {
		return false // a failure rate's window is timed: each success when it comes
	}
	for {
		w := c.succ.Load()
		if w&succPending+1 >= uint64(c.cfg.FailureThreshold) {
			return false
		}
		if w&succLocked != 0 {
			// Wait for the holder, then retry without mu: settling
			// under mu would start a convoy of successes.
			c.mu.Lock()
			c.mu.Unlock()
			continue
		}
		if c.gen.Load() != p.gen || p.start < mono.Time(c.lastFailure.Load()) {
			// Done's verdicts, without mu: gen and lastFailure only grow.
			return true
		}
		if c.succ.CompareAndSwap(w, (w+1)&^succFailing) {
			return true
		}
	}
}

// Probed records the verdict of an active probe at now: a failure counts
// like a failed request (it reopens a half-open circuit), and a success
// moves an open circuit to half-open at once, so that the next request
// probes it.
func (c *Circuit) Probed(r Result, now time.Time) {
	c.lock(now)
	defer c.unlock()
	switch st := State(c.state.Load()); {
	case r == Failure && st != Open:
		c.recordFailure()
	case r == Success && st == Open:
		c.cb.HalfOpen()
	case r == Success && st == Closed:
		c.recordSuccess()
	}
	c.settleClean()
}

// Reset closes the circuit by hand at now, frees the probe gate of a
// probe that may hang, and ends the failing episode: the next trip opens
// for Cooldown.
func (c *Circuit) Reset(now time.Time) {
	c.lock(now)
	defer c.unlock()
	c.cb.Close()
	c.probe.Store(0)
	c.episode.Store(0)
	c.settleClean()
}

// HoldOpen opens the circuit until at least until, as another process of
// the fleet saw it open. An open circuit's deadline only moves later. The
// change is remote: the fleet is not told of it again.
func (c *Circuit) HoldOpen(until, now time.Time) {
	if !until.After(now) {
		return
	}
	c.lock(now)
	defer c.unlock()
	end := mono.Of(until)
	if State(c.state.Load()) == Open {
		end = max(end, mono.Time(c.openUntil.Load()))
	} else {
		c.remote = true
		c.cb.Open()
	}
	c.openUntil.Store(int64(end))
	c.lastOpen.Store(int64(end.Sub(mono.Of(now))))
	c.held.Store(true)
	c.clean.Store(false)
}

// Trip opens a closed circuit at now on the fleet's evidence. It is this
// process's change: the fleet hears of it.
func (c *Circuit) Trip(now time.Time) {
	if State(c.state.Load()) != Closed {
		return
	}
	c.lock(now)
	defer c.unlock()
	if State(c.state.Load()) == Closed {
		c.cb.Open()
		c.clean.Store(false)
	}
}

// CloseRemote closes the circuit at now, as the fleet's probe found the
// upstream well.
func (c *Circuit) CloseRemote(now time.Time) {
	c.lock(now)
	defer c.unlock()
	if State(c.state.Load()) != Closed {
		c.remote = true
		c.cb.Close()
		c.settleClean()
	}
}

// Snapshot is what a circuit shows of itself at one instant.
type Snapshot struct {
	// State as callers see it: an open circuit whose deadline passed
	// reads HalfOpen, since the next request probes it.
	State State
	// Since is when the state last changed; zero when never.
	Since time.Time
	// OpenFor is how long an open circuit stays open.
	OpenFor time.Duration
	// OpenTime is how long the circuit last opened for (see OpenTime);
	// 0 when never.
	OpenTime time.Duration
	// Held says the circuit is open on the fleet's word (HoldOpen).
	Held bool
	// Trips counts changes from closed to open.
	Trips uint64
	// Failures is how many failures the current window counts.
	Failures uint
	// Failing says the last attempt that counted failed.
	Failing bool
	// Mark changes whenever the state or the open deadline does, so
	// that a reader can tell whether the circuit changed between two
	// snapshots.
	Mark [2]int64
}

// Snapshot returns the circuit's state at now, without taking the lock
// unless successes counted without it are pending (see succ): Failures
// counts them.
func (c *Circuit) Snapshot(now time.Time) Snapshot {
	s := Snapshot{
		State:    State(c.state.Load()),
		Held:     c.held.Load(),
		Trips:    c.trips.Load(),
		Failing:  c.Failing(),
		OpenTime: time.Duration(c.lastOpen.Load()),
		Mark:     [2]int64{c.since.Load(), c.openUntil.Load()},
	}
	if since := mono.Time(c.since.Load()); since != 0 {
		s.Since = since.Time()
	}
	if s.State == Open {
		s.OpenFor = mono.Time(c.openUntil.Load()).Until(mono.Of(now))
		if s.OpenFor == 0 {
			s.State = HalfOpen
		}
	}
	if !c.clean.Load() {
		if c.succ.Load()&succPending != 0 {
			c.lock(now) // cb counts the pending successes
			c.unlock()
		}
		s.Failures = c.cb.Metrics().Failures() // failsafe-go locks its own
	}
	return s
}

// Status is the state as Snapshot reports it, without the rest.
func (c *Circuit) Status(now time.Time) State {
	s := State(c.state.Load())
	if s == Open && mono.Time(c.openUntil.Load()).Until(mono.Of(now)) == 0 {
		return HalfOpen
	}
	return s
}

// Recovering reports whether the circuit closed within the last ProbeLife.
func (c *Circuit) Recovering(now time.Time) bool {
	since := mono.Time(c.since.Load())
	return State(c.state.Load()) == Closed && since != 0 && mono.Of(now).Sub(since) < c.cfg.ProbeLife
}

// OpenFor is how long an open circuit stays open at now (0 unless open).
func (c *Circuit) OpenFor(now time.Time) time.Duration {
	if State(c.state.Load()) != Open {
		return 0
	}
	return mono.Time(c.openUntil.Load()).Until(mono.Of(now))
}

// Held reports whether the circuit is open on the fleet's word (HoldOpen).
func (c *Circuit) Held() bool { return c.held.Load() }

// Failing reports whether the last attempt that counted failed.
func (c *Circuit) Failing() bool { return c.succ.Load()&succFailing != 0 }
