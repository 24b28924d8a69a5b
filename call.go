package failover

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/failover-go/failover/internal/circuit"
)

// maxAttemptErrors bounds how many causes an Error keeps.
const maxAttemptErrors = 64

// request is one RoundTrip's request as every attempt reads it. RoundTrip
// builds it before the first attempt and nothing writes it after: the
// call's attempts read the call's, and a hedged attempt's goroutine reads
// a copy in the heap (see hedgedParts).
type request struct {
	t         *Transport
	req       *http.Request // the caller's, never modified; its Context is the request's
	addressed *upstream
	rest      string // the request's path after the addressed base path
	rawRest   string // the same, escaped
	spelled   bool   // the caller's URL spells the scheme and host as addressed's BaseURL does (see keepsURL)

	// On a redirect hop, whom the caller's credentials belong to; nil
	// otherwise.
	hop *hop

	// The options of the request's context (WithUpstreams,
	// WithoutFailover, WithAttemptTimeout); nil without any.
	opts *requestOptions

	trace *Trace // from the request's context; nil without one

	// With Upstream.Models: the model the caller asked for, and the
	// body it is read from ("" when the body says none or cannot be
	// read: the request then goes to every upstream as it is).
	model     string
	modelBody []byte
}

// tally is what a request's attempts leave for its Error, its outcome and
// its Trace. The call keeps one; a race keeps its own while the caller
// waits in Base, which the call takes in when it takes the race over.
type tally struct {
	errs     []attemptRec // what happened at each upstream, for an Error
	secrets  []string     // the caller's credentials in every form, once an error needs them (redact)
	roundNo  int32        // the current round, for the Trace
	sent     int32        // attempts sent: the last one's number
	passed   int32        // upstreams passed over (skip) for another reason than the model
	attempts int          // launched in the current round
}

// call is one RoundTrip over the upstreams: its rounds and the waits
// between them, the body's replay, the answer held for lack of a better
// one, and what happened at each upstream. It belongs to its caller's
// goroutine alone: attempts and races never see it.
type call struct {
	request
	tally
	body replay

	ups     []*upstream    // the upstreams WithUpstreams allows, in its order; nil: every upstream, as the Router orders them
	held    *http.Response // the latest answer, returned if nothing better comes
	last    *upstream      // the upstream of the last failed attempt
	fatal   int            // attempts in the current round with permanent errors or Unservable answers
	notHere int            // attempts in the current round answered Unservable
	hedges  int            // hedges sent in the current round
	refused []*upstream    // upstreams that answered Unservable: no later round asks them again

	// Pinning (pin.go): the upstream that holds the state the request
	// references (nil: none) and its reference; whether its body was
	// read for them; and whether a success creates state to learn.
	pin      *upstream
	pinRef   string
	pinKey   string // the name of pin's key that holds it; "": any
	pinsRead bool
	creates  bool

	// With affinity: the request's session (0: none) and the upstream
	// that answered it last, if any (affinity.go).
	sessionKey  uint64
	affine      *upstream
	affineKey   string // the name of affine's key that answered it
	sameRetried uint64 // bit i: the request went again to the upstream of index i (63: any past it)
	budgeted    int    // places the request holds in the retry budget
	rerounded   bool   // a round came again at once, an upstream passed over having come back

	// How the request went, for its outcome (outcome) and its Trace.
	start       time.Time  // when the first round began
	lastEnd     time.Time  // when the last attempt the call took ended
	answer      attemptRef // the attempt whose answer RoundTrip returns
	heldBy      attemptRef // the attempt whose answer is held
	callerFault bool       // the request ended on the caller's own error
	slept       bool       // the request waited between rounds

	// Where the Request of answer's and heldBy's answer goes
	// (attempt.servedRoom); nil: Transport.served makes it.
	answerRoom, heldRoom *servedRequest
}

// ended is RoundTrip's last step: it tells the request's outcome to the
// metrics and the Trace.
//
// A streamed answer's body is wrapped to measure its time to first byte,
// and a metered one's to read its usage (usageBody, which times a stream's
// first byte too).
func (c *call) ended(resp *http.Response, err error) {
	o := c.outcome(resp, err)
	var took time.Duration
	switch {
	case c.start.IsZero():
	case c.slept || o == reqCanceled || o == reqUnavailable || c.lastEnd.IsZero():
		took = time.Since(c.start) // the request waited, or may have ended in a wait
	default:
		took = c.lastEnd.Sub(c.start) // nothing comes after the last attempt's end but finishing
	}
	var u *upstream
	if resp != nil {
		u = c.answer.u
	}
	k := c.continuation()
	if k == nil {
		c.t.reqs.count(u, o, took) // (a continuation is part of the caller's request, counted once)
	} else {
		k.sent = c.sent
	}
	if u != nil && !(c.meters() && c.meter(resp, u)) {
		// (A first look at the first byte spares isEventStream's work on
		// the JSON answers most requests get.)
		if ct := resp.Header["Content-Type"]; len(ct) > 0 && ct[0] != "" && ct[0][0]|0x20 == 't' && isEventStream(ct[0]) && resp.Body != nil && resp.Body != http.NoBody {
			resp.Body = &firstByteBody{ReadCloser: resp.Body, start: c.start, hist: &u.m.firstByte}
		}
	}
	if c.trace != nil && c.trace.Done != nil && k == nil {
		d := TraceDone{Outcome: requestOutcomes[o], Attempts: int(c.sent), Err: c.t.scrub(err, c.req, c.hop), Duration: took}
		if resp != nil {
			d.StatusCode = resp.StatusCode
			if a := c.answer; a.u != nil {
				d.Upstream, d.Attempt = a.u.name, int(a.n)
			}
		}
		c.callHook(resp, func() { c.trace.Done(d) })
	}
}

// end closes what run leaves behind: the caller's body when no attempt
// took it, and the answer held for lack of a better one, as a discarded
// answer is closed; and it leaves the retry budget. On a return, none is held (finish hands it on); one is
// when the caller's own code (a Router's, a Classifier's) panics or ends
// the goroutine (runtime.Goexit, which recover does not see), which then
// goes on.
func (c *call) end() {
	c.t.retry.budget.active.Add(-1)
	c.t.retry.budget.done(c.budgeted)
	c.body.closeUnused()
	c.discardHeld()
}

// callHook calls f, one of the Trace's hooks. When it panics or ends the
// goroutine (runtime.Goexit), the answers the call has in hand (resp and
// the held one) are closed before the panic or the Goexit goes on, as a
// discarded answer would be.
func (c *call) callHook(resp *http.Response, f func()) {
	returned := false
	defer func() {
		if !returned {
			if resp != nil {
				resp.Body.Close()
			}
			c.discardHeld()
		}
	}()
	f()
	returned = true
}

// firstByteBody is a streamed answer's body, which observes the time from
// the request's start to the first byte the caller reads.
type firstByteBody struct {
	io.ReadCloser
	start time.Time
	hist  *lazyHistogram
	seen  bool
}

func (b *firstByteBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.seen {
		b.seen = true
		b.hist.update(time.Since(b.start).Seconds())
	}
	return n, err
}

// How launch sends an attempt.
type launchMode int

const (
	plain      launchMode = iota // the upstream's turn in the round
	hedge                        // beside an attempt in flight (see race)
	lastResort                   // past the circuit's refusal (see Transport.lastResort)
)

// launched is what launch made of an upstream.
type launched int

const (
	ready    launched = iota // the attempt is prepared: send it
	skipped                  // the last resort's bound is reached (nothing recorded)
	declined                 // a hedge not sent: no budget, or it would probe; the upstream stays untried
	dropped                  // a hedge whose body could not be had (recorded)
	over                     // the request is over: finish it
)

// launch prepares a for s, a step the plan admitted (or the last
// resort's), with the next body of b, recording in l. It hands the permit
// back unused when a is not sent, even when GetBody panics. A hedge also
// needs a permit that is not the half-open probe (a probe canceled by a
// winning attempt would leave its circuit without a verdict) and the
// budget's consent. With racing, a has its own context and URL.
func (r *request) launch(ctx context.Context, l *tally, b *replay, a *attempt, s *step, mode launchMode, racing bool, now time.Time) launched {
	u, p := s.u, s.p
	if mode == lastResort && !r.t.takeLastResort() {
		return skipped // the last resort's bound: the circuit's refusal stands
	}
	sent, spent := false, false
	h := r.t.hedge
	defer func() {
		if sent {
			return
		}
		if mode == lastResort {
			r.t.lastResortDone()
		}
		if spent {
			h.refund()
		}
		u.circuit.Done(p, circuit.Neutral, now) // hands the permit back unused
	}()
	if mode == hedge {
		if p.Probe() || !h.spend() {
			return declined
		}
		spent = true
	}
	if !b.canSend() {
		l.addErr(r, u, ErrBodyNotReplayable)
		return over
	}
	a.u, a.k, a.p, a.start, a.hedge, a.lastResort, a.demoted = u, s.k, p, now, mode == hedge, mode == lastResort, s.demoted
	a.timeout, a.answer = r.attemptTimeouts(u)
	a.callerBound = r.opts != nil && r.opts.timeoutSet
	if dl, ok := ctx.Deadline(); ok && !a.callerBound {
		bound := a.timeout
		a.timeout = r.t.deadlineBound(u, bound, dl.Sub(now))
		a.cut = a.timeout < bound
	}
	l.attempts++
	if err := r.prepare(ctx, a, b, racing || a.timeout > 0 || a.answer > 0, !racing); err != nil {
		l.addErr(r, u, err)
		if mode == hedge {
			return dropped // the attempts in flight may still answer (the deferred refund gives the hedge back)
		}
		return over
	}
	l.sent++
	a.n = int(l.sent)
	if r.trace != nil && r.trace.AttemptStart != nil {
		// Before sent: a hook that panics leaves the permit, the last
		// resort's slot and the hedge budget to the deferred hand-back,
		// and counts nothing.
		r.trace.AttemptStart(r.traceAttempt(l, a))
	}
	switch mode {
	case hedge:
		h.sent.Inc()
	case lastResort:
		u.m.lastResort.Inc()
	}
	if s.demoted != "" {
		u.m.demoted[s.demoted].Inc()
	}
	sent = true
	return ready
}

// skip records in l that u was passed over, and why. passedOver says
// whether the request's first choice was passed over (not so for a
// hedge's: the attempt it hedges is in flight).
func (l *tally) skip(r *request, u *upstream, av availability, passedOver bool) {
	u.m.skipped[av.reason].Inc()
	if r.trace != nil && r.trace.Skipped != nil {
		ts := TraceSkip{Upstream: u.name, Round: int(l.roundNo), Reason: av.reason}
		if av.known {
			ts.RetryAfter = av.wait
		}
		r.trace.Skipped(ts)
	}
	if av.reason == ReasonModelNotServed {
		l.addErr(r, u, ErrModelNotServed)
		return
	}
	if passedOver {
		l.passed++
	}
	l.record(attemptRec{u: u, cause: av.err(), retryAfter: av.wait})
}

// heard is what an attempt's answer does outside the request, once, where
// it is first taken in (the caller's goroutine, or a race's while the
// caller waits in Base): the Trace hears it, and its upstream's headroom,
// cooldown and last error take it in. The redacted message of its error
// goes to a.msg.
func (r *request) heard(l *tally, a *attempt) {
	a.heard = true
	if a.o == Success && a.err == nil && r.trace == nil {
		a.headroomOf().note(a.resp.Header, a.end, a.endM, r.t.rate) // most answers
		return
	}
	r.heardAll(l, a)
}

// heardAll is heard for an answer that is not a plain success, or has a
// Trace to tell.
func (r *request) heardAll(l *tally, a *attempt) {
	if a.err != nil {
		a.msg = l.redact(r, a.err.Error())
	}
	if r.trace != nil && r.trace.AttemptDone != nil {
		r.traceDone(l, a)
	}
	u, resp, now := a.u, a.resp, a.end
	switch a.o {
	case Success:
		if a.err == nil {
			a.headroomOf().note(resp.Header, now, a.endM, r.t.rate)
		}
		return
	case Rejected, Canceled, Unservable:
		return
	case RateLimited:
		r.t.coolDown(u, a.k, resp, now)
	case AuthFailed:
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		r.t.log(slog.LevelError, "upstream rejected its credentials", u, append(keyAttr(a.k), slog.Int("status", status))...)
	}
	if resp != nil {
		u.setLastError(statusText(resp.StatusCode), now)
	} else {
		u.setLastError(a.msg, now)
	}
}

// settle acts on a's answer: it reports done with the result when the
// request is over; otherwise it keeps the response or the error for later.
func (c *call) settle(a *attempt) (*http.Response, error, bool) {
	u, resp, err := a.u, a.resp, a.err
	c.lastEnd = a.end
	switch {
	case a.heard:
	case c.trace != nil && c.trace.AttemptDone != nil:
		c.callHook(resp, func() { c.request.heard(&c.tally, a) })
	default:
		c.request.heard(&c.tally, a)
	}
	switch a.o {
	case Success, Rejected:
		c.discardHeld()
		if err == nil {
			c.answered(a)
			return resp, nil, true
		}
		// A request no upstream can send (an invalid header): the
		// caller's own error, as it is, but for any credential it
		// quotes (see Transport.scrub).
		c.callerFault = true
		return nil, c.t.scrub(err, c.req, c.hop), true
	case Canceled:
		if a.callerFault {
			c.discardHeld()
			c.callerFault = true
			return nil, c.t.scrub(err, c.req, c.hop), true // the caller's own error, as it is, but for any credential it quotes
		}
		if cerr := c.req.Context().Err(); cerr != nil {
			if resp != nil {
				discard(resp)
			}
			c.discardHeld()
			return nil, cerr, true
		}
		if err != nil && canceled(c.req) {
			// The caller closed the request's Cancel channel: net/http's
			// error says so, as it is.
			c.discardHeld()
			return nil, err, true
		}
		// A custom classifier said stop while the caller waits on.
		if resp != nil {
			c.discardHeld()
			c.answered(a)
			return resp, nil, true
		}
		c.addErr(u, err)
		return c.finishRound()
	case Unservable:
		// This upstream cannot serve this request; the next may at
		// once. Nobody is to blame: no cooldown, no last error. No
		// later round asks it again (it would hear the same, and a
		// refused prompt sent again is one more refusal on the
		// account), nor does the last resort.
		c.fatal++
		c.notHere++
		c.refused = append(c.refused, u)
		if resp != nil {
			c.hold(resp, a)
		} else {
			c.addErr(u, err) // a custom Classifier's verdict on an error
		}
		c.last = u
		return nil, nil, false
	}
	if resp != nil {
		c.hold(resp, a)
	} else {
		if permanent(err) {
			c.fatal++
		}
		c.record(attemptRec{u: u, err: err, msg: a.msg})
	}
	c.last = u
	return nil, nil, false
}

// final reports whether a's outcome ends the request, whatever the
// others' (see settle): a race stops the other attempts on it.
func (a *attempt) final() bool {
	return a.o == Success || a.o == Rejected || a.o == Canceled || a.panicked != nil
}

// statusText describes a status for Health: "HTTP 503 Service
// Unavailable", "HTTP 529".
func statusText(code int) string {
	if text := http.StatusText(code); text != "" {
		return "HTTP " + strconv.Itoa(code) + " " + text
	}
	return "HTTP " + strconv.Itoa(code)
}

// attemptRec is what happened at one upstream, kept by value (one
// allocation for all of them) until an Error is built from them.
type attemptRec struct {
	u          *upstream
	err        error // the attempt's error, or
	cause      error // why it was skipped (ErrCircuitOpen, ErrRateLimited)
	retryAfter time.Duration
	msg        string // err's message, redacted
}

func (r attemptRec) attemptError() *AttemptError {
	if r.cause != nil {
		return &AttemptError{Upstream: r.u.name, Err: &unavailableError{err: r.cause, retryAfter: r.retryAfter}}
	}
	return &AttemptError{Upstream: r.u.name, Err: r.err, msg: r.msg}
}

// addErr records err at u, for the Error.
func (c *call) addErr(u *upstream, err error) { c.tally.addErr(&c.request, u, err) }

// addErr records err at u, for the Error, its message redacted of r's
// credentials.
func (l *tally) addErr(r *request, u *upstream, err error) {
	if len(l.errs) < maxAttemptErrors {
		l.record(attemptRec{u: u, err: err, msg: l.redact(r, err.Error())})
	}
}

func (l *tally) record(rec attemptRec) {
	if len(l.errs) < maxAttemptErrors {
		l.errs = append(l.errs, rec)
	}
}

// takeIn adds what a race recorded, from when it took over, to l.
func (l *tally) takeIn(race *tally) {
	for _, rec := range race.errs {
		l.record(rec)
	}
	l.sent = race.sent
	l.attempts += race.attempts
}

// finish ends the request with the latest answer, or with an Error.
func (c *call) finish() (*http.Response, error) {
	if c.held != nil {
		resp := c.held
		c.held = nil
		c.answer, c.answerRoom = c.heldBy, c.heldRoom
		return resp, nil
	}
	e := &Error{Attempts: make([]*AttemptError, len(c.errs))}
	for i, r := range c.errs {
		if c.pin != nil && r.u == c.pin {
			e.Attempts[i] = c.pinnedError(r)
		} else {
			e.Attempts[i] = r.attemptError()
			if c.pin != nil {
				continue // passed over before the request was pinned: its wait is not the request's
			}
		}
		if ra := r.retryAfter; ra > 0 && (e.retry == 0 || ra < e.retry) {
			e.retry = ra
		}
	}
	return nil, e
}

// finishRound is finish for a round: the request is over.
func (c *call) finishRound() (*http.Response, error, bool) {
	resp, err := c.finish()
	return resp, err, true
}

func (c *call) hold(resp *http.Response, a *attempt) {
	c.discardHeld()
	c.held, c.heldBy, c.heldRoom = resp, a.ref(), a.servedRoom()
}

// answered makes a's answer the one RoundTrip returns.
func (c *call) answered(a *attempt) {
	c.answer, c.answerRoom = a.ref(), a.servedRoom()
}

// bufferHeld reads the held answer's body into memory (at most maxDrain
// bytes, for at most drainTimeout) so that its connection is free while the
// request waits for another round.
func (c *call) bufferHeld() {
	if r := c.held; r != nil {
		r.Body = buffer(r.Body)
	}
}

func (c *call) discardHeld() {
	if c.held != nil {
		discard(c.held)
		c.held = nil
	}
}
