package failover

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/failover-go/failover/internal/redact"
)

// The race of a hedged attempt once its delay has passed (see hedge.go
// for the attempt, its budget and its delay): hedges go to the next
// upstreams of the plan as their delays pass, each on a goroutine of its
// own that hands its result over a channel, and the first answer that
// ends the request wins; the attempts that lost are canceled, drained and
// closed on goroutines of their own (abandon), and a panic in one is
// reported (logPanic) rather than lost.
//
// Two goroutines run a race, one after the other, never both: the
// timer's while the caller waits in Base (run), then the caller's (race),
// which takes it over once the timer's has stopped. Neither writes the
// other's state: the timer's records in the race's own tally, which the
// call takes in.

// race is a hedged attempt's race.
type race struct {
	req     request         // the request, copied for the hedges' goroutines
	body    replay          // the body, copied: each hedge takes the next
	tally   tally           // what the race records until the caller takes it over
	ctx     context.Context // the request's
	first   *attempt        // the caller's, sent on its goroutine
	targets []*upstream     // where the hedges go, in order (hedgeTargets)
	taken   []*upstream     // the targets tried: the round's plan passes over them
	hedges  int             // hedges sent in the round
	timer   *time.Timer     // the next hedge's delay
	flying  []*attempt      // hedges in flight
	results chan *attempt   // the hedges' results, as they come
	got     []*attempt      // results taken in while the caller waited in Base
	back    chan struct{}   // closed by the caller when Base returned
	stopped chan struct{}   // closed when the timer's goroutine has stopped
	ended   time.Time       // when stop ended the attempts in flight; zero until it does

	// How the timer's goroutine ended, for the caller to go on with: a
	// Trace hook's panic, or its runtime.Goexit.
	panicked any
	goexited bool
}

// run is the race while the caller waits in Base, on the timer's
// goroutine: it sends the hedge the passed delay calls for, and the next
// ones as their delays pass, and takes in their results, which the Trace
// and the upstreams hear at once (heard). On an answer that ends the
// request it stops the other attempts, the caller's too, so that Base
// returns; their results, which may still come in, are the caller's to
// trace as abandoned. It stops when the caller is back.
func (r *race) run() {
	returned := false
	defer func() {
		if v := recover(); v != nil {
			r.panicked = v
		} else if !returned {
			r.goexited = true // a Trace hook or a Logger's handler ended this goroutine
		}
		if !returned {
			r.stop() // the request is over: the caller's attempt ends too
		}
		close(r.stopped)
	}()
	r.hedge(&r.tally)
	canceled, results := r.ctx.Done(), r.results
	for {
		select {
		case <-r.back:
			returned = true
			return
		case <-canceled:
			// The caller gave up: what the race took in before stands,
			// nothing after.
			r.stop()
			canceled, results = nil, nil
		case <-r.tick():
			r.hedge(&r.tally)
		case a := <-results:
			r.land(a)
			r.got = append(r.got, a)
			if a.panicked == nil && !a.lost.Load() {
				r.req.heard(&r.tally, a)
			}
			if a.final() {
				r.stop()
			}
		}
	}
}

// race takes r over once Base has returned r.first: it settles what the
// race took in, then r.first, then the hedges as they answer, sending
// further hedges as their delays pass. It reports done with the result
// when the request is over; when every attempt failed, the round goes on
// without the upstreams the race took.
func (c *call) race(ctx context.Context, p *plan, r *race) (resp *http.Response, err error, done bool) {
	first := r.first
	c.tally.takeIn(&r.tally)
	inHand := len(r.got)            // taken in before the caller gave up, if it did: they stand
	pending := append(r.got, first) // taken in, not settled yet
	var lost []*attempt             // stopped for another's answer
	defer func() {
		c.hedges = r.hedges
		p.taken = append(p.taken, r.taken...)
		if r.timer != nil {
			r.timer.Stop()
		}
		if first.end.After(c.lastEnd) {
			c.lastEnd = first.end // the caller waited for it all the same
		}
		r.req.t.abandon(r.flying, r.results)
		for _, a := range append(pending, lost...) {
			if a.resp != nil {
				go r.req.t.drop(a) // draining takes a while: not on the caller's time
			} else {
				r.req.t.drop(a)
			}
		}
	}()
	defer func() {
		// First: a hook's panic still leaves the above to run, and
		// closes the answer in hand.
		if c.trace == nil || c.trace.AttemptDone == nil {
			return
		}
		var unheard []*attempt
		for _, a := range append(pending, lost...) {
			if !a.heard && a.panicked == nil {
				unheard = append(unheard, a)
			}
		}
		at := r.ended // the race stopped them while the caller was in Base
		if at.IsZero() {
			at = time.Now()
		}
		c.callHook(resp, func() {
			c.request.traceAbandoned(&c.tally, append(unheard, r.flying...), at)
		})
	}()
	if r.panicked != nil {
		panic(r.panicked)
	}
	if r.goexited {
		runtime.Goexit() // a hook's, on the race's goroutine
	}
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil && n >= inHand {
			c.discardHeld()
			return nil, err, true
		}
		var a *attempt
		switch {
		case len(pending) > 0:
			a, pending = pending[0], pending[1:]
		case len(r.flying) == 0:
			return nil, nil, false // every attempt failed: the round goes on
		default:
			select {
			case <-ctx.Done():
				continue
			case <-r.tick():
				r.hedge(&c.tally)
				continue
			case a = <-r.results:
				r.land(a)
			}
		}
		if a.panicked != nil {
			a.stop(nil)
			panic(a.panicked) // the deferred abandon cleans up the rest
		}
		if a.lost.Load() {
			lost = append(lost, a) // dropped, and traced as abandoned
			continue
		}
		if resp, err, done := c.settle(a); done {
			if a.hedge && resp != nil && resp == a.resp {
				c.t.hedge.won.Inc()
			}
			return resp, err, true
		}
	}
}

// hedge sends a hedge to the next target that takes it, recording in l,
// and arms the timer for the one after. When none goes (no budget, no
// body, no target left) the race sends no more.
func (r *race) hedge(l *tally) {
	for r.ctx.Err() == nil && len(r.targets) > 0 {
		// (A caller that gave up gets no hedge for a request that is
		// over.)
		u := r.targets[0]
		r.targets = r.targets[1:]
		now := time.Now()
		var s step
		r.req.t.admitted(u, r.req.model, now, &s)
		r.taken = append(r.taken, u)
		if s.av.reason != "" {
			l.skip(&r.req, u, s.av, false)
			continue
		}
		a := new(attempt)
		switch r.req.launch(r.ctx, l, &r.body, a, &s, hedge, true, now) {
		case ready:
			r.hedges++
			r.flying = append(r.flying, a)
			go a.fly(&r.req, r.results)
			d := r.req.t.hedgeDelay(u, time.Now())
			if r.timer == nil {
				r.timer = time.NewTimer(d)
			} else {
				r.timer.Reset(d)
			}
			return
		case declined:
			r.taken = r.taken[:len(r.taken)-1] // untried: the round may fail over to it
		}
		break
	}
	r.targets = nil
}

// tick is the timer of the next hedge, nil when no more may go.
func (r *race) tick() <-chan time.Time {
	if r.timer == nil || len(r.targets) == 0 || r.hedges >= r.req.t.hedge.MaxHedges {
		return nil
	}
	return r.timer.C
}

// land takes a, a hedge's result, out of the attempts in flight.
func (r *race) land(a *attempt) {
	r.flying = slices.DeleteFunc(r.flying, func(b *attempt) bool { return b == a })
}

// stop ends the caller's attempt and the hedges in flight: an answer
// ends the request, or the race's goroutine ended. Their results are
// dropped as they come, and no hedge follows them: the caller may wait
// in a Base deaf to its canceled context for a while yet.
func (r *race) stop() {
	r.targets = nil
	if r.ended.IsZero() {
		r.ended = time.Now()
	}
	for _, a := range append(r.flying, r.first) {
		a.lost.Store(true)
		a.stop(errHedgeLost)
	}
}

// abandonAll ends the race for a caller whose goroutine Base ended: the
// hedges are abandoned and what the race took in is dropped.
func (r *race) abandonAll() {
	r.req.traceAbandoned(&r.tally, r.flying, time.Now())
	r.req.t.abandon(r.flying, r.results)
	for _, a := range r.got {
		r.req.t.drop(a)
	}
}

// fly runs a and hands its result to the race, or cleans up when the
// request is over. A panic in Base or Classify reaches the caller's
// goroutine; when the request is over, it is logged instead, as net/http
// logs a handler's panic: the caller has its answer, and a panic on a
// goroutine of our own would end the program.
func (a *attempt) fly(r *request, results chan<- *attempt) {
	returned := false
	defer func() {
		if v := recover(); v != nil {
			a.panicked = v
			a.stack = debug.Stack()
		} else if !returned {
			a.goexited() // Base ended this goroutine (runtime.Goexit)
		}
		if a.state.CompareAndSwap(flying, delivered) {
			results <- a // never blocks: it holds every hedge of the race
			return
		}
		a.cleanup()
		if a.panicked != nil {
			r.t.logPanic(a)
		}
	}()
	a.send(r)
	returned = true
}

// Where a hedge's result goes.
const (
	flying    = iota
	delivered // sent to the race
	abandoned // the request is over: the attempt cleans up after itself
)

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
	t.reportPanic(redact.String(msg, t.creds.upstreamSecrets, redact.Compact(t.creds.appendRequestSecrets([]string{}, a.out))))
}
