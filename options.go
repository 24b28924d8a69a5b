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

// Per-request control, through the request's context, in the manner of
// net/http/httptrace: WithUpstreams, WithoutFailover and
// WithAttemptTimeout each return a context that carries one value of
// requestOptions, which every later call copies and extends, so that
// RoundTrip reads all of them with one lookup, and none at all in a
// process that never called one.
//
// How a restriction meets the admission decision: it shapes the order
// before admission, and is no input to admit. Transport.admit says
// whether an upstream can take a request now, from the upstream's own
// state (and its Models); Health, the Routers and failover_skipped_total
// report that decision, and a caller's choice is none of it. An upstream
// left out of a request's list is never considered for it, as no Router
// ever considered it: it is not skipped, so neither Trace.Skipped nor
// failover_skipped_total hears of it. Counted as a skip with a reason of
// its own, a request restricted to one of three upstreams would add two
// skips per request to a metric that says why upstreams are unavailable.
// The upstreams in the list still go through admit, each with the reason
// admit gives, exactly as without a list.

// requestOptions is what the With functions attached to a context. Once in
// a context it is never modified: each call makes a new one.
type requestOptions struct {
	names      []string      // WithUpstreams, copied; meaningful when restricted
	restricted bool          // WithUpstreams was called (with no names: to no upstream)
	once       bool          // WithoutFailover
	timeout    time.Duration // WithAttemptTimeout, when timeoutSet; 0 for no bound
	timeoutSet bool
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

// WithUpstreams returns a copy of ctx that restricts a request made with
// it to the named upstreams (Upstream.Name), tried in the order given:
// LiteLLM's per-call fallbacks, the Go way.
//
// The list is the order: the Router is not asked. Everything else
// happens within the list as it does over every upstream without one. An
// upstream whose circuit is open, whose probe is in flight, that cools
// down after a 429 or that does not serve the model is skipped, for the
// reason the Transport gives everywhere else ([Trace.Skipped],
// failover_skipped_total). A demoted one (out of headroom, degraded,
// suspect) is tried after the list's others, in the list's order, as the
// Routers treat demoted upstreams: the list says which upstreams the
// caller prefers, and demotion that one looks hung or failing now.
// Config.Retries makes its rounds over the list, a hedge goes to the next
// upstream of the list, a wait (RateLimit.MaxWait) waits for the list's
// first to come back, and the last resort ([LastResortConfig]) is the
// list's. Upstreams the list leaves out are never considered: they are
// not skipped, and neither the Trace nor the metrics mention them.
//
// A name the Transport has no upstream of makes RoundTrip fail the
// request with an [*UnknownUpstreamError] that names it
// (errors.Is(err, ErrUnknownUpstream)), never a silent pass-through: it
// sends nothing, closes the request's body and counts against no
// upstream; the Trace's Done says [RequestCanceled], the caller's own
// fault. So does a list of no names: a request restricted to nothing. A
// name given twice keeps its first place.
//
// The caller's credentials still reach only the upstream the request is
// addressed to: a request addressed to the primary and restricted to the
// backup goes to the backup, rewritten, with the backup's Header and
// without the caller's credentials.
//
// A later WithUpstreams replaces the list; the other options compose
// (see [WithoutFailover], [WithAttemptTimeout], [WithTrace]). Options
// apply to requests addressed to an upstream, and to the redirect hops
// that follow them, which carry the same context; a request addressed to
// no upstream goes as [Config.Unrouted] says, options aside.
func WithUpstreams(ctx context.Context, names ...string) context.Context {
	names = slices.Clone(names)
	return withOptions(ctx, func(o *requestOptions) { o.names, o.restricted = names, true })
}

// WithoutFailover returns a copy of ctx with which a request is sent at
// most once: for a request that must not be sent twice, such as a file
// upload or a paid tool call.
//
// The request goes to the first upstream that takes it, in the order it
// would have anyway (the Router's, or [WithUpstreams]'s), passing over
// those admission refuses (an open circuit, a probe in flight, a
// cooldown), which sends nothing, and waiting within RateLimit.MaxWait
// when all of them refuse, as any request does. What that one attempt
// gets is the answer: a 503 or 429 is returned as it came, an error as an
// [*Error] that names only that upstream; nothing fails over, nothing is
// hedged (Config.Hedge), no further round is made (Config.Retries). No
// last resort either: a request that must not be sent twice goes only
// where admission lets it, never past an open circuit to the upstream
// likeliest to be failing, where a failure would leave the caller unsure
// whether it was processed. When every upstream refuses it, the caller
// gets an [*Error] matching ErrCircuitOpen or ErrRateLimited, with
// RetryAfter, and knows that nothing was sent. To pin the request to one
// upstream, add WithUpstreams(ctx, name).
//
// A body without GetBody is not buffered for replay (Config.MaxBodyBuffer)
// unless an upstream has Models, which reads the model from it. A
// redirect hop is a new request of the caller's http.Client, and gets its
// own attempt. Base may still resend as net/http's Transport does: only a
// request it knows nothing of was written, or one it deems idempotent.
func WithoutFailover(ctx context.Context) context.Context {
	return withOptions(ctx, func(o *requestOptions) { o.once = true })
}

// WithAttemptTimeout returns a copy of ctx with which each attempt of a
// request waits at most d for its response headers, instead of the
// Transport's own attempt timeouts (Config.AttemptTimeout, or any an
// upstream has of its own): the request's bound wins, for every upstream
// it tries. A d of zero or less means no bound but the request's own
// deadline, for a request known to answer late (a long generation
// without streaming sends its headers at its end). A later
// WithAttemptTimeout replaces d.
//
// An attempt that times out fails over with ErrAttemptTimeout, as with
// Config.AttemptTimeout. It counts against the upstream's circuit only
// when d is at least the Transport's own timeout for it: then that one
// would have fired too. A shorter d, or any d where the Transport sets
// none, is the caller's impatience, which must not open a circuit for
// every other caller: such a timeout counts for neither success nor
// failure (nor among failover_timeouts_held_back_total). So a service that
// bounds its attempts only per request sets Config.AttemptTimeout too,
// for hangs to count.
func WithAttemptTimeout(ctx context.Context, d time.Duration) context.Context {
	d = max(d, 0)
	return withOptions(ctx, func(o *requestOptions) { o.timeout, o.timeoutSet = d, true })
}

// once reports whether the request is sent at most once (WithoutFailover).
func (r *request) once() bool { return r.opts != nil && r.opts.once }

// attemptTimeout is the bound of an attempt of the request at u: the
// request's own (WithAttemptTimeout) when it has one, else the
// Transport's; 0 for none.
func (r *request) attemptTimeout(u *upstream) time.Duration {
	if o := r.opts; o != nil && o.timeoutSet {
		return o.timeout
	}
	return r.t.configuredTimeout(u)
}

// configuredTimeout is the Transport's own attempt timeout at u
// (Upstream.AttemptTimeout, else Config.AttemptTimeout); 0 for none.
func (t *Transport) configuredTimeout(u *upstream) time.Duration { return u.timeout }

// impatient reports whether a, which timed out, did so on a bound of the
// caller's shorter than the Transport's own at a.u (or where it has
// none): a timeout that says nothing against the upstream.
func (t *Transport) impatient(a *attempt) bool {
	c := t.configuredTimeout(a.u)
	return a.timeout > 0 && (c == 0 || a.timeout < c)
}

// options applies the request's options before its body is read, and
// returns the largest body the call buffers for replay
// (Config.MaxBodyBuffer). (Small enough to be inlined into run: a request
// without options pays one test.)
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

// restrict applies the request's WithUpstreams: c.ups becomes the
// upstreams that names name, in their order. A name no upstream has, or a list
// of none, fails the request before anything is read or sent: its body is
// closed, and the call ends as the caller's own fault.
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
		closeBody(c.req)
		c.callerFault = true
		known := make([]string, len(c.t.upstreams))
		for i, u := range c.t.upstreams {
			known[i] = u.name
		}
		return &UnknownUpstreamError{Names: unknown, Upstreams: known}
	}
	c.ups = ups
	return nil
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
