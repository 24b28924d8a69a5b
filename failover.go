package failover

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// The failover loop. run makes rounds until one settles the request; a
// round walks the round's plan (plan.go), which says which upstream comes
// next and why, and sends the request to each it admits, plainly or
// hedged, until an answer settles it. Between rounds, backoff waits as
// go-retryablehttp's policy says, and when no upstream may take the
// request at all, the last resort sends it past the circuit that opened
// first.

// run is the failover loop of one request: the rounds, until one settles
// it or the retries, the body or the caller's context end them.
func (c *call) run() (*http.Response, error) {
	c.t.retry.budget.active.Add(1)
	defer c.end()
	limit, err := c.options()
	if err != nil {
		return nil, err
	}
	if k := c.continuation(); k != nil {
		c.ups = k.ups // the upstreams that continue the stream
	}
	if err := c.body.init(c.req, limit); err != nil {
		c.callerFault = true // the caller's body failed to read
		return nil, err
	}
	if c.opts != nil && c.opts.pinned != "" {
		if err := c.byOption(c.opts.pinned); err != nil {
			return nil, err
		}
	}
	if early := c.readsEarly(); c.t.models || c.t.affinity != nil || early {
		data := c.body.data(c.t.readLimit())
		c.body.keep(data)
		c.read(data)
		if early {
			c.readPins(data)
		}
	}
	if c.pin != nil && c.ups != nil && !slices.Contains(c.ups, c.pin) {
		c.callerFault = true // the caller's own contradiction: nothing was sent
		c.record(attemptRec{u: c.pin, err: ErrLeftOut, msg: ErrLeftOut.Error()})
		return c.finish()
	}
	if c.t.hedge != nil {
		c.t.hedge.earn()
	}
	ctx := c.req.Context()
	var waited time.Duration
	extra := false // the round is one of Config.Retries: it holds a place in the retry budget
	for round := 0; ; c.roundNo++ {
		c.attempts, c.fatal, c.notHere, c.hedges = 0, 0, 0, 0
		errsBefore := len(c.errs)
		resp, err, done := c.round(ctx)
		c.retried(extra)
		extra = false
		if done {
			return resp, err
		}
		if !c.body.canSend() {
			return c.finish()
		}
		now := time.Now()
		next, known := c.t.earliest(c.candidates(), c.admitting(), now)
		var wait time.Duration
		switch {
		case c.attempts == c.notHere && known && next <= 0 && !c.rerounded:
			// An upstream the round passed over takes requests now: a
			// circuit's open time ended, or a cooldown, since the round
			// looked. Another round at once, but only once: what
			// admission says does not change back and forth for ever.
			c.rerounded = true
			c.errs = c.errs[:errsBefore] // the next round says it again
		case c.attempts == c.notHere:
			// Every upstream was skipped, or said it cannot serve the
			// request: wait within MaxWait for the first of the others
			// to come back, or try the last resort among them (never
			// for a request sent at most once: see WithoutFailover). A
			// sheddable request is refused at once (see WithSheddable),
			// and so is a pinned one (see PinConfig).
			if c.shed() {
				return c.refuse(next, known)
			}
			if c.pin != nil {
				return c.finish() // pinned: refused at once, not failed over
			}
			if !known || next <= 0 || next > c.t.rate.MaxWait-waited {
				if u := c.t.lastResort(c.candidates(), c.admitting(), now); u != nil && !c.once() && !c.pinnedFor(u) {
					return c.lastResort(ctx, u, now)
				}
				return c.finish()
			}
			wait = next
			if dl, ok := ctx.Deadline(); !ok || now.Add(wait).Before(dl) {
				c.errs = c.errs[:errsBefore] // the next round says it again
			}
		case round < c.t.retries && c.fatal < c.attempts && !c.shed():
			wait = c.backoff(round, now)
			if known && next > wait {
				if next > c.t.rate.MaxCooldown {
					return c.finish() // nothing comes back in time
				}
				wait = next
			}
			round++
			extra = true
		default:
			return c.finish()
		}
		if dl, ok := ctx.Deadline(); ok && !now.Add(wait).Before(dl) {
			return c.finish()
		}
		if extra && !c.takeRetry() {
			return c.finish() // the retry budget is spent
		}
		if wait <= 0 {
			continue
		}
		c.bufferHeld()
		c.slept = true
		if err := sleep(ctx, wait); err != nil {
			c.discardHeld()
			return nil, err
		}
		waited += wait
	}
}

// candidates are the upstreams a round of the request may ask: those it
// may use (servable), or its pin alone.
func (c *call) candidates() []*upstream {
	if c.pin != nil {
		return c.t.upstreams[c.pin.index : c.pin.index+1]
	}
	return c.servable(c.usable())
}

// readLimit is the largest body read for what it says (its model, its
// session, the state it references): a body of GetBody is read whatever
// MaxBodyBuffer, which is for the bodies without one: within it, or 8 MiB
// when it is negative (never buffer).
func (t *Transport) readLimit() int64 { return cmp.Or(max(t.maxBody, 0), defaultMaxBodyBuffer) }

// backoff is the wait before round+1: a held 429's or 5xx's Retry-After
// (503, Anthropic's 529 "overloaded"; RetryAfter reads it, saturating:
// go-retryablehttp's DefaultBackoff would multiply a huge value past
// int64), else DefaultBackoff's exponential wait; never more than
// MaxCooldown, never negative.
func (c *call) backoff(round int, now time.Time) time.Duration {
	if r := c.held; r != nil && (r.StatusCode == http.StatusTooManyRequests || r.StatusCode/100 == 5) {
		if d, ok := RetryAfter(r.Header, now); ok {
			return min(d, c.t.rate.MaxCooldown)
		}
	}
	return min(max(retryablehttp.DefaultBackoff(c.t.waitMin, c.t.waitMax, round, nil), 0), c.t.rate.MaxCooldown)
}

// round walks the round's plan once: it sends the request to each
// upstream the plan admits, in its order, and records each it passes
// over. It reports done with the result when the request is over.
func (c *call) round(ctx context.Context) (*http.Response, error, bool) {
	now := time.Now()
	if c.start.IsZero() {
		c.start = now // the body's init before is the caller's time
	}
	var p plan
	c.plan(&p, now)
	var s step
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			c.discardHeld()
			return nil, err, true
		}
		if i > 0 {
			now = time.Now() // the attempts before took time
		}
		if !p.next(now, &s) {
			return nil, nil, false
		}
		if s.av.reason == "" && !c.pinsRead && s.u != c.addressed && c.pinLate(&p, &s, now) {
			continue // the request references state elsewhere: the plan is made anew
		}
		if s.av.reason != "" {
			c.skip(&c.request, s.u, s.av, true)
			c.logSkip(s.u, s.av)
			continue
		}
		if resp, err, done := c.send(ctx, &p, &s, now); done {
			return resp, err, true
		}
	}
}

// send sends the request to s.u, which the plan admitted, and settles
// what comes back: hedged when the request may go twice (hedge.go),
// plainly otherwise. It reports done with the result when the request is
// over.
func (c *call) send(ctx context.Context, p *plan, s *step, now time.Time) (*http.Response, error, bool) {
	if c.t.hedge != nil && c.body.replayable && !c.once() && c.pin == nil && !c.shed() && len(c.usable()) > 1 {
		return c.sendHedged(ctx, p, s, now, 0)
	}
	var tried uint64 // the keys of s.u sent to (Upstream.Keys)
	for retry := false; ; {
		var plainAttempt attempt
		a := &plainAttempt
		if t := s.u.timeouts; t.Headers > 0 || t.Attempt > 0 || c.opts != nil {
			// Bounded: the attempt, its parts and its watch in one
			// allocation.
			x := new(timedParts)
			a = &x.a
			a.own, a.watch = &x.o, &x.w
		}
		if c.request.launch(ctx, &c.tally, &c.body, a, s, plain, false, now) != ready {
			c.retried(retry)
			return c.finishRound()
		}
		c.failedOver(s.u)
		a.send(&c.request)
		resp, err, done := c.settleSent(a)
		c.retried(retry)
		if done {
			return resp, err, true
		}
		if a.k != nil {
			tried |= a.k.bit
			if now, retry = c.rekey(p, s, a, tried); retry {
				retry = false // another key: no retry
				continue
			}
		}
		if retry, now, err = c.again(ctx, p, s, a); !retry {
			return nil, err, err != nil
		}
	}
}

// rekey decides whether the request goes at once to another key of the
// upstream whose key a's answer refused (a 429, an exhausted quota, a 401
// or a 403), tried being the keys it went to (see plan.nextKey), as it
// would to another upstream: no wait, no retry. When it does, it admits
// the upstream anew into s, with that key, at the time it returns.
func (c *call) rekey(p *plan, s *step, a *attempt, tried uint64) (time.Time, bool) {
	if a.o != RateLimited && a.o != AuthFailed || !c.body.canSend() {
		return time.Time{}, false
	}
	now := time.Now()
	k := p.nextKey(a.u, tried, now)
	if k == nil {
		return now, false
	}
	c.t.admittedKey(a.u, c.model, k.name, true, now, s)
	return now, s.av.reason == ""
}

// again decides whether the request goes once more to the upstream whose
// attempt a just failed it, rather than on to the next (see RetryConfig;
// plan.switching says whether moving on costs anything). When it does, it
// waits, takes a place in the retry budget, and admits the upstream anew
// into s at the time it returns. It returns the context's error when the
// caller gave up during the wait.
func (c *call) again(ctx context.Context, p *plan, s *step, a *attempt) (bool, time.Time, error) {
	u, t := a.u, c.t
	bit := uint64(1) << min(u.index, 63) // (upstreams past 63 share one retry)
	if t.retry.off || c.sameRetried&bit != 0 || !c.body.canSend() || c.shed() {
		return false, time.Time{}, nil
	}
	now := time.Now()
	wait, ok := t.retryWait(a, now)
	if !ok {
		return false, time.Time{}, nil
	}
	if dl, ok := ctx.Deadline(); ok && !now.Add(wait+t.retryMargin(u, now)).Before(dl) {
		return false, time.Time{}, nil
	}
	if p.switching(u, now) == switchFree || !t.readmits(u, c.model, now, wait) || !c.takeRetry() {
		return false, time.Time{}, nil
	}
	c.sameRetried |= bit
	c.bufferHeld()
	c.slept = true
	if err := sleep(ctx, wait); err != nil {
		c.retried(true)
		c.discardHeld()
		return false, time.Time{}, err
	}
	now = time.Now()
	want, strict := p.wantKey, p.strictKey
	if !strict && a.k != nil {
		want = a.k.name // kept, unless it cools down now or looks revoked
	}
	t.admittedKey(u, c.model, want, strict, now, s)
	if s.av.reason != "" {
		c.retried(true) // taken meanwhile (a circuit opened, a cooldown grew): on to the next
		return false, time.Time{}, nil
	}
	u.m.retries.Inc()
	return true, now, nil
}

// takeRetry takes a place in the retry budget for one retry of the
// request: an extra round, or an attempt again at the same upstream.
func (c *call) takeRetry() bool {
	if !c.t.retry.budget.take() {
		return false
	}
	c.budgeted++
	return true
}

// retried gives back the place of a retry that is over, when it took one.
func (c *call) retried(took bool) {
	if took {
		c.budgeted--
		c.t.retry.budget.done(1)
	}
}

// timedParts is what an attempt with a bound on its headers takes, in one
// allocation: the attempt, the parts of its request (which prepare would
// allocate, with the context the bound ends) and its watch.
type timedParts struct {
	a attempt
	o outParts
	w headersWatch
}

// settleSent settles a, the round's attempt at its turn: a request sent
// at most once ends with what it got.
func (c *call) settleSent(a *attempt) (*http.Response, error, bool) {
	if resp, err, done := c.settle(a); done {
		return resp, err, true
	}
	if c.once() {
		return c.finishRound() // sent once: what it got is the answer
	}
	return nil, nil, false
}

// failedOver counts a move from the last failed upstream to u, once u's
// attempt has its body: one whose GetBody failed moved on to nothing.
func (c *call) failedOver(u *upstream) {
	if c.last != nil && c.last != u {
		c.t.countFailover(c.last, u)
		c.logFailover(u)
	}
}

// lastResort sends the request to u, which admit refused for its circuit,
// when every upstream the request may use did so (see
// Transport.lastResort), and ends the request with what comes back.
func (c *call) lastResort(ctx context.Context, u *upstream, now time.Time) (*http.Response, error) {
	var a attempt
	s := step{u: u}
	if len(u.keys) > 0 {
		if s.k = c.t.pickKey(u, "", false, false, now); s.k == nil {
			return c.finish() // every key cools down
		}
	}
	if c.request.launch(ctx, &c.tally, &c.body, &a, &s, lastResort, false, now) != ready {
		return c.finish()
	}
	c.failedOver(u)
	a.send(&c.request)
	if resp, err, done := c.settle(&a); done {
		return resp, err
	}
	return c.finish()
}

// servable is ups without the upstreams that answered this request
// Unservable (ups itself when there are none: it is not written to).
func (c *call) servable(ups []*upstream) []*upstream {
	if len(c.refused) == 0 {
		return ups
	}
	out := make([]*upstream, 0, len(ups))
	for _, u := range ups {
		if !slices.Contains(c.refused, u) {
			out = append(out, u)
		}
	}
	return out
}

func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
