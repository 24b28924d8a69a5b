package failover

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// UnroutedPolicy says what RoundTrip does with a request addressed to no
// upstream: its URL lies under no Upstream.BaseURL (same scheme, host and
// port, path under the base path). The commonest cause is another spelling
// of an upstream's host, such as "http://localhost:8080/v1" for the
// upstream "http://127.0.0.1:8080/v1".
//
// Whatever the policy, each such scheme and host is logged once, at level
// Warn, and listed by [Transport.UnroutedHosts]; and a redirect hop goes
// to Base as it is, without the caller's credentials when the request
// before it was routed.
type UnroutedPolicy int

const (
	// UnroutedRefuse, the default, fails the request with an
	// [*UnroutedError] that names the BaseURLs; nothing is sent. A request
	// that worked without failover would hide the misconfiguration until
	// the first outage.
	UnroutedRefuse UnroutedPolicy = iota

	// UnroutedPass sends the request to Base untouched, with the
	// caller's credentials: no failover, no circuit, no metrics but
	// failover_unrouted_requests_total. For an http.Client that also
	// talks to other hosts.
	UnroutedPass

	// UnroutedFirst treats a request to a scheme and host no upstream
	// has as addressed to the first upstream when its path lies under
	// that upstream's base path (it is refused otherwise): it fails over
	// like any other, and the caller's credentials go to the first
	// upstream. Choose it only when every host your clients address means
	// that upstream. So that one upstream's credentials never reach the
	// first, it still refuses a request that reaches another upstream's
	// host by another spelling, or names a host beyond ASCII (IDNA).
	UnroutedFirst
)

// String returns "refuse", "pass" or "first".
func (p UnroutedPolicy) String() string {
	switch p {
	case UnroutedRefuse:
		return "refuse"
	case UnroutedPass:
		return "pass"
	case UnroutedFirst:
		return "first"
	}
	return "UnroutedPolicy(" + strconv.Itoa(int(p)) + ")"
}

// ErrUnrouted is the error, wrapped in an [*UnroutedError], of a request
// refused because it was addressed to no upstream ([UnroutedRefuse]).
var ErrUnrouted = errors.New("failover: request addressed to no upstream")

// UnroutedError is the error RoundTrip returns for a request refused by
// [UnroutedRefuse] (or by [UnroutedFirst], when its path lies outside the
// first upstream's base path). It holds no credential: URL is the
// request's scheme, host and path, without user info or query.
type UnroutedError struct {
	URL      string   // what the request was addressed to
	Why      string   // why no upstream matched it
	BaseURLs []string // the upstreams' BaseURLs, in order
}

// Error says what was addressed, why it matched no upstream, and which
// BaseURLs there are.
func (e *UnroutedError) Error() string {
	return ErrUnrouted.Error() + ": " + e.URL + " " + e.Why + "; the upstreams' BaseURLs are " +
		strings.Join(e.BaseURLs, ", ") + " (see Config.Unrouted)"
}

// Unwrap returns [ErrUnrouted].
func (e *UnroutedError) Unwrap() error { return ErrUnrouted }

// UnroutedHost is a scheme and host that requests addressed to no
// upstream named, as [Transport.UnroutedHosts] lists them.
type UnroutedHost struct {
	Host     string    // scheme and host, lowercased: "http://localhost:8080"
	Requests uint64    // requests to it since the first
	First    time.Time // when the first came
}

// maxUnroutedHosts bounds the distinct hosts a Transport keeps and logs:
// a client also used for other traffic (UnroutedPass) would grow it
// without end.
const maxUnroutedHosts = 64

// unroutedHosts is the set behind UnroutedHosts and the log-once rule.
type unroutedHosts struct {
	mu     sync.Mutex
	hosts  map[string]*unroutedHost
	others atomic.Uint64 // requests to hosts past maxUnroutedHosts
}

type unroutedHost struct {
	requests atomic.Uint64
	first    time.Time
}

// note counts a request to key (scheme://host), and reports whether it is
// the first to that key, which is then logged.
func (s *unroutedHosts) note(key string, now time.Time) (first, full bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.hosts[key]; h != nil {
		h.requests.Add(1)
		return false, false
	}
	if len(s.hosts) >= maxUnroutedHosts {
		return s.others.Add(1) == 1, true
	}
	if s.hosts == nil {
		s.hosts = map[string]*unroutedHost{}
	}
	h := &unroutedHost{first: now}
	h.requests.Store(1)
	s.hosts[key] = h
	return true, false
}

// UnroutedHosts lists the schemes and hosts of requests addressed to no
// upstream (redirect hops aside), first seen first: at most 64, after
// which further hosts count under the Host "other". Empty when every
// request was routed. See [UnroutedPolicy].
func (t *Transport) UnroutedHosts() []UnroutedHost {
	s := &t.unroutedHosts
	s.mu.Lock()
	out := make([]UnroutedHost, 0, len(s.hosts)+1)
	for k, h := range s.hosts {
		out = append(out, UnroutedHost{Host: k, Requests: h.requests.Load(), First: h.first})
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b UnroutedHost) int { return a.First.Compare(b.First) })
	if n := s.others.Load(); n > 0 {
		out = append(out, UnroutedHost{Host: "other", Requests: n})
	}
	return out
}

// roundTripUnrouted handles a request that route matched to no upstream.
func (t *Transport) roundTripUnrouted(r request) (*http.Response, error) {
	t.unrouted.Inc()
	req := r.req
	start := time.Now()
	if req.Response != nil {
		resp, err := t.base.RoundTrip(r.unrouted())
		t.traceUnrouted(r, resp, err, start)
		return resp, err
	}
	key := unroutedKey(req.URL)
	if first, full := t.unroutedHosts.note(key, time.Now()); first {
		if full {
			t.logf(slog.LevelWarn, "requests addressed to no upstream come from more than 64 hosts; no more are logged", slog.String("policy", t.unroutedPolicy.String()))
		} else {
			t.logf(slog.LevelWarn, "request addressed to no upstream", slog.String("host", key), slog.String("policy", t.unroutedPolicy.String()),
				slog.String("why", t.whyUnrouted(req.URL)), slog.Any("base_urls", t.baseURLs()))
		}
	}
	var resp *http.Response
	var err error
	if t.unroutedPolicy == UnroutedPass {
		resp, err = t.base.RoundTrip(req)
	} else {
		closeBody(req)
		addr := key
		if req.URL.Opaque == "" && req.URL.Host != "" {
			addr += req.URL.EscapedPath()
		}
		err = &UnroutedError{URL: addr, Why: t.whyUnrouted(req.URL), BaseURLs: t.baseURLs()}
	}
	t.traceUnrouted(r, resp, err, start)
	return resp, err
}

// traceUnrouted calls the Trace's Done, if any, for an unrouted request.
func (t *Transport) traceUnrouted(r request, resp *http.Response, err error, start time.Time) {
	tr := requestTrace(r.req.Context())
	if tr == nil || tr.Done == nil {
		return
	}
	d := TraceDone{Outcome: RequestUnrouted, Duration: time.Since(start)}
	if resp != nil {
		d.StatusCode = resp.StatusCode
	} else {
		d.Err = t.scrub(err, r.req, r.hop) // Base's own, as the caller gets it, or the refusal
	}
	defer func() {
		if v := recover(); v != nil && resp != nil {
			resp.Body.Close()
			panic(v)
		} else if v != nil {
			panic(v)
		}
	}()
	tr.Done(d)
}

// unroutedKey returns u's scheme and host, lowercased, as UnroutedHosts
// lists them: "http://localhost:8080", or "http:" for a URL without a host
// (whose opaque part could hold anything).
func unroutedKey(u *url.URL) string {
	s := strings.ToLower(u.Scheme)
	if u.Opaque != "" || u.Host == "" {
		return s + ":"
	}
	if s != "" {
		s += ":"
	}
	return s + "//" + hostKey(u.Scheme, u.Host)
}

// whyUnrouted says why route matched u to no upstream.
func (t *Transport) whyUnrouted(u *url.URL) string {
	if u.Opaque != "" || u.Host == "" {
		return "is not an absolute URL with a host"
	}
	if hasDotSegment(u.Path) {
		return `has a "." or ".." path segment`
	}
	switch {
	case t.hostOfUpstream(u):
		return "lies under no upstream's base path on its host"
	case t.unroutedPolicy == UnroutedFirst && t.maybeIDN(u.Host):
		return "has a host name that may be an upstream's by IDNA, which net/http dials it by"
	case t.unroutedPolicy == UnroutedFirst && t.reachesUpstream(u):
		return "reaches an upstream's host and port, spelled otherwise than its BaseURL"
	case t.unroutedPolicy == UnroutedFirst:
		return "lies outside the first upstream's base path"
	}
	return "has a scheme and host no upstream has"
}

// baseURLs returns the upstreams' BaseURLs, as Health shows them.
func (t *Transport) baseURLs() []string {
	out := make([]string, len(t.upstreams))
	for i, u := range t.upstreams {
		out[i] = u.baseURL
	}
	return out
}
