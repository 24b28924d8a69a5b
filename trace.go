package failover

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/redact"
)

// Trace is a set of hooks that follow one request through the Transport,
// in the manner of net/http/httptrace; attach it with [WithTrace]. It tells
// what the response alone cannot: which upstreams were passed over and
// why, which were tried, how each attempt ended, whose answer the caller
// got.
//
// Every hook but Usage is called one at a time, in the order of events,
// before RoundTrip returns; with [Config.Hedge], some are called on a
// goroutine of the Transport's, and an AttemptDone may come after a later
// attempt's AttemptStart. Hooks must not block: the request waits on them.
// No argument holds a credential. A request addressed to no upstream calls
// only Done, with [RequestUnrouted].
type Trace struct {
	// Skipped is called for each upstream the request passed over
	// without sending it anything, with the reason the admission
	// decision gave (the same reasons [UpstreamHealth.Unavailable] and
	// failover_skipped_total show).
	Skipped func(TraceSkip)

	// AttemptStart is called when an attempt is about to be sent.
	AttemptStart func(TraceAttempt)

	// AttemptDone is called when an attempt has ended: response headers
	// came, or an error, or the request ended without needing it.
	AttemptDone func(TraceAttemptDone)

	// Done is called once, when RoundTrip is about to return: whose
	// answer the caller gets, or why none.
	Done func(TraceDone)

	// Usage is called with the answer's usage and cost (see [Usage]),
	// when the answer reports it: unlike the other hooks, once its body
	// has been read to its end or closed, on the goroutine that did so,
	// usually after RoundTrip has returned. It meters the request's
	// answer even when Config.MeterUsage is off. A stream continued by
	// other upstreams (Config.Continue) reports each upstream's answer.
	Usage func(Usage)

	// Continued is called when a stream of the answer broke after its
	// content began and continuation is on ([ContinueConfig]): whether
	// another upstream continued it. Like Usage, it comes after
	// RoundTrip has returned, on the goroutine reading the body. The
	// continuation's attempts come to Skipped, AttemptStart and
	// AttemptDone, numbered after the request's, and its answer's usage
	// to Usage; Done is not called again.
	Continued func(TraceContinued)
}

// TraceContinued is a stream that broke, as [Trace.Continued] receives
// it. Its errors are scrubbed of every credential.
type TraceContinued struct {
	From  string // the Name of the upstream whose stream broke
	To    string // the Name of the upstream that continued it; "" when none did
	Cause error  // why it broke: a cut, a *StallError, an error event, ErrStreamTruncated
	Err   error  // why it was not continued; nil when it was
}

// TraceSkip is an upstream passed over, as [Trace.Skipped] receives it.
type TraceSkip struct {
	Upstream   string        // the upstream's Name
	Round      int           // the request's round: 0, then one more for each of Config.Retries and each wait
	Reason     Reason        // why: rate_limited, circuit_open, probe_in_flight, probe_elsewhere, model_not_served, shed
	RetryAfter time.Duration // when it takes requests again; 0 when unknown
}

// TraceAttempt is an attempt, as [Trace.AttemptStart] receives it.
type TraceAttempt struct {
	Upstream   string // the upstream's Name
	Key        string // the Name of the upstream's key it was sent with (Upstream.Keys); "" without Keys
	Attempt    int    // 1 for the request's first attempt, 2 for the next, ...
	Round      int    // as in TraceSkip
	Hedge      bool   // sent beside a slower attempt still in flight (Config.Hedge)
	LastResort bool   // sent past an open circuit, every upstream refusing (Config.LastResort)
	Demoted    Reason // why the upstream was demoted (tried after those that were not) when it was tried; "" when it was not
}

// TraceAttemptDone is an attempt that ended, as [Trace.AttemptDone]
// receives it.
type TraceAttemptDone struct {
	TraceAttempt

	// Outcome is how the classifier judged the attempt (Canceled for an
	// abandoned one).
	Outcome Outcome

	// StatusCode is the response's status; 0 when none came.
	StatusCode int

	// Err is the attempt's error, an [*AttemptError] whose message is
	// scrubbed of every credential; nil when a response came.
	Err error

	// Duration is the time from the attempt's start to its response
	// headers or its error; for an abandoned attempt, to its abandonment.
	Duration time.Duration

	// Abandoned says that the request ended while the attempt was in
	// flight (a hedge or the attempt beside it answered first): it was
	// canceled, and its answer, if one comes, is drained and closed.
	Abandoned bool

	// URL is where the attempt went: scheme, host and path, never a
	// query or user info.
	URL string
}

// TraceDone is how a request ended, as [Trace.Done] receives it.
type TraceDone struct {
	// Outcome is how the request ended for its caller.
	Outcome RequestOutcome

	// Upstream names the upstream whose answer the caller gets, and
	// Attempt which attempt brought it; "" and 0 when RoundTrip returns
	// an error.
	Upstream string
	Attempt  int

	// Attempts is how many attempts were sent, abandoned ones included.
	Attempts int

	// StatusCode is the answer's status; 0 with an error.
	StatusCode int

	// Err is what RoundTrip returns as its error; when that is Base's
	// own and its message quotes a credential, an error that says the
	// same without it and unwraps to Base's.
	Err error

	// Duration is the time from the request's first attempt (or skip)
	// to RoundTrip's return: buffering a body without GetBody comes
	// before it. 0 when the request ended before that.
	Duration time.Duration
}

// RequestOutcome is how a request ended for its caller, as [Trace.Done]
// and the failover_requests_total metric name it.
type RequestOutcome string

// Request outcomes.
const (
	// RequestAnswered: the first upstream the request tried served it
	// (a 2xx or 3xx, or the caller's own 4xx), nothing passed over
	// before it.
	RequestAnswered RequestOutcome = "answered"

	// RequestFailedOver: an upstream served it after others before it
	// failed, could not serve it (Unservable) or were passed over.
	RequestFailedOver RequestOutcome = "failed_over"

	// RequestHedged: a hedge's answer served it (Config.Hedge).
	RequestHedged RequestOutcome = "hedged"

	// RequestFailed: no upstream served it. The caller gets the last
	// upstream's failure (a 5xx, 429, 401, an Unservable 400, ..., or an
	// answer a custom Classifier judged Canceled) or an [*Error].
	RequestFailed RequestOutcome = "failed"

	// RequestUnavailable: every upstream was passed over, nothing was
	// sent; the caller gets an [*Error] matching ErrCircuitOpen,
	// ErrRateLimited or ErrModelNotServed.
	RequestUnavailable RequestOutcome = "unavailable"

	// RequestCanceled: the caller's context ended, or its own request
	// could not be sent (its body failed to read, an invalid header, a
	// name no upstream has in WithUpstreams); the caller gets an error.
	RequestCanceled RequestOutcome = "canceled"

	// RequestUnrouted: the request was addressed to no upstream
	// (Config.Unrouted); only Trace.Done says so, the metric is
	// failover_unrouted_requests_total.
	RequestUnrouted RequestOutcome = "unrouted"
)

// requestOutcome indexes requestOutcomes: the outcomes of a routed
// request, as outcome computes them and the metrics count them.
type requestOutcome int

const (
	reqAnswered requestOutcome = iota
	reqFailedOver
	reqHedged
	reqFailed // the last with an upstream's answer, possibly
	reqUnavailable
	reqCanceled
)

var requestOutcomes = [...]RequestOutcome{
	reqAnswered:    RequestAnswered,
	reqFailedOver:  RequestFailedOver,
	reqHedged:      RequestHedged,
	reqFailed:      RequestFailed,
	reqUnavailable: RequestUnavailable,
	reqCanceled:    RequestCanceled,
}

type traceKey struct{}

// tracing is set by the first WithTrace of the process: until then no
// context carries a Trace, and RoundTrip does not look for one.
var tracing atomic.Bool

// WithTrace returns a copy of ctx that carries t: a request made with it
// calls t's hooks. When ctx already carries a Trace, both are called, t's
// hooks first, as httptrace composes them.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	if t == nil {
		return ctx
	}
	if old := ContextTrace(ctx); old != nil {
		t = t.compose(old)
	}
	tracing.Store(true)
	return context.WithValue(ctx, traceKey{}, t)
}

// requestTrace is ContextTrace for RoundTrip: nothing to look up until a
// Trace exists.
func requestTrace(ctx context.Context) *Trace {
	if !tracing.Load() {
		return nil
	}
	return ContextTrace(ctx)
}

// ContextTrace returns the Trace that ctx carries, or nil.
func ContextTrace(ctx context.Context) *Trace {
	t, _ := ctx.Value(traceKey{}).(*Trace)
	return t
}

// compose returns a Trace whose hooks call t's, then old's.
func (t *Trace) compose(old *Trace) *Trace {
	return &Trace{
		Skipped:      both(t.Skipped, old.Skipped),
		AttemptStart: both(t.AttemptStart, old.AttemptStart),
		AttemptDone:  both(t.AttemptDone, old.AttemptDone),
		Done:         both(t.Done, old.Done),
		Usage:        both(t.Usage, old.Usage),
		Continued:    both(t.Continued, old.Continued),
	}
}

func both[T any](f, g func(T)) func(T) {
	switch {
	case f == nil:
		return g
	case g == nil:
		return f
	}
	return func(v T) { f(v); g(v) }
}

// attemptRef is what a call keeps of the attempt whose answer it returns
// or holds.
type attemptRef struct {
	u     *upstream
	o     Outcome
	n     int32 // the attempt's number in the request, from 1
	hedge bool
	k     *key // the key of u it was sent with; nil: u has no Keys
}

func (a *attempt) ref() attemptRef {
	return attemptRef{u: a.u, n: int32(a.n), o: a.o, hedge: a.hedge, k: a.k}
}

// outcome is how the request ended for its caller, given what RoundTrip
// returns: the one judgment behind Trace.Done and failover_requests_total.
func (c *call) outcome(resp *http.Response, err error) requestOutcome {
	switch {
	case resp != nil:
		a := c.answer
		switch {
		case a.o != Success && a.o != Rejected:
			return reqFailed // a failure held for want of better, or one a Classifier said to stop at
		case a.hedge:
			return reqHedged
		case a.n > 1 || c.passed > 0:
			return reqFailedOver
		}
		return reqAnswered
	case c.callerFault || canceled(c.req):
		return reqCanceled
	case c.sent == 0:
		return reqUnavailable
	}
	return reqFailed
}

// traceAttempt describes a, recorded in l, for the hooks.
func (r *request) traceAttempt(l *tally, a *attempt) TraceAttempt {
	return TraceAttempt{Upstream: a.u.name, Key: a.k.nameOf(), Attempt: a.n, Round: int(l.roundNo), Hedge: a.hedge, LastResort: a.lastResort, Demoted: a.demoted}
}

// traceDone calls AttemptDone for a, its error's message redacted in
// a.msg (see heard).
func (r *request) traceDone(l *tally, a *attempt) {
	d := TraceAttemptDone{TraceAttempt: r.traceAttempt(l, a), Outcome: a.o, Duration: a.end.Sub(a.start), URL: a.url()}
	if a.resp != nil {
		d.StatusCode = a.resp.StatusCode
	}
	if a.err != nil {
		d.Err = &AttemptError{Upstream: a.u.name, Err: a.err, msg: a.msg}
	}
	r.trace.AttemptDone(d)
}

// scrub returns err as it is when it is this package's (already scrubbed)
// or its message holds no credential of req's, its redirect chain's or an
// upstream's; else an error with a scrubbed message that unwraps to err.
func (t *Transport) scrub(err error, req *http.Request, h *hop) error {
	switch err.(type) {
	case nil, *Error, *UnroutedError:
		return err
	}
	secrets := t.creds.appendRequestSecrets([]string{}, req)
	if h != nil {
		secrets = append(secrets, h.secrets...)
	}
	msg := err.Error()
	if scrubbed := redact.String(msg, t.creds.upstreamSecrets, redact.Compact(secrets)); scrubbed != msg {
		return &scrubbedError{err: err, msg: scrubbed}
	}
	return err
}

// scrubbedError is an error with its message scrubbed of credentials.
type scrubbedError struct {
	err error
	msg string
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// traceAbandoned calls AttemptDone for each attempt still in flight when
// a race ends.
func (r *request) traceAbandoned(l *tally, flying []*attempt, now time.Time) {
	if r.trace == nil || r.trace.AttemptDone == nil {
		return
	}
	for _, a := range flying {
		r.trace.AttemptDone(TraceAttemptDone{TraceAttempt: r.traceAttempt(l, a), Outcome: Canceled, Duration: now.Sub(a.start), Abandoned: true, URL: a.url()})
	}
}

// url is a's URL for the Trace: scheme, host and path.
func (a *attempt) url() string {
	if a.out == nil {
		return ""
	}
	u := a.out.URL
	return u.Scheme + "://" + u.Host + u.EscapedPath()
}
