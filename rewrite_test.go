package failover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A caller's credentials reach only the upstream the caller addressed, in
// every form a credential takes and every way a request can address an
// upstream. Every upstream answers 503, so every request visits all three.
func TestCredentialsStayWithTheirUpstream(t *testing.T) {
	upstreams := []Upstream{
		{Name: "a", BaseURL: "http://api.a.test/v1", Header: http.Header{"Authorization": {"Bearer key-a-upstream"}}},
		{Name: "b", BaseURL: "http://b.test:8080/openai/v1/", Header: http.Header{"X-Api-Key": {"key-b-upstream"}, "X-Custom-Token": {"key-b-custom"}}},
		{Name: "c", BaseURL: "http://[::1]:9/v1"},
	}
	hosts := map[string]string{"a": "api.a.test", "b": "b.test:8080", "c": "[::1]:9"}
	tests := []struct {
		name, url, addressed, wantPath string
	}{
		{"exact base", "http://api.a.test/v1/chat/completions", "a", "/v1/chat/completions"},
		{"base with trailing slash", "http://api.a.test/v1/", "a", "/v1/"},
		{"base alone", "http://api.a.test/v1", "a", "/v1"},
		{"host in upper case", "http://API.A.Test/v1/chat/completions", "a", "/v1/chat/completions"},
		{"default port written out", "http://api.a.test:80/v1/chat/completions", "a", "/v1/chat/completions"},
		{"user info", "http://user:caller-secret-pass@api.a.test/v1/chat/completions", "a", "/v1/chat/completions"},
		{"base path with trailing slash", "http://b.test:8080/openai/v1/chat/completions", "b", "/openai/v1/chat/completions"},
		{"IPv6 host", "http://[::1]:9/v1/chat/completions", "c", "/v1/chat/completions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newFakeNet()
			for _, h := range hosts {
				n.status(h, 503, "down")
			}
			tr := newTestTransport(t, Config{Base: n, Upstreams: upstreams, Breaker: BreakerConfig{FailureThreshold: 100}})
			req := httptestRequest("POST", tt.url+"?key=caller-secret-query&api_key=caller-secret-q2&model=x", chatBody)
			req.Header.Set("Authorization", "Bearer caller-secret-auth")
			req.Header.Set("Proxy-Authorization", "Basic caller-secret-proxy")
			req.Header.Set("Api-Key", "caller-secret-azure")
			req.Header.Set("X-Goog-Api-Key", "caller-secret-goog")
			req.Header.Set("Cookie", "session=caller-secret-cookie")
			req.Header.Set("X-Custom-Token", "caller-secret-custom")
			req.Header["x-api-key"] = []string{"caller-secret-anthropic"} // not canonical
			req.Header.Set("X-Request-Id", "r-1")                         // not a credential
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()

			for name, host := range hosts {
				got := n.requests(host)
				if len(got) != 1 {
					t.Fatalf("%s got %d requests, want 1", name, len(got))
				}
				s := got[0]
				if s.Header.Get("X-Request-Id") != "r-1" || s.Body != chatBody || !strings.Contains(s.RawQuery, "model=x") {
					t.Errorf("%s: the request's own data did not arrive: %+v", name, s)
				}
				if name != tt.addressed {
					if leaked := findSecret(s, "caller-secret"); leaked != "" {
						t.Errorf("%s, not addressed, got the caller's credential in %s", name, leaked)
					}
				} else if s.Path != tt.wantPath {
					t.Errorf("%s: path %q, want %q", name, s.Path, tt.wantPath)
				}
				for other, key := range map[string]string{"a": "key-a-upstream", "b": "key-b-upstream"} {
					if other != name {
						if leaked := findSecret(s, key); leaked != "" {
							t.Errorf("%s got upstream %s's key in %s", name, other, leaked)
						}
					}
				}
			}

			// The addressed upstream gets the caller's credentials, except
			// for the names its own Header sets, which replace them.
			a := n.requests(hosts[tt.addressed])[0]
			own := upstreams[indexOf(tt.addressed)].Header
			for _, name := range []string{"Authorization", "Proxy-Authorization", "Api-Key", "X-Goog-Api-Key", "Cookie", "X-Custom-Token", "X-Api-Key"} {
				vals := headerValues(a.Header, name)
				if want, ok := own[name]; ok {
					if strings.Join(vals, ",") != strings.Join(want, ",") {
						t.Errorf("addressed %s: %s = %q, want only its own %q", tt.addressed, name, vals, want)
					}
				} else if len(vals) == 0 || !strings.Contains(vals[0], "caller-secret") {
					t.Errorf("addressed %s: %s = %q, want the caller's", tt.addressed, name, vals)
				}
			}
			if !strings.Contains(a.RawQuery, "key=caller-secret-query") {
				t.Errorf("addressed %s lost the caller's key= parameter: %q", tt.addressed, a.RawQuery)
			}
		})
	}
}

func indexOf(name string) int { return int(name[0] - 'a') }

// headerValues returns the values of name in h under any spelling of it.
func headerValues(h http.Header, name string) []string {
	var out []string
	for k, vs := range h {
		if strings.EqualFold(k, name) {
			out = append(out, vs...)
		}
	}
	return out
}

// findSecret reports where in s a value containing secret appears.
func findSecret(s seen, secret string) string {
	for k, vs := range s.Header {
		for _, v := range vs {
			if strings.Contains(v, secret) {
				return "header " + k
			}
		}
	}
	switch {
	case strings.Contains(s.RawQuery, secret):
		return "query"
	case strings.Contains(s.User, secret):
		return "user info"
	}
	return ""
}

// fuzzCredentialHeaders are the header names that the package documents as
// a caller's credentials, and X-Custom-Token, which upstream 1 sets.
var fuzzCredentialHeaders = []string{
	"Authorization", "Proxy-Authorization", "Api-Key", "X-Api-Key", "X-Goog-Api-Key",
	"Cookie", "Openai-Organization", "Openai-Project", "X-Custom-Token",
}

// fuzzForwardParams are the query parameters that the package documents
// as going to every upstream (Config.ForwardParams); every other one
// carries credentials.
var fuzzForwardParams = []string{
	"api-version", "alt", "$alt", "enum-encoding", "beta", "model", "deployment", "intent", "stream",
	"starting_after", "include", "include[]", "limit", "after", "before", "order", "after_id", "before_id",
	"pageSize", "purpose", "filter",
}

// received is a request as an upstream received it.
type received struct {
	Scheme, Host, ReqHost, Path, EscapedPath, RawQuery string
	User                                               *url.Userinfo
	Header                                             http.Header
	Body                                               string
}

// recordingNet is an in-memory Base where every upstream answers 503, so
// that every upstream gets one attempt; it records them all.
type recordingNet struct {
	mu  sync.Mutex
	got []received
}

func (n *recordingNet) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	rec := received{
		Scheme: r.URL.Scheme, Host: r.URL.Host, ReqHost: r.Host,
		Path: r.URL.Path, EscapedPath: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery,
		Header: r.Header.Clone(), Body: string(body),
	}
	if r.URL.User != nil {
		u := *r.URL.User
		rec.User = &u
	}
	n.mu.Lock()
	n.got = append(n.got, rec)
	n.mu.Unlock()
	resp := respond(http.StatusServiceUnavailable, "down")
	resp.Request = r
	return resp, nil
}

const fuzzRequestBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// Every upstream gets the request rewritten for it, through the real
// Transport: exactly its configured scheme and host; a path under its base
// path with the rest of the caller's path byte for byte and no dot segment;
// every non-credential query pair byte for byte; the caller's headers, but
// its own Header for the names it sets, and none of the caller's
// credentials (header values, key= parameters, user info) unless the caller
// addressed it; never another upstream's key. A request addressed to no
// upstream goes to Base untouched (UnroutedPass), to the first upstream as
// if addressed to it when its path lies under that base path
// (UnroutedFirst), or nowhere, with an ErrUnrouted that holds none of its
// credentials (UnroutedRefuse, and UnroutedFirst otherwise).
func FuzzRewrite(f *testing.F) {
	addRouteSeeds(f, true)
	f.Fuzz(func(t *testing.T, b0, b1, b2, target string, mode uint16, header string) {
		all := strings.ToLower(b0 + b1 + b2 + target + header)
		if strings.Contains(all, strings.ToLower(callerMarker)) || strings.Contains(all, strings.ToLower(upstreamMarker)) {
			return
		}
		n := &recordingNet{}
		policy := UnroutedPolicy(mode >> 12 % 3)
		tr, bases, accepted := fuzzTransportWith(t, n, policy, b0, b1, b2)
		if tr == nil {
			return
		}
		raw := fuzzRequestURL(accepted, target, mode)
		req, err := http.NewRequest("POST", raw, strings.NewReader(fuzzRequestBody))
		if err != nil {
			return
		}
		// The caller's credentials, in every form.
		if req.URL.User == nil {
			req.URL.User = url.UserPassword("caller", callerMarker+"-pass")
		}
		creds := "key=" + callerMarker + "-q&API_KEY=" + callerMarker + "-q2&%61ccess_token=" + callerMarker + "-q3&code=" + callerMarker + "-q4" +
			"&alt=sse&limit=2"
		if req.URL.RawQuery == "" {
			req.URL.RawQuery = creds
		} else {
			req.URL.RawQuery += "&" + creds
		}
		for _, name := range fuzzCredentialHeaders {
			req.Header.Set(name, "caller "+callerMarker+" "+name)
		}
		req.Header["x-api-key"] = []string{callerMarker + "-lower"} // not canonical
		req.Header.Set("X-Request-Id", "r-1")
		req.Header.Set("Content-Type", "application/json")
		if validToken(header) {
			if isCredentialHeader(header) {
				req.Header[header] = append(req.Header[header], callerMarker+"-fuzzed")
			} else {
				req.Header[header] = append(req.Header[header], "plain")
			}
		}
		want := wantRoute(req.URL, bases)
		if want < 0 && policy == UnroutedFirst {
			want = wantFirst(req.URL, bases[0])
		}
		in := fmt.Sprintf("request %q (header %q) against bases %q, Unrouted %v, addressed to %d", req.URL, header, accepted, policy, want)
		callerURL := *req.URL
		callerHeader := req.Header.Clone()

		resp, err := tr.RoundTrip(req)
		if want < 0 && policy != UnroutedPass {
			if !errors.Is(err, ErrUnrouted) || resp != nil {
				t.Fatalf("%s: got %v, %v; want the ErrUnrouted refusal", in, resp, err)
			}
			if strings.Contains(err.Error(), callerMarker) {
				t.Fatalf("%s: the refusal carries a credential: %v", in, err)
			}
			if len(n.got) != 0 {
				t.Fatalf("%s: refused, yet Base got %d requests", in, len(n.got))
			}
			return
		}
		if err != nil {
			t.Fatalf("%s: RoundTrip: %v", in, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s: status %d, want the last upstream's 503", in, resp.StatusCode)
		}
		if callerURL.String() != req.URL.String() || !reflect.DeepEqual(callerHeader, req.Header) {
			t.Fatalf("%s: RoundTrip modified the caller's request", in)
		}
		got := n.got

		if want < 0 {
			if len(got) != 1 {
				t.Fatalf("%s: addressed to no upstream, yet Base got %d requests", in, len(got))
			}
			g := got[0]
			if g.Scheme != req.URL.Scheme || g.Host != req.URL.Host || g.Path != req.URL.Path || g.EscapedPath != req.URL.EscapedPath() ||
				g.RawQuery != req.URL.RawQuery || g.User.String() != req.URL.User.String() || !reflect.DeepEqual(g.Header, req.Header) {
				t.Fatalf("%s: addressed to no upstream, yet Base did not get the request untouched: %+v", in, g)
			}
			return
		}

		byUpstream := make([]received, len(bases))
		for _, g := range got {
			i, err := strconv.Atoi(g.Header.Get("X-Fuzz-Upstream"))
			if err != nil || i < 0 || i >= len(bases) || byUpstream[i].Header != nil {
				t.Fatalf("%s: an attempt that is no upstream's, or a second one: %+v", in, g)
			}
			byUpstream[i] = g
		}
		if len(got) != len(bases) {
			t.Fatalf("%s: %d attempts for %d upstreams each answering 503", in, len(got), len(bases))
		}
		addr := bases[want]
		rest, rawRest := req.URL.Path[len(addr.path):], req.URL.EscapedPath()[len(addr.rawPath):]
		var wantPairs []string
		for _, p := range queryPairs(req.URL.RawQuery) {
			if p != "" && !credentialPair(p) {
				wantPairs = append(wantPairs, p)
			}
		}
		for i, g := range byUpstream {
			b := bases[i]
			in := fmt.Sprintf("%s: upstream %d (%s)", in, i, b.url)
			if g.Scheme != b.url.Scheme || g.Host != b.url.Host || g.ReqHost != b.url.Host {
				t.Fatalf("%s got a request for %s://%s (Host %q), not for its configured %s://%s", in, g.Scheme, g.Host, g.ReqHost, b.url.Scheme, b.url.Host)
			}
			if g.Body != fuzzRequestBody {
				t.Fatalf("%s got body %q", in, g.Body)
			}
			if dump := fmt.Sprintf("%+v %v", g, g.User); i != want && strings.Contains(dump, callerMarker) {
				t.Fatalf("%s, not addressed, got the caller's credentials: %+v, user %v", in, g, g.User)
			}
			for j := range bases {
				if j != i && strings.Contains(fmt.Sprintf("%+v %v", g, g.User), upstreamSecret(j)) {
					t.Fatalf("%s got upstream %d's key: %+v", in, j, g)
				}
			}
			own := fuzzUpstreamHeader(i)
			for k, vs := range own {
				if hv := fuzzHeaderValues(g.Header, k); !slices.Equal(hv, vs) {
					t.Fatalf("%s: %s = %q, want only its own %q", in, k, hv, vs)
				}
			}
			for k, vs := range req.Header {
				switch {
				case len(fuzzHeaderValues(own, k)) > 0:
					// Its own value replaces the caller's: checked above.
				case i != want && isCredentialHeader(k):
					if _, ok := g.Header[k]; ok {
						t.Fatalf("%s, not addressed, got the caller's %s", in, k)
					}
				case !slices.Equal(g.Header[k], vs):
					t.Fatalf("%s: header %s = %q, want the caller's %q", in, k, g.Header[k], vs)
				}
			}
			for k := range g.Header {
				if _, ok := req.Header[k]; !ok && len(fuzzHeaderValues(own, k)) == 0 {
					t.Fatalf("%s got header %s, which neither the caller nor its config set", in, k)
				}
			}

			if i == want {
				if g.Path != req.URL.Path || g.EscapedPath != req.URL.EscapedPath() || g.RawQuery != req.URL.RawQuery || g.User.String() != req.URL.User.String() {
					t.Fatalf("%s, addressed, got path %q (%q), query %q, user %v; want the caller's %q (%q), %q, %v",
						in, g.Path, g.EscapedPath, g.RawQuery, g.User, req.URL.Path, req.URL.EscapedPath(), req.URL.RawQuery, req.URL.User)
				}
				continue
			}
			if g.User != nil {
				t.Fatalf("%s, not addressed, got user info %v", in, g.User)
			}
			if !pathUnder(g.Path, b.path) || !pathUnder(g.EscapedPath, b.rawPath) {
				t.Fatalf("%s got path %q (%q), not under its base path %q (%q)", in, g.Path, g.EscapedPath, b.path, b.rawPath)
			}
			if dotSegments(g.Path) {
				t.Fatalf("%s got path %q (%q), with dot segments once decoded", in, g.Path, g.EscapedPath)
			}
			if g.Path[len(b.path):] != rest || g.EscapedPath[len(b.rawPath):] != rawRest {
				t.Fatalf("%s got path %q (%q): after its base %q (%q) comes %q (%q), not the rest of the caller's path %q (%q)",
					in, g.Path, g.EscapedPath, b.path, b.rawPath, g.Path[len(b.path):], g.EscapedPath[len(b.rawPath):], rest, rawRest)
			}
			var pairs []string
			for _, p := range queryPairs(g.RawQuery) {
				if p != "" {
					pairs = append(pairs, p)
				}
			}
			if !slices.Equal(pairs, wantPairs) {
				t.Fatalf("%s got query %q; want the caller's non-credential pairs %q", in, g.RawQuery, wantPairs)
			}
		}
	})
}

// queryPairs splits a raw query at '&' and ';', as some servers do.
func queryPairs(raw string) []string {
	return strings.FieldsFunc(raw, func(r rune) bool { return r == '&' || r == ';' })
}

// credentialPair reports whether a raw query pair's name is a credential
// parameter: any but those documented as going to every upstream.
func credentialPair(pair string) bool {
	name, _, _ := strings.Cut(pair, "=")
	if n, err := url.QueryUnescape(name); err == nil {
		name = n
	}
	return !slices.ContainsFunc(fuzzForwardParams, func(c string) bool { return strings.EqualFold(name, c) })
}

// isCredentialHeader reports whether name, in any case, is a credential
// header: a documented one, a name an upstream's Header sets, or one the
// patterns catch.
func isCredentialHeader(name string) bool {
	for _, c := range fuzzCredentialHeaders {
		if strings.EqualFold(name, c) {
			return true
		}
	}
	for i := range 3 {
		if len(fuzzHeaderValues(fuzzUpstreamHeader(i), name)) > 0 {
			return true
		}
	}
	return !strings.EqualFold(name, "Idempotency-Key") && namedLikeSecret(name)
}

// namedLikeSecret is the documented pattern rule (Config.CredentialHeaders),
// written here apart from the package's: the name contains one of the
// substrings, or has one of the words, in any case.
func namedLikeSecret(name string) bool {
	lower := strings.ToLower(name)
	for _, s := range []string{"auth", "key", "token", "secret", "passw", "credential", "signature", "session", "cookie", "bearer", "jwt", "csrf", "xsrf"} {
		if strings.Contains(lower, s) {
			return true
		}
	}
	spaced := name
	for _, re := range wordBreaks {
		spaced = re.ReplaceAllString(spaced, "$1 $2")
	}
	for _, w := range strings.FieldsFunc(spaced, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
	}) {
		if slices.ContainsFunc([]string{"sig", "pw", "pwd", "sid", "otp"}, func(s string) bool { return strings.EqualFold(w, s) }) {
			return true
		}
	}
	return false
}

// wordBreaks find where one word of a name ends and the next begins:
// "sigV4", "pwd2", "2fa".
var wordBreaks = []*regexp.Regexp{
	regexp.MustCompile(`([a-z])([A-Z])`),
	regexp.MustCompile(`([A-Za-z])([0-9])`),
	regexp.MustCompile(`([0-9])([A-Za-z])`),
}

// fuzzHeaderValues returns the values of name in h under any spelling.
func fuzzHeaderValues(h http.Header, name string) []string {
	var out []string
	for k, vs := range h {
		if strings.EqualFold(k, name) {
			out = append(out, vs...)
		}
	}
	return out
}

// validToken reports whether s is a valid header field name (RFC 9110
// token).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// callerMark is in every value of the caller's credentials that the tests
// below send, so that finding it proves a leak.
const callerMark = "caller-secret"

// leaks reports where in s any of secrets appears.
func leaks(s seen, secrets ...string) []string {
	var out []string
	for _, secret := range secrets {
		for k, vs := range s.Header {
			for _, v := range vs {
				if strings.Contains(v, secret) {
					out = append(out, fmt.Sprintf("header %s: %q", k, v))
				}
			}
		}
		if strings.Contains(s.RawQuery, secret) {
			out = append(out, fmt.Sprintf("query %q", s.RawQuery))
		}
	}
	return out
}

// callerQuery is a query as SDKs send it, with credentials under names no
// deny list knows: Azure Functions' code=, a SAS token's sv, sp and se
// (its sig= is known), a gateway's own name. safeQuery is what of it may
// reach an upstream the caller did not address: the pairs named as LLM
// APIs name theirs, byte for byte and in order, the ';' between two of
// them kept.
const (
	callerQuery = "api-version=2024-10-21&code=" + callerMark + "-fn&sv=" + callerMark + "-sv&sp=" + callerMark + "-sp" +
		"&se=" + callerMark + "-se&x-tenant-ref=" + callerMark + "-ref&$alt=json;enum-encoding=int&alt=sse&beta=true&limit=20&after=obj_1"
	safeQuery = "api-version=2024-10-21&$alt=json;enum-encoding=int&alt=sse&beta=true&limit=20&after=obj_1"
)

// hopCaller sends, through a real http.Client that follows redirects, a
// POST to url with the caller's credentials in headers and in the query
// (key=, and Azure Functions' code=, which no deny list names).
func hopCaller(t *testing.T, tr http.RoundTripper, url string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", url+"?key="+callerMark+"-query&code="+callerMark+"-code&model=x", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+callerMark+"-auth")
	req.Header.Set("Api-Key", callerMark+"-azure")
	req.Header.Set("X-Api-Key", callerMark+"-anthropic")
	req.Header.Set("Cookie", "session="+callerMark+"-cookie")
	req.Header.Set("X-Request-Id", "r-1")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	return resp
}

// A redirect hop is a new request to the Transport (req.Response is set),
// built by http.Client from the caller's first request's headers. The
// caller's credentials reach only the upstream the caller addressed,
// whatever the hop; an upstream's own Header reaches only that upstream.
// Real servers, a real http.Client following the redirects.
func TestRedirectHopsKeepCredentialsWithTheirUpstream(t *testing.T) {
	const (
		primaryOwn = "primary-own-secret"
		backupOwn  = "backup-own-secret"
	)
	tests := []struct {
		name string
		// primary and backup answer each request; every server other
		// than these two answers 200.
		primary, backup func(s *hopServers, w http.ResponseWriter, r *http.Request)
		// target is where the caller sends the request (the primary's
		// base URL when empty).
		target func(s *hopServers) string
		// want is the server whose last request must be the hop's and
		// what it may receive: the caller's credentials or not.
		want       func(s *hopServers) *server
		wantCaller bool
	}{
		{
			name:    "307 from the backup to its own host",
			primary: hopDown,
			backup:  hopRedirect(307, func(s *hopServers) string { return s.backup.URL + "/v1/retry" }),
			want:    func(s *hopServers) *server { return s.backup },
		},
		{
			name:    "302 from the backup to a third host",
			primary: hopDown,
			backup:  hopRedirect(302, func(s *hopServers) string { return s.third.URL + "/landing" }),
			want:    func(s *hopServers) *server { return s.third },
		},
		{
			name:    "301 from the backup to a third host",
			primary: hopDown,
			backup:  hopRedirect(301, func(s *hopServers) string { return s.third.URL + "/landing" }),
			want:    func(s *hopServers) *server { return s.third },
		},
		{
			name:    "303 from the backup to a third host",
			primary: hopDown,
			backup:  hopRedirect(303, func(s *hopServers) string { return s.third.URL + "/landing" }),
			want:    func(s *hopServers) *server { return s.third },
		},
		{
			name:    "302 from the backup to a third host, which 302s to a fourth",
			primary: hopDown,
			backup:  hopRedirect(302, func(s *hopServers) string { return s.third.URL + "/hop" }),
			want:    func(s *hopServers) *server { return s.fourth },
		},
		{
			// A regional redirect: the primary sends the caller to the
			// backup's base URL, its query (the caller's key) echoed.
			name: "307 from the primary to the backup, echoing the query",
			primary: func(s *hopServers, w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("key") == "" {
					hopDown(s, w, r) // the hop, failed over to the primary: it has no key
					return
				}
				http.Redirect(w, r, s.backup.URL+"/v1/chat/completions?"+r.URL.RawQuery, 307)
			},
			backup: hopOK,
			want:   func(s *hopServers) *server { return s.backup },
		},
		{
			name: "302 from the primary to a third host, echoing the query",
			primary: func(s *hopServers, w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, s.third.URL+"/callback?"+r.URL.RawQuery, 302)
			},
			backup: hopOK,
			want:   func(s *hopServers) *server { return s.third },
		},
		{
			// The caller addressed a host that is no upstream: its
			// credentials are for that host alone.
			name:    "302 from a host that is no upstream to the backup",
			primary: hopDown,
			backup:  hopOK,
			target:  func(s *hopServers) string { return s.fourth.URL + "/start" },
			want:    func(s *hopServers) *server { return s.backup },
		},
		{
			// The hop's Referer is the first URL, the caller's key= in
			// it: it must not follow the hop when it fails over.
			name: "307 from the primary to its own host, failed over to the backup",
			primary: func(s *hopServers, w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/chat/completions" {
					http.Redirect(w, r, s.primary.URL+"/v1/moved", 307)
					return
				}
				hopDown(s, w, r)
			},
			backup: hopOK,
			want:   func(s *hopServers) *server { return s.backup },
		},
		{
			// Back where the caller sent them: the credentials follow.
			name: "307 from the backup to the primary's host",
			primary: func(s *hopServers, w http.ResponseWriter, r *http.Request) {
				hopOKUnless(s, w, r, "/v1/chat/completions")
			},
			backup:     hopRedirect(307, func(s *hopServers) string { return s.primary.URL + "/v1/again" }),
			want:       func(s *hopServers) *server { return s.primary },
			wantCaller: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &hopServers{}
			s.primary = newServer(t, func(w http.ResponseWriter, r *http.Request) { tt.primary(s, w, r) })
			s.backup = newServer(t, func(w http.ResponseWriter, r *http.Request) { tt.backup(s, w, r) })
			s.third = newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/hop" {
					http.Redirect(w, r, s.fourth.URL+"/landing", 302)
					return
				}
				hopOK(s, w, r)
			})
			s.fourth = newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/start" {
					http.Redirect(w, r, s.backup.URL+"/v1/chat/completions", 302)
					return
				}
				hopOK(s, w, r)
			})
			tr := newTestTransport(t, Config{
				Breaker:  BreakerConfig{FailureThreshold: 100},
				Unrouted: UnroutedPass, // one case starts at a host that is no upstream
				Upstreams: []Upstream{
					{Name: "primary", BaseURL: s.primary.URL + "/v1", Header: http.Header{"X-Primary-Token": {primaryOwn}}},
					{Name: "backup", BaseURL: s.backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + backupOwn}}},
				},
			})
			target := s.primary.URL + "/v1/chat/completions"
			if tt.target != nil {
				target = tt.target(s)
			}
			resp := hopCaller(t, tr, target)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d, want the 200 at the end of the redirects", resp.StatusCode)
			}
			want := tt.want(s)
			reqs := want.requests()
			if len(reqs) == 0 {
				t.Fatal("the hop never arrived")
			}
			hop := reqs[len(reqs)-1]
			if hop.Header.Get("X-Request-Id") != "r-1" {
				t.Errorf("the hop lost the caller's X-Request-Id: %v", hop.Header)
			}
			if got := leaks(hop, callerMark); tt.wantCaller && len(got) < 4 {
				t.Errorf("the hop to the addressed upstream lost the caller's credentials: %v", hop.Header)
			} else if !tt.wantCaller && len(got) > 0 {
				t.Errorf("the hop got the caller's credentials: %v", got)
			}
			// Every request any server got: an upstream's own Header
			// only at that upstream, the caller's credentials nowhere
			// but where the caller sent them (the primary, or the host
			// of the target).
			for name, srv := range map[string]*server{"primary": s.primary, "backup": s.backup, "third": s.third, "fourth": s.fourth} {
				for _, r := range srv.requests() {
					if srv != s.primary {
						if got := leaks(r, primaryOwn); len(got) > 0 {
							t.Errorf("%s got the primary's own Header: %v", name, got)
						}
					}
					if srv != s.backup {
						if got := leaks(r, backupOwn); len(got) > 0 {
							t.Errorf("%s got the backup's own Header: %v", name, got)
						}
					}
					addressed := s.primary
					if tt.target != nil {
						addressed = s.fourth
					}
					if srv != addressed {
						if got := leaks(r, callerMark); len(got) > 0 {
							t.Errorf("%s (%s) got the caller's credentials: %v", name, r.Path, got)
						}
					}
				}
			}
			if want == s.backup {
				if got := hop.Header.Get("Authorization"); got != "Bearer "+backupOwn {
					t.Errorf("the hop to the backup got Authorization %q, want its own", got)
				}
			}
		})
	}
}

// hopServers are the servers of a redirect test: the two upstreams, and
// two hosts that are no upstream.
type hopServers struct{ primary, backup, third, fourth *server }

func hopDown(_ *hopServers, w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", 503) }

func hopOK(_ *hopServers, w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }

// hopOKUnless answers 503 at path and 200 elsewhere.
func hopOKUnless(_ *hopServers, w http.ResponseWriter, r *http.Request, path string) {
	if r.URL.Path == path {
		http.Error(w, "down", 503)
		return
	}
	io.WriteString(w, "ok")
}

// hopRedirect answers the request for /v1/chat/completions with a
// redirect to where, and anything else with 200.
func hopRedirect(code int, where func(*hopServers) string) func(*hopServers, http.ResponseWriter, *http.Request) {
	return func(s *hopServers, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			http.Redirect(w, r, where(s), code)
			return
		}
		io.WriteString(w, "ok")
	}
}

// A hop whose chain cannot be followed back to its first request (here
// its Response has no Request) belongs to no upstream: it carries none of
// the caller's credentials anywhere, and the upstream still gets its own.
func TestRedirectHopOfUnknownChain(t *testing.T) {
	primary := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1", Header: http.Header{"X-Primary-Token": {"primary-own-secret"}}},
	}})
	req := httptestRequest("GET", primary.URL+"/v1/models?key="+callerMark+"-query&model=x", "")
	req.Header.Set("X-Api-Key", callerMark+"-anthropic")
	req.Header.Set("X-Request-Id", "r-1")
	req.Response = &http.Response{StatusCode: 307}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s := primary.requests()[0]
	if got := leaks(s, callerMark); len(got) > 0 {
		t.Errorf("a hop of unknown origin delivered the caller's credentials: %v", got)
	}
	if s.Header.Get("X-Primary-Token") != "primary-own-secret" || s.Header.Get("X-Request-Id") != "r-1" || s.RawQuery != "model=x" {
		t.Errorf("the hop lost what is not the caller's credentials: %+v", s)
	}
}

// A Location's own query pairs are the redirecting server's to hand out:
// a presigned URL on a host that is no upstream keeps its signature, while
// the caller's key= (echoed beside it) and credential headers stay behind.
func TestRedirectKeepsLocationSignature(t *testing.T) {
	const presigned = "X-Amz-Signature=server-signature-0123456789&X-Amz-Credential=AKIDSERVER%2F20260101"
	store := newUpstreamServer(t, 200, "file")
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, store.URL+"/file?"+presigned+"&key="+r.URL.Query().Get("key"), 302)
	})
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "primary", BaseURL: primary.URL + "/v1"}}})
	hopCaller(t, tr, primary.URL+"/v1/files/f-1/content")
	s := store.requests()[0]
	if s.RawQuery != presigned {
		t.Errorf("the presigned URL arrived with query %q, want %q", s.RawQuery, presigned)
	}
	if got := leaks(s, callerMark); len(got) > 0 {
		t.Errorf("the host that is no upstream got the caller's credentials: %v", got)
	}
}

// A hedge that lost the race goes on in Base after RoundTrip has returned
// (abandon cancels it, waits for nothing). Once the caller has closed the
// winner's body it may mutate its request (RoundTripper contract); the
// loser's request must not change under Base, so an attempt of a hedged
// round never shares the caller's URL (found by review of the shared URL,
// clone's keepsURL). Here the caller addresses b, the hedge: a, first in
// order, wins.
func TestHedgeLoserKeepsItsURL(t *testing.T) {
	hedged := make(chan struct{})
	canceled := make(chan struct{})
	mutated := make(chan struct{})
	sawPath := make(chan string, 1)
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		if r.URL.Host == "a.test" {
			<-hedged // slow: it answers once the hedge is in Base
			return respond(200, "a"), nil
		}
		// b.test: the hedge, still inside Base when a wins.
		close(hedged)
		<-r.Context().Done()
		close(canceled)
		<-mutated
		sawPath <- r.URL.Host + r.URL.Path // e.g. a logging Base, or net/http writing the request line
		return nil, r.Context().Err()
	})
	tr := newTestTransport(t, Config{Base: base, Hedge: &HedgeConfig{Delay: 5 * time.Millisecond, Percent: 100}, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test"},
		{Name: "b", BaseURL: "http://b.test"},
	}})
	req := httptestRequest("POST", "http://b.test/v1/chat/completions", `{"model":"m"}`)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := readBody(t, resp); got != "a" {
		t.Fatalf("body %q, want the first attempt's", got)
	}
	resp.Body.Close()
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("the hedge was never canceled")
	}
	// The caller reuses its request, as it may once the body is closed.
	req.URL.Host = "other.test"
	req.URL.Path = "/v1/embeddings"
	close(mutated)
	if got := <-sawPath; got != "b.test/v1/chat/completions" {
		t.Errorf("the abandoned hedge's request changed under Base: its URL now reads %q, want b.test/v1/chat/completions", got)
	}
}

// pathAt gives the path at an upstream the request was not addressed to:
// its base path and the rest, the caller's own string when the base paths
// are the same.
func TestPathAt(t *testing.T) {
	tr := newTestTransport(t, Config{Base: newFakeNet(), Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test/v1"},
		{Name: "b", BaseURL: "http://b.test/v1"},
		{Name: "c", BaseURL: "http://c.test/openai/v1"},
		{Name: "d", BaseURL: "http://d.test"},
	}})
	for _, tc := range []struct{ url, b, c, d string }{
		{"http://a.test/v1/chat/completions", "/v1/chat/completions", "/openai/v1/chat/completions", "/chat/completions"},
		{"http://a.test/v1", "/v1", "/openai/v1", ""},
		{"http://a.test/v1/", "/v1/", "/openai/v1/", "/"},
		{"http://a.test/v1/a%2Fb", "/v1/a/b", "/openai/v1/a/b", "/a/b"},
	} {
		req := httptestRequest("GET", tc.url, "")
		var r request
		r.t, r.req = tr, req
		r.addressed, r.rest, r.rawRest, r.spelled = tr.address(req.URL)
		if r.addressed == nil {
			t.Fatalf("%s: addressed to no upstream", tc.url)
		}
		for i, want := range []string{tc.b, tc.c, tc.d} {
			if got := r.pathAt(tr.upstreams[i+1]); got != want {
				t.Errorf("%s at %s: path %q, want %q", tc.url, tr.upstreams[i+1].name, got, want)
			}
		}
	}
}

// A view's context holds its mark and gives every other value of the
// attempt's context, as context.WithValue's would.
func TestViewContext(t *testing.T) {
	type key struct{}
	req := httptestRequest("GET", "http://a.test/v1/models", "").WithContext(context.WithValue(context.Background(), key{}, "v"))
	r := request{req: req}
	v := r.view(req.Clone(req.Context()))
	if m, ok := v.Context().Value(viewKey{}).(*viewMark); !ok || m.view != v || m.origin != req {
		t.Fatalf("mark %+v, want one naming the view and the caller's request", v.Context().Value(viewKey{}))
	}
	if v.Context().Value(key{}) != "v" {
		t.Error("the attempt's context's value is lost")
	}
	if s := fmt.Sprint(v.Context()); !strings.Contains(s, "viewKey") {
		t.Errorf("String %q", s)
	}
}

// Every upstream gets its own host in the Host header, the one the caller
// addressed too, whatever Host the caller set: a gateway built on
// httputil.ReverseProxy keeps its own client's Host (NewSingleHostReverseProxy
// does not rewrite it), which would reach the provider with the
// upstream's credentials and be refused there, or worse served as another
// virtual host.
func TestCallerHostNotSent(t *testing.T) {
	primary := newUpstreamServer(t, http.StatusServiceUnavailable, "down")
	backup := newUpstreamServer(t, http.StatusOK, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{BaseURL: primary.URL}, {BaseURL: backup.URL}}})
	req := httptestRequest("POST", primary.URL+"/v1/chat", `{"model":"m"}`)
	req.Host = "gateway.example"
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	for _, s := range []*server{primary, backup} {
		want := strings.TrimPrefix(s.URL, "http://")
		if got := s.requests(); len(got) != 1 || got[0].Host != want {
			t.Errorf("%s got %+v, want one request with its own Host", want, got)
		}
	}
}

// Azure OpenAI's classic path, failed over to and from: a request sent to
// a {deployment} upstream has its model, after Models, in the path and
// the upstream's Query; one addressed to it has a deployment and a Query
// that are its own, which no other upstream gets. A request with no model
// skips it unless it was addressed to one.
func TestDeploymentFailover(t *testing.T) {
	const version = "2024-10-21"
	upstreams := []Upstream{
		{Name: "openai", BaseURL: "https://api.openai.test/v1",
			Header: http.Header{"Authorization": {"Bearer openai-upstream-key"}},
			Models: map[string]string{"my-gpt4o": "gpt-4o", "*": "*"}},
		{Name: "azure", BaseURL: "https://res.azure.test/openai/deployments/{deployment}",
			Header: http.Header{"Api-Key": {"azure-upstream-key"}},
			Query:  url.Values{"api-version": {version}},
			Models: map[string]string{"gpt-4o": "my-gpt4o", "*": "*"}},
		{Name: "azure2", BaseURL: "https://res2.azure.test/openai/deployments/{deployment}/",
			Query: url.Values{"api-version": {version}}},
	}
	hosts := []string{"api.openai.test", "res.azure.test", "res2.azure.test"}
	type want struct {
		path, rawQuery, model string // model: "" for no body
	}
	for _, tt := range []struct {
		name, method, url, body string
		header                  http.Header
		first                   int             // the upstream tried first
		down                    []string        // hosts answering 503
		want                    map[string]want // host: its one request; the others get none
	}{
		{name: "openai to azure", method: "POST", url: "https://api.openai.test/v1/chat/completions", body: `{"model":"gpt-4o"}`,
			header: http.Header{"Authorization": {"Bearer caller-secret"}},
			down:   []string{"api.openai.test"},
			want: map[string]want{
				"api.openai.test": {"/v1/chat/completions", "", "gpt-4o"},
				"res.azure.test":  {"/openai/deployments/my-gpt4o/chat/completions", "api-version=" + version, "my-gpt4o"},
			}},
		{name: "azure to openai", method: "POST", url: "https://res.azure.test/openai/deployments/my-gpt4o/chat/completions?api-version=2024-06-01&stream=true", body: `{"model":"my-gpt4o"}`,
			header: http.Header{"Api-Key": {"caller-secret"}},
			first:  1,
			down:   []string{"res.azure.test"},
			want: map[string]want{
				"res.azure.test":  {"/openai/deployments/my-gpt4o/chat/completions", "stream=true&api-version=" + version, "my-gpt4o"},
				"api.openai.test": {"/v1/chat/completions", "stream=true", "gpt-4o"},
			}},
		{name: "model escaped", method: "POST", url: "https://api.openai.test/v1/embeddings", body: `{"model":"text embedding:3"}`,
			down: []string{"api.openai.test", "res.azure.test"},
			want: map[string]want{
				"api.openai.test": {"/v1/embeddings", "", "text embedding:3"},
				"res.azure.test":  {"/openai/deployments/text%20embedding:3/embeddings", "api-version=" + version, "text embedding:3"},
				"res2.azure.test": {"/openai/deployments/text%20embedding:3/embeddings", "api-version=" + version, "text embedding:3"},
			}},
		{name: "model no segment", method: "POST", url: "https://api.openai.test/v1/chat/completions", body: `{"model":"a/b"}`,
			down: []string{"api.openai.test"},
			want: map[string]want{"api.openai.test": {"/v1/chat/completions", "", "a/b"}}},
		{name: "no model", method: "GET", url: "https://api.openai.test/v1/models",
			down: []string{"api.openai.test"},
			want: map[string]want{"api.openai.test": {"/v1/models", "", ""}}},
		{name: "no model addressed to a deployment", method: "GET", url: "https://res.azure.test/openai/deployments/d1/files?api-version=2024-06-01",
			down: []string{"res.azure.test", "api.openai.test"},
			want: map[string]want{
				"res.azure.test":  {"/openai/deployments/d1/files", "api-version=" + version, ""},
				"api.openai.test": {"/v1/files", "", ""},
				"res2.azure.test": {"/openai/deployments/d1/files", "api-version=" + version, ""},
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newFakeNet()
			for _, h := range hosts {
				code := 200
				if slices.Contains(tt.down, h) {
					code = 503
				}
				n.status(h, code, "{}")
			}
			ups := append([]Upstream{upstreams[tt.first]}, slices.Delete(slices.Clone(upstreams), tt.first, tt.first+1)...)
			tr := newTestTransport(t, Config{Base: n, Upstreams: ups, Retry: RetryConfig{Off: true}, Breaker: BreakerConfig{FailureThreshold: 100}})
			req := httptestRequest(tt.method, tt.url, tt.body)
			for k, vs := range tt.header {
				req.Header[k] = vs
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			for i, h := range hosts {
				got := n.requests(h)
				w, ok := tt.want[h]
				if !ok {
					if len(got) != 0 {
						t.Errorf("%s got %d requests, want none", h, len(got))
					}
					continue
				}
				if len(got) != 1 {
					t.Fatalf("%s got %d requests, want 1", h, len(got))
				}
				s := got[0]
				if p := (&url.URL{Path: s.Path, RawPath: s.RawPath}).EscapedPath(); p != w.path || s.RawQuery != w.rawQuery {
					t.Errorf("%s got %s?%s, want %s?%s", h, p, s.RawQuery, w.path, w.rawQuery)
				}
				if m, _ := requestModel([]byte(s.Body)); m != w.model {
					t.Errorf("%s got model %q, want %q", h, m, w.model)
				}
				for k, vs := range upstreams[i].Header {
					if got := s.Header[k]; !slices.Equal(got, vs) {
						t.Errorf("%s: %s = %q, want its own", h, k, got)
					}
				}
				addressed := strings.Contains(tt.url, "//"+h+"/")
				if leaked := findSecret(s, "caller-secret"); leaked != "" && !addressed {
					t.Errorf("%s, not addressed, got the caller's credential in %s", h, leaked)
				}
				for j, u := range upstreams {
					for _, vs := range u.Header {
						if leaked := findSecret(s, vs[0]); leaked != "" && j != i {
							t.Errorf("%s got %s's key in %s", h, u.Name, leaked)
						}
					}
				}
			}
		})
	}
}

// TestDeploymentFromHostileModel: a request to OpenAI that fails
// over to Azure fills {deployment} with the body's model; whatever the
// model (dot segments, slashes raw or JSON-escaped, escapes, ? and #,
// unicode), Azure gets one segment that decodes to it, or nothing, and
// never the caller's Authorization or query key.
func TestDeploymentFromHostileModel(t *testing.T) {
	n := newFakeNet()
	n.status("api.openai.test", 503, "down")
	n.status("res.azure.test", 200, `{"choices":[]}`)
	tr := newTestTransport(t, Config{Base: n, Retry: RetryConfig{Off: true}, Upstreams: []Upstream{
		{Name: "openai", BaseURL: "https://api.openai.test/v1"},
		{Name: "azure", BaseURL: "https://res.azure.test/openai/deployments/{deployment}",
			Header: http.Header{"Api-Key": {"azure-key-0123456789"}}, Query: url.Values{"api-version": {"2024-10-21"}}},
	}})
	reached := 0
	for _, m := range []string{`..`, `.`, `a/b`, `a\u002fb`, `%2e%2e`, `%2F`, `x?y#z`, `a\\b`, `\u2215etc`, `..%2f..`, ` `, `a;b`, `a\u0000b`} {
		before := n.count("res.azure.test")
		req := httptestRequest("POST", "https://api.openai.test/v1/chat/completions?api-key=caller-query-key-123&api-version=caller", `{"model":"`+m+`"}`)
		req.Header.Set("Authorization", "Bearer caller-key-123")
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		if n.count("res.azure.test") == before {
			continue
		}
		reached++
		var model string
		json.Unmarshal([]byte(`"`+m+`"`), &model)
		s := n.requests("res.azure.test")[before]
		esc := (&url.URL{Path: s.Path, RawPath: s.RawPath}).EscapedPath()
		segs := strings.Split(esc, "/")
		if len(segs) != 6 || segs[1] != "openai" || segs[2] != "deployments" || segs[4] != "chat" || segs[5] != "completions" {
			t.Errorf("model %q: Azure got path %q", model, esc)
			continue
		}
		if d, err := url.PathUnescape(segs[3]); err != nil || d != model {
			t.Errorf("model %q: deployment segment %q decodes to %q", model, segs[3], d)
		}
		if strings.Contains(s.RawQuery, "caller") || s.Header.Get("Authorization") != "" {
			t.Errorf("model %q: Azure got query %q, Authorization %q", model, s.RawQuery, s.Header.Get("Authorization"))
		}
	}
	if reached == 0 {
		t.Error("no model reached Azure: the test checks nothing")
	}
}

// TestAzureKeyStaysAtAzure: the caller's own Azure api-key and
// query key (the Azure upstream sets none) reach neither OpenAI on
// failover nor OpenAI's host when Azure redirects there and http.Client
// follows.
func TestAzureKeyStaysAtAzure(t *testing.T) {
	n := newFakeNet()
	n.status("res.azure.test", 503, "down")
	n.status("api.openai.test", 200, `{"choices":[]}`)
	tr := newTestTransport(t, Config{Base: n, Retry: RetryConfig{Off: true}, Upstreams: []Upstream{
		{Name: "azure", BaseURL: "https://res.azure.test/openai/deployments/{deployment}", Query: url.Values{"api-version": {"2024-10-21"}}},
		{Name: "openai", BaseURL: "https://api.openai.test/v1", Header: http.Header{"Authorization": {"Bearer openai-key-0123456789"}}},
	}})
	check := func(what string) {
		t.Helper()
		for _, s := range n.requests("api.openai.test") {
			if strings.Contains(s.RawQuery, "caller") || strings.Contains(fmt.Sprint(s.Header), "caller") {
				t.Errorf("%s: OpenAI got query %q, header %v", what, s.RawQuery, s.Header)
			}
		}
	}
	req := httptestRequest("POST", "https://res.azure.test/openai/deployments/gpt-4o/chat/completions?api-version=2024-02-01&subscription-key=caller-sub-key-123", `{"model":"gpt-4o"}`)
	req.Header.Set("Api-Key", "caller-azure-key-123")
	req.Header.Set("Ocp-Apim-Subscription-Key", "caller-apim-key-123")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n.count("api.openai.test") != 1 {
		t.Fatalf("OpenAI got %d requests, want 1", n.count("api.openai.test"))
	}
	check("failover")

	n.handle("res.azure.test", func(*http.Request) (*http.Response, error) {
		return respond(307, "", "Location", "https://api.openai.test/v1/chat/completions?api-version=x"), nil
	})
	req, _ = http.NewRequest("POST", "https://res.azure.test/openai/deployments/gpt-4o/chat/completions?api-version=2024-02-01&subscription-key=caller-sub-key-123", strings.NewReader(`{"model":"gpt-4o"}`))
	req.Header.Set("Api-Key", "caller-azure-key-123")
	resp, err = (&http.Client{Transport: tr}).Do(req)
	if err == nil {
		resp.Body.Close()
	}
	check("redirect")
}
