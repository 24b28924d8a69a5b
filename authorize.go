package failover

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/failover-go/failover/internal/redact"
)

// An Authorizer sets the credentials of a request the Transport is about to
// send to an upstream: a token that rotates, a signature over the final
// body. See [Upstream.Authorizer].
//
// Authorize is called once per attempt, on the attempt's own request
// (never the caller's), once its URL, Host, Header, query and body are
// final, with the upstream's model in the body (Upstream.Models) and its
// final ContentLength. It sets headers, as req.Header.Set does, and must
// not read req.Body, which Base sends: it reads the body through
// req.GetBody, which is nil when the request has none (Body nil or
// http.NoBody) or when its body cannot be replayed (no GetBody of the
// caller's and larger than [Config.MaxBodyBuffer]); for the latter it signs
// an unsigned payload or fails. req.Context() is the attempt's: it ends
// when the caller gives up, another attempt wins, or the attempt's bound
// for its kind ([Timeouts], [WithAttemptTimeout]) passes, which fails the
// attempt unsent with [ErrAttemptTimeout], blaming no upstream.
//
// Authorize may be called concurrently, from several goroutines.
type Authorizer interface {
	Authorize(req *http.Request) error
}

// AuthorizerFunc adapts a function to [Authorizer].
type AuthorizerFunc func(*http.Request) error

// Authorize calls f(req).
func (f AuthorizerFunc) Authorize(req *http.Request) error { return f(req) }

// authorizeError is an Authorizer's error, its message scrubbed of the
// credentials that its request carried (those it set before failing
// included).
type authorizeError struct {
	err error
	msg string
}

func (e *authorizeError) Error() string   { return ErrAuthorize.Error() + ": " + e.msg }
func (e *authorizeError) Unwrap() []error { return []error{ErrAuthorize, e.err} }

// unauthorized reports whether err is an Authorizer's: the attempt was not
// sent.
func unauthorized(err error) bool {
	_, ok := err.(*authorizeError)
	return ok
}

// authorize calls the Authorizer of a's upstream on a.out, the attempt's
// request as Base will get it. Its failure ends the attempt unsent (see
// judge): a.out's body and context are closed, and the upstream's last
// error says why; its circuit hears nothing, as the upstream did nothing.
func (r *request) authorize(a *attempt) error {
	u, out := a.u, a.out
	if out.URL == r.req.URL {
		own := *out.URL // shared with the caller (keepsURL): the Authorizer may write it
		out.URL = &own
	}
	for k, vs := range out.Header {
		// The value slices are shared with the caller and the upstream's
		// Header: an append must not write theirs.
		out.Header[k] = vs[:len(vs):len(vs)]
	}
	// The attempt's bound holds the Authorizer too: a token endpoint that
	// hangs ends its context, and the attempt, unsent, as timed out.
	var timer *time.Timer
	if d := a.authorizeBound(r); d > 0 && a.ends() {
		e := a.ender
		timer = time.AfterFunc(d, func() { e.stop(ErrAttemptTimeout) })
	}
	err := callAuthorizer(u.cfg.Authorizer, out, func(v any, stack []byte) {
		msg := fmt.Sprintf("failover: panic in the Authorizer of %s: %v\n%s", u.name, v, stack)
		r.t.reportPanic(r.scrubAttempt(out, msg))
	})
	if timer != nil && !timer.Stop() {
		// The bound ended it, whatever it said.
		if err == nil {
			err = ErrAttemptTimeout
		} else {
			err = fmt.Errorf("%w: %w", ErrAttemptTimeout, err)
		}
	}
	if err == nil {
		return nil
	}
	if out.Body != nil {
		out.Body.Close() // as Base would have
	}
	a.stop(nil)
	e := &authorizeError{err: err, msg: r.scrubAttempt(out, err.Error())}
	if !canceled(r.req) && !a.lost.Load() {
		u.setLastError(e.Error(), time.Now())
		r.t.log(slog.LevelError, "Authorizer failed", u) // never its message: a token may be in it
	}
	return e
}

// authorizeBound is how long a's Authorizer may take: the attempt's bound
// for its kind (streamed or not), 0 for none.
func (a *attempt) authorizeBound(r *request) time.Duration {
	d := a.answer
	if a.timeout != a.answer && streamed(a.out, r.t.maxBody) {
		d = a.timeout
	}
	return max(d, 0)
}

// callAuthorizer calls az on req, and returns a panic as an error, after
// telling it, with its stack, to panicked.
func callAuthorizer(az Authorizer, req *http.Request, panicked func(v any, stack []byte)) (err error) {
	defer func() {
		if v := recover(); v != nil {
			panicked(v, debug.Stack())
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	return az.Authorize(req)
}

// scrubAttempt scrubs from msg the upstreams' credentials, the caller's
// and those out, an attempt's request, carries.
func (r *request) scrubAttempt(out *http.Request, msg string) string {
	c := r.t.creds
	s := c.appendRequestSecrets(c.appendRequestSecrets([]string{}, r.req), out)
	if r.hop != nil {
		s = append(s, r.hop.secrets...)
	}
	return redact.String(msg, c.upstreamSecrets, redact.Compact(s))
}

// authorizeProbe calls u's Authorizer, if any, on a probe's request; a
// failure is logged, scrubbed, and the probe is not sent.
func (p *prober) authorizeProbe(u *upstream, req *http.Request) bool {
	az := u.cfg.Authorizer
	if az == nil {
		return true
	}
	scrub := func(msg string) string {
		return redact.String(msg, p.secrets, redact.Compact(p.creds.appendRequestSecrets([]string{}, req)))
	}
	err := callAuthorizer(az, req, func(v any, stack []byte) {
		p.reportPanic(scrub(fmt.Sprintf("failover: panic in the Authorizer of %s: %v\n%s", u.name, v, stack)))
	})
	if err == nil {
		return true
	}
	if req.Body != nil {
		req.Body.Close()
	}
	p.log(slog.LevelError, "probe: "+ErrAuthorize.Error()+": "+scrub(err.Error()), u)
	return false
}

// checkAuthorizer refuses an Authorizer that holds a nil pointer or func.
func checkAuthorizer(field string, az Authorizer) error {
	if nilValue(az) {
		return configError(field, fmt.Sprintf("is a nil %T: leave it nil for no Authorizer", az))
	}
	return nil
}
