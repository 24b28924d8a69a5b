package failover

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/failover-go/failover/internal/redact"
)

// clone copies the caller's request for one attempt to up: its own URL
// (or the caller's, read only, when rewrite changes nothing and shareURL
// allows) and its own header map, without the headers up sets or those
// mayCross keeps back; the value slices are shared, never written.
func (r *request) clone(ctx context.Context, up *upstream, shareURL bool, own *outParts) *http.Request {
	// The request as the caller made it, or with the attempt's own
	// context (WithContext's copy, inlined, stays on the stack).
	req := r.req
	if ctx != req.Context() {
		req = req.WithContext(ctx)
	}
	var out *http.Request
	switch {
	case own != nil:
		// Made with the attempt (see hedgedParts): the URL is its own.
		own.r, own.u = *req, *req.URL
		out = &own.r
		out.URL = &own.u
	case shareURL && r.keepsURL(up):
		// The URL as the caller built it from up's BaseURL: shared,
		// read only, and the clone takes less memory. Not for an
		// attempt of a hedged round (shareURL false): one that loses
		// may still be in Base after RoundTrip has returned, when the
		// caller may change its request.
		out = new(http.Request)
		*out = *req
	default:
		all := new(struct {
			r http.Request
			u url.URL
		})
		all.r, all.u = *req, *req.URL
		out = &all.r
		out.URL = &all.u
	}
	h := make(http.Header, len(r.req.Header)+len(up.header))
	owner := up == r.owner()
	for k, v := range r.req.Header {
		if r.crosses(up, owner, k, v) {
			h[k] = v
		}
	}
	out.Header = h
	return out
}

// crosses reports whether the caller's field k (a header or a trailer),
// with values vs, may go to up: not when up sets it (its Header), nor,
// unless up is the credentials' owner, when mayCross says no.
func (r *request) crosses(up *upstream, owner bool, k string, vs []string) bool {
	return !up.sets(k) && (owner || r.mayCross(k, vs))
}

// trailer gives out, bound for up, the caller's trailers by the rule its
// headers follow (crosses): the caller's map itself when up is the
// credentials' owner and every field may go, else a map of those that
// may. Any other upstream gets a map of its own whatever the caller's
// holds, so that a field the caller adds while its body is read (which
// net/http sends) reaches none. A caller may set trailer values while
// its body is read, as net/http allows, so that map takes them again when
// the body ends (trailerBody). It runs once out's body is final.
func (r *request) trailer(out *http.Request, up *upstream) {
	owner := up == r.owner()
	if owner && r.allCross(up) {
		return
	}
	own := make(http.Header, len(r.req.Trailer))
	for k, vs := range r.req.Trailer {
		if r.crosses(up, owner, k, vs) {
			own[k] = vs
		}
	}
	out.Trailer = own
	if len(own) > 0 && out.Body != nil && out.Body != http.NoBody {
		// Not r itself: the call it belongs to would escape to the heap.
		out.Body = &trailerBody{ReadCloser: out.Body, src: r.req.Trailer, hop: r.hop, own: own}
	}
}

// allCross reports whether every trailer of the caller's may go to up,
// the credentials' owner: up sets none of them.
func (r *request) allCross(up *upstream) bool {
	for k, vs := range r.req.Trailer {
		if !r.crosses(up, true, k, vs) {
			return false
		}
	}
	return true
}

// trailerBody is the body of a request whose trailers are a map of their
// own (see trailer): at the body's end, before net/http writes the
// trailers, it takes the caller's values again for the fields that may go
// (their names decided when the map was made), and drops those whose
// values now carry a credential of a redirect hop's. It never adds a
// field: net/http has announced them.
type trailerBody struct {
	io.ReadCloser
	src http.Header // the caller's trailers
	hop *hop        // nil unless the request is a redirect hop
	own http.Header
}

func (b *trailerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		for k := range b.own {
			if vs := b.src[k]; b.hop != nil && b.hop.carries(vs...) {
				delete(b.own, k)
			} else {
				b.own[k] = vs
			}
		}
	}
	return n, err
}

// escapedRest is the escaped rest of the request's path after its
// addressed base path: rawRest, which route leaves empty when the caller's
// URL has no RawPath (and the base path needs no escaping), and then the
// rest escaped as net/url escapes a path.
func (r *request) escapedRest() string {
	if r.rawRest != "" || r.rest == "" || r.req.URL.RawPath != "" {
		return r.rawRest
	}
	if pathSafe(r.rest) {
		return r.rest // its escaping, as escapedPath's first look finds
	}
	u := url.URL{Path: r.rest}
	return u.EscapedPath()
}

// keepsURL reports whether rewrite leaves the caller's URL as it is for
// up: up is the upstream the caller addressed, in the scheme and host its
// BaseURL spells, with no Query to set, and the request is not a redirect
// hop.
func (r *request) keepsURL(up *upstream) bool {
	return up == r.addressed && r.hop == nil && r.spelled && len(up.queryNames) == 0
}

// rewrite points out, a clone of the caller's request, at u: scheme, host,
// base path (with its deployment), u's headers (and k's over them, when
// it is sent with k, one of u's Keys) and query. Host is always
// u's, even when the caller set another (a gateway on
// httputil.ReverseProxy keeps its own client's Host, which would reach
// the provider with u's credentials). Any upstream but the credentials'
// owner gets the URL without user info and credential query pairs. A URL
// shared with the caller (keepsURL) is not written.
func (r *request) rewrite(out *http.Request, u *upstream, k *key) {
	out.Host = u.host
	for _, f := range u.headers {
		out.Header[f.key] = f.values
	}
	if k != nil {
		k.setKey(out.Header)
	}
	if out.URL == r.req.URL {
		return
	}
	out.URL.Scheme = u.scheme
	out.URL.Host = u.host
	switch {
	case u == r.addressed:
	case u.deployed:
		// The deployment is a segment of its own: its escaping in
		// RawPath keeps a "%" or "?" in it from reading as more.
		d := r.deploymentAt(u)
		out.URL.Path = u.path + "/" + d + u.suffix + r.rest
		out.URL.RawPath = u.rawPath + "/" + url.PathEscape(d) + u.rawSuffix + r.escapedRest()
		out.URL.User = nil
		out.URL.RawQuery = r.t.creds.stripQuery(out.URL.RawQuery)
	default:
		out.URL.Path = r.pathAt(u)
		// url.URL uses RawPath only while it is an encoding of Path;
		// it keeps an encoded base path (".../proxy%2Fopenai/v1").
		if rawRest := r.escapedRest(); u.rawPath == u.path && rawRest == r.rest {
			out.URL.RawPath = out.URL.Path // the same bytes: keeps "!" and friends as sent
		} else {
			out.URL.RawPath = u.rawPath + rawRest
		}
		out.URL.User = nil
		out.URL.RawQuery = r.t.creds.stripQuery(out.URL.RawQuery)
	}
	if r.hop != nil && u != r.hop.owner {
		out.URL.User = nil
		out.URL.RawQuery = r.hop.stripQuery(out.URL.RawQuery)
	}
	out.URL.RawQuery = u.withQuery(out.URL.RawQuery)
}

// deploymentAt is what fills the {deployment} of u, a deployed upstream
// the request was not addressed to: the request's model as u's Models
// map it, or for a request that names none, the deployment the caller
// addressed, as it is. Admission sends no other request here; were one
// sent, it would keep the placeholder, which the upstream refuses.
func (r *request) deploymentAt(u *upstream) string {
	if r.model != "" {
		if m, ok := u.models.lookup(r.model); ok && pathSegment(m) {
			return m
		}
	} else if a := r.addressed; a != nil && a.deployed && r.hop == nil {
		if d := a.deployment(r.req.URL.Path, r.rest); pathSegment(d) {
			return d
		}
	}
	return "{deployment}"
}

// mayCross reports whether the caller's header k, with values vs, may go
// to an upstream the caller's credentials are not for: not when it is a
// credential or, on a redirect hop, carries one (a Referer with the first
// URL's key=).
func (r *request) mayCross(k string, vs []string) bool {
	return !r.t.creds.header(k) && (r.hop == nil || !r.hop.carries(vs...))
}

// Redirect hops. http.Client follows a 3xx with a new request, the hop,
// which copies the first request's headers and reaches RoundTrip addressed
// to wherever the Location points. The caller's credentials in it belong
// to the upstream the first request addressed, its owner; anyone else gets
// the hop without them, wherever they are carried (see docs/design.md). A
// hop whose chain cannot be followed back belongs to no upstream.

// hop is what a redirect hop knows of the caller's credentials: the
// upstream they belong to, the chain's first request, and every form of
// their values, in the first request and in the hop, to find them
// wherever the hop carries them.
type hop struct {
	owner   *upstream     // nil: none
	origin  *http.Request // nil: unknown
	secrets []string
}

// owner returns the upstream the caller's credentials belong to: the one
// the request is addressed to, or for a redirect hop the one its chain's
// first request was (nil: none).
func (r *request) owner() *upstream {
	if r.hop != nil {
		return r.hop.owner
	}
	return r.addressed
}

// maxRedirects bounds the walk back along a redirect chain (http.Client
// stops at 10).
const maxRedirects = 100

// redirected returns what req, a redirect hop, knows of the caller's
// credentials: those of the chain's first request, and those of the hop's
// headers, which http.Client copied from it. The hop's URL is the
// Location's, not the caller's, unless the first request is unknown.
func (t *Transport) redirected(req *http.Request) *hop {
	h := &hop{origin: firstRequest(req)}
	if h.origin != nil {
		h.owner, _, _, _ = t.address(h.origin.URL)
		h.secrets = t.creds.appendRequestSecrets(h.secrets, h.origin)
	} else {
		h.secrets = t.creds.appendURLSecrets(h.secrets, req.URL)
	}
	h.secrets = redact.Compact(t.creds.appendHeaderSecrets(h.secrets, req.Header))
	return h
}

// firstRequest returns the first request of the redirect chain of req, a
// hop, following each hop's Response.Request back; nil when the chain is
// broken. A view made by this package (see view) names the first request
// itself: its URL is where an attempt went, not where the caller sent it.
func firstRequest(req *http.Request) *http.Request {
	r := req
	for range maxRedirects {
		if r.Response == nil {
			if r.URL == nil {
				return nil
			}
			return r
		}
		prev := r.Response.Request
		if prev == nil {
			return nil
		}
		if m, ok := prev.Context().Value(viewKey{}).(*viewMark); ok && m.view == prev {
			return m.origin
		}
		r = prev
	}
	return nil
}

// viewKey is the context key of a view's viewMark.
type viewKey struct{}

// viewMark is the first request of the chain of the request a view shows.
type viewMark struct {
	view   *http.Request // the view it was made for: a request built on its context is not
	origin *http.Request // nil when unknown
}

// view returns what resp.Request shows of out, the attempt at an upstream
// the request was not addressed to: out, with the caller's own headers and
// the caller's context, which also names the chain's first request, for a
// redirect that follows the response (firstRequest). Not the attempt's
// context: that ends with the answer's body.
func (r *request) view(out *http.Request) *http.Request {
	all := new(struct { // one allocation
		v http.Request
		c viewCtx
	})
	m := &all.c.mark
	m.origin = r.req
	if r.hop != nil {
		m.origin = r.hop.origin
	}
	all.c.Context = r.req.Context()
	all.v = *out.WithContext(&all.c) // WithContext's copy, inlined, stays on the stack
	v := &all.v
	v.Header = r.req.Header
	m.view = v
	return v
}

// viewCtx is a view's context: the caller's, with its viewMark under viewKey
// (context.WithValue's, made in the view's allocation).
type viewCtx struct {
	context.Context
	mark viewMark
}

func (c *viewCtx) Value(key any) any {
	if key == (viewKey{}) {
		return &c.mark
	}
	return c.Context.Value(key)
}

// String names it for a panic's or a log's %v, as context.WithValue's
// does.
func (c *viewCtx) String() string {
	return fmt.Sprintf("%v.WithValue(failover.viewKey)", c.Context)
}

// pathAt is the request's path at u, an upstream it was not addressed
// to: u's base path and the rest, or the caller's path itself when the
// base paths are the same.
func (r *request) pathAt(u *upstream) string {
	p := r.req.URL.Path
	if n := len(u.path); len(p) == n+len(r.rest) && p[:n] == u.path && p[n:] == r.rest {
		return p
	}
	return u.path + r.rest
}

// unrouted returns what goes to Base for r, addressed to no upstream: the
// caller's request untouched, unless it is a redirect hop whose
// credentials belong to an upstream (or to no one knows what); then a copy
// without them.
func (r *request) unrouted() *http.Request {
	if h := r.hop; h == nil || h.origin != nil && h.owner == nil {
		return r.req
	}
	out := r.req.Clone(r.req.Context())
	for k, vs := range out.Header {
		if r.t.creds.header(k) || r.hop.carries(vs...) {
			delete(out.Header, k)
		}
	}
	out.URL.User = nil
	out.URL.RawQuery = r.hop.stripQuery(out.URL.RawQuery)
	return out
}

// carries reports whether any of vs holds one of the caller's credentials.
func (h *hop) carries(vs ...string) bool {
	for _, v := range vs {
		for _, s := range h.secrets {
			if strings.Contains(v, s) {
				return true
			}
		}
	}
	return false
}

// stripQuery drops the pairs of a raw query that carry one of the
// caller's credentials, escaped or not.
func (h *hop) stripQuery(raw string) string {
	return stripQuery(raw, func(pair string) bool {
		if h.carries(pair) {
			return true
		}
		p, err := url.QueryUnescape(pair)
		return err == nil && h.carries(p)
	})
}
