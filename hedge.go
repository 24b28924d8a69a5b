package failover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/failover-go/failover/internal/circuit"
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
// Only a request whose body can be sent twice is hedged: no body, a body
// with GetBody, or one the Transport buffered (see Config.MaxBodyBuffer).
// A hedge counts against no retry: when an attempt fails before the delay,
// the request fails over as usual. A half-open probe is never hedged, and a
// hedge never probes: a canceled probe would leave its circuit without a
// verdict.
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

// race is a round with hedging: it tries the upstreams in order, sending
// the request to the next one also when the attempts in flight have not
// answered within the delay, and takes the first answer that ends the
// request. It reports done with the result when the request is over.
//
// Each attempt runs in its own goroutine, with its own copy of the
// request. When the request is over, the attempts still in flight are
// canceled; each closes what it got when Base returns.
func (c *call) race(ctx context.Context, order []*upstream) (*http.Response, error, bool) {
	h := c.t.hedge
	c.racing = true
	defer func() { c.racing = false }()
	results := make(chan *attempt, len(order))
	var flying []*attempt
	hedges := 0
	tried := make([]bool, len(order)) // upstreams the round has sent to or skipped
	left := len(order)
	// However the round ends, even by a panic, the attempts still in
	// flight are canceled and closed.
	defer func() { c.t.abandon(flying, results) }()
	defer func() { c.traceAbandoned(flying, time.Now()) }() // first; a hook's panic still leaves abandon to run

	// next launches the next upstream in order that takes the request.
	// It reports whether it did, and whether the request is over. A
	// hedge goes only to an upstream whose circuit is closed, passing
	// over the others and leaving them to fail over to.
	next := func(isHedge bool) (sent, stop bool) {
		for i, u := range order {
			now := time.Now()
			if tried[i] || (isHedge && u.circuit.Status(now) != circuit.Closed) {
				continue
			}
			tried[i] = true
			left--
			a := new(attempt)
			mode := plain
			if isHedge {
				mode = hedge
			}
			switch c.launch(ctx, a, u, mode, now) {
			case skipped:
				continue
			case declined:
				tried[i] = false
				left++
				return false, false
			case dropped:
				return false, false
			case over:
				return false, true
			}
			flying = append(flying, a)
			go a.fly(c.request, results)
			return true, false
		}
		return false, false
	}

	sent, stop := next(false)
	if stop {
		return c.finishRound()
	}
	if !sent {
		return nil, nil, false
	}
	timer := time.NewTimer(c.t.hedgeDelay(flying[0].u, time.Now()))
	defer timer.Stop()
	for {
		var tick <-chan time.Time
		if hedges < h.MaxHedges && left > 0 && !probing(flying) {
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			c.discardHeld()
			return nil, ctx.Err(), true
		case <-tick:
			if sent, _ := next(true); !sent {
				hedges = h.MaxHedges // out of budget, or nowhere to hedge to
				continue
			}
			hedges++
			timer.Reset(c.t.hedgeDelay(flying[len(flying)-1].u, time.Now()))
		case a := <-results:
			flying = slices.DeleteFunc(flying, func(b *attempt) bool { return b == a })
			if a.panicked != nil {
				a.cancel(nil)
				panic(a.panicked) // the deferred abandon cleans up the rest
			}
			if resp, err, done := c.settle(a); done {
				if a.hedge && resp != nil && resp == a.resp {
					h.won.Inc()
				}
				return resp, err, true
			}
			if len(flying) > 0 {
				continue // another attempt may still answer
			}
			sent, stop := next(false) // fail over as usual
			if stop {
				return c.finishRound()
			}
			if !sent {
				return nil, nil, false
			}
			timer.Reset(c.t.hedgeDelay(flying[0].u, time.Now()))
		}
	}
}

// probing reports whether one of attempts is a half-open probe: it is not
// hedged, since a probe canceled by a winning hedge gives its circuit no
// verdict, and the next request would probe again.
func probing(attempts []*attempt) bool {
	for _, a := range attempts {
		if a.p.Probe() {
			return true
		}
	}
	return false
}

// fly runs a and hands its result to the call, or cleans up when the call
// is over. A panic in Base or Classify reaches the caller's goroutine; when
// the call is over, it is logged instead, as net/http logs a handler's
// panic: the caller has its answer, and a panic on a goroutine of our own
// would end the program.
func (a *attempt) fly(r request, results chan<- *attempt) {
	defer func() {
		if v := recover(); v != nil {
			a.panicked = v
			a.stack = debug.Stack()
		}
		if a.state.CompareAndSwap(flying, delivered) {
			results <- a // never blocks: it holds every attempt of the round
			return
		}
		a.cleanup()
		if a.panicked != nil {
			r.t.logPanic(a)
		}
	}()
	a.send(r)
}

// abandon ends the attempts still in flight: it cancels those that have
// not answered, which clean up when Base returns, and closes the answers
// already on their way.
func (t *Transport) abandon(attempts []*attempt, results <-chan *attempt) {
	pending := 0
	for _, a := range attempts {
		a.lost.Store(true)
		if a.state.CompareAndSwap(flying, abandoned) {
			a.cancel(errHedgeLost)
		} else {
			pending++ // delivered: on its way to results
		}
	}
	for range pending {
		// Draining an answer can take a while: not on the caller's time.
		go func(a *attempt) {
			a.cleanup()
			if a.panicked != nil {
				t.logPanic(a)
			}
		}(<-results)
	}
}

// cleanup closes what an attempt nobody waits for got: it drains a
// response (so that its connection can serve again), then ends its context.
func (a *attempt) cleanup() {
	if a.resp != nil {
		discard(a.resp)
	}
	a.cancel(errHedgeLost)
}

// logPanic reports the panic of an attempt nobody waits for.
func (t *Transport) logPanic(a *attempt) {
	msg := fmt.Sprintf("failover: panic in an abandoned hedged attempt to %s: %v\n%s", a.u.name, a.panicked, a.stack)
	if t.logger != nil {
		t.logger.Error(msg)
		return
	}
	log.Print(msg)
}
