package failover

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// The failover loop: why a request went to the backup. run makes rounds
// until one settles the request; each round (round) takes the upstreams
// in the order that order (or the Router) gives, where the one decision
// of upstream.go, admit and demotion, puts first those that may take the
// request and last those demoted (failing, auth_failing, out_of_headroom,
// degraded, suspect), and try sends the request to the first that admits
// it. An upstream passed over is recorded with its reason (skip), which
// the Error and the Trace report; an answer that fails over moves the
// round on to the next. Between rounds, backoff waits as
// go-retryablehttp's policy says, and when no upstream may take the
// request at all, lastResort sends it past the circuit that opened first.

// run is the failover loop of one request: the rounds, until one settles
// it or the retries, the body or the caller's context end them.
func (c *call) run() (*http.Response, error) {
	defer c.end()
	limit, err := c.options()
	if err != nil {
		return nil, err
	}
	if err := c.body.init(c.req, limit); err != nil {
		c.callerFault = true // the caller's body failed to read
		return nil, err
	}
	if c.t.models {
		// A body of GetBody is read for its model whatever MaxBodyBuffer,
		// which is for the bodies without one: within it, or 8 MiB
		// when it is negative (never buffer).
		c.model, c.modelBody = c.body.model(cmp.Or(max(c.t.maxBody, 0), defaultMaxBodyBuffer))
	}
	if c.t.hedge != nil {
		c.t.hedge.earn()
	}
	ctx := c.req.Context()
	var waited time.Duration
	for round := 0; ; c.roundNo++ {
		c.attempts, c.fatal, c.notHere = 0, 0, 0
		errsBefore := len(c.errs)
		if resp, err, done := c.round(ctx); done {
			return resp, err
		}
		if !c.body.canSend() {
			return c.finish()
		}
		now := time.Now()
		next, known := c.t.earliest(c.servable(c.usable()), c.model, now)
		var wait time.Duration
		switch {
		case c.attempts == c.notHere:
			// Every upstream was skipped, or said it cannot serve the
			// request: wait within MaxWait for the first of the others
			// to come back, or try the last resort among them (never
			// for a request sent at most once: see WithoutFailover).
			if !known || next <= 0 || next > c.t.rate.MaxWait-waited {
				if u := c.t.lastResort(c.servable(c.usable()), c.model, now); u != nil && !c.once() {
					return c.lastResort(ctx, u, now)
				}
				return c.finish()
			}
			wait = next
			if dl, ok := ctx.Deadline(); !ok || now.Add(wait).Before(dl) {
				c.errs = c.errs[:errsBefore] // the next round says it again
			}
		case round < c.t.retries && c.fatal < c.attempts:
			wait = c.backoff(round, now)
			if known && next > wait {
				if next > c.t.rate.MaxCooldown {
					return c.finish() // nothing comes back in time
				}
				wait = next
			}
			round++
		default:
			return c.finish()
		}
		if dl, ok := ctx.Deadline(); ok && !now.Add(wait).Before(dl) {
			return c.finish()
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

// backoff is the wait before round+1: a held 429's or 503's Retry-After
// (RetryAfter reads it, saturating; go-retryablehttp's DefaultBackoff
// would multiply a huge value past int64), else DefaultBackoff's
// exponential wait; never more than MaxCooldown, never negative.
func (c *call) backoff(round int, now time.Time) time.Duration {
	if r := c.held; r != nil && (r.StatusCode == http.StatusTooManyRequests || r.StatusCode == http.StatusServiceUnavailable) {
		if d, ok := RetryAfter(r.Header, now); ok {
			return min(d, c.t.rate.MaxCooldown)
		}
	}
	return min(max(retryablehttp.DefaultBackoff(c.t.waitMin, c.t.waitMax, round, nil), 0), c.t.rate.MaxCooldown)
}

// round tries each upstream in order once. It reports done with the
// result when the request is over.
func (c *call) round(ctx context.Context) (*http.Response, error, bool) {
	now := time.Now()
	if c.start.IsZero() {
		c.start = now // the body's init before is the caller's time
	}
	hedged := c.t.hedge != nil && c.body.replayable && !c.once()
	if c.t.router == nil && !hedged {
		return c.roundInOrder(ctx, now)
	}
	var buf [8]*upstream
	if !hedged && c.ups == nil && len(c.refused) == 0 {
		// This package's Routers name their first pick without ordering
		// the others, which are ordered only if it does not settle the
		// request (see firstRouted).
		if first, then := c.t.firstRouted(c.model, now); first != nil {
			if resp, err, done := c.try(ctx, first, false, &now); done {
				return resp, err, true
			}
			now = time.Now()
			for i, u := range c.t.routed(buf[:0], c.model, now, first, then) {
				if resp, err, done := c.try(ctx, u, i > 0, &now); done {
					return resp, err, true
				}
			}
			return nil, nil, false
		}
	}
	if hedged && (c.t.router == nil || c.ups != nil) {
		// The configured order, its demoted upstreams found as the round
		// goes (as roundInOrder does), not all read first.
		if ups := c.servable(c.usable()); len(ups) > 1 {
			return c.hedgedRound(ctx, ups, true)
		}
	}
	order := c.servable(c.t.order(buf[:0], c.ups, c.model, now))
	if hedged && len(order) > 1 {
		return c.hedgedRound(ctx, slices.Clone(order), false) // order may be on this stack; the round keeps it
	}
	for i, u := range order {
		if resp, err, done := c.try(ctx, u, i > 0, &now); done {
			return resp, err, true
		}
	}
	return nil, nil, false
}

// roundInOrder is round for the configured order (no Router, no Hedge):
// Transport.order's, the demoted upstreams after the others, found as the
// round goes, so that a request the first upstream serves looks at no
// other, however many there are.
func (c *call) roundInOrder(ctx context.Context, now time.Time) (*http.Response, error, bool) {
	var buf [8]*upstream
	demoted := buf[:0]
	tried := false
	for i, u := range c.usable() {
		if len(c.refused) > 0 && slices.Contains(c.refused, u) {
			continue // it cannot serve this request (see servable)
		}
		if i < 64 && c.t.demotion(u, now) != "" { // as Transport.order: past 64, none is
			demoted = append(demoted, u)
			continue
		}
		if resp, err, done := c.try(ctx, u, tried, &now); done {
			return resp, err, true
		}
		tried = true
	}
	for _, u := range demoted {
		if resp, err, done := c.try(ctx, u, tried, &now); done {
			return resp, err, true
		}
		tried = true
	}
	return nil, nil, false
}

// try is u's turn in a round: it sends the request to u when admit lets
// it, and reports done with the result when the request is over. later
// says an upstream came before u in the round, so now is read again.
func (c *call) try(ctx context.Context, u *upstream, later bool, now *time.Time) (*http.Response, error, bool) {
	if err := ctx.Err(); err != nil {
		c.discardHeld()
		return nil, err, true
	}
	if later {
		*now = time.Now() // the attempts before took time
	}
	var a attempt
	switch c.launch(ctx, &a, u, plain, *now) {
	case skipped:
		return nil, nil, false
	case over:
		return c.finishRound()
	}
	a.send(&c.request)
	if resp, err, done := c.settle(&a); done {
		return resp, err, true
	}
	if c.once() {
		return c.finishRound() // sent once: what it got is the answer
	}
	return nil, nil, false
}

// lastResort sends the request to u, which admit refused for its circuit,
// when every upstream the request may use did so (see
// Transport.lastResort), and ends the request with what comes back.
func (c *call) lastResort(ctx context.Context, u *upstream, now time.Time) (*http.Response, error) {
	var a attempt
	if c.launch(ctx, &a, u, lastResort, now) != ready {
		return c.finish()
	}
	a.send(&c.request)
	if resp, err, done := c.settle(&a); done {
		return resp, err
	}
	return c.finish()
}

// skip records that u was not tried, and why. passedOver says whether the
// request's first choice was passed over (not so for a hedge's: the
// attempt it hedges is in flight).
func (c *call) skip(u *upstream, a availability, passedOver bool) {
	u.m.skipped[a.reason].Inc()
	if c.trace != nil && c.trace.Skipped != nil {
		ts := TraceSkip{Upstream: u.name, Round: int(c.roundNo), Reason: a.reason}
		if a.known {
			ts.RetryAfter = a.wait
		}
		c.callHook(nil, func() { c.trace.Skipped(ts) })
	}
	if a.reason == ReasonModelNotServed {
		c.addErr(u, ErrModelNotServed)
		return
	}
	if passedOver {
		c.passed++
	}
	c.record(attemptRec{u: u, cause: a.err(), retryAfter: a.wait})
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

// order returns the upstreams in the order a request for model tries
// them: the router's order (the configured one when there is no router),
// or the request's own list (ups, from WithUpstreams: the router is not
// asked), demoted upstreams last. Without a router it allocates nothing:
// it returns the list (t.upstreams, or ups) when no upstream is demoted,
// and reorders into buf otherwise (past the 64th, no upstream is demoted).
func (t *Transport) order(buf, ups []*upstream, model string, now time.Time) []*upstream {
	if ups == nil {
		if t.router != nil {
			return t.routed(buf, model, now, nil, nil)
		}
		ups = t.upstreams
	}
	var demoted uint64
	for i, u := range ups {
		if i < 64 && t.demotion(u, now) != "" {
			demoted |= 1 << i
		}
	}
	if demoted == 0 {
		return ups
	}
	out := buf[:0]
	for i, u := range ups {
		if i >= 64 || demoted&(1<<i) == 0 {
			out = append(out, u)
		}
	}
	for i, u := range ups {
		if i < 64 && demoted&(1<<i) != 0 {
			out = append(out, u)
		}
	}
	return out
}
