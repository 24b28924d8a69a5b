package failover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/circuit"
	"github.com/failover-go/failover/internal/mono"
)

// attempt is one send of the request to one upstream and what came back.
// Whoever launched it writes its first fields before sending it and reads
// the rest after; send, on whichever goroutine runs it, reads only the
// attempt and the request, which nothing writes.
type attempt struct {
	u          *upstream
	k          *key // the key of u it is sent with (step.k); nil when u has no Keys
	n          int  // its number in the request, from 1
	p          circuit.Permit
	start      time.Time
	hedge      bool   // sent as a hedge, beside an attempt still in flight
	lastResort bool   // sent past its circuit's refusal (Transport.lastResort): it counts as an active probe
	demoted    Reason // why the plan put its upstream after others (step.demoted)
	out        *http.Request
	body       *watchedBody  // the watcher of out's body, when it has one (see watchBody)
	ender                    // what ends its own context; zero when nothing needs to end the attempt early
	own        *outParts     // made with the attempt for out and its wrappers (hedgedParts); nil: prepare makes them
	watch      *headersWatch // made with the attempt (timedParts, hedgedParts); nil: roundTrip makes one if needed
	hedged     *hedgeWait    // the hedge timer armed for it, on the caller's goroutine; nil: none

	// timeout and answer bound its wait for response headers, if the
	// request is streamed and if not (request.attemptTimeouts); 0 means
	// no bound. callerBound says they are the caller's own.
	timeout, answer time.Duration
	callerBound     bool
	cut             bool          // timeout was cut short by the caller's deadline (deadlineBound)
	fired           time.Duration // the bound that ended it (headersWatch); 0: none did
	streamed        bool          // the request is streamed, as far as the watch learned

	sent        time.Time // when Base was called, with a bound
	resp        *http.Response
	err         error
	o           Outcome
	end         time.Time // when the answer came
	endM        mono.Time // end, on the monotonic clock (converted once)
	callerFault bool      // err is the caller's own: its body's (see watchedBody)
	heard       bool      // heard has taken it in
	msg         string    // err's message, redacted (heard)

	// Hedging: whether the call gave up on it, and who owns its result.
	lost     atomic.Bool
	state    atomic.Int32 // flying, delivered or abandoned
	panicked any
	stack    []byte
}

// outParts is what an attempt's request takes, in one allocation: the
// request, its URL, the watcher of its body, the wrapper of its
// response's body that ends its context, and the Request its answer
// shows ServedBy (Transport.served). Nothing in it is pooled: the caller
// holds it with the answer.
type outParts struct {
	r      http.Request
	u      url.URL
	b      watchedBody
	rb     releasingBody
	ctx    ownCtx
	served servedRequest
}

// servedRoom is where the Request of a's answer goes (Transport.served):
// in the allocation of a's parts, or nil when a has none.
func (a *attempt) servedRoom() *servedRequest {
	if a.own == nil {
		return nil
	}
	return &a.own.served
}

// ender ends an attempt's own context: context.WithCancelCause's cancel,
// or its ownCtx. It is a value, not the attempt, so that what keeps it
// (the timeout's timer, the response's body) keeps no attempt alive and
// lets an attempt of a round without hedging stay on its stack.
type ender struct {
	cancel context.CancelCauseFunc
	ctx    *ownCtx
}

// stop ends the context, if there is one, with cause.
func (e ender) stop(cause error) {
	switch {
	case e.cancel != nil:
		e.cancel(cause)
	case e.ctx != nil:
		e.ctx.end(cause)
	}
}

// closed is the end of the answer's body (read to its end or closed): it
// ends a context.WithCancelCause's, which its parent lets go of only then,
// and releases an ownCtx. It may be called again.
func (e ender) closed() {
	switch {
	case e.cancel != nil:
		e.cancel(nil)
	case e.ctx != nil:
		e.ctx.release()
	}
}

// ends reports whether there is a context to end.
func (e ender) ends() bool { return e.cancel != nil || e.ctx != nil }

// ownCtx is an attempt's own context when its caller's is never done
// (context.Background's kind), as a hedged round's first attempt has it:
// the caller's deadline and values, and the Done, Err and cause of a
// pooled canceler, which the attempt ends early (end). It spares an
// attempt answered in time any allocation for its context. The end of the
// answer's body releases it, giving the canceler back to the
// pool unless it was ended or has served cancelerUses attempts; after its
// release it may read as done (its canceler retired, or ended by a later
// attempt), as any attempt's context does once its answer is over. See
// docs/design.md.
type ownCtx struct {
	context.Context // the caller's: Deadline and Value
	c               *canceler
	state           atomic.Int32 // ctxLive, ctxEnded or ctxReleased
}

// An ownCtx's states.
const (
	ctxLive     = iota // the attempt's: end ends it
	ctxEnded           // ended: its canceler is canceled
	ctxReleased        // the answer's body is done: the canceler went back, or was retired
)

// canceler is the cancelCtx of an ownCtx, with its Done channel made at
// once. Pooled ones are made outside any synctest bubble, since using a
// bubble's channel outside it is fatal; a round in a bubble makes its own
// and never pools it.
type canceler struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	pooled bool // it goes back to cancelers when released unended
	uses   int  // attempts it has served
}

// cancelerUses is how many attempts a pooled canceler serves before it is
// retired, ended, so that contexts a Base derived and never canceled do
// not pile up among its children.
const cancelerUses = 64

var cancelers = sync.Pool{New: func() any { return newCanceler(true) }}

func newCanceler(pooled bool) *canceler {
	c := &canceler{pooled: pooled}
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	c.ctx.Done() // the channel, made now: outside any bubble for a pooled one
	return c
}

// init makes c the context of an attempt under parent, whose Done is
// nil, with a canceler from the pool, or of its own in a synctest bubble.
func (c *ownCtx) init(parent context.Context, bubbled bool) {
	c.Context = parent
	if bubbled {
		c.c = newCanceler(false)
	} else {
		c.c = cancelers.Get().(*canceler)
	}
}

func (c *ownCtx) Done() <-chan struct{} { return c.c.ctx.Done() }

func (c *ownCtx) Err() error { return c.c.ctx.Err() }

func (c *ownCtx) Value(key any) any {
	if v := c.c.ctx.Value(key); v != nil {
		return v // the cancelCtx, for its own key: for Cause and derived contexts
	}
	return c.Context.Value(key)
}

// end ends the attempt's context with cause, unless it ended already or
// was released.
func (c *ownCtx) end(cause error) {
	if c.state.CompareAndSwap(ctxLive, ctxEnded) {
		c.c.cancel(cause)
	}
}

// release gives the canceler back to the pool, unless the context ended
// already: the answer's body is done, and the attempt will not end
// it. A canceler of a bubble's round, or one that has served cancelerUses
// attempts, is ended instead.
func (c *ownCtx) release() {
	if !c.state.CompareAndSwap(ctxLive, ctxReleased) {
		return
	}
	k := c.c
	if k.uses++; !k.pooled || k.uses >= cancelerUses {
		k.cancel(nil)
		return
	}
	cancelers.Put(k)
}

// String names it for a panic's or a log's %v, as the context package's
// own do.
func (c *ownCtx) String() string {
	return fmt.Sprintf("%v.WithCancel(failover attempt)", c.Context)
}

// prepare builds a's request: the caller's, rewritten for a.u, with the
// next copy of the body. With cancelable, the request has its own context,
// which a.stop ends: an ownCtx in a.own when the caller's context is never
// done, else context.WithCancelCause's.
func (r *request) prepare(ctx context.Context, a *attempt, b *replay, cancelable, shareURL bool) error {
	u := a.u
	actx := ctx
	if cancelable {
		if a.own != nil && ctx.Done() == nil {
			a.own.ctx.init(ctx, inBubble(a.start))
			a.ctx = &a.own.ctx
			actx = a.ctx
		} else {
			actx, a.cancel = context.WithCancelCause(ctx)
		}
	}
	out := r.clone(actx, u, shareURL, a.own)
	r.rewrite(out, u, a.k)
	body, err := b.next()
	if err != nil {
		a.stop(nil)
		return err
	}
	out.Body = body
	if b.buffered != nil {
		out.GetBody = b.getBody
		// The buffer's length stands in only for a length the caller
		// left unknown, and not with trailers (it then goes chunked): a
		// known length that disagrees with the body fails as net/http
		// fails it (see watchedBody).
		if out.ContentLength <= 0 && len(out.Trailer) == 0 {
			out.ContentLength = int64(len(b.buffered))
		}
	}
	if data, ok := r.mapped(u); ok {
		if body != nil {
			body.Close() // this attempt sends the renamed body instead
		}
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		out.Body, _ = out.GetBody()
		if out.ContentLength > 0 || len(out.Trailer) == 0 {
			out.ContentLength = int64(len(data)) // with trailers and no length, it goes chunked, as above
		}
	}
	if r.req.Trailer != nil {
		r.trailer(out, u)
	}
	// A body of a kind that may fail to read, or disagree with its
	// length, is watched, to tell the caller's fault (see judge); a body
	// in memory, the usual one, spares the watcher's allocation.
	var own *watchedBody
	if a.own != nil {
		own = &a.own.b
	}
	out.Body, a.body = watchBody(own, out.Body, out.ContentLength)
	a.out = a.body.traced(out)
	return nil
}

// mapped returns the body of the request for u when u's Models rename the
// model, and whether it does.
func (r *request) mapped(u *upstream) ([]byte, bool) {
	if k := r.continuation(); k != nil {
		return k.continued(r, u), true
	}
	if r.model == "" || len(u.models) == 0 {
		return nil, false
	}
	target, ok := u.models.lookup(r.model)
	if !ok || target == r.model {
		return nil, false
	}
	body, err := rewriteModel(r.modelBody, target)
	return body, err == nil
}

// send sends a's request through Base and records what came back, in a
// and in a.u's circuit and figures. r is the request as a's goroutine has
// it: the call's, or a hedge's own copy; nothing writes either while a is
// in flight.
func (a *attempt) send(r *request) {
	u, t := a.u, r.t
	answered := false
	start := a.p.Start() // a.start, converted once by admit
	if start == 0 {
		start = mono.Of(a.start) // the last resort's: no permit
	}
	u.live.start(start)
	// One deferred func for all of the hand-back: it runs even if Base,
	// Classify, the stream guard or a hook panics, or ends the goroutine.
	defer func() {
		v := recover()
		u.live.end(start, answered)
		if a.lastResort {
			t.lastResortDone()
		}
		u.circuit.Release(a.p)
		if v != nil {
			// A panic with an answer in hand: close it and end the
			// attempt's context before the panic goes on, as a
			// discarded answer would be.
			if a.resp != nil {
				a.resp.Body.Close()
			}
			a.stop(nil)
			panic(v)
		}
	}()
	var resp *http.Response
	var err error
	if a.u.cfg.Authorizer != nil {
		err = r.authorize(a) // (authorize.go)
	}
	if err == nil {
		resp, err = a.roundTrip(r)
	}
	a.resp = resp
	if a.hedged != nil && resp != nil {
		// Its headers came: the upstream is not silent, and a stream
		// held until its first content (a model thinking) is not hedged.
		a.hedged.disarm()
	}
	if r.t.stream != nil {
		resp, err = r.t.guardStream(r.req.Context(), a.u, resp, err)
		a.resp = resp
	}
	a.end = time.Now()
	a.endM = mono.Of(a.end)
	r.showRequest(resp, a)
	lost := a.lost.Load()
	a.resp = resp
	a.o, a.err = a.judge(r, resp, err, lost)
	if a.o == AuthFailed && a.resp != nil && r.heldBack(u) {
		a.o, a.err = t.uncredentialed(a) // (misconfig.go)
	}
	answered = a.o != Canceled && (a.err == nil || !timedOut(a.err)) && !lost
	r.t.account(a, lost)
}

// timedOut reports whether err says the attempt timed out rather than
// that its upstream answered: the attempt timeout, or a timeout of Base's
// own (http.Transport's ResponseHeaderTimeout, a dial timeout), which is
// a net.Error whose Timeout is true.
func timedOut(err error) bool {
	var nerr net.Error
	return errors.Is(err, ErrAttemptTimeout) || errors.As(err, &nerr) && nerr.Timeout()
}

// roundTrip sends a.out through Base within the attempt timeout; a
// response that raced the timeout is closed. The attempt's own context,
// if any, ends at once without a response or with a protocol switch (101,
// whose Body, the connection, no wrapper may hide), at once for an answer
// without a body (bodyless), and otherwise when the body is done
// (releasingBody).
func (a *attempt) roundTrip(r *request) (*http.Response, error) {
	t := r.t
	var w *headersWatch
	if a.timeout > 0 || a.answer > 0 {
		a.sent = time.Now() // for stalled: the deadline is counted from here
		w = a.watch.start(a.ender, a.out, a.sent, a.timeout, a.answer, t.maxBody, a.callerBound)
	}
	resp, err := t.base.RoundTrip(a.out)
	if resp == nil && err == nil {
		err = errNoResponse // a Base that breaks the RoundTripper contract
	}
	if w != nil {
		a.fired, a.streamed = w.end()
		if a.fired > 0 && !canceled(r.req) && !a.lost.Load() {
			// Our timeout fired, not the caller's.
			if resp != nil {
				resp.Body.Close()
				resp = nil
			}
			err = ErrAttemptTimeout
		}
	}
	if a.ends() {
		switch {
		case err != nil || switched(resp):
			a.stop(nil)
		case bodyless(a.out, resp):
			a.closed() // nothing to read: done now
		case a.own != nil:
			a.own.rb = releasingBody{ReadCloser: resp.Body, e: a.ender}
			resp.Body = &a.own.rb
		default:
			resp.Body = &releasingBody{ReadCloser: resp.Body, e: a.ender}
		}
	}
	return resp, err
}

// bodyless reports whether resp, the answer to req, has no body to read:
// none at all (a Base's nil), http.NoBody (net/http's HTTP/1 for a 204, a
// 304 or a HEAD), or one that HTTP allows none for, which HTTP/2 gives
// a body of its own that reads nothing.
func bodyless(req *http.Request, resp *http.Response) bool {
	return resp.Body == nil || resp.Body == http.NoBody || req.Method == http.MethodHead ||
		resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
}

// switched reports whether resp is a protocol switch whose Body is the
// connection (net/http's bodyIsWritable).
func switched(resp *http.Response) bool {
	_, writable := resp.Body.(io.Writer)
	return resp.StatusCode == http.StatusSwitchingProtocols && writable
}

// guardStream holds a successful stream with the StreamGuard until its
// first content: nothing has reached the caller yet, so a stream that
// starts with an error, or says nothing in time, fails over. The stream it
// hands on fails a read that waits past u's Idle bound (FirstContent's,
// if longer, while no content came) with a *StallError.
func (t *Transport) guardStream(ctx context.Context, u *upstream, resp *http.Response, err error) (*http.Response, error) {
	g := t.stream
	if g == nil || err != nil || resp.StatusCode/100 != 2 || ctx.Err() != nil {
		return resp, err
	}
	guarded, content, gerr := g.hold(resp, u.timeouts.FirstContent)
	if gerr != nil {
		return nil, gerr
	}
	limit := u.timeouts.Idle
	if !content && limit > 0 && u.timeouts.FirstContent > limit {
		limit = u.timeouts.FirstContent
	}
	if limit > 0 && guarded.Body != nil && guarded.Body != http.NoBody && isEventStream(guarded.Header.Get("Content-Type")) {
		guarded.Body = watchStalls(guarded.Body, u.name, limit, func() { t.streamStalled(u, limit) })
	}
	return guarded, nil
}

// showRequest sets resp.Request to where the request went, with the
// caller's own headers, keeping the upstream's credentials out of SDK
// error dumps (see view). An answer from an upstream the caller did not
// address loses its Set-Cookie: the client's Jar would file it under the
// addressed upstream's URL.
func (r *request) showRequest(resp *http.Response, a *attempt) {
	u := a.u
	if resp == nil {
		return
	}
	if u == r.addressed {
		if len(u.header) > 0 || len(u.keys) > 0 || u.cfg.Authorizer != nil || resp.Request == nil {
			resp.Request = r.req
		}
		return
	}
	resp.Request = r.view(a.out)
	if _, ok := resp.Header["Set-Cookie"]; ok {
		delete(resp.Header, "Set-Cookie")
	}
}

// judge classifies what came back, and returns the attempt's error; a 400,
// 403 or 413 has the first bytes of its body read first, for the
// classifier's [BodyPrefix]. An attempt canceled for a hedge that
// answered first (lost) is a failure only when its upstream looks hung,
// as the attempt would have timed out; a caller's cancellation is
// Canceled, whatever came back.
func (a *attempt) judge(r *request, resp *http.Response, err error, lost bool) (Outcome, error) {
	t := r.t
	switch {
	case lost:
		if resp == nil && !canceled(r.req) && (t.suspect(a.u, a.end) || t.silent(a)) {
			return Failed, errHedgeLost
		}
		return Canceled, err
	case unauthorized(err):
		// Its Authorizer failed: nothing was sent, and nobody is to
		// blame (authorize.go).
		if canceled(r.req) {
			return Canceled, err
		}
		return Unservable, err
	case err != nil && a.body != nil && a.body.faulted(err):
		// The caller's body failed to read, or disagrees with its
		// ContentLength: no upstream is to blame.
		a.callerFault = true
		return Canceled, err
	case err == nil || !canceled(r.req):
		if err == nil && peekable(resp.StatusCode) {
			peekBody(resp) // for BodyPrefix: is it Unservable?
		}
		return t.classify(resp, err), err
	case resp == nil && errors.Is(r.req.Context().Err(), context.DeadlineExceeded) && t.silent(a):
		// The caller's deadline ended an attempt at an upstream that had
		// stayed silent past its normal time: it counts, as the
		// attempt's own timeout would have.
		return Failed, err
	}
	return Canceled, err
}

// canceled reports whether the caller ended req: its context is done, or
// its Cancel channel is closed (deprecated, but http.Client closes it for
// its Timeout in front of a RoundTripper other than net/http's, and
// net/http then fails the request with an error of its own).
func canceled(req *http.Request) bool {
	if req.Context().Err() != nil {
		return true
	}
	select {
	case <-req.Cancel: // nil: never
		return true
	default:
		return false
	}
}

// account records a's outcome: its latency for the router, its result in
// the circuit (and the fleet's failures), and its window and metrics. An
// attempt cut short (lost) has no latency.
func (t *Transport) account(a *attempt, lost bool) {
	u, now := a.u, a.end
	res := circuitResult(a.o, a.err)
	timedOut := a.err != nil && errors.Is(a.err, ErrAttemptTimeout) // (errors.Is is not inlined: most attempts have no error)
	figure := a.o                                                   // what u's recent figures count
	if timedOut && t.impatient(a) {
		// The caller's own bound, shorter than the Transport's: no
		// verdict on u (see WithAttemptTimeout), in its circuit or in
		// the figures that Degraded, Health and the Routers read.
		timedOut = false
		if res == circuit.Failure {
			res = circuit.Neutral
		}
		figure = Canceled
	}
	elapsed := now.Sub(a.start)
	if lost {
		elapsed = -1 // how long it would have taken is unknown
	} else if t.router != nil && (figure == Success || figure == Rejected || figure == Failed) {
		u.latency.observe(elapsed, now) // a fast 429 or 401 says nothing of speed
	}
	if timedOut {
		u.timedOut.Store(int64(mono.Of(now)))
	}
	if res == circuit.Failure && timedOut && (t.stalled(a) || t.othersTimedOut(u, now)) {
		res = circuit.Neutral // the evidence points at this process, not at u
		u.m.heldBack.Inc()
	}
	if a.lastResort {
		u.circuit.Probed(res, now) // it went past the circuit: a probe's verdict
	} else {
		u.circuit.Done(a.p, res, now)
		if res == circuit.Failure && t.fleet != nil {
			t.fleet.failure(u, now)
		}
	}
	t.noteAuth(a.authOf(), a.o, a.resp != nil && !lost, a.endM)
	if a.k != nil {
		a.k.attempts.Inc()
	}
	u.observe(a.o, figure, elapsed, a.endM)
}

// streamStalled counts a stream of u that went silent for silence after
// its content began as a failure of u: in its circuit, the fleet's
// failures, its metrics and its last error.
func (t *Transport) streamStalled(u *upstream, silence time.Duration) {
	now := time.Now()
	u.circuit.Probed(circuit.Failure, now)
	if t.fleet != nil {
		t.fleet.failure(u, now)
	}
	u.m.stalls.Inc()
	u.setLastError((&StallError{Upstream: u.name, Silence: silence}).Error(), now)
}

// errNoResponse is what an attempt gets from a Base that returned neither
// a response nor an error.
var errNoResponse = errors.New("failover: Base returned no response and no error")

// stalled reports whether an attempt that timed out returned more than a
// tenth of its timeout after the deadline: a canceled dial or read returns
// at once, so this process was not running (starved, a long GC, a paused
// VM) and the answer may have been there to read.
func (t *Transport) stalled(a *attempt) bool {
	d := a.fired
	return a.end.Sub(a.sent) > d+min(d/10, maxDuration-d) // saturating
}

// othersTimedOut reports whether an attempt at u that timed out at now
// says more of this process than of u: every other upstream timed out too
// within the last two attempt timeouts (the longer of the pair).
// Providers rarely all hang at once, while a starved client makes all of
// them look hung, and opening every circuit would fail every request.
func (t *Transport) othersTimedOut(u *upstream, now time.Time) bool {
	if len(t.upstreams) < 2 {
		return false
	}
	for _, v := range t.upstreams {
		if v == u {
			continue
		}
		if since := mono.Of(now).Add(-mulDuration(2, max(u.timeout, v.timeout))); mono.Time(v.timedOut.Load()) < since {
			return false
		}
	}
	return true
}

// circuitResult is what an attempt counts for on the circuit: a request
// that no upstream could send (Rejected with an error) and the outcomes
// that say nothing of the upstream's health (Canceled, AuthFailed,
// RateLimited, Unservable) count for nothing.
func circuitResult(o Outcome, err error) circuit.Result {
	switch {
	case o == Success, o == Rejected && err == nil:
		return circuit.Success
	case o == Failed:
		return circuit.Failure
	}
	return circuit.Neutral
}

// observe records one attempt at u in its metrics, with outcome o, and in
// its window, with outcome figure (Canceled for one that says nothing of
// u); a negative latency is unknown (the attempt was cut short) and
// counts in no percentile.
func (u *upstream) observe(o, figure Outcome, d time.Duration, now mono.Time) {
	u.window.add(figure, d, now)
	u.m.attempts[o].Inc()
	if o != Canceled && d >= 0 {
		u.m.duration.Update(d.Seconds())
	}
}

func (u *upstream) setLastError(msg string, at time.Time) {
	u.window.last.Store(&lastError{msg: msg, at: at})
}
