package failover

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// Shared is state that the Transports of a fleet (the processes of one
// service, each with its own Transport) share, so that the fleet learns
// once that an upstream is down, not once per process. Package
// [github.com/failover-go/failover/redisshared] implements it on Redis.
//
// What is shared, per upstream name:
//
//   - that a circuit opened, and for how long: every process opens its own
//     for the time left;
//   - that an upstream cools down after a 429, and for how long, under the
//     same extend-only rule as in one process;
//   - which process sends the half-open probe: one per cooldown in the
//     whole fleet, the one that holds the probe's lease, and its verdict,
//     which closes or reopens the circuit everywhere;
//   - the failures of a closed circuit, and each member's request rate
//     (stored, refreshed every SharedSync), so that a fleet that fails
//     together trips after about FailureThreshold failures in all rather
//     than FailureThreshold per process. From two periods after it
//     starts (when it knows the members' rates), a process whose own last
//     attempt failed opens its circuit
//     when the fleet's last FailureThreshold failures came within the
//     time the whole fleet takes to send 2×FailureThreshold requests:
//     about as dense as FailureThreshold consecutive failures of the
//     fleet's merged stream of requests, with room for the jitter of a
//     loaded machine. Stray background errors rarely are, whatever the
//     fleet's size: at 0.5 % errors, a stray error completes such a run
//     of 5 about once in 4 million.
//
// Nothing secret is shared: upstream names, durations and request rates
// only. Upstreams are matched by [Upstream.Name], so every process must
// name them alike; an upstream without a Name is named after its host,
// which is then shared too.
//
// The fleet's failures count under the consecutive-failure rule only; with
// BreakerConfig.FailureRate, each process judges its own failures.
//
// The Transport calls Shared only from goroutines of its own, never from a
// request: a slow or unreachable store adds no latency to requests and
// fails none. While it is unreachable, each Transport runs on its own
// state, and it shares again when the store comes back. An upstream whose
// cooldown is over is probed by one process: the others skip it, as they
// skip an upstream whose probe is in flight, until the verdict; so does the
// one process until it has the lease, which it asks for in the background.
// Each call is bounded by Config.SharedSync through its context: a store
// must honour the context's deadline (see redisshared on go-redis).
//
// Durations are relative (how long from now), so that processes need not
// agree on the time of day.
type Shared interface {
	// Publish records e in the store and tells the other members.
	// Publishing an Open or Cooling event never shortens what the store
	// holds. Closed clears the upstream's open state and probe lease and
	// records, for For, that the fleet closed the circuit; Open clears
	// that record. Reset does what Closed does and clears the cooldown
	// too. Failure is told, not stored; Rate is stored, not told.
	Publish(ctx context.Context, e SharedEvent) error

	// Load returns what the store holds for the named upstreams: an
	// Open event for each open circuit, a Closed event for each circuit
	// the fleet closed within its For, a Cooling event for each
	// cooldown, with For the time left, and a Rate event for each member
	// whose rate has not expired. An upstream it returns nothing for is
	// none of these, or the store lost its state.
	Load(ctx context.Context, upstreams []string) ([]SharedEvent, error)

	// Subscribe calls deliver with each event that members publish,
	// its own included, until ctx is done or the subscription fails. It
	// returns the error that ended it; the Transport subscribes again.
	Subscribe(ctx context.Context, deliver func(SharedEvent)) error

	// AcquireProbe takes the lease on the half-open probe of upstream for
	// ttl, for member, unless another member holds it. It reports
	// whether member holds it.
	AcquireProbe(ctx context.Context, upstream, member string, ttl time.Duration) (bool, error)
}

// SharedKind is what a [SharedEvent] says.
type SharedKind uint8

// The kinds of [SharedEvent].
const (
	// SharedOpen: the upstream's circuit opened, for For.
	SharedOpen SharedKind = iota + 1
	// SharedClosed: a probe found the upstream well; its circuit is
	// closed for everyone.
	SharedClosed
	// SharedCooling: the upstream rate-limited a request; it cools down
	// for For.
	SharedCooling
	// SharedFailure: an attempt failed while the circuit was closed.
	// It is only published, never stored.
	SharedFailure
	// SharedReset: an operator closed the circuit and ended the cooldown
	// (Transport.Reset); it clears both for everyone.
	SharedReset
	// SharedRate: a member's recent requests per second to the upstream
	// (Rate), good for For. It is stored, not told: Load returns one per
	// member, so that each member knows the fleet's rate.
	SharedRate
)

// String returns "open", "closed" or "cooling".
func (k SharedKind) String() string {
	switch k {
	case SharedOpen:
		return "open"
	case SharedClosed:
		return "closed"
	case SharedCooling:
		return "cooling"
	case SharedFailure:
		return "failure"
	case SharedReset:
		return "reset"
	case SharedRate:
		return "rate"
	}
	return "unknown"
}

// SharedEvent is one fact about an upstream, as members of a fleet share
// it.
type SharedEvent struct {
	Upstream string         // Upstream.Name
	Kind     SharedKind     //
	For      time.Duration  // Open, Cooling: how long from now
	Reason   CooldownReason // Cooling: why
	Rate     float64        // Failure, Rate: the member's recent requests per second to the upstream
	At       time.Time      // Failure: when it happened, by its member's clock
	Member   string         // the member that published it

	at time.Time // when it happened, for At and For
}

// Defaults of the fleet's work.
const (
	maxFailureAge     = time.Second // older failures are not told nor counted
	defaultSharedSync = time.Second
	sharedQueue       = 256 // events waiting to be published; more are dropped
)

// fleet is a Transport's side of Config.Shared: two goroutines, one that
// publishes, takes probe leases and reconciles, and one that listens.
type fleet struct {
	t        *Transport
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
	down     atomic.Bool  // the store failed last time; local state rules
	started  atomic.Bool  // some call to the store succeeded
	stopped  atomic.Bool  // Close was called: local state rules
	ticks    atomic.Int32 // periods run: the fleet's rates are known after 2

	errors    *metrics.Counter
	dropped   *metrics.Counter
	published *metrics.Counter
	received  *metrics.Counter
	adopted   *metrics.Counter
}

// fleetState is what a process knows of the fleet about one upstream.
type fleetState struct {
	lease   atomic.Int64 // unix ns until which this process holds the probe
	wanting atomic.Bool  // a request for the probe is queued

	mu       sync.Mutex
	failures []int64               // the fleet's last FailureThreshold failures (unix ns), a ring
	next     int                   // where the next one goes
	members  map[string]memberRate // the other members' request rates
}

type memberRate struct {
	rate float64
	at   int64 // unix ns when it was reported
}

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
		s.failures = make([]int64, threshold)
		s.next = 0
	}
	at := now.UnixNano()
	s.failures[s.next] = at
	s.next = (s.next + 1) % threshold
	first, last := s.failures[0], s.failures[0] // failures arrive out of order
	for _, f := range s.failures {
		first, last = min(first, f), max(last, f)
	}
	if member != "" {
		if s.members == nil {
			s.members = map[string]memberRate{}
		}
		s.members[member] = memberRate{rate, at}
	}
	total := own
	for m, r := range s.members {
		if at-r.at > int64(rateWindow) {
			delete(s.members, m)
			continue
		}
		total += r.rate
	}
	if first == 0 || total <= 0 { // not yet threshold failures
		return false
	}
	span := time.Duration(float64(2*threshold) / total * float64(time.Second))
	return last-first <= int64(span)
}

// noteRate records a member's request rate.
func (s *fleetState) noteRate(member string, rate float64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.members == nil {
		s.members = map[string]memberRate{}
	}
	s.members[member] = memberRate{rate, now.UnixNano()}
}

func newFleet(t *Transport, s Shared, every time.Duration) *fleet {
	var id [8]byte
	rand.Read(id[:])
	f := &fleet{
		t:        t,
		s:        s,
		member:   hex.EncodeToString(id[:]),
		byName:   map[string]*upstream{},
		every:    every,
		queue:    make(chan SharedEvent, sharedQueue),
		failures: make(chan SharedEvent, sharedQueue),
		leases:   make(chan *upstream, len(t.upstreams)),
		errors:   t.metrics.GetOrCreateCounter("failover_shared_errors_total"),
		dropped:  t.metrics.GetOrCreateCounter("failover_shared_dropped_total"),

		published: t.metrics.GetOrCreateCounter(`failover_shared_events_total{direction="out"}`),
		received:  t.metrics.GetOrCreateCounter(`failover_shared_events_total{direction="in"}`),
		adopted:   t.metrics.GetOrCreateCounter(`failover_shared_applied_total`),
	}
	t.metrics.GetOrCreateGauge("failover_shared_up", func() float64 {
		return boolMetric(f.started.Load() && !f.down.Load() && !f.stopped.Load())
	})
	for _, u := range t.upstreams {
		f.byName[u.name] = u
		f.names = append(f.names, u.name)
		u.breaker.mayProbe = func(now time.Time) bool { return f.mayProbe(u, now) }
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

func (f *fleet) stop() {
	f.stopped.Store(true)
	f.cancel()
	f.wg.Wait()
}

// mayProbe reports whether this process may send u's half-open probe: it
// holds the fleet's lease, or the store is unreachable, or the Transport
// is closed. Otherwise it asks for the lease, without waiting for it.
func (f *fleet) mayProbe(u *upstream, now time.Time) bool {
	if f.down.Load() || f.stopped.Load() || now.UnixNano() < u.fleet.lease.Load() {
		return true
	}
	if u.fleet.wanting.CompareAndSwap(false, true) {
		select {
		case f.leases <- u:
		default:
			u.fleet.wanting.Store(false)
		}
	}
	return false
}

// publish queues e, without waiting; a full queue drops it.
func (f *fleet) publish(e SharedEvent) {
	if f.stopped.Load() {
		return
	}
	e.Member, e.at = f.member, time.Now()
	q := f.queue
	if e.Kind == SharedFailure {
		q = f.failures
	}
	select {
	case q <- e:
	default:
		f.dropped.Inc()
	}
}

// changed publishes a state change of u's circuit that this process made.
func (f *fleet) changed(u *upstream, c stateChange) {
	if c.remote {
		return
	}
	switch {
	case c.to == Open:
		if left := u.breaker.remaining(); left > 0 {
			f.publish(SharedEvent{Upstream: u.name, Kind: SharedOpen, For: left})
		}
	case c.to == Closed:
		u.fleet.lease.Store(0)
		f.publish(SharedEvent{Upstream: u.name, Kind: SharedClosed, For: u.breaker.probeTTL})
	}
}

// failure publishes a failed attempt on u, while its circuit is closed,
// and trips it when the fleet's failures are dense enough.
func (f *fleet) failure(u *upstream) {
	if !u.breaker.counting || u.breaker.status() != Closed {
		return
	}
	now := time.Now()
	rate := u.rate(now)
	f.publish(SharedEvent{Upstream: u.name, Kind: SharedFailure, Rate: rate, at: now})
	if u.fleet.dense(now, "", 0, rate, u.breaker.threshold) && f.ticks.Load() >= 2 {
		u.breaker.trip()
	}
}

// rate is this process's recent requests per second to u.
func (u *upstream) rate(now time.Time) float64 {
	return u.window.rate(now, now.Add(-rateWindow))
}

// cooled publishes u's cooldown.
func (f *fleet) cooled(u *upstream, d time.Duration, reason CooldownReason) {
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
			ttl := u.breaker.probeTTL
			if f.call(ctx, func(ctx context.Context) (err error) {
				got, err = f.s.AcquireProbe(ctx, u.name, f.member, ttl)
				return err
			}) && got {
				u.fleet.lease.Store(now.Add(ttl).UnixNano())
			}
			u.fleet.wanting.Store(false)
		case <-tick.C:
			f.shareRates(ctx)
			f.reconcile(ctx)
			if f.ticks.Load() < 2 {
				f.ticks.Add(1)
			}
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
	for _, u := range f.t.upstreams {
		if !u.breaker.counting {
			continue
		}
		if rate := u.rate(now); rate > 0 {
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
	case SharedOpen, SharedCooling, SharedRate:
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
	type mark struct{ since, openUntil, coolUntil int64 }
	marks := make([]mark, len(f.t.upstreams))
	snap := func(u *upstream) mark {
		return mark{u.breaker.since.Load(), u.breaker.openUntil.Load(), u.cd.until.Load()}
	}
	for i, u := range f.t.upstreams {
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
	for i, u := range f.t.upstreams {
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
			if u.breaker.openUntil.Load() == 0 {
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
		err := f.s.Subscribe(ctx, func(e SharedEvent) {
			f.received.Inc()
			if e.Member != f.member {
				f.apply(e)
			}
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

// apply adopts an event from the fleet into this process's state.
func (f *fleet) apply(e SharedEvent) {
	u := f.byName[e.Upstream]
	if u == nil {
		return // an upstream this process does not have
	}
	now := time.Now()
	switch e.Kind {
	case SharedOpen:
		if e.For > 0 && (u.breaker.status() != Open || u.breaker.openLeft(now) < e.For) {
			u.breaker.holdOpen(now.Add(e.For))
			f.adopted.Inc()
		}
	case SharedClosed, SharedReset:
		u.fleet.lease.Store(0)
		if u.breaker.status() != Closed {
			u.breaker.closeRemote()
			f.adopted.Inc()
		}
		if e.Kind == SharedReset {
			u.cd.clear()
		}
	case SharedFailure:
		// Dated by its member's clock, not by its arrival: messages
		// delayed on the way and delivered together would look like a
		// burst. A skew between clocks shifts one member's failures as a
		// whole, which makes stray failures no likelier to line up.
		at := e.At
		if at.IsZero() || at.After(now) {
			at = now
		}
		if !u.breaker.counting || now.Sub(at) > maxFailureAge {
			return
		}
		// Until the members' rates are known (two periods after start),
		// the fleet's rate would be underestimated and stray failures
		// would look dense: failures are recorded but not judged.
		if u.fleet.dense(at, e.Member, e.Rate, u.rate(now), u.breaker.threshold) && f.ticks.Load() >= 2 && u.breaker.failing.Load() && u.breaker.status() == Closed {
			u.breaker.trip()
			f.adopted.Inc()
		}
	case SharedRate:
		if e.Member != f.member && e.Rate > 0 {
			u.fleet.noteRate(e.Member, e.Rate, now)
		}
	case SharedCooling:
		if e.For > 0 && u.cd.remaining(now) < e.For {
			reason := e.Reason
			if reason == "" {
				reason = CooldownRateLimited
			}
			u.cd.extend(now, e.For, reason)
			f.adopted.Inc()
		}
	}
}

// call runs one call to the store, bounded by the period, and reports
// whether it succeeded.
func (f *fleet) call(ctx context.Context, fn func(context.Context) error) bool {
	cctx, cancel := context.WithTimeout(ctx, f.every)
	err := fn(cctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			f.failed(err)
		}
		return false
	}
	f.started.Store(true)
	if f.down.CompareAndSwap(true, false) {
		// What this process learned alone stays its own: telling it now
		// could reopen a circuit the fleet closed meanwhile.
		f.log(slog.LevelInfo, "shared state reachable again")
	}
	return true
}

// failed counts a failure of the store, and logs the first of an outage.
func (f *fleet) failed(err error) {
	f.errors.Inc()
	if f.down.CompareAndSwap(false, true) {
		f.log(slog.LevelWarn, "shared state unreachable; each process runs on its own state until it is back", slog.String("error", err.Error()))
	}
}

func (f *fleet) log(level slog.Level, msg string, attrs ...slog.Attr) {
	if l := f.t.logger; l != nil && l.Enabled(context.Background(), level) {
		l.LogAttrs(context.Background(), level, "failover: "+msg, attrs...)
	}
}
