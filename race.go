package failover

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"slices"
	"time"

	"github.com/failover-go/failover/internal/circuit"
)

// The race of a hedged round once its first delay has passed (see
// hedge.go for the round's start, its budget and its delay): the racer
// sends each hedge as its delay passes, takes the first answer that ends
// the request, and fails over as a round does when every attempt in
// flight failed; the attempts that lost are canceled, drained and closed
// on goroutines of their own (abandon), and a panic in one is reported
// (logPanic) rather than lost.

// racer is a hedged round once a delay has passed: the attempts in flight,
// each on a goroutine of its own but the first, which is the caller's.
// Only the goroutine that runs it reads or writes the call until the round
// ends.
type racer struct {
	c       *call
	ctx     context.Context
	order   []*upstream
	results chan *attempt
	flying  []*attempt
	tried   []bool // upstreams the round has sent to or skipped
	left    int    // upstreams not tried
	hedges  int
}

// run sends the hedge the passed delay calls for, then takes the first
// answer that ends the request, sending further hedges as their delays
// pass and failing over as usual when every attempt in flight failed.
// However the round ends, even by a panic, the attempts still in flight
// are canceled and closed.
func (r *racer) run() (*http.Response, error, bool) {
	c, h := r.c, r.c.t.hedge
	defer func() { c.t.abandon(r.flying, r.results) }()
	defer func() { c.traceAbandoned(r.flying, time.Now()) }() // first; a hook's panic still leaves abandon to run
	var timer *time.Timer
	arm := func(a *attempt) {
		d := c.t.hedgeDelay(a.u, time.Now())
		if timer == nil {
			timer = time.NewTimer(d)
			return
		}
		timer.Reset(d)
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	hedgeNow := func() {
		if r.ctx.Err() != nil {
			// The caller gave up (before the delay passed, with a Base
			// that does not heed it, or as the tick came): no hedge for
			// a request that is over; the select ends the round.
			return
		}
		if sent, _ := r.next(true); !sent {
			r.hedges = h.MaxHedges // out of budget, or nowhere to hedge to
			return
		}
		r.hedges++
		arm(r.flying[len(r.flying)-1])
	}
	hedgeNow()
	for {
		var tick <-chan time.Time
		if timer != nil && r.hedges < h.MaxHedges && r.left > 0 && !probing(r.flying) {
			tick = timer.C
		}
		select {
		case <-r.ctx.Done():
			c.discardHeld()
			return nil, r.ctx.Err(), true
		case <-tick:
			hedgeNow()
		case a := <-r.results:
			r.flying = slices.DeleteFunc(r.flying, func(b *attempt) bool { return b == a })
			if a.panicked != nil {
				a.stop(nil)
				panic(a.panicked) // the deferred abandon cleans up the rest
			}
			if resp, err, done := c.settle(a); done {
				if a.hedge && resp != nil && resp == a.resp {
					h.won.Inc()
				}
				return resp, err, true
			}
			if len(r.flying) > 0 {
				continue // another attempt may still answer
			}
			sent, stop := r.next(false) // fail over as usual
			if stop {
				return c.finishRound()
			}
			if !sent {
				return nil, nil, false
			}
			arm(r.flying[0])
		}
	}
}

// next launches the next upstream in order that takes the request. It
// reports whether it did, and whether the request is over. A hedge goes
// only to an upstream whose circuit is closed, passing over the others and
// leaving them to fail over to.
func (r *racer) next(isHedge bool) (sent, stop bool) {
	c := r.c
	for i, u := range r.order {
		now := time.Now()
		if r.tried[i] || (isHedge && u.circuit.Status(now) != circuit.Closed) {
			continue
		}
		r.tried[i] = true
		r.left--
		a := new(attempt)
		mode := plain
		if isHedge {
			mode = hedge
		}
		switch c.launch(r.ctx, a, u, mode, now) {
		case skipped:
			continue
		case declined:
			r.tried[i] = false
			r.left++
			return false, false
		case dropped:
			return false, false
		case over:
			return false, true
		}
		r.flying = append(r.flying, a)
		go a.fly(c.request, r.results)
		return true, false
	}
	return false, false
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
	returned := false
	defer func() {
		if v := recover(); v != nil {
			a.panicked = v
			a.stack = debug.Stack()
		} else if !returned {
			a.goexited() // Base ended this goroutine (runtime.Goexit)
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
	a.send(&r)
	returned = true
}

// abandon ends the attempts still in flight: it cancels those that have
// not answered, which clean up when Base returns, and closes the answers
// already on their way.
func (t *Transport) abandon(attempts []*attempt, results <-chan *attempt) {
	pending := 0
	for _, a := range attempts {
		a.lost.Store(true)
		if a.state.CompareAndSwap(flying, abandoned) {
			a.stop(errHedgeLost)
		} else {
			pending++ // delivered: on its way to results
		}
	}
	for range pending {
		// Draining an answer can take a while: not on the caller's time.
		go t.drop(<-results)
	}
}

// drop cleans up after a, an attempt nobody waits for, and logs its
// panic, if it had one.
func (t *Transport) drop(a *attempt) {
	a.cleanup()
	if a.panicked != nil {
		t.logPanic(a)
	}
}

// cleanup closes what an attempt nobody waits for got: it drains a
// response (so that its connection can serve again), then ends its context.
func (a *attempt) cleanup() {
	if a.resp != nil {
		discard(a.resp)
	}
	a.stop(errHedgeLost)
}

// logPanic reports the panic of an attempt nobody waits for, scrubbed of
// the credentials of the request Base was given (its upstream's Header,
// the caller's own when it went to the upstream they are for), which the
// panic's value may quote.
func (t *Transport) logPanic(a *attempt) {
	msg := fmt.Sprintf("failover: panic in an abandoned hedged attempt to %s: %v\n%s", a.u.name, a.panicked, a.stack)
	t.reportPanic(redact(msg, t.creds.upstreamSecrets, compactSecrets(t.creds.appendRequestSecrets([]string{}, a.out))))
}
