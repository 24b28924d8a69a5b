package failover

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/failover-go/failover/internal/circuit"
	"github.com/failover-go/failover/internal/mono"
)

// Defaults of the fleet's work.
const (
	maxFailureAge     = time.Second // older failures are not told nor counted
	defaultSharedSync = time.Second
	sharedQueue       = 256 // events waiting to be published; more are dropped
)

// fleet is a Transport's side of Config.Shared: two goroutines, one that
// publishes, takes probe leases and reconciles, and one that listens. It
// holds what they need, not the Transport, so that they leave a Transport
// dropped without Close unreachable (see background).
type fleet struct {
	upstreams   []*upstream
	maxCooldown time.Duration // RateLimit.MaxCooldown
	logger      *slog.Logger
	pins        *pins // where told references go; nil: pinning is off

	s        Shared
	member   string
	byName   map[string]*upstream
	names    []string
	every    time.Duration    // reconcile period, and the bound on each call
	queue    chan SharedEvent // open, closed, cooling, reset: these come first
	failures chan SharedEvent
	leases   chan *upstream
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once
	down     atomic.Bool // the store failed storeDownAfter calls in a row; local state rules
	outage   atomic.Bool // an outage was logged and has not ended (storeUpAfter calls in a row answered)

	failStreak, okStreak atomic.Int32 // calls in a row that failed, that succeeded
	started              atomic.Bool  // some call to the store succeeded
	stopped              atomic.Bool  // Close was called: local state rules
	ticks                atomic.Int32 // periods run: the fleet's rates are known after 2

	// adopting counts the adoptions under way (enter), and idle is closed
	// once Close was called and none is: Close waits for it.
	adopting atomic.Int32
	idle     chan struct{}
	idleOnce sync.Once

	errors    *metrics.Counter
	dropped   *metrics.Counter
	published *metrics.Counter
	received  *metrics.Counter
	adopted   *metrics.Counter
}

// fleetState is what a process knows of the fleet about one upstream.
type fleetState struct {
	lease   atomic.Int64 // mono.Time until which this process holds the probe
	wanting atomic.Bool  // a request for the probe is queued

	// news counts the circuit's changes and the fleet's Opens adopted,
	// asked is its count when the lease was last asked for, and refused
	// the store's first refusal of the lease since.
	news    atomic.Uint64
	asked   atomic.Uint64
	refused atomic.Pointer[refusal]

	mu       sync.Mutex
	failures []mono.Time           // the fleet's last FailureThreshold failures, a ring
	next     int                   // where the next one goes
	members  map[string]memberRate // the other members' request rates
	cool     claim                 // the fleet's cooldown, as this process adopted it
	open     claim                 // the fleet's open circuit, as this process adopted it
}

// refusal is the store's first refusal of the probe's lease, asked for
// when the circuit's news counted news.
type refusal struct {
	news uint64
	at   mono.Time
}

// claim is a state the fleet says an upstream is in (cooling down, open)
// as this process adopted it: one episode, from its first adoption for as
// long as the fleet keeps saying it, each time within slack of the end it
// said last.
type claim struct {
	since mono.Time // when this process first adopted it; 0: never
	end   mono.Time // the latest end the fleet said
}

// hold returns how long to hold the state at now for the fleet's word
// that it lasts d: d, capped at limit from the episode's first adoption.
// Said within slack of the end said last (the store repeats it at every
// reconcile), it is the same episode however it moves the end, so that a
// store that repeats or extends a state keeps it no longer than limit;
// said later, it is a new one. It returns 0 past the cap. Requires that
// the fleetState's mu is held.
func (c *claim) hold(now mono.Time, d, limit, slack time.Duration) time.Duration {
	if c.since == 0 || now.Sub(c.end) > slack {
		c.since, c.end = now, now
	}
	c.end = max(c.end, now.Add(d))
	// Never past limit, not even for a now read before since's: goroutines
	// that deliver at once take the lock in any order.
	return max(0, min(d, limit, c.since.Add(limit).Sub(now)))
}

// adopt returns how long this process holds the state c, which the fleet
// says lasts d from now (see claim.hold).
func (s *fleetState) adopt(c *claim, now time.Time, d, limit, slack time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return c.hold(mono.Of(now), d, limit, slack)
}

// forget ends c's episode: this process saw for itself what the fleet
// says (a 429, a trip), and the fleet's next word on it is news.
func (s *fleetState) forget(c *claim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*c = claim{}
}

type memberRate struct {
	rate float64
	at   mono.Time // when it was reported
}

// maxRate is the most requests per second a member's rate may say: more,
// or a rate that is not a positive number, is the store's garbage.
const maxRate = 1e9

// isRate reports whether r can be a member's request rate.
func isRate(r float64) bool { return r > 0 && r <= maxRate }

// rateWindow is how far back request rates reach.
const rateWindow = 10 * time.Second

// dense records a failure at now (from member, at rate; "" for this
// process) and reports whether the fleet's last threshold failures came
// within the time the fleet takes to send threshold requests, own being
// this process's rate.
func (s *fleetState) dense(now time.Time, member string, rate, own float64, threshold int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if threshold < 1 {
		return false
	}
	if len(s.failures) != threshold {
		s.failures = make([]mono.Time, threshold)
		s.next = 0
	}
	at := mono.Of(now)
	s.failures[s.next] = at
	s.next = (s.next + 1) % threshold
	first, last := s.failures[0], s.failures[0] // failures arrive out of order
	for _, f := range s.failures {
		first, last = min(first, f), max(last, f)
	}
	if member != "" && isRate(rate) {
		if s.members == nil {
			s.members = map[string]memberRate{}
		}
		s.members[member] = memberRate{rate, at}
	}
	total := own
	for m, r := range s.members {
		if at.Sub(r.at) > rateWindow {
			delete(s.members, m)
			continue
		}
		total += r.rate
	}
	if first == 0 || total <= 0 { // not yet threshold failures
		return false
	}
	span := time.Duration(float64(2*threshold) / total * float64(time.Second))
	return last.Sub(first) <= span
}

// noteRate records a member's request rate. A member not heard of
// before makes it drop the rates of members gone quiet, so that a store
// naming ever new members does not grow the map for good.
func (s *fleetState) noteRate(member string, rate float64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := mono.Of(now)
	if s.members == nil {
		s.members = map[string]memberRate{}
	}
	if _, ok := s.members[member]; !ok {
		for m, r := range s.members {
			if at.Sub(r.at) > rateWindow {
				delete(s.members, m)
			}
		}
	}
	s.members[member] = memberRate{rate, at}
}

func newFleet(t *Transport, s Shared, every time.Duration) *fleet {
	var id [8]byte
	rand.Read(id[:])
	f := &fleet{
		upstreams:   t.upstreams,
		maxCooldown: t.rate.MaxCooldown,
		logger:      t.logger,
		pins:        t.pins,

		s:        s,
		member:   hex.EncodeToString(id[:]),
		byName:   map[string]*upstream{},
		every:    every,
		queue:    make(chan SharedEvent, sharedQueue),
		failures: make(chan SharedEvent, sharedQueue),
		leases:   make(chan *upstream, len(t.upstreams)),
		idle:     make(chan struct{}),
		errors:   t.metrics.GetOrCreateCounter(famSharedErrors.series()),
		dropped:  t.metrics.GetOrCreateCounter(famSharedDropped.series()),

		published: t.metrics.GetOrCreateCounter(famSharedEvents.series("out")),
		received:  t.metrics.GetOrCreateCounter(famSharedEvents.series("in")),
		adopted:   t.metrics.GetOrCreateCounter(famSharedApplied.series()),
	}
	t.metrics.GetOrCreateGauge(famSharedUp.series(), func() float64 {
		return boolMetric(f.started.Load() && !f.down.Load() && !f.stopped.Load())
	})
	for _, u := range t.upstreams {
		f.byName[u.name] = u
		f.names = append(f.names, u.name)
	}
	return f
}

func (f *fleet) start() {
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		f.work(ctx)
	}()
	go func() {
		defer f.wg.Done()
		f.listen(ctx)
	}()
}

// stop ends the fleet's goroutines and waits for them and for the
// adoptions under way until deadline, closeWait from Close's start: a call
// to the store in flight ends at its context's deadline when the store
// honours it, and one that does not is left to end on its own, its
// goroutine with it (see Transport.Close), which the log tells by
// deadline. From its start, nothing the store says is adopted.
func (f *fleet) stop(deadline time.Time) {
	f.stopped.Store(true)
	f.cancel()
	f.adopting.Add(1)
	f.leave() // closes idle unless an adoption is under way; its leave will
	done := make(chan struct{})
	go func() {
		f.wg.Wait()
		<-f.idle
		close(done)
	}()
	wait := time.NewTimer(time.Until(deadline.Add(-closeLogWait)))
	defer wait.Stop()
	select {
	case <-done:
	case <-wait.C:
		bounded(deadline, func() {
			f.log(slog.LevelWarn, "Close returns while a call to the shared state, or the adoption of what it said, goes on past its bound; the goroutine that made it ends when it returns")
		})
	}
}

// enter begins adopting what the store said, and reports whether it may:
// not once Close was called. Each enter that reports true is followed by a
// leave.
func (f *fleet) enter() bool {
	f.adopting.Add(1)
	if f.stopped.Load() {
		f.leave()
		return false
	}
	return true
}

// leave ends what enter began.
func (f *fleet) leave() {
	if f.adopting.Add(-1) == 0 && f.stopped.Load() {
		f.idleOnce.Do(func() { close(f.idle) })
	}
}

// closeWait is how long Close waits for the fleet's goroutines: the bound
// of the call in flight, and closeGrace for it to return once its deadline
// has passed.
func (f *fleet) closeWait() time.Duration { return f.callBound() + closeGrace }

// callBound bounds each call to the store: the period, at least
// minCallBound.
func (f *fleet) callBound() time.Duration { return max(f.every, minCallBound) }

// mayProbe reports whether this process may send u's half-open probe: it
// holds the fleet's lease, or the store is unreachable, or the Transport
// is closed, or the store has refused the lease for the circuit's
// ProbeLife with no word of another member's probe meanwhile (a probe
// older is presumed hung). Otherwise, with ask, it asks for the lease,
// without waiting for it. It is the circuit's Lease.
func (f *fleet) mayProbe(u *upstream, now time.Time, ask bool) bool {
	if f.down.Load() || f.stopped.Load() || f.holdsLease(u, now) {
		return true
	}
	if r := u.fleet.refused.Load(); r != nil && r.news == u.fleet.news.Load() && mono.Of(now).Sub(r.at) >= u.circuit.ProbeLife() {
		return true
	}
	if ask {
		f.wantLease(u)
	}
	return false
}

// wantLease queues a call to the store for u's probe lease, unless one is
// queued already.
func (f *fleet) wantLease(u *upstream) {
	if u.fleet.wanting.CompareAndSwap(false, true) {
		u.fleet.asked.Store(u.fleet.news.Load())
		select {
		case f.leases <- u:
		default:
			u.fleet.wanting.Store(false)
		}
	}
}

// holdsLease reports whether this process holds the fleet's lease on u's
// probe at now.
func (f *fleet) holdsLease(u *upstream, now time.Time) bool {
	return mono.Of(now) < mono.Time(u.fleet.lease.Load())
}

// publish queues e, without waiting; a full queue drops it.
func (f *fleet) publish(e SharedEvent) {
	if f.stopped.Load() {
		return
	}
	e.Member, e.at = f.member, time.Now()
	q := f.queue
	if e.Kind == SharedFailure || e.Kind == SharedPin {
		q = f.failures // news of circuits and cooldowns comes first
	}
	select {
	case q <- e:
	default:
		f.dropped.Inc()
	}
}

// changed publishes a state change of u's circuit that this process made.
// The times told are this circuit's own (its Upstream.Breaker's): the
// others hold it open for as long, extend-only (see Shared). Any change
// is news, which ends a wait for the probe's lease; one to open that this
// process made is its own evidence, after which the fleet's word on an
// open circuit is news too (see claim); one that its probe made shortens
// its lease to the open time (see work).
func (f *fleet) changed(u *upstream, c circuit.Change) {
	u.fleet.news.Add(1)
	if c.Remote {
		return
	}
	switch c.To {
	case circuit.Open:
		u.fleet.forget(&u.fleet.open)
		if left := u.circuit.OpenFor(c.At); left > 0 {
			f.publish(SharedEvent{Upstream: u.name, Kind: SharedOpen, For: left})
		}
		if c.From == circuit.HalfOpen && f.holdsLease(u, c.At) {
			f.wantLease(u)
		}
	case circuit.Closed:
		u.fleet.lease.Store(0)
		f.publish(SharedEvent{Upstream: u.name, Kind: SharedClosed, For: u.circuit.ProbeLife()})
	}
}

// failure publishes a failed attempt on u at now, while its circuit is
// closed, and trips it when the fleet's failures are dense enough. After
// Close, the fleet's failures, heard before, trip nothing.
func (f *fleet) failure(u *upstream, now time.Time) {
	if f.stopped.Load() || !u.circuit.Counting() || u.circuit.Status(now) != circuit.Closed {
		return
	}
	rate := u.rate(now)
	f.publish(SharedEvent{Upstream: u.name, Kind: SharedFailure, Rate: rate, at: now})
	if u.fleet.dense(now, "", 0, rate, u.circuit.Threshold()) && f.ticks.Load() >= 2 {
		u.circuit.Trip(now)
	}
}

// rate is this process's recent requests per second to u.
func (u *upstream) rate(now time.Time) float64 {
	return u.window.rate(now, now.Add(-rateWindow))
}

// cooled publishes u's cooldown, which a 429 to this process started or
// lengthened: after it, the fleet's word on u's cooldown is news (see
// claim).
func (f *fleet) cooled(u *upstream, d time.Duration, reason CooldownReason) {
	u.fleet.forget(&u.fleet.cool)
	f.publish(SharedEvent{Upstream: u.name, Kind: SharedCooling, For: d, Reason: reason})
}

// work publishes, takes leases and reconciles until ctx is done.
func (f *fleet) work(ctx context.Context) {
	tick := time.NewTicker(f.every)
	defer tick.Stop()
	f.reconcile(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-f.queue:
			f.send(ctx, e)
		case e := <-f.failures:
			f.sendQueued(ctx) // state changes go first
			f.send(ctx, e)
		case u := <-f.leases:
			var got bool
			now := time.Now()
			// For the probe's lifetime: long enough for this process's
			// next request to probe, and for the probe. Once the probe
			// failed and the circuit is open again, a lease held is
			// taken anew until the open time ends (the store's holder
			// holds it for ttl from now), so that the fleet's next
			// probe may be any member's.
			ttl := u.circuit.ProbeLife()
			if left := u.circuit.OpenFor(now); left > 0 {
				if !f.holdsLease(u, now) {
					u.fleet.wanting.Store(false)
					continue
				}
				ttl = left
			}
			asked := u.fleet.asked.Load()
			switch {
			case !f.call(ctx, func(ctx context.Context) (err error) {
				got, err = f.s.AcquireProbe(ctx, u.name, f.member, ttl)
				return err
			}):
			case got:
				u.fleet.lease.Store(int64(mono.Of(now).Add(ttl)))
				u.fleet.refused.Store(nil)
			default:
				// The first refusal since the news the lease was
				// asked after: mayProbe waits a ProbeLife from it.
				if r := u.fleet.refused.Load(); r == nil || r.news != asked {
					u.fleet.refused.Store(&refusal{asked, mono.Of(now)})
				}
			}
			u.fleet.wanting.Store(false)
		case <-tick.C:
			f.shareRates(ctx)
			f.sendUrgent(ctx)
			f.reconcile(ctx)
			if f.ticks.Load() < 2 {
				f.ticks.Add(1)
			}
		}
	}
}

// sendUrgent publishes the state changes waiting in the queue, then the
// failures waiting when it was called, state changes always first. The
// period's work calls it before each of its own store calls, so that news
// waits for one call at most, not for the whole period's.
func (f *fleet) sendUrgent(ctx context.Context) {
	f.sendQueued(ctx)
	for range len(f.failures) {
		select {
		case e := <-f.failures:
			f.send(ctx, e)
			f.sendQueued(ctx)
		default:
			return
		}
	}
}

// sendQueued publishes the state changes waiting in the queue.
func (f *fleet) sendQueued(ctx context.Context) {
	for {
		select {
		case e := <-f.queue:
			f.send(ctx, e)
		default:
			return
		}
	}
}

// shareRates stores this process's request rate to each upstream, so
// that the others can weigh the fleet's failures (see fleetState.dense).
func (f *fleet) shareRates(ctx context.Context) {
	now := time.Now()
	for _, u := range f.upstreams {
		if !u.circuit.Counting() {
			continue
		}
		if rate := u.rate(now); rate > 0 {
			f.sendUrgent(ctx)
			f.send(ctx, SharedEvent{Upstream: u.name, Kind: SharedRate, Rate: rate, For: 3 * f.every, Member: f.member, at: now})
		}
	}
}

// send publishes e, with its durations counted from now.
func (f *fleet) send(ctx context.Context, e SharedEvent) {
	waited := time.Since(e.at)
	switch e.Kind {
	case SharedFailure:
		if waited > maxFailureAge {
			return // stale: with others as stale, it would look like a burst
		}
		e.At = e.at
	case SharedOpen, SharedCooling, SharedRate, SharedPin:
		if e.For -= waited; e.For <= 0 {
			return // over before it could be told
		}
	}
	if f.call(ctx, func(ctx context.Context) error { return f.s.Publish(ctx, e) }) {
		f.published.Inc()
	}
}

// reconcile reads the store and adopts what it holds, so that a missed
// message or a restart still converges: open circuits, cooldowns, and
// circuits the fleet closed. A circuit whose state changed while the
// store was read keeps its new state: the read may predate it.
func (f *fleet) reconcile(ctx context.Context) {
	type mark struct {
		circuit   [2]int64
		coolUntil int64
	}
	marks := make([]mark, len(f.upstreams))
	snap := func(u *upstream) mark {
		return mark{u.circuit.Snapshot(time.Now()).Mark, u.cd.until.Load()}
	}
	for i, u := range f.upstreams {
		marks[i] = snap(u)
	}
	var evs []SharedEvent
	if !f.call(ctx, func(ctx context.Context) (err error) {
		evs, err = f.s.Load(ctx, f.names)
		return err
	}) {
		return
	}
	stale := make([]bool, len(marks))
	for i, u := range f.upstreams {
		stale[i] = snap(u) != marks[i] // changed meanwhile: the read may predate the change
	}
	for _, e := range evs {
		u := f.byName[e.Upstream]
		if u == nil || stale[u.index] {
			continue
		}
		if e.Kind == SharedClosed {
			// Only a circuit this process holds open on the fleet's
			// word: one it opened itself is its own to probe.
			if !u.circuit.Held() {
				continue
			}
		}
		f.apply(e)
	}
}

// listen follows the members' events until ctx is done, subscribing again
// a period after each failure.
func (f *fleet) listen(ctx context.Context) {
	for {
		err := callShared(ctx, func(ctx context.Context) error {
			return f.s.Subscribe(ctx, func(e SharedEvent) {
				if f.stopped.Load() {
					return // a store's goroutine may deliver after Close
				}
				f.received.Inc()
				if e.Member != f.member {
					f.apply(e)
				}
			})
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// Counted, but the lease and state calls may still work: only
			// they decide whether this process runs on its own.
			f.errors.Inc()
		}
		if sleep(ctx, f.every) != nil {
			return
		}
	}
}

// apply adopts an event from the fleet into this process's state, unless
// Close was called. What the fleet says keeps an upstream out no longer
// than this process's own cap from when it first adopted it (see claim): a
// cooldown, MaxCooldown; an open circuit, that or its own
// Breaker.MaxCooldown, whichever is longer, so that it holds another
// member's long open time.
func (f *fleet) apply(e SharedEvent) {
	u := f.byName[e.Upstream]
	if u == nil {
		return // an upstream this process does not have
	}
	if !f.enter() {
		return
	}
	defer f.leave()
	now := time.Now()
	switch e.Kind {
	case SharedOpen:
		// The lease holder's probe decides: an Open arriving meanwhile
		// (its own read back, another member's late) must not drop it.
		if e.For <= 0 || u.circuit.Status(now) == circuit.HalfOpen && f.holdsLease(u, now) {
			return
		}
		d := u.fleet.adopt(&u.fleet.open, now, e.For, max(u.circuit.MaxCooldown(), f.maxCooldown), f.callBound())
		if d > 0 && (u.circuit.Status(now) != circuit.Open || u.circuit.OpenFor(now) < d) {
			u.fleet.news.Add(1) // a probe's verdict, or a trip
			u.circuit.HoldOpen(now.Add(d), now)
			f.adopted.Inc()
		}
	case SharedClosed, SharedReset:
		u.fleet.lease.Store(0)
		if u.circuit.Status(now) != circuit.Closed {
			u.circuit.CloseRemote(now)
			f.adopted.Inc()
		}
		if e.Kind == SharedReset {
			u.cd.clear()
		}
	case SharedFailure:
		// Dated by its member's clock, not by its arrival, so that
		// delayed messages delivered together do not look like a burst
		// (see docs/design.md).
		age := time.Duration(0)
		if !e.At.IsZero() {
			age = max(0, now.Sub(e.At))
		}
		if !u.circuit.Counting() || age > maxFailureAge {
			return
		}
		at := now.Add(-age)
		// Until the members' rates are known (two periods after start),
		// failures are recorded but not judged.
		if u.fleet.dense(at, e.Member, e.Rate, u.rate(now), u.circuit.Threshold()) && f.ticks.Load() >= 2 && u.circuit.Failing() && u.circuit.Status(now) == circuit.Closed {
			u.circuit.Trip(now)
			f.adopted.Inc()
		}
	case SharedPin:
		if p := f.pins; p != nil && e.Member != f.member && e.For > 0 && validRef(e.Ref) {
			p.learn(e.Ref, u, e.Key, now, e.For)
		}
	case SharedRate:
		if e.Member != f.member && e.Member != "" && isRate(e.Rate) {
			u.fleet.noteRate(e.Member, e.Rate, now)
		}
	case SharedCooling:
		// Capped at this process's MaxCooldown, as a provider's own
		// Retry-After is.
		if e.For <= 0 {
			return
		}
		d := u.fleet.adopt(&u.fleet.cool, now, e.For, f.maxCooldown, f.callBound())
		if d > 0 && u.cd.remaining(now) < d {
			reason := CooldownRateLimited
			if e.Reason == CooldownQuotaExhausted {
				reason = e.Reason
			}
			u.cd.extend(now, d, reason)
			f.adopted.Inc()
		}
	}
}

// call runs one call to the store, bounded by the period, and reports
// whether it succeeded.
func (f *fleet) call(ctx context.Context, fn func(context.Context) error) bool {
	if ctx.Err() != nil {
		return false // Close was called: no more calls
	}
	cctx, cancel := context.WithTimeout(ctx, f.callBound())
	err := callShared(cctx, fn)
	cancel()
	if ctx.Err() != nil {
		// Close was called meanwhile and may have returned: adopt and
		// count nothing.
		return false
	}
	if err != nil {
		f.failed(err)
		return false
	}
	f.started.Store(true)
	f.failStreak.Store(0)
	f.down.Store(false)
	if f.okStreak.Add(1) >= storeUpAfter && f.outage.CompareAndSwap(true, false) {
		// What this process learned alone is not told: it could reopen
		// a circuit the fleet closed meanwhile.
		f.log(slog.LevelInfo, "shared state reachable again")
	}
	return true
}

// callShared calls fn, a call to the Shared store; a panic in it is the
// store's failure, as an error would be: on the fleet's goroutine it
// would end the process.
func callShared(ctx context.Context, fn func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("failover: Shared panicked: %v", v)
		}
	}()
	return fn(ctx)
}

// minCallBound is the shortest bound on a call to the store: a healthy
// store on a loaded machine must not look down.
const minCallBound = time.Second

// Hysteresis of the store's health, so that one slow call or a flapping
// store neither turns the process to its own state nor logs again: local
// state rules after storeDownAfter failed calls in a row, and a logged
// outage ends after storeUpAfter successful ones.
const (
	storeDownAfter = 2
	storeUpAfter   = 3
)

// failed counts a failure of the store, and logs the first of an outage.
func (f *fleet) failed(err error) {
	f.errors.Inc()
	f.okStreak.Store(0)
	if f.failStreak.Add(1) < storeDownAfter {
		return
	}
	f.down.Store(true)
	if f.outage.CompareAndSwap(false, true) {
		f.log(slog.LevelWarn, "shared state unreachable; each process runs on its own state until it is back", slog.String("error", err.Error()))
	}
}

func (f *fleet) log(level slog.Level, msg string, attrs ...slog.Attr) {
	if l := f.logger; l != nil && l.Enabled(context.Background(), level) {
		l.LogAttrs(context.Background(), level, "failover: "+msg, attrs...)
	}
}
