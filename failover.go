package failover

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// defaultCredentialHeaders are the header names that carry a caller's
// credentials, besides every name an Upstream.Header sets.
var defaultCredentialHeaders = []string{
	"Authorization",
	"Proxy-Authorization",
	"Api-Key",
	"X-Api-Key",
	"X-Goog-Api-Key",
	"Cookie",
	// Account-scoped: another provider answers 401 to a foreign org.
	"Openai-Organization",
	"Openai-Project",
}

// credentialParams are query parameters that carry a caller's credentials
// (Gemini's key=, and the usual spellings of others).
var credentialParams = []string{"key", "api_key", "api-key", "apikey", "access_token"}

// minSecretLen is the shortest header value that is scrubbed from error
// messages; shorter values (a version number) would scrub innocent text.
const minSecretLen = 8

// Bounds on reading the body of a response that is thrown away.
const (
	maxDrain     = 64 << 10
	drainTimeout = 250 * time.Millisecond
)

// maxAttemptErrors bounds how many causes an Error keeps.
const maxAttemptErrors = 64

// upstream is the configuration and live state of one upstream.
type upstream struct {
	cfg     Upstream // as configured, for probes
	index   int
	name    string
	baseURL string // redacted: scheme, host and path only
	scheme  string
	host    string // as configured, for the rewritten URL and Host header
	match   string // hostKey of scheme and host
	path    string // decoded base path, no trailing slash
	rawPath string // escaped base path, no trailing slash
	header  http.Header

	breaker  *breaker
	cd       cooldown
	window   window
	recent   recent
	live     liveness
	models   modelMap // Upstream.Models
	latency  peakEWMA // for LeastLatency
	headroom headroomState
	fleet    fleetState // with Config.Shared
	m        upstreamMetrics
}

// demoted reports whether u is to be tried after the others: out of
// rate-limit headroom, degraded, or suspected of hanging.
func (t *Transport) demoted(u *upstream, now time.Time) bool {
	if u.outOfHeadroom(now) {
		return true
	}
	if t.degraded.enabled() {
		u.refresh(now, t.degraded)
		if u.recent.degraded.Load() {
			return true
		}
	}
	return u.suspect(now, t.hang, t.degraded)
}

// order returns the upstreams in the order a request tries them: the
// router's order (the configured one when there is no router), demoted
// upstreams last. Without a router it allocates nothing: it returns
// t.upstreams when no upstream is demoted, and reorders into buf
// otherwise (past the 64th, no upstream is demoted).
func (t *Transport) order(buf []*upstream, now time.Time) []*upstream {
	if t.router != nil {
		return t.routed(buf, now)
	}
	var demoted uint64
	for i, u := range t.upstreams {
		if i < 64 && t.demoted(u, now) {
			demoted |= 1 << i
		}
	}
	if demoted == 0 {
		return t.upstreams
	}
	out := buf[:0]
	for i, u := range t.upstreams {
		if i >= 64 || demoted&(1<<i) == 0 {
			out = append(out, u)
		}
	}
	for i, u := range t.upstreams {
		if i < 64 && demoted&(1<<i) != 0 {
			out = append(out, u)
		}
	}
	return out
}

// routed asks the router for the order.
func (t *Transport) routed(buf []*upstream, now time.Time) []*upstream {
	var cbuf [8]Candidate
	var ibuf [8]int
	cands := cbuf[:0]
	for i, u := range t.upstreams {
		cands = append(cands, t.candidate(i, u, now))
	}
	out := buf[:0]
	for _, i := range t.router.Order(ibuf[:0], cands) {
		out = append(out, t.upstreams[i])
	}
	return out
}

// candidate is what a Router knows of u at now. An upstream the Transport
// would skip (cooling down, or with a probe in flight) reads as Open.
func (t *Transport) candidate(i int, u *upstream, now time.Time) Candidate {
	u.refresh(now, t.degraded) // the router reads the recent figures
	degraded := t.demoted(u, now)
	state := u.breaker.status()
	if u.cd.remaining(now) > 0 || (state != Closed && u.breaker.probeInFlight(now)) {
		state = Open
	}
	since := u.breaker.since.Load()
	return Candidate{
		Index:       i,
		Name:        u.name,
		Weight:      u.cfg.Weight,
		Cost:        u.cfg.Cost,
		InFlight:    int(u.live.inflight.Load()),
		Latency:     u.latency.value(now),
		P50:         time.Duration(u.recent.p50.Load()),
		SuccessRate: math.Float64frombits(u.recent.rate.Load()),
		State:       state,
		Recovering:  state == Closed && since != 0 && now.UnixNano()-since < int64(u.breaker.probeTTL),
		Degraded:    degraded,
	}
}

// hostKey returns host lowercased and without the scheme's default port, so
// that every spelling of one authority compares equal.
func hostKey(scheme, host string) string {
	h, port := splitHostPort(host)
	if port == defaultPort(scheme) {
		port = ""
	}
	h = strings.ToLower(h)
	if port == "" {
		return h
	}
	return h + ":" + port
}

// sameHost reports whether host (a request URL's) names the same
// authority as u, without allocating.
func (u *upstream) sameHost(scheme, host string) bool {
	h, port := splitHostPort(host)
	if port == defaultPort(scheme) {
		port = ""
	}
	if port == "" {
		return strings.EqualFold(h, u.match)
	}
	n := len(u.match) - len(port) - 1
	return n > 0 && u.match[n] == ':' && u.match[n+1:] == port && strings.EqualFold(h, u.match[:n])
}

// splitHostPort splits an authority into host and port. An IPv6 host keeps
// its brackets, so that "[::1]:8080" and "[::1:8080]" stay apart.
func splitHostPort(host string) (h, port string) {
	if strings.HasPrefix(host, "[") {
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return host, ""
		}
		h, rest := host[:end+1], host[end+1:]
		if p, ok := strings.CutPrefix(rest, ":"); ok {
			return h, p
		}
		return h, ""
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		return host[:i], host[i+1:]
	}
	return host, ""
}

func defaultPort(scheme string) string {
	switch strings.ToLower(scheme) {
	case "http":
		return "80"
	case "https":
		return "443"
	}
	return ""
}

// hasDotSegment reports whether p has a "." or ".." segment, which would
// let a request climb out of a base path once the upstream resolves it. A
// backslash separates segments too, as some servers read it.
func hasDotSegment(p string) bool {
	if !strings.Contains(p, ".") {
		return false
	}
	for p != "" {
		i := strings.IndexAny(p, `/\`)
		seg := p
		if i >= 0 {
			seg, p = p[:i], p[i+1:]
		} else {
			p = ""
		}
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// route returns the upstream that u is addressed to (the longest matching
// base path wins) and the rest of the path after its base path, decoded and
// escaped, or nil. Both the decoded and the escaped path must lie under the
// base path, so that an encoded slash cannot pass for a path segment.
func (t *Transport) route(u *url.URL) (up *upstream, rest, rawRest string) {
	if u.Opaque != "" || u.Host == "" {
		return nil, "", ""
	}
	raw := u.EscapedPath()
	for _, c := range t.upstreams {
		if !strings.EqualFold(u.Scheme, c.scheme) || !c.sameHost(c.scheme, u.Host) ||
			!underBase(u.Path, c.path) || !underBase(raw, c.rawPath) {
			continue
		}
		if up == nil || len(c.path) > len(up.path) {
			up = c
		}
	}
	if up == nil || hasDotSegment(u.Path) {
		return nil, "", ""
	}
	return up, u.Path[len(up.path):], raw[len(up.rawPath):]
}

// underBase reports whether path is base or lies under it.
func underBase(path, base string) bool {
	return strings.HasPrefix(path, base) && (len(path) == len(base) || path[len(base)] == '/')
}

// call is one RoundTrip over the upstreams.
type call struct {
	t         *Transport
	req       *http.Request
	addressed *upstream
	rest      string // the request's path after the addressed base path
	rawRest   string // the same, escaped
	body      replay

	held     *http.Response // the latest answer, returned if nothing better comes
	errs     []attemptRec   // what happened at each upstream, for an Error
	last     *upstream      // the upstream of the last failed attempt
	attempts int            // in the current round
	fatal    int            // attempts in the current round with permanent errors

	// With Upstream.Models: the model the caller asked for, and the
	// body it is read from ("" when the body says none or cannot be
	// read: the request then goes to every upstream as it is).
	model     string
	modelBody []byte
}

// readModel reads the model of the request's body, for model mapping. It
// uses the body buffered for replay, or one read of GetBody; a body that
// cannot be replayed is left alone.
func (c *call) readModel() {
	data := c.body.buffered
	if data == nil && c.body.getBody != nil {
		rc, err := c.body.getBody()
		if err != nil {
			return
		}
		data, err = io.ReadAll(io.LimitReader(rc, c.t.maxBody+1))
		rc.Close()
		if err != nil || int64(len(data)) > c.t.maxBody {
			return
		}
	}
	if m, ok := requestModel(data); ok {
		c.model, c.modelBody = m, data
	}
}

// mapped returns the body of the request for u when u's Models rename the
// model, and whether it does.
func (c *call) mapped(u *upstream) ([]byte, bool) {
	if c.model == "" || len(u.models) == 0 {
		return nil, false
	}
	target, ok := u.models.lookup(c.model)
	if !ok || target == c.model {
		return nil, false
	}
	body, err := rewriteModel(c.modelBody, target)
	return body, err == nil
}

func (c *call) run() (*http.Response, error) {
	defer c.body.closeUnused()
	if err := c.body.init(c.req, c.t.maxBody); err != nil {
		return nil, err
	}
	if c.t.models {
		c.readModel()
	}
	if c.t.hedge != nil {
		c.t.hedge.earn()
	}
	ctx := c.req.Context()
	var waited time.Duration
	for round := 0; ; {
		c.attempts, c.fatal = 0, 0
		errsBefore := len(c.errs)
		if resp, err, done := c.round(ctx); done {
			return resp, err
		}
		if !c.body.canSend() {
			return c.finish()
		}
		now := time.Now()
		next, known := c.t.earliest(now)
		var wait time.Duration
		switch {
		case c.attempts == 0:
			// Every upstream was skipped: wait within MaxWait for the
			// first to come back.
			if !known || next <= 0 || waited+next > c.t.rate.MaxWait {
				return c.finish()
			}
			wait = next
			if dl, ok := ctx.Deadline(); !ok || now.Add(wait).Before(dl) {
				c.errs = c.errs[:errsBefore] // the next round says it again
			}
		case round < c.t.retries && c.fatal < c.attempts:
			// DefaultBackoff returns a 429's or 503's Retry-After
			// uncapped.
			wait = min(retryablehttp.DefaultBackoff(c.t.waitMin, c.t.waitMax, round, c.held), c.t.rate.MaxCooldown)
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
		if err := sleep(ctx, wait); err != nil {
			c.discardHeld()
			return nil, err
		}
		waited += wait
	}
}

// round tries each upstream in order once. It reports done with the
// result when the request is over.
func (c *call) round(ctx context.Context) (*http.Response, error, bool) {
	if c.t.hedge != nil && c.body.replayable && len(c.t.upstreams) > 1 {
		return c.hedged(ctx)
	}
	var buf [8]*upstream
	now := time.Now()
	for i, u := range c.t.order(buf[:0], now) {
		if err := ctx.Err(); err != nil {
			c.discardHeld()
			return nil, err, true
		}
		if i > 0 {
			now = time.Now() // the attempts before took time
		}
		p, ok := c.admit(u, now)
		if !ok {
			continue
		}
		if !c.body.canSend() {
			u.breaker.done(p, Canceled) // hand the permit back unused
			c.addErr(u, ErrBodyNotReplayable)
			resp, err := c.finish()
			return resp, err, true
		}
		if resp, err, done := c.attempt(ctx, u, p, now); done {
			return resp, err, true
		}
	}
	return nil, nil, false
}

// admit returns a permit to send the request to u, or records why u is
// skipped: cooling down, not serving the model, or its circuit open.
func (c *call) admit(u *upstream, now time.Time) (permit, bool) {
	if left := u.cd.remaining(now); left > 0 {
		c.skip(u, ErrRateLimited, left)
		return permit{}, false
	}
	if c.model != "" && len(u.models) > 0 {
		if _, ok := u.models.lookup(c.model); !ok {
			c.addErr(u, ErrModelNotServed)
			return permit{}, false
		}
	}
	p, ok := u.breaker.allow()
	if !ok {
		c.skip(u, ErrCircuitOpen, u.breaker.remaining())
	}
	return p, ok
}

// flight is one attempt: the request to one upstream and what came back.
type flight struct {
	u      *upstream
	p      permit
	start  time.Time
	hedge  bool // sent as a hedge, beside an attempt still in flight
	out    *http.Request
	cancel context.CancelCauseFunc // nil when nothing needs to end the attempt early

	resp *http.Response
	err  error
	o    Outcome
	now  time.Time // when the answer came

	// Hedging: whether the call gave up on it, and who owns its result.
	lost     atomic.Bool
	state    atomic.Int32 // flying, delivered or abandoned
	panicked any
	stack    []byte
}

// attempt sends the request to u. It reports done with the result when the
// request is over; otherwise it has kept the response or the error for
// later.
func (c *call) attempt(ctx context.Context, u *upstream, p permit, start time.Time) (*http.Response, error, bool) {
	if p.probe != 0 {
		defer u.breaker.releaseProbe(p) // even if GetBody panics
	}
	f := flight{u: u, p: p, start: start}
	if err := c.prepare(ctx, &f, c.t.timeout > 0); err != nil {
		u.breaker.done(p, Canceled)
		c.addErr(u, err)
		resp, err := c.finish()
		return resp, err, true
	}
	c.send(&f)
	return c.settle(&f)
}

// prepare builds f's request: the caller's, rewritten for f.u, with the
// next copy of the body. With cancelable, the request has its own context,
// which f.cancel ends.
func (c *call) prepare(ctx context.Context, f *flight, cancelable bool) error {
	u := f.u
	if c.last != nil && c.last != u && !f.hedge {
		c.last.m.failovers[u.index].Inc()
	}
	c.attempts++
	actx := ctx
	if cancelable {
		actx, f.cancel = context.WithCancelCause(ctx)
	}
	out := c.clone(actx, u)
	c.rewrite(out, u)
	body, err := c.body.next()
	if err != nil {
		if f.cancel != nil {
			f.cancel(nil)
		}
		return err
	}
	out.Body = body
	if c.body.buffered != nil {
		out.GetBody = c.body.getBody
		out.ContentLength = int64(len(c.body.buffered))
	}
	if data, ok := c.mapped(u); ok {
		if body != nil {
			body.Close() // this attempt sends the renamed body instead
		}
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		out.Body, _ = out.GetBody()
		out.ContentLength = int64(len(data))
	}
	f.out = out
	return nil
}

// send sends f's request through Base, and records what came back in f
// and in f.u's breaker and figures. It touches nothing of c but what it
// reads, so that hedged attempts can run side by side.
func (c *call) send(f *flight) {
	ctx := c.req.Context()
	u := f.u
	if f.p.probe != 0 {
		defer u.breaker.releaseProbe(f.p) // even if Base or Classify panics
	}
	var timer *time.Timer
	if c.t.timeout > 0 {
		cancel := f.cancel
		timer = time.AfterFunc(c.t.timeout, func() { cancel(ErrAttemptTimeout) })
	}
	var now time.Time
	answered := false
	u.live.start(f.start)
	defer func() { u.live.end(now, answered) }() // even if Base panics
	resp, err := c.t.base.RoundTrip(f.out)
	if timer != nil && !timer.Stop() && ctx.Err() == nil && !f.lost.Load() {
		// Our timeout fired, not the caller's: a response that raced it
		// has a canceled context and cannot be read.
		if resp != nil {
			resp.Body.Close()
			resp = nil
		}
		err = ErrAttemptTimeout
	}
	if f.cancel != nil {
		if err != nil {
			f.cancel(nil)
		} else {
			resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: f.cancel}
		}
	}
	if g := c.t.stream; g != nil && err == nil && resp.StatusCode/100 == 2 && ctx.Err() == nil {
		// Nothing has reached the caller yet: a stream that starts with
		// an error, or says nothing in time, fails over.
		if guarded, gerr := g.guard(resp); gerr != nil {
			resp, err = nil, gerr
		} else {
			resp = guarded
		}
	}
	now = time.Now()
	elapsed := now.Sub(f.start)
	if resp != nil && len(u.header) > 0 {
		// resp.Request shows where the request went, with the caller's
		// own headers: u's credentials stay out of SDK error dumps.
		if u == c.addressed {
			resp.Request = c.req
		} else {
			view := *f.out
			view.Header = c.req.Header
			resp.Request = &view
		}
	}

	o := Canceled
	lost := f.lost.Load()
	switch {
	case lost:
		// Canceled for a hedge that answered first: a failure only when
		// the upstream looks hung, as the attempt would have timed out.
		if resp == nil && ctx.Err() == nil && (u.suspect(now, c.t.hang, c.t.degraded) || u.silent(f.start, now, c.t.hang, c.t.degraded)) {
			o, err = Failed, errHedgeLost
		}
	case err == nil || ctx.Err() == nil:
		o = c.t.classify(resp, err)
	}
	answered = o != Canceled && !errors.Is(err, ErrAttemptTimeout) && !lost
	if lost {
		elapsed = -1 // cut short: how long it would have taken is unknown
	} else if c.t.router != nil && (o == Success || o == Rejected || o == Failed) {
		u.latency.observe(elapsed, now) // a fast 429 or 401 says nothing of speed
	}
	bo := breakerOutcome(o, err)
	u.breaker.done(f.p, bo)
	if bo == Failed && c.t.fleet != nil {
		c.t.fleet.failure(u)
	}
	u.observe(o, elapsed, now)
	f.resp, f.err, f.o, f.now = resp, err, o, now
}

// settle acts on f's answer: it reports done with the result when the
// request is over; otherwise it keeps the response or the error for later.
func (c *call) settle(f *flight) (*http.Response, error, bool) {
	ctx := c.req.Context()
	u, resp, err, now := f.u, f.resp, f.err, f.now
	switch f.o {
	case Success, Rejected:
		if err == nil {
			if f.o == Success {
				u.noteHeadroom(resp.Header, now, c.t.rate.DefaultCooldown)
			}
			c.discardHeld()
			return resp, nil, true
		}
		// A request no upstream can send (an invalid header).
		c.addErr(u, err)
		r, e := c.finish()
		return r, e, true
	case Canceled:
		if cerr := ctx.Err(); cerr != nil {
			if resp != nil {
				discard(resp)
			}
			c.discardHeld()
			return nil, cerr, true
		}
		// A custom classifier said stop while the caller waits on.
		if resp != nil {
			c.discardHeld()
			return resp, nil, true
		}
		c.addErr(u, err)
		r, e := c.finish()
		return r, e, true
	case RateLimited:
		c.t.coolDown(u, resp, now)
	case AuthFailed:
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		c.t.log(slog.LevelError, "upstream rejected its credentials", u, slog.Int("status", status))
	}
	if resp != nil {
		u.setLastError(statusText(resp.StatusCode), now)
		c.hold(resp)
	} else {
		if permanent(err) {
			c.fatal++
		}
		msg := c.t.redact(err.Error(), c.req)
		u.setLastError(msg, now)
		c.addErrMsg(u, err, msg)
	}
	c.last = u
	return nil, nil, false
}

// statusText describes a status for Health: "HTTP 503 Service
// Unavailable", "HTTP 529".
func statusText(code int) string {
	if text := http.StatusText(code); text != "" {
		return "HTTP " + strconv.Itoa(code) + " " + text
	}
	return "HTTP " + strconv.Itoa(code)
}

// coolDown starts or extends u's cooldown after a 429.
func (t *Transport) coolDown(u *upstream, resp *http.Response, now time.Time) {
	d, reason := t.rate.DefaultCooldown, CooldownRateLimited
	if resp != nil {
		d, reason = t.rate.cooldownFor(resp, now)
	}
	before := u.cd.until.Load()
	if u.cd.extend(now, d, reason) {
		u.m.cooldowns[reason].Inc()
		t.log(slog.LevelWarn, "upstream cooling down", u, slog.Duration("cooldown", d), slog.String("reason", string(reason)))
	}
	if t.fleet != nil && u.cd.until.Load() != before {
		t.fleet.cooled(u, d, reason)
	}
}

// skip records that u was not tried.
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

func (c *call) skip(u *upstream, cause error, retryAfter time.Duration) {
	if cause == ErrRateLimited {
		u.m.skippedCooling.Inc()
	} else {
		u.m.skippedOpen.Inc()
	}
	c.record(attemptRec{u: u, cause: cause, retryAfter: retryAfter})
}

func (c *call) addErr(u *upstream, err error) {
	if len(c.errs) < maxAttemptErrors {
		c.addErrMsg(u, err, c.t.redact(err.Error(), c.req))
	}
}

// addErrMsg records err with its message already redacted.
func (c *call) addErrMsg(u *upstream, err error, msg string) {
	c.record(attemptRec{u: u, err: err, msg: msg})
}

func (c *call) record(r attemptRec) {
	if len(c.errs) < maxAttemptErrors {
		c.errs = append(c.errs, r)
	}
}

// clone copies the caller's request for one attempt to up: its own URL and
// header map, without the headers keepHeader leaves out, the value slices
// shared (nothing writes them). With the caller's context, request and URL
// take one allocation.
func (c *call) clone(ctx context.Context, up *upstream) *http.Request {
	var out *http.Request
	if ctx == c.req.Context() {
		pair := new(struct {
			r http.Request
			u url.URL
		})
		pair.r, pair.u = *c.req, *c.req.URL
		out = &pair.r
		out.URL = &pair.u
	} else {
		out = c.req.WithContext(ctx)
		u := *c.req.URL
		out.URL = &u
	}
	h := make(http.Header, len(c.req.Header)+len(up.header))
	for k, v := range c.req.Header {
		if c.keepHeader(k, up) {
			h[k] = v
		}
	}
	out.Header = h
	return out
}

// finish ends the request with the latest answer, or with an Error.
func (c *call) finish() (*http.Response, error) {
	if c.held != nil {
		resp := c.held
		c.held = nil
		return resp, nil
	}
	e := &Error{Attempts: make([]*AttemptError, len(c.errs))}
	for i, r := range c.errs {
		e.Attempts[i] = r.attemptError()
		if ra := r.retryAfter; ra > 0 && (e.retry == 0 || ra < e.retry) {
			e.retry = ra
		}
	}
	return nil, e
}

func (c *call) hold(resp *http.Response) {
	c.discardHeld()
	c.held = resp
}

// bufferHeld reads the held answer's body into memory (at most maxDrain
// bytes, for at most drainTimeout) so that its connection is free while the
// request waits for another round.
func (c *call) bufferHeld() {
	r := c.held
	if r == nil || r.Body == nil || r.Body == http.NoBody {
		return
	}
	timer := time.AfterFunc(drainTimeout, func() { r.Body.Close() })
	data, err := io.ReadAll(io.LimitReader(r.Body, maxDrain+1))
	timer.Stop()
	if err == nil && len(data) <= maxDrain {
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(data))
		return
	}
	r.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(data), r.Body), Closer: r.Body}
}

func (c *call) discardHeld() {
	if c.held != nil {
		discard(c.held)
		c.held = nil
	}
}

// rewrite points out, a clone of the caller's request, at u: scheme, host,
// base path and u's headers. Credentials the caller set go only to the
// upstream the caller addressed (clone left the caller's credential
// headers out for any other).
func (c *call) rewrite(out *http.Request, u *upstream) {
	out.URL.Scheme = u.scheme
	out.URL.Host = u.host
	out.Host = u.host
	if u != c.addressed {
		out.URL.Path = u.path + c.rest
		// url.URL uses RawPath only while it is an encoding of Path;
		// it keeps an encoded base path (".../proxy%2Fopenai/v1").
		if u.rawPath == u.path && c.rawRest == c.rest {
			out.URL.RawPath = out.URL.Path // the same bytes: keeps "!" and friends as sent
		} else {
			out.URL.RawPath = u.rawPath + c.rawRest
		}
		out.URL.User = nil
		out.URL.RawQuery = stripQueryCredentials(out.URL.RawQuery)
	}
	for k, v := range u.header {
		out.Header[k] = v
	}
}

// keepHeader reports whether the caller's header k goes to u: not when u's
// Header replaces it, in any spelling (net/http would send a non-canonical
// key as a second header), nor, for an upstream the caller did not address,
// when it carries a credential.
func (c *call) keepHeader(k string, u *upstream) bool {
	if _, ok := u.header[k]; ok {
		return false
	}
	ck := k
	if !canonicalASCII(k) {
		ck = http.CanonicalHeaderKey(k)
		if _, ok := u.header[ck]; ok {
			return false
		}
	}
	if u != c.addressed {
		for _, name := range c.t.credHeaders {
			if ck == name {
				return false
			}
		}
	}
	return true
}

// canonicalASCII reports, quickly, whether k is already in canonical form
// ("Content-Type"); false only costs a call to http.CanonicalHeaderKey.
func canonicalASCII(k string) bool {
	upper := true
	for i := 0; i < len(k); i++ {
		b := k[i]
		switch {
		case upper && 'a' <= b && b <= 'z', !upper && 'A' <= b && b <= 'Z', b <= ' ', b >= 0x7f:
			return false
		}
		upper = b == '-'
	}
	return true
}

// stripQueryCredentials drops the pairs of a raw query whose name is a
// credential parameter, and keeps every other pair byte for byte, in order
// (url.ParseQuery would drop pairs with a ';' and reorder the rest). Pairs
// are split at '&' and at ';' alike, since some servers read ';' as a
// separator: "a=1;key=k" loses its key either way.
func stripQueryCredentials(raw string) string {
	if raw == "" {
		return raw
	}
	var b strings.Builder
	changed, wrote := false, false
	sep := byte(0) // the separator before the current pair
	for rest := raw; ; {
		i := strings.IndexAny(rest, "&;")
		pair := rest
		if i >= 0 {
			pair = rest[:i]
		}
		if isCredentialParam(queryName(pair)) {
			changed = true
		} else {
			if wrote {
				b.WriteByte(sep)
			}
			b.WriteString(pair)
			wrote = true
		}
		if i < 0 {
			break
		}
		sep, rest = rest[i], rest[i+1:]
	}
	if !changed {
		return raw
	}
	return b.String()
}

// queryName returns the unescaped name of a raw query pair.
func queryName(pair string) string {
	name, _, _ := strings.Cut(pair, "=")
	if n, err := url.QueryUnescape(name); err == nil {
		return n
	}
	return name
}

func isCredentialParam(name string) bool {
	for _, p := range credentialParams {
		if strings.EqualFold(name, p) {
			return true
		}
	}
	return false
}

// redact replaces every known secret in msg: the upstreams' header values,
// and the caller's credential header values, key= query values and URL
// password.
func (t *Transport) redact(msg string, req *http.Request) string {
	scrub := func(v string) {
		if len(v) >= minSecretLen {
			msg = strings.ReplaceAll(msg, v, "[REDACTED]")
		}
	}
	for _, s := range t.secrets {
		scrub(s)
	}
	for _, name := range t.credHeaders {
		for _, v := range req.Header.Values(name) {
			scrub(v)
		}
	}
	if u := req.URL; u != nil {
		if u.User != nil {
			if pw, ok := u.User.Password(); ok {
				scrub(pw)
				scrub(url.QueryEscape(pw))
			}
		}
		for _, pair := range strings.FieldsFunc(u.RawQuery, func(r rune) bool { return r == '&' || r == ';' }) {
			if isCredentialParam(queryName(pair)) {
				_, value, _ := strings.Cut(pair, "=")
				scrub(value)
				if v, err := url.QueryUnescape(value); err == nil {
					scrub(v)
				}
			}
		}
	}
	return msg
}

// earliest returns how long until the first upstream can take a request,
// 0 when one can now, and whether that is known (a probe in flight may end
// at any moment).
func (t *Transport) earliest(now time.Time) (time.Duration, bool) {
	best, known := time.Duration(-1), false
	for _, u := range t.upstreams {
		d := max(u.cd.remaining(now), u.breaker.remaining())
		if d == 0 && u.breaker.probeInFlight(now) {
			continue
		}
		if d == 0 {
			return 0, true
		}
		if best < 0 || d < best {
			best, known = d, true
		}
	}
	return max(best, 0), known
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

// replay gives each attempt the caller's body.
type replay struct {
	first      io.ReadCloser // the caller's Body, for the first attempt
	used       bool
	replayable bool
	buffered   []byte                        // the body, when the Transport buffered it
	getBody    func() (io.ReadCloser, error) // for the attempts after the first
}

// init prepares the caller's body: GetBody when set, else a buffer of at
// most max bytes.
func (b *replay) init(req *http.Request, max int64) error {
	b.first = req.Body
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		b.replayable = true
	case req.GetBody != nil:
		b.replayable = true
		b.getBody = req.GetBody
	case max < 0:
	default:
		data, err := io.ReadAll(io.LimitReader(req.Body, max+1))
		if err != nil {
			req.Body.Close()
			b.used = true
			return err
		}
		if int64(len(data)) > max {
			// Too large to keep: one attempt, that streams the rest.
			b.first = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(data), req.Body), Closer: req.Body}
			return nil
		}
		req.Body.Close()
		b.buffered = data
		b.replayable = true
		b.getBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		b.first, _ = b.getBody()
	}
	return nil
}

func (b *replay) canSend() bool { return b.replayable || !b.used }

// next returns the body of the next attempt.
func (b *replay) next() (io.ReadCloser, error) {
	if !b.used {
		b.used = true
		return b.first, nil
	}
	if !b.replayable {
		return nil, ErrBodyNotReplayable
	}
	if b.getBody == nil {
		return b.first, nil // nil or http.NoBody
	}
	rc, err := b.getBody()
	if err != nil {
		return nil, &bodyError{err}
	}
	return rc, nil
}

// closeUnused closes the caller's body when no attempt took it.
func (b *replay) closeUnused() {
	if !b.used && b.first != nil {
		b.first.Close()
	}
}

// bodyError is GetBody failing; it matches ErrBodyNotReplayable.
type bodyError struct{ err error }

func (e *bodyError) Error() string {
	return ErrBodyNotReplayable.Error() + ": GetBody: " + e.err.Error()
}
func (e *bodyError) Unwrap() []error { return []error{ErrBodyNotReplayable, e.err} }

// cancelOnClose ends an attempt's context when the caller closes the body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// discard drains a response that will not be returned, so that its
// connection can be reused, and closes it. It reads at most maxDrain bytes
// for at most drainTimeout: a body that is larger or stalls costs its
// connection instead.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	timer := time.AfterFunc(drainTimeout, func() { resp.Body.Close() })
	io.CopyN(io.Discard, resp.Body, maxDrain)
	timer.Stop()
	resp.Body.Close()
}
