package failover

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Per-request control, in the manner of net/http/httptrace: each With
// function returns a context carrying one requestOptions, which later
// calls copy and extend, so that RoundTrip reads them all with one lookup,
// and none in a process that never called one. A restriction shapes the
// order before admission, and is no input to admit (docs/design.md).

// requestOptions is what the With functions attached to a context. Once in
// a context it is never modified: each call makes a new one.
type requestOptions struct {
	names      []string      // WithUpstreams, copied; meaningful when restricted
	restricted bool          // WithUpstreams was called (with no names: to no upstream)
	once       bool          // WithoutFailover
	timeout    time.Duration // WithAttemptTimeout, when timeoutSet; 0 for no bound
	timeoutSet bool
	session    string // WithSession; "": the Transport's
	pinned     string // WithPinned; "": none
	shed       bool   // WithSheddable

	// The stream that broke whose continuation the request is; nil for
	// a request of the caller's (continue.go).
	cont *continuation
}

type optionsKey struct{}

// optioning is set by the first With function of the process: until then
// no context carries options, and RoundTrip does not look for them.
var optioning atomic.Bool

// withOptions returns a copy of ctx that carries ctx's options, if any,
// changed by set.
func withOptions(ctx context.Context, set func(*requestOptions)) context.Context {
	o := new(requestOptions)
	if old, _ := ctx.Value(optionsKey{}).(*requestOptions); old != nil {
		*o = *old
	}
	set(o)
	optioning.Store(true)
	return context.WithValue(ctx, optionsKey{}, o)
}

// contextOptions returns the options ctx carries, or nil. RoundTrip asks
// only once optioning is set.
func contextOptions(ctx context.Context) *requestOptions {
	o, _ := ctx.Value(optionsKey{}).(*requestOptions)
	return o
}

// WithUpstreams returns a copy of ctx that restricts a request made with it
// to the named upstreams (Upstream.Name), tried in the order given instead
// of the Router's. Within the list everything works as over all upstreams:
// unavailable ones are skipped ([Trace.Skipped]), demoted ones go after
// the list's others, and retries, hedges, waits and the last resort keep
// to the list. Upstreams left out are never considered, nor mentioned in
// the Trace or the metrics.
//
// A name no upstream has, or an empty list, fails the request with an
// [*UnknownUpstreamError]: nothing is sent and no upstream is blamed. A
// name given twice keeps its first place. The caller's credentials still
// reach only the upstream the request is addressed to. A later
// WithUpstreams replaces the list; the other options compose. Options
// apply to requests addressed to an upstream and to their redirect hops.
func WithUpstreams(ctx context.Context, names ...string) context.Context {
	names = slices.Clone(names)
	return withOptions(ctx, func(o *requestOptions) { o.names, o.restricted = names, true })
}

// WithoutFailover returns a copy of ctx with which a request is sent at
// most once, for a request that must not be sent twice (a file upload, a
// paid tool call). It goes to the first upstream that takes it, in the
// usual order, passing over an open circuit, a probe in flight or a
// cooldown, and waiting within RateLimit.MaxWait as any request does. That
// attempt's answer or error is the result: nothing fails over, is hedged
// or retried, and there is no last resort. When every upstream refuses
// it, the [*Error] matches ErrCircuitOpen or ErrRateLimited, and nothing
// was sent. To pin the request to one upstream, add [WithUpstreams].
//
// A body without GetBody is not buffered unless an upstream has Models.
// Base may still resend as net/http's Transport does (a request it knows
// was not written, or an idempotent one).
func WithoutFailover(ctx context.Context) context.Context {
	return withOptions(ctx, func(o *requestOptions) { o.once = true })
}

// WithSheddable returns a copy of ctx with which a request is sheddable:
// work that can come back later (a batch job, background work), which
// leaves the last of the upstreams' capacity to the interactive requests.
// It passes over an upstream whose rate-limit headroom is short (see
// [ShedConfig]), and when no upstream it may use takes it now, it is
// refused at once with an [*Error] that matches [ErrShed] and says in
// RetryAfter when capacity is expected back: it does not wait within
// RateLimit.MaxWait, go to the last resort, make extra rounds (Retries),
// go to an upstream again after it failed there, or hedge. The other
// options compose.
func WithSheddable(ctx context.Context) context.Context {
	return withOptions(ctx, func(o *requestOptions) { o.shed = true })
}

// WithAttemptTimeout returns a copy of ctx with which each attempt of a
// request waits at most d for its response headers, streamed or not,
// instead of the Transport's Timeouts.Headers and Timeouts.Attempt; d <= 0
// means no bound but the request's deadline. A later call replaces d. An
// attempt that times out fails over with ErrAttemptTimeout, but counts
// against the upstream's circuit only when d is at least the Transport's
// own bound there: a caller's impatience must not open a circuit for
// every other caller.
func WithAttemptTimeout(ctx context.Context, d time.Duration) context.Context {
	d = max(d, 0)
	return withOptions(ctx, func(o *requestOptions) { o.timeout, o.timeoutSet = d, true })
}

// once reports whether the request is sent at most once (WithoutFailover).
func (r *request) once() bool { return r.opts != nil && r.opts.once }

// attemptTimeouts are the bounds on the headers of an attempt of the
// request at u, if it is streamed and if not: the request's own
// (WithAttemptTimeout) when it has one, else u's Timeouts; 0 for none.
func (r *request) attemptTimeouts(u *upstream) (stream, answer time.Duration) {
	if o := r.opts; o != nil && o.timeoutSet {
		return o.timeout, o.timeout
	}
	return u.timeouts.Headers, u.timeouts.Attempt
}

// impatient reports whether a timed out on a bound of the caller's
// (WithAttemptTimeout, or a stream's Headers cut to its deadline's share)
// shorter than the Transport's own at a.u for the request's kind, or
// where it has none: a timeout that says nothing against the upstream.
func (t *Transport) impatient(a *attempt) bool {
	if a.cut && a.streamed {
		return a.fired < a.u.timeouts.Headers // the caller's deadline's share, not the upstream's bound
	}
	if !a.callerBound {
		return false
	}
	own := a.u.timeouts.Attempt
	if a.streamed {
		own = a.u.timeouts.Headers
	}
	return own == 0 || a.fired < own
}

// options applies the request's options before its body is read, and
// returns the largest body the call buffers for replay. It is kept small
// enough to inline: a request without options pays one test.
func (c *call) options() (bodyLimit int64, err error) {
	bodyLimit = c.t.maxBody
	if c.opts != nil {
		bodyLimit, err = c.applyOptions()
	}
	return bodyLimit, err
}

// applyOptions is options for a request that has some.
func (c *call) applyOptions() (int64, error) {
	o := c.opts
	if o.restricted {
		if err := c.restrict(o.names); err != nil {
			return 0, err
		}
	}
	if o.once && !c.t.models {
		return -1, nil // sent once, and no upstream needs its model: nothing to keep
	}
	return c.t.maxBody, nil
}

// restrict applies the request's WithUpstreams: c.ups becomes the named
// upstreams, in order. An unknown name, or no name, fails the request
// before anything is read or sent, as the caller's own fault.
func (c *call) restrict(names []string) error {
	ups := make([]*upstream, 0, len(names))
	var unknown []string
next:
	for _, name := range names {
		for _, u := range c.t.upstreams {
			if u.name == name {
				if !slices.Contains(ups, u) {
					ups = append(ups, u)
				}
				continue next
			}
		}
		if !slices.Contains(unknown, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 || len(ups) == 0 {
		return c.unknown(unknown)
	}
	c.ups = ups
	return nil
}

// unknown fails the request, before anything is read or sent, for naming
// upstreams the Transport does not have (or none): the caller's own fault.
func (c *call) unknown(names []string) error {
	closeBody(c.req)
	c.callerFault = true
	known := make([]string, len(c.t.upstreams))
	for i, u := range c.t.upstreams {
		known[i] = u.name
	}
	return &UnknownUpstreamError{Names: names, Upstreams: known}
}

// ErrUnknownUpstream is the error, wrapped in an [*UnknownUpstreamError],
// of a request that [WithUpstreams] restricted to a name the Transport
// has no upstream of, or to no name at all.
var ErrUnknownUpstream = errors.New("failover: unknown upstream")

// UnknownUpstreamError is the error RoundTrip returns for a request that
// [WithUpstreams] restricted to names the Transport has no upstream of, or
// to none. Nothing was sent, and no upstream counts it.
type UnknownUpstreamError struct {
	Names     []string // the names no upstream has, as given; empty when WithUpstreams named none
	Upstreams []string // the names the Transport's upstreams have, in order
}

// Error names the unknown names and the upstreams there are.
func (e *UnknownUpstreamError) Error() string {
	var b strings.Builder
	if len(e.Names) == 0 {
		b.WriteString("failover: WithUpstreams names no upstream")
	} else {
		b.WriteString(ErrUnknownUpstream.Error())
		if len(e.Names) > 1 {
			b.WriteString("s")
		}
		b.WriteString(" ")
		writeQuoted(&b, e.Names)
		b.WriteString(" in WithUpstreams")
	}
	b.WriteString("; the upstreams are ")
	writeQuoted(&b, e.Upstreams)
	return b.String()
}

// Unwrap returns [ErrUnknownUpstream].
func (e *UnknownUpstreamError) Unwrap() error { return ErrUnknownUpstream }

func writeQuoted(b *strings.Builder, names []string) {
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(n))
	}
}

// usable returns the upstreams the request may use: its WithUpstreams
// list, or every upstream.
func (c *call) usable() []*upstream {
	if c.ups != nil {
		return c.ups
	}
	return c.t.upstreams
}
