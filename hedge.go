package failover

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/failover-go/failover/internal/circuit"
	"github.com/failover-go/failover/internal/mono"
)

// HedgeConfig turns on hedging: when an attempt has not answered within a
// delay, the same request also goes to the next upstream of the plan, and
// the first answer wins; the other attempt is canceled and its response,
// if it had one, drained and closed.
//
// Hedging trades money for tail latency: every hedge is a request the
// providers bill. The budget bounds it to Percent % of the requests plus a
// burst of 10. Only a request whose body can be sent twice is hedged (no
// body, GetBody, or one the Transport buffered); a half-open probe is
// never hedged, and a hedge never probes. An attempt that fails before the
// delay fails over as usual. A Base that ignores its request's canceled
// context holds the caller until it returns. An httptrace.ClientTrace in
// the request's context hears hedged attempts at the same time: its hooks
// must be safe for concurrent use. A canceled attempt counts against its
// upstream only when the upstream looks hung ([HangConfig]).
type HedgeConfig struct {
	// Delay is how long the first attempt may go unanswered before the
	// hedge is sent. Zero means the p95 of the attempted upstream's
	// recent latency (over Window), kept between MinDelay and MaxDelay,
	// and MaxDelay while the upstream has fewer than MinSamples recent
	// latencies.
	Delay time.Duration

	// MinDelay is the shortest latency-based delay. Zero means 20ms.
	MinDelay time.Duration

	// MaxDelay is the longest latency-based delay. Zero means 2s.
	MaxDelay time.Duration

	// MaxHedges is how many hedges one request may send, each a delay
	// after the one before, each to the next upstream. Zero means 1.
	MaxHedges int

	// Percent is the budget: hedges per 100 requests. Zero means 10;
	// 100 means no budget: every request may be hedged.
	Percent float64

	// Window is how far back the latencies of the latency-based delay
	// reach. Zero means 30s.
	Window time.Duration

	// MinSamples is the fewest recent latencies for the latency-based
	// delay; with fewer, the delay is MaxDelay. Zero means 20.
	MinSamples int
}

const defaultHedgeMaxDelay = 2 * time.Second

// hedgeBurst is how many hedges the budget holds when full.
const hedgeBurst = 10

// hedgeUnit is one hedge in the budget's count.
const hedgeUnit = 1_000_000

func (c HedgeConfig) withDefaults() HedgeConfig {
	if c.MinDelay == 0 {
		c.MinDelay = 20 * time.Millisecond
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = defaultHedgeMaxDelay
	}
	if c.MaxHedges == 0 {
		c.MaxHedges = 1
	}
	if c.Percent == 0 {
		c.Percent = 10
	}
	if c.Window == 0 {
		c.Window = defaultRecentWindow
	}
	if c.MinSamples == 0 {
		c.MinSamples = defaultMinSamples
	}
	return c
}

func (c HedgeConfig) validate() error {
	switch {
	case c.Delay < 0:
		return configError("Hedge.Delay", "must not be negative")
	case c.MinDelay < 0:
		return configError("Hedge.MinDelay", "must not be negative")
	case c.MaxDelay < 0:
		return configError("Hedge.MaxDelay", "must not be negative")
	case c.MinDelay > cmp.Or(c.MaxDelay, defaultHedgeMaxDelay):
		return configError("Hedge.MinDelay", "must not exceed Hedge.MaxDelay")
	case c.MaxHedges < 0:
		return configError("Hedge.MaxHedges", "must not be negative")
	case c.Percent < 0 || c.Percent > 100 || c.Percent != c.Percent:
		return configError("Hedge.Percent", "must be between 0 and 100")
	case c.Window < 0:
		return configError("Hedge.Window", "must not be negative")
	case c.MinSamples < 0:
		return configError("Hedge.MinSamples", "must not be negative")
	}
	return nil
}

// hedger is the Transport's hedging: its configuration, budget and
// metrics.
type hedger struct {
	HedgeConfig
	// tokens is the budget in millionths of a hedge (hedgeUnit): each
	// request adds Percent/100 of a hedge, each hedge takes one, and it
	// holds at most hedgeBurst.
	tokens  atomic.Int64
	deposit int64

	sent   *metrics.Counter
	won    *metrics.Counter
	denied *metrics.Counter
}

func newHedger(c HedgeConfig, s *metrics.Set) *hedger {
	c = c.withDefaults()
	h := &hedger{
		HedgeConfig: c,
		deposit:     int64(c.Percent / 100 * hedgeUnit),
		sent:        s.GetOrCreateCounter(famHedges.series()),
		won:         s.GetOrCreateCounter(famHedgeWins.series()),
		denied:      s.GetOrCreateCounter(famHedgesDenied.series()),
	}
	h.tokens.Store(hedgeBurst * hedgeUnit)
	return h
}

// earn adds one request's share to the budget.
func (h *hedger) earn() {
	for {
		v := h.tokens.Load()
		if v >= hedgeBurst*hedgeUnit || h.tokens.CompareAndSwap(v, min(v+h.deposit, hedgeBurst*hedgeUnit)) {
			return
		}
	}
}

// spend takes one hedge from the budget, if it has one.
func (h *hedger) spend() bool {
	if h.Percent >= 100 {
		return true
	}
	for {
		v := h.tokens.Load()
		if v < hedgeUnit {
			h.denied.Inc()
			return false
		}
		if h.tokens.CompareAndSwap(v, v-hedgeUnit) {
			return true
		}
	}
}

// refund gives back a hedge that was not sent.
func (h *hedger) refund() {
	if h.Percent >= 100 {
		return
	}
	for {
		v := h.tokens.Load()
		if h.tokens.CompareAndSwap(v, min(v+hedgeUnit, hedgeBurst*hedgeUnit)) {
			return
		}
	}
}

// hedgeDelay is how long an attempt on u may go unanswered before a
// hedge.
func (t *Transport) hedgeDelay(u *upstream, now time.Time) time.Duration {
	h := t.hedge
	if h.Delay > 0 {
		return h.Delay
	}
	f := u.hedgeRecent.get(&u.window, now)
	if f.samples < h.MinSamples {
		return h.MaxDelay
	}
	return min(max(f.p95, h.MinDelay), h.MaxDelay)
}

// errHedgeLost cancels an attempt whose request another attempt answered.
var errHedgeLost = errors.New("failover: another attempt answered first")

// hedgedParts is what a hedged attempt takes, in one allocation: the
// attempt and the parts of its request (which prepare would allocate),
// its timer, the race it becomes when its delay passes first, and room
// for the race's targets.
type hedgedParts struct {
	a    attempt
	o    outParts
	hw   headersWatch
	w    hedgeWait
	race race
	buf  [4]*upstream
}

// sendHedged is send for a request that may go twice. The attempt goes to
// Base on the caller's goroutine, as without hedging, with a timer armed
// for its delay: an attempt answered in time costs a pooled timer and
// nothing more. When the delay passes first, the timer's goroutine runs
// the race (race.go), sending hedges to the next upstreams of the plan
// while the caller waits in Base; the caller takes the race over when
// Base returns.
func (c *call) sendHedged(ctx context.Context, p *plan, s *step, now time.Time, tried uint64) (*http.Response, error, bool) {
	x := new(hedgedParts)
	a := &x.a
	a.own, a.watch = &x.o, &x.hw
	if c.request.launch(ctx, &c.tally, &c.body, a, s, plain, true, now) != ready {
		return c.finishRound()
	}
	c.failedOver(s.u)
	var targets []*upstream
	if h := c.t.hedge; !a.p.Probe() && c.hedges < h.MaxHedges {
		targets = hedgeTargets(*p, x.buf[:0], h.MaxHedges-c.hedges, now)
	}
	if len(targets) == 0 {
		a.send(&c.request) // nowhere to hedge to, or a probe: never hedged
		return c.settleRekeyed(ctx, p, s, a, tried)
	}
	r := &x.race
	r.req, r.body, r.ctx, r.first, r.targets, r.hedges = c.request, c.body, ctx, a, targets, c.hedges
	r.tally = tally{roundNo: c.roundNo, sent: c.sent, secrets: c.secrets}
	x.w.arm(r)
	a.hedged = &x.w
	a.sendCatching(&c.request, &x.w)
	raced := x.w.end()
	x.w.recycle()
	if raced {
		return c.race(ctx, p, r)
	}
	if a.panicked != nil {
		panic(a.panicked) // send closed what it had, as without hedging
	}
	return c.settleRekeyed(ctx, p, s, a, tried)
}

// settleRekeyed settles a, answered before any hedge went, and sends the
// request at once with another key of its upstream when its key said 429
// or 401 (see call.rekey), hedged again; tried are the keys sent to.
// (After a race, the request moves on to the next upstream instead.)
func (c *call) settleRekeyed(ctx context.Context, p *plan, s *step, a *attempt, tried uint64) (*http.Response, error, bool) {
	resp, err, done := c.settleSent(a)
	if done || a.k == nil {
		return resp, err, done
	}
	tried |= a.k.bit
	if now, ok := c.rekey(p, s, a, tried); ok {
		return c.sendHedged(ctx, p, s, now, tried)
	}
	return resp, err, done
}

// hedgeTargets appends to dst the next n upstreams of q, a copy of the
// round's plan (which it does not move on), whose circuits are closed and
// that admit takes now: where the hedges go, each admitted again when it
// is sent. A hedge never goes to an upstream that is not closed: it would
// probe it. One that admit refuses (cooling down, or not serving the
// model) would only use up a hedge: the round passes over it in its turn.
func hedgeTargets(q plan, dst []*upstream, n int, now time.Time) []*upstream {
	for len(dst) < n {
		u, _ := q.upcoming(now)
		if u == nil {
			break
		}
		if u.circuit.Status(now) == circuit.Closed && q.t.admit(u, q.model, now, nil).reason == "" {
			dst = append(dst, u)
		}
	}
	return dst
}

// sendCatching is send, the panic of Base or Classify kept in a rather
// than raised: the caller raises it once the race, if any, has stopped.
func (a *attempt) sendCatching(r *request, w *hedgeWait) {
	returned := false
	defer func() {
		if v := recover(); v != nil {
			a.panicked = v
			a.stack = debug.Stack()
			return
		}
		if !returned {
			// Base ended the caller's goroutine (runtime.Goexit), which
			// ends whatever comes: the race must not wait for a.
			a.goexited()
			if w.end() {
				w.race.abandonAll()
			}
		}
	}()
	a.send(r)
	returned = true
}

// goexited makes a, whose Base ended its goroutine before returning, an
// attempt that ends the request with ErrBaseGoexit, blaming no upstream.
// What it had in hand when it ended (Classify or a read of the body by
// the stream guard may end it after Base answered) is closed and its
// context ended, as send does on a panic: nobody else will.
func (a *attempt) goexited() {
	if a.resp != nil {
		a.resp.Body.Close()
	}
	a.stop(nil)
	if a.end.IsZero() {
		a.end = time.Now() // Base never returned: the attempt ended now, for the Trace and the call's lastEnd
		a.endM = mono.Of(a.end)
	}
	a.resp, a.err, a.o, a.callerFault = nil, ErrBaseGoexit, Canceled, true
}

// A hedgeWait's states.
const (
	idle    = iota // not armed, or its attempt answered in time
	waiting        // the attempt is in Base, the timer armed
	fired          // the delay passed first: the race runs
)

// hedgeWait is the timer of a hedged attempt, which waits in Base on the
// caller's goroutine, and the race the timer's goroutine runs when the
// delay passes first. (Its timer and the timer's func come from a pool,
// but in a synctest bubble: see hedgeFire.)
type hedgeWait struct {
	timer   *time.Timer // time.AfterFunc(f.fn), made by arm or f's
	f       *hedgeFire  // nil until armed
	spent   bool        // the timer fired, or may have: f is not given back
	bubbled bool        // armed in a synctest bubble: the timer is the bubble's

	mu       sync.Mutex
	state    int
	due      time.Time // when the delay passes; a fire before is a stale one
	race     *race
	disarmed bool // the attempt's headers came first (disarm): its timer is stopped, or spent
}

// disarm stops w's timer once its attempt's headers came, before the
// attempt's stream is held for its first content: only silence before the
// headers is hedged. A race already running is left to end.
func (w *hedgeWait) disarm() {
	w.mu.Lock()
	waiting := w.state == waiting
	if waiting {
		w.state = idle
	}
	w.mu.Unlock()
	if waiting {
		w.disarmed = true
		if !w.timer.Stop() {
			w.spent = true // its fire is on its way, to find w idle
		}
	}
}

// arm starts the delay of r.first, launched and about to be sent on the
// caller's goroutine.
func (w *hedgeWait) arm(r *race) {
	now := time.Now() // after launch, which may have taken a while (a Trace hook): the delay runs from the send
	d := r.req.t.hedgeDelay(r.first.u, now)
	w.mu.Lock()
	w.state, w.due, w.race = waiting, now.Add(d), r
	w.mu.Unlock()
	w.f = hedgeFires.Get().(*hedgeFire)
	w.f.w.Store(w)
	if w.bubbled = inBubble(now); !w.bubbled && w.f.timer != nil {
		w.timer = w.f.timer
		w.timer.Reset(d)
		return
	}
	w.timer = time.AfterFunc(d, w.f.fn)
}

// hedgeFire is the func a hedgeWait's timer runs, and the hedgeWait it
// runs for, pooled with the timer that runs it when that was made outside
// any synctest bubble: an attempt whose timer never fired gives them back
// (recycle), stopped, so that an unfired hedge allocates nothing. One whose
// timer fired, or may have, is left to the garbage collector: its func may
// still be on its way, and must find the attempt it was armed for.
//
// A timer made in a bubble belongs to it, and to stop or reset it from
// outside is fatal (a pooled one would go to a request in another bubble,
// or in none): it is never pooled, nor is a bubble's attempt given a pooled
// one (it would run on the real clock).
type hedgeFire struct {
	w     atomic.Pointer[hedgeWait]
	fn    func()      // run, made once with the hedgeFire
	timer *time.Timer // time.AfterFunc(fn), made outside any bubble and stopped; nil until then
}

// inBubble reports whether now, from time.Now, was read in a synctest
// bubble: there time.Now has no monotonic reading ("Don't return a
// monotonic time inside a synctest bubble", runtime/time.go), and outside
// one it always has (TestInBubble holds both on the Go it runs with).
func inBubble(now time.Time) bool {
	return now == now.Round(0) // Round(0) strips the monotonic reading alone
}

var hedgeFires = sync.Pool{New: func() any {
	f := new(hedgeFire)
	f.fn = f.run
	return f
}}

func (f *hedgeFire) run() {
	if w := f.w.Load(); w != nil {
		w.fire()
	}
}

// recycle gives w's timer's func back to the pool at the attempt's end
// when the timer never fired: every Stop found it armed, so the func is
// not on its way, and cannot be.
func (w *hedgeWait) recycle() {
	if w.f == nil || w.spent {
		return
	}
	w.f.w.Store(nil)
	if !w.bubbled {
		w.f.timer = w.timer // stopped: the last Stop found it armed
	}
	hedgeFires.Put(w.f)
	w.f, w.timer = nil, nil
}

// end is the caller's side once Base has returned: it disarms the timer
// when the delay has not passed (false: the caller settles its attempt,
// as without hedging); else it stops the race's goroutine and reports
// true: the caller takes the race over.
func (w *hedgeWait) end() bool {
	w.mu.Lock()
	raced := w.state == fired
	w.state = idle
	w.mu.Unlock()
	if !raced {
		if !w.disarmed && !w.timer.Stop() {
			w.spent = true // its fire is on its way, to find w idle
		}
		return false
	}
	w.spent = true
	close(w.race.back)
	<-w.race.stopped
	return true
}

// fire runs on the timer's goroutine when the delay passes: unless the
// attempt answered first, it runs the race until the caller takes it
// over.
func (w *hedgeWait) fire() {
	w.mu.Lock()
	if w.state != waiting || time.Now().Before(w.due) {
		w.mu.Unlock()
		return
	}
	w.state = fired
	r := w.race
	r.back, r.stopped = make(chan struct{}), make(chan struct{})
	r.results = make(chan *attempt, len(r.targets))
	w.mu.Unlock()
	// The race's goroutines are the caller's work: its profiler labels
	// (pprof.Do), which the hedges' goroutines inherit.
	pprof.SetGoroutineLabels(r.ctx)
	r.run()
}
