package failover

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/failover-go/failover/internal/mono"
)

// HedgeConfig turns on hedging: when an attempt has not answered within a
// delay, the same request also goes to the next upstream in order, and the
// first answer wins. The other attempt is canceled and its response, if it
// had one, drained and closed.
//
// Hedging trades money for tail latency: every hedge is a second request
// the providers bill, and an answer that was only slow, not lost, is paid
// for twice. The budget bounds that: over any stretch of time, hedges are
// at most Percent % of the requests plus a burst of 10. A delay at the
// upstream's p95 hedges about the slowest 5 % of requests, so a Percent
// above 5 rarely binds on a normal day and holds the bill on a slow one.
//
// The first attempt of a round goes to Base on the caller's goroutine, as
// without hedging, and a timer waits for its delay: a request answered in
// time costs no goroutine or channel, and no allocation more (the timer
// comes from a pool). When the delay
// passes first, the timer's goroutine runs the rest of the round, and
// RoundTrip returns the winner's answer once Base has returned from the
// first attempt, which is canceled when it loses: a Base that does not
// return when its request's context is canceled (http.Transport does)
// holds the caller until it returns, as it would with an AttemptTimeout.
//
// Only a request whose body can be sent twice is hedged: no body, a body
// with GetBody, or one the Transport buffered (see Config.MaxBodyBuffer).
// A hedge counts against no retry: when an attempt fails before the delay,
// the request fails over as usual. A half-open probe is never hedged, and a
// hedge never probes: a canceled probe would leave its circuit without a
// verdict. An httptrace.ClientTrace in the request's context hears every
// attempt, hedged ones at the same time: its hooks must be safe for
// concurrent use, as they are for a request whose dials race (net/http's
// Happy Eyeballs).
//
// A canceled attempt counts as neither success nor failure, unless its
// upstream looks hung when it is canceled: it is suspected of hanging (see
// HangConfig), or, with enough recent latencies to know its p99
// (HangConfig.MinSamples), it has answered nothing since the attempt started
// and the attempt waited past the hang limit (HangConfig's Multiple of that
// p99, at least Floor). Then it counts as a failure, as it would have when
// it timed out, so that hedging does not hide a hung upstream from its
// breaker. An upstream with too few recent latencies is not judged so: a
// slow one and a hung one then look alike. A fixed Delay far below an
// upstream's usual latency makes every attempt on it lose, and with a
// known p99 it then looks hung and its circuit opens; the default delay,
// its own p95, leaves it most of its answers.
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

// Where a hedged attempt's result goes.
const (
	flying    = iota
	delivered // sent to the call
	abandoned // the call is over: the attempt cleans up after itself
)

// hedgedRound is a round with hedging. It tries the upstreams in order,
// each attempt on the caller's goroutine, as a round without hedging
// does, with a timer armed for its delay (hedgeWait). An attempt that
// answers within the delay costs the hedging its timer, a pooled one, and
// nothing more: no goroutine, no channel. When the delay passes first,
// the timer's goroutine takes the round over (racer): it sends the hedge,
// and takes the first answer that ends the request, the caller's
// attempt's too when Base returns it. It reports done with the result
// when the request is over.
//
// The round runs on a copy of the call in the heap, made with the first
// attempt in one allocation: the goroutine that takes the round over
// needs it, and the caller's call is on a stack, which moves.
func (c *call) hedgedRound(ctx context.Context, order []*upstream, lazy bool) (*http.Response, error, bool) {
	x := new(struct {
		c call
		a attempt
		o outParts
		w hedgeWait
	})
	x.c = *c
	defer func() { *c = x.c }() // after the round is the caller's alone again, even by a panic
	resp, err, done := x.c.hedgedRoundOn(ctx, order, lazy, &x.a, &x.o, &x.w)
	x.w.recycle()
	return resp, err, done
}

// hedgedRoundOn is hedgedRound on the call's copy. With lazy, order is the
// configured order, and its demoted upstreams (Transport.demotion) are
// tried after the others, found as the round goes: an attempt answered in
// time reads no other upstream's demotion, however many there are.
func (c *call) hedgedRoundOn(ctx context.Context, order []*upstream, lazy bool, first *attempt, own *outParts, w *hedgeWait) (*http.Response, error, bool) {
	c.racing = true // every attempt has its own context and URL
	defer func() { c.racing = false }()
	var buf [8]*upstream
	demoted := buf[:0]
	n := len(order)
	for k := 0; k < n+len(demoted); k++ {
		var u *upstream
		var rest []*upstream // the upstreams after u, for the hedges and the failovers
		unsorted := 0        // how many of rest, from its start, may be demoted
		now := time.Now()
		if k < n {
			u = order[k]
			if lazy && k < 64 && c.t.demotion(u, now) != "" { // as Transport.order: past 64, none is
				demoted = append(demoted, u)
				continue
			}
			rest, unsorted = order[k+1:], n-k-1
			if !lazy {
				unsorted = 0
			}
		} else {
			u = demoted[k-n]
		}
		if err := ctx.Err(); err != nil {
			c.discardHeld()
			return nil, err, true
		}
		a := first
		if a == nil {
			a = new(attempt) // after a failover: the first one's parts are taken
		}
		a.own = own
		switch c.launch(ctx, a, u, plain, now) {
		case skipped:
			*a = attempt{} // not sent: the next upstream's turn takes it
			continue
		case over:
			return c.finishRound()
		}
		first, own = nil, nil
		later := demoted // the demoted upstreams after u
		if k >= n {
			later = demoted[k-n+1:]
		}
		armed := !a.p.Probe() && len(rest)+len(later) > 0 // someone to hedge to
		if armed {
			w.arm(c, ctx, a, rest, unsorted, later, k)
		}
		if !armed {
			a.send(&c.request)
		} else {
			a.sendCatching(c.request, w)
			if res, raced := w.end(c.t, a); raced {
				if res.panicked != nil {
					panic(res.panicked)
				}
				if res.goexited {
					runtime.Goexit() // a hook's, on the racer's goroutine: see fire
				}
				if a.end.After(c.lastEnd) {
					// The round ended before Base returned a: the caller
					// waited for it all the same (see ended's Duration).
					c.lastEnd = a.end
				}
				return res.resp, res.err, res.done
			}
			if a.panicked != nil {
				panic(a.panicked) // send closed what it had, as without hedging
			}
		}
		if resp, err, done := c.settle(a); done {
			return resp, err, true
		}
	}
	return nil, nil, false
}

// sendCatching is send, the panic of Base or Classify kept in a rather
// than raised: the attempt's hedgeWait says on which goroutine it is
// raised.
func (a *attempt) sendCatching(r request, w *hedgeWait) {
	returned := false
	defer func() {
		if v := recover(); v != nil {
			a.panicked = v
			a.stack = debug.Stack()
			return
		}
		if !returned {
			// Base ended the caller's goroutine (runtime.Goexit), which
			// ends whatever comes: the round must not wait for a.
			a.goexited()
			if res, raced := w.end(r.t, a); raced && res.resp != nil {
				res.resp.Body.Close() // nobody is left to read it
			}
		}
	}()
	a.send(&r)
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
	fired          // the delay passed first: a racer has the round
)

// hedgeWait is the timer of an attempt of a hedged round, which waits in
// Base on the caller's goroutine, and what the timer's goroutine needs to
// take the round over when the delay passes first. It is made with the
// round (hedgedRound), its timer at the first attempt and armed again for
// each after; its channels only when the delay passes. (Its timer and the
// timer's func come from a pool, but in a synctest bubble: see hedgeFire.)
type hedgeWait struct {
	timer   *time.Timer // time.AfterFunc(f.fn), made by the first arm or f's
	f       *hedgeFire  // nil until the first arm
	spent   bool        // the timer fired, or may have: f is not given back
	bubbled bool        // the first arm was in a synctest bubble: the timer is the bubble's
	final   chan raceResult

	mu       sync.Mutex
	state    int
	due      time.Time // when the delay passes; a fire before is an earlier attempt's
	c        *call
	ctx      context.Context
	a        *attempt
	order    []*upstream // the upstreams after a's, read only
	unsorted int         // how many of order, from its start, have their demotions not read (racerOrder)
	index    int         // a's place in the round's configured order
	results  chan *attempt
}

// raceResult is a racer's end of the round, or its panic, or its
// goroutine's end (runtime.Goexit, in a Trace hook).
type raceResult struct {
	resp     *http.Response
	err      error
	done     bool
	panicked any
	goexited bool
}

// arm starts the delay of a, an attempt of c's round launched and about
// to be sent on the caller's goroutine. The upstreams after a's, for the
// hedges and the failovers, are rest, of which the first unsorted are in the configured
// order with their demotions not read yet, then later, demoted ones; index
// is a's place in the round's configured order (for the 64 whose demotion
// is read).
//
// rest is kept as it is (the round's order is in the heap: the
// configured order, or a copy), later copied after it when there are
// any (they may be on the caller's stack).
func (w *hedgeWait) arm(c *call, ctx context.Context, a *attempt, rest []*upstream, unsorted int, later []*upstream, index int) {
	now := time.Now() // after launch, which may have taken a while (a Trace hook): the delay runs from the send
	d := c.t.hedgeDelay(a.u, now)
	order := rest
	if len(later) > 0 {
		order = append(slices.Clip(rest), later...)
	}
	w.mu.Lock()
	w.state, w.due = waiting, now.Add(d)
	w.c, w.ctx, w.a, w.index, w.unsorted, w.order = c, ctx, a, index, unsorted, order
	w.mu.Unlock()
	if w.timer != nil {
		w.timer.Reset(d)
		return
	}
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
// any synctest bubble: a round whose timer never fired gives them back
// (recycle), stopped, so that an unfired hedge allocates nothing. One whose
// timer fired, or may have, is left to the garbage collector: its func may
// still be on its way, and must find the round it was armed for.
//
// A timer made in a bubble belongs to it, and to stop or reset it from
// outside is fatal (a pooled one would go to a request in another bubble,
// or in none): it is never pooled, nor is a bubble's round given a pooled
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

// recycle gives w's timer's func back to the pool at the round's end
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

// racerOrder is the order of the upstreams a racer may send to: w.order,
// its first unsorted ones' demotions read now, as Transport.order's, the
// demoted after the others and before those already found demoted.
func (w *hedgeWait) racerOrder(now time.Time) []*upstream {
	head := w.order[:w.unsorted]
	var demoted uint64
	for i, u := range head {
		if w.index+1+i < 64 && w.c.t.demotion(u, now) != "" {
			demoted |= 1 << i
		}
	}
	if demoted == 0 {
		return w.order
	}
	out := make([]*upstream, 0, len(w.order))
	for i, u := range head {
		if demoted&(1<<i) == 0 {
			out = append(out, u)
		}
	}
	out = append(out, w.order[w.unsorted:]...)
	for i, u := range head {
		if demoted&(1<<i) != 0 {
			out = append(out, u)
		}
	}
	return out
}

// end is the caller's side once Base has returned a's answer: it disarms
// the timer when the delay has not passed (raced false: the caller settles
// a, as without hedging); else it hands a to the racer that has the round,
// as a hedge's goroutine does, and waits for the round's end.
func (w *hedgeWait) end(t *Transport, a *attempt) (res raceResult, raced bool) {
	w.mu.Lock()
	raced = w.state == fired
	results, final := w.results, w.final
	w.state = idle
	w.mu.Unlock()
	if !raced {
		if !w.timer.Stop() {
			w.spent = true // its fire is on its way, to find w idle
		}
		w.release()
		return raceResult{}, false
	}
	w.spent = true
	switch {
	case a.state.CompareAndSwap(flying, delivered):
		results <- a // never blocks: it holds every attempt of the round
	case a.resp != nil:
		// The round is over: nobody waits for a. Draining its answer can
		// take a while: not on the caller's time (see abandon).
		go t.drop(a)
	default:
		t.drop(a)
	}
	res = <-final
	w.release()
	return res, true
}

// release clears w for the round's next attempt. A fire of its timer that
// is already on its way finds it idle, or armed for a later attempt whose
// delay has not passed.
func (w *hedgeWait) release() {
	w.mu.Lock()
	w.c, w.ctx, w.a, w.order, w.results, w.final = nil, nil, nil, nil, nil, nil
	w.mu.Unlock()
}

// fire runs on the timer's goroutine when the delay passes: unless the
// attempt answered first, it takes the round over and runs it to its end,
// which it hands to the caller's goroutine with a panic, if one comes, or
// a hook's runtime.Goexit, which the caller's goroutine then takes.
func (w *hedgeWait) fire() {
	w.mu.Lock()
	if w.state != waiting || time.Now().Before(w.due) {
		w.mu.Unlock()
		return
	}
	w.state = fired
	// The round's goroutines are the caller's work: its profiler labels
	// (pprof.Do), which the hedges' goroutines inherit.
	pprof.SetGoroutineLabels(w.ctx)
	order := w.racerOrder(time.Now())
	r := &racer{c: w.c, ctx: w.ctx, order: order, flying: []*attempt{w.a}}
	r.results = make(chan *attempt, len(order)+1)
	r.tried = make([]bool, len(order))
	r.left = len(order)
	w.results = r.results
	final := make(chan raceResult, 1)
	w.final = final
	w.mu.Unlock()
	var res raceResult
	returned := false
	defer func() {
		if v := recover(); v != nil {
			res = raceResult{panicked: v}
		} else if !returned {
			// A Trace hook (or a Logger's handler) ended this goroutine
			// (runtime.Goexit): r.run's deferred abandon has ended the
			// round; the caller, whose hook it is, ends as it would have
			// with the hook on its own goroutine.
			res = raceResult{goexited: true}
		}
		final <- res // never blocks: it holds one
	}()
	res.resp, res.err, res.done = r.run()
	returned = true
}
