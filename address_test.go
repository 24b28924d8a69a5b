package failover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
)

// An encoded base path of the upstream failed over to is kept.
func TestEncodedBasePath(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 200, "ok")
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test/v1"},
		{Name: "b", BaseURL: "http://b.test/proxy%2Fopenai/v1"},
	}})
	for _, tt := range []struct{ url, want string }{
		{"http://a.test/v1/models", "/proxy%2Fopenai/v1/models"},
		{"http://a.test/v1/models/a%2Fb", "/proxy%2Fopenai/v1/models/a%2Fb"},
	} {
		before := len(n.requests("b.test"))
		resp, err := tr.RoundTrip(httptestRequest("GET", tt.url, ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s := n.requests("b.test")[before]
		if got := (&url.URL{Path: s.Path, RawPath: s.RawPath}).EscapedPath(); got != tt.want {
			t.Errorf("%s reached the backup as %q, want %q", tt.url, got, tt.want)
		}
	}
	// An encoded slash is not a path segment: /v1%2Fx is not under /v1.
	if up, _, _, _ := tr.route(mustParse(t, "http://a.test/v1%2Fx")); up != nil {
		t.Errorf("/v1%%2Fx routed to %s", up.name)
	}
}

func TestIPv6HostsStayApart(t *testing.T) {
	tr := newTestTransport(t, Config{Base: newFakeNet(), Upstreams: []Upstream{{Name: "a", BaseURL: "http://[::1]:8080/v1"}}})
	for _, tt := range []struct {
		url    string
		routed bool
	}{
		{"http://[::1]:8080/v1/x", true},
		{"http://[::1:8080]/v1/x", false},
		{"http://[::1]/v1/x", false},
		{"http://[::1]:80/v1/x", false},
	} {
		if up, _, _, _ := tr.route(mustParse(t, tt.url)); (up != nil) != tt.routed {
			t.Errorf("%s routed = %v, want %v", tt.url, up != nil, tt.routed)
		}
	}
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// A URL routed to an upstream lies under its base, decoded and escaped, has
// no dot segments, and goes to the upstream with the longest such base; the
// rest of its path is what follows the base, and both forms of it agree.
// Every base New accepts is an absolute http(s) URL without user info,
// query, fragment or dot segments.
func FuzzRoute(f *testing.F) {
	addRouteSeeds(f, false)
	f.Fuzz(func(t *testing.T, b0, b1, b2, target string, mode uint16) {
		tr, bases, accepted := fuzzTransport(t, roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, errors.New("unused")
		}), b0, b1, b2)
		if tr == nil {
			return
		}
		raw := fuzzRequestURL(accepted, target, mode)
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		in := fmt.Sprintf("URL %q against bases %q", raw, accepted)
		up, rest, rawRest, _ := tr.route(u)
		// The escaped rest as rewrite reads it (route leaves it to be
		// made from rest when u has no RawPath).
		rawRest = (&request{req: &http.Request{URL: u}, rest: rest, rawRest: rawRest}).escapedRest()
		got := -1
		if up != nil {
			got = up.index
		}
		if want := wantRoute(u, bases); got != want {
			t.Fatalf("%s: routed to upstream %d, want %d", in, got, want)
		}
		if up == nil {
			return
		}
		b, esc := bases[got], u.EscapedPath()
		switch {
		case !pathUnder(u.Path, b.path) || !pathUnder(esc, b.rawPath):
			t.Fatalf("%s: routed to %q, but its path %q (%q) is not under %q (%q)", in, b.url, u.Path, esc, b.path, b.rawPath)
		case dotSegments(u.Path):
			t.Fatalf("%s: routed with dot segments in %q", in, u.Path)
		case rest != u.Path[len(b.path):] || rawRest != esc[len(b.rawPath):]:
			t.Fatalf("%s: rest %q (%q), want %q (%q)", in, rest, rawRest, u.Path[len(b.path):], esc[len(b.rawPath):])
		}
		if dec, err := url.PathUnescape(rawRest); err != nil || dec != rest {
			t.Fatalf("%s: the escaped rest %q decodes to %q (%v), not to the rest %q: another upstream gets a different path", in, rawRest, dec, err, rest)
		}
	})
}

// route says a URL is spelled as its upstream's BaseURL only when scheme
// and host are the same bytes, for a host among the first spellings
// (Transport.spelled) and past them alike: only then may an attempt share
// the caller's URL (keepsURL).
func TestRouteSpelled(t *testing.T) {
	cfg := Config{Base: newFakeNet()}
	for i := range maxSpellings + 2 {
		cfg.Upstreams = append(cfg.Upstreams, Upstream{Name: fmt.Sprint("u", i), BaseURL: fmt.Sprintf("https://u%d.test/v1", i)})
	}
	// Two upstreams on one host, spelled otherwise, and one on its
	// other scheme.
	cfg.Upstreams = append(cfg.Upstreams,
		Upstream{Name: "lower", BaseURL: "https://u0.test/v2"},
		Upstream{Name: "upper", BaseURL: "https://U0.test/v3"},
		Upstream{Name: "plain", BaseURL: "http://u0.test/v4"},
	)
	tr := newTestTransport(t, cfg)
	last := fmt.Sprintf("u%d", maxSpellings+1)
	for _, tt := range []struct {
		url, up string
		spelled bool
	}{
		{"https://u0.test/v1/x", "u0", true},
		{"https://U0.test/v1/x", "u0", false},
		{"https://u0.test:443/v1/x", "u0", false},
		{"https://u0.test/v2/x", "lower", true},
		{"https://u0.test/v3/x", "upper", false},
		{"https://U0.test/v3/x", "upper", true},
		{"http://u0.test/v4/x", "plain", true},
		{"http://u0.test/v1/x", "", false}, // u0 is on https
		{"https://" + last + ".test/v1/x", last, true},
		{"https://" + strings.ToUpper(last) + ".test/v1/x", last, false},
	} {
		up, _, _, spelled := tr.route(mustParse(t, tt.url))
		name := ""
		if up != nil {
			name = up.name
		}
		if name != tt.up || spelled != tt.spelled {
			t.Errorf("%s: routed to %q, spelled %v; want %q, %v", tt.url, name, spelled, tt.up, tt.spelled)
		}
	}
}

// Under UnroutedFirst, a URL on an upstream's own authority spelled
// otherwise than hostKey knows (a host name's trailing dot, a port's
// leading zeros: net/http reaches the same server) is that upstream's
// business: the caller's credentials for it must not go to the first.
// Over real connections, each name dialed to its upstream's server.
func TestUnroutedFirstSparesAnUpstreamsAuthoritySpelledOtherwise(t *testing.T) {
	first := newUpstreamServer(t, 200, "first")
	b := newUpstreamServer(t, 200, "b")
	c := newUpstreamServer(t, 200, "c")
	e := newUpstreamServer(t, 200, "e")
	d := &net.Dialer{}
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		h, _, _ := net.SplitHostPort(addr)
		if a, err := netip.ParseAddr(h); err == nil {
			h = a.Unmap().String() // as the kernel reaches a v4-mapped address
		}
		switch strings.TrimRight(strings.ToLower(h), ".") {
		case "first.test":
			addr = first.Listener.Addr().String()
		case "b.test":
			addr = b.Listener.Addr().String()
		case "::1":
			addr = c.Listener.Addr().String()
		case "10.9.8.7":
			addr = e.Listener.Addr().String()
		}
		return d.DialContext(ctx, network, addr)
	}}
	tr := newTestTransport(t, Config{Base: base, Unrouted: UnroutedFirst, Upstreams: []Upstream{
		{Name: "first", BaseURL: "http://first.test/v1"},
		{Name: "b", BaseURL: "http://b.test:8080/v1"},
		{Name: "c", BaseURL: "http://[::1]:8081/v1"},
		{Name: "e", BaseURL: "http://10.9.8.7:8082/v1"},
		{Name: "h", BaseURL: "https://h.test/v1"}, // its port 443, which http://h.test:443 reaches in plain text
	}})
	t.Cleanup(base.CloseIdleConnections)
	checkSpared(t, tr, first, "reaches an upstream's host and port, spelled otherwise than its BaseURL",
		"http://b.test.:8080/v1/chat",
		"http://B.TEST..:8080/v1/chat",
		"http://b.test:08080/v1/chat",
		"http://[0:0:0:0:0:0:0:1]:8081/v1/chat",
		"http://[0::1]:08081/v1/chat",
		"http://[::ffff:10.9.8.7]:8082/v1/chat",
		"http://[::FFFF:0a09:0807]:8082/v1/chat",
		"http://h.test:443/v1/chat",
		"http://H.test.:0443/v1/chat",
	)
	// A host no upstream is reached at still goes to the first, as
	// UnroutedFirst says, the caller's credentials with it.
	req, _ := http.NewRequest("POST", "http://gateway.test/v1/chat", strings.NewReader("hi"))
	req.Header.Set("Authorization", "Bearer sk-for-the-first")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("a foreign host under UnroutedFirst: %v, want the first upstream's answer", err)
	}
	resp.Body.Close()
	if p := first.requests(); len(p) == 0 || p[len(p)-1].Header.Get("Authorization") != "Bearer sk-for-the-first" {
		t.Errorf("a foreign host under UnroutedFirst: the first upstream did not get the request with its credentials")
	}
}

// A host name net/http reaches through IDNA (canonicalAddr's idnaASCII:
// fullwidth letters, an ideographic full stop, the Kelvin sign, each mapped
// to its ASCII form) is the authority it maps to: under UnroutedFirst, a
// URL on an upstream's host spelled so must not carry the caller's
// credentials for that upstream to the first. The dialer records what
// net/http dials, and the pass-through half shows it is b's server.
func TestUnroutedFirstSparesAnUpstreamsAuthorityInUnicode(t *testing.T) {
	first := newUpstreamServer(t, 200, "first")
	b := newUpstreamServer(t, 200, "b")
	d := &net.Dialer{}
	var mu sync.Mutex
	var dialed []string
	// No keep-alive: each request dials, so that what it dials is seen.
	// With them, the last request's connection, put back in the pool by
	// its readLoop after CloseIdleConnections had run on a loaded
	// machine, was reused for a spelling of the same host, which then
	// dialed nothing.
	base := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		switch addr {
		case "first.test:80":
			addr = first.Listener.Addr().String()
		case "b.test:8080", "k.test:8080":
			addr = b.Listener.Addr().String()
		default:
			return nil, fmt.Errorf("no such test host %q", addr)
		}
		return d.DialContext(ctx, network, addr)
	}}
	t.Cleanup(base.CloseIdleConnections)
	ups := []Upstream{
		{Name: "first", BaseURL: "http://first.test/v1"},
		{Name: "b", BaseURL: "http://b.test:8080/v1"},
		{Name: "k", BaseURL: "http://k.test:8080/v1"},
	}
	targets := []struct{ url, dials string }{
		{"http://\uff42.test:8080/v1/chat", "b.test:8080"},           // fullwidth b
		{"http://%EF%BD%82.test:8080/v1/chat", "b.test:8080"},        // the same, percent-encoded
		{"http://b\u3002test:8080/v1/chat", "b.test:8080"},           // ideographic full stop
		{"http://\uff22\uff0e\uff34EST:8080/v1/chat", "b.test:8080"}, // fullwidth B, full stop, T
		{"http://\u212a.test:8080/v1/chat", "k.test:8080"},           // Kelvin sign
	}
	// What net/http dials for each: b's (or k's) server, as it is.
	for _, target := range targets {
		mu.Lock()
		dialed = nil
		mu.Unlock()
		req, err := http.NewRequest("POST", target.url, strings.NewReader("hi"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := base.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", target.url, err)
		}
		resp.Body.Close()
		mu.Lock()
		got := slices.Clone(dialed)
		mu.Unlock()
		if len(got) != 1 || got[0] != target.dials {
			t.Fatalf("%s: net/http dialed %q, want %q", target.url, got, target.dials)
		}
	}
	before := b.count()
	tr := newTestTransport(t, Config{Base: base, Unrouted: UnroutedFirst, Upstreams: ups})
	var urls []string
	for _, target := range targets {
		urls = append(urls, target.url)
	}
	checkSpared(t, tr, first, "has a host name that may be an upstream's by IDNA, which net/http dials it by", urls...)
	if b.count() != before {
		t.Errorf("b got %d requests through the Transport, want none (refused)", b.count()-before)
	}
}

// An IPv6 literal's zone does not change the server of an address that
// needs none: net/http dials [::1%lo] (and [::1%x], an unknown zone, index
// 0) to ::1 itself. Under UnroutedFirst, a URL on an upstream's [::1]
// authority with a zone must not carry the caller's credentials for that
// upstream to the first. Over real loopback connections, default dialing.
func TestUnroutedFirstSparesAnUpstreamsIPv6AuthorityWithAZone(t *testing.T) {
	first := newUpstreamServer(t, 200, "first")
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	newServerOn(t, ln, "c")
	port := ln.Addr().(*net.TCPAddr).Port
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	targets := []string{
		fmt.Sprintf("http://[::1%%25lo]:%d/v1/chat", port),
		fmt.Sprintf("http://[::1%%25x]:%d/v1/chat", port),
		fmt.Sprintf("http://[0::1%%251]:%d/v1/chat", port),
	}
	checkReaches(t, base, "c", targets...) // net/http reaches c's server for each
	tr := newTestTransport(t, Config{Base: base, Unrouted: UnroutedFirst, Upstreams: []Upstream{
		{Name: "first", BaseURL: first.URL + "/v1"},
		{Name: "c", BaseURL: fmt.Sprintf("http://[::1]:%d/v1", port)},
	}})
	checkSpared(t, tr, first, "reaches an upstream's host and port, spelled otherwise than its BaseURL", targets...)
}

// newServerOn is newUpstreamServer answering 200 and body on ln.
func newServerOn(t *testing.T, ln net.Listener, body string) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, seen{Method: r.Method, Host: r.Host, Path: r.URL.Path, Header: r.Header.Clone()})
		s.mu.Unlock()
		io.WriteString(w, body)
	}))
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// The other way round: an upstream's BaseURL on a host name beyond ASCII
// is dialed as IDNA maps it (bücher.test as xn--bcher-kva.test), so a URL
// on that ASCII name is the upstream's authority too, and under
// UnroutedFirst must not carry the caller's credentials for it to the
// first.
func TestUnroutedFirstSparesAnUpstreamsAuthorityInPunycode(t *testing.T) {
	first := newUpstreamServer(t, 200, "first")
	b := newUpstreamServer(t, 200, "b")
	d := &net.Dialer{}
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		switch addr {
		case "first.test:80":
			addr = first.Listener.Addr().String()
		case "xn--bcher-kva.test:80":
			addr = b.Listener.Addr().String()
		default:
			return nil, fmt.Errorf("no such test host %q", addr)
		}
		return d.DialContext(ctx, network, addr)
	}}
	t.Cleanup(base.CloseIdleConnections)
	tr := newTestTransport(t, Config{Base: base, Unrouted: UnroutedFirst, Upstreams: []Upstream{
		{Name: "first", BaseURL: "http://first.test/v1"},
		{Name: "b", BaseURL: "http://bücher.test/v1"},
	}})
	// net/http dials b's BaseURL, and the name below, to b's server.
	checkReaches(t, base, "b", "http://bücher.test/v1/chat", "http://xn--bcher-kva.test/v1/chat")
	checkSpared(t, tr, first, "has a host name that may be an upstream's by IDNA, which net/http dials it by", "http://xn--bcher-kva.test/v1/chat", "http://XN--BCHER-KVA.test./v1/chat")
}

// checkSpared sends each target through tr with a credential and checks
// that it is refused with ErrUnrouted for why and that
// first, the first upstream's server, got no credential.
func checkSpared(t *testing.T, tr *Transport, first *server, why string, targets ...string) {
	t.Helper()
	for _, target := range targets {
		req := httptestRequest("POST", target, "hi")
		req.Header.Set("Authorization", "Bearer sk-for-another-only-qwqw")
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		for _, s := range first.requests() {
			if s.Header.Get("Authorization") != "" {
				t.Fatalf("%s: the first upstream got the credentials the caller sent to another upstream's authority", target)
			}
		}
		var ue *UnroutedError
		if !errors.As(err, &ue) || ue.Why != why {
			t.Errorf("%s: err %v, want ErrUnrouted (an upstream's authority, not spelled as its BaseURL) %q", target, err, why)
		}
	}
}

// checkReaches checks that base, net/http itself, reaches for each target
// the server that answers body.
func checkReaches(t *testing.T, base http.RoundTripper, body string, targets ...string) {
	t.Helper()
	for _, target := range targets {
		resp, err := base.RoundTrip(httptestRequest("POST", target, "hi"))
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != body {
			t.Fatalf("%s: net/http reached %q, want %s's server", target, got, body)
		}
	}
}

// A URL is addressed to a {deployment} upstream when one path segment
// stands in the deployment's place: its rest is what follows, so that it
// goes to another upstream as /chat/completions does. A deployment that
// is no single segment addresses nothing; the longest base path wins, a
// deployment counting for one byte.
func TestRouteDeployment(t *testing.T) {
	tr := newTestTransport(t, Config{Base: newFakeNet(), Upstreams: []Upstream{
		{Name: "root", BaseURL: "https://res.test/openai"},
		{Name: "classic", BaseURL: "https://res.test/openai/deployments/{deployment}"},
		{Name: "v1", BaseURL: "https://res.test/openai/v1"},
		{Name: "suffixed", BaseURL: "https://other.test/x/%7Bdeployment%7D/api/"},
	}})
	for _, tt := range []struct {
		url, up, rest, rawRest string
	}{
		{"https://res.test/openai/deployments/my-gpt4o/chat/completions?api-version=1", "classic", "/chat/completions", "/chat/completions"},
		{"https://res.test/openai/deployments/my-gpt4o", "classic", "", ""},
		{"https://res.test/openai/deployments/gpt%204o/embeddings", "classic", "/embeddings", "/embeddings"},
		{"https://res.test/openai/deployments/a/files/x%2Fy", "classic", "/files/x/y", "/files/x%2Fy"},
		{"https://res.test/openai/deployments/", "root", "/deployments/", "/deployments/"},
		{"https://res.test/openai/deployments", "root", "/deployments", "/deployments"},
		{"https://res.test/openai/deployments/a%2Fb/chat/completions", "root", "/deployments/a/b/chat/completions", "/deployments/a%2Fb/chat/completions"},
		{"https://res.test/openai/deployments/a%5Cb/chat/completions", "root", "/deployments/a\\b/chat/completions", "/deployments/a%5Cb/chat/completions"},
		{"https://res.test/openai/deployments/../v1/models", "", "", ""},
		{"https://res.test/openai/v1/models", "v1", "/models", ""},
		{"https://other.test/x/dep/api/chat", "suffixed", "/chat", "/chat"},
		{"https://other.test/x/dep/api", "suffixed", "", ""},
		{"https://other.test/x/dep/apix", "", "", ""},
		{"https://other.test/x/dep", "", "", ""},
	} {
		up, rest, rawRest, _ := tr.route(mustParse(t, tt.url))
		name := ""
		if up != nil {
			name = up.name
		}
		if name != tt.up || rest != tt.rest || rawRest != tt.rawRest {
			t.Errorf("%s: routed to %q, rest %q %q; want %q, %q %q", tt.url, name, rest, rawRest, tt.up, tt.rest, tt.rawRest)
		}
	}
}

// Under UnroutedFirst, a first upstream with a {deployment} takes an
// unrouted URL only when a deployment stands in its place.
func TestUnroutedFirstDeployment(t *testing.T) {
	tr := newTestTransport(t, Config{Base: newFakeNet(), Unrouted: UnroutedFirst, Upstreams: []Upstream{
		{Name: "classic", BaseURL: "https://res.test/openai/deployments/{deployment}"},
	}})
	for _, tt := range []struct{ url, up, rest string }{
		{"https://gw.test/openai/deployments/d/chat/completions", "classic", "/chat/completions"},
		{"https://gw.test/openai/deployments/chat", "classic", ""},
		{"https://gw.test/openai/deployments", "", ""},
		{"https://gw.test/openai/deployments/a%2Fb/chat", "", ""},
	} {
		up, rest, _, _ := tr.address(mustParse(t, tt.url))
		name := ""
		if up != nil {
			name = up.name
		}
		if name != tt.up || rest != tt.rest {
			t.Errorf("%s: addressed to %q, rest %q; want %q, %q", tt.url, name, rest, tt.up, tt.rest)
		}
	}
}

// TestDeploymentShadowingRefused: a {deployment} upstream whose base
// path is another upstream's BaseURL on the same host reads that
// upstream's requests as its own ("/v1/chat/completions" as deployment
// "chat"): the request is addressed to the wrong upstream, and on
// failover its rest ("/completions") is wrong. New should refuse the
// ambiguity, or the route should prefer the literal BaseURL.
func TestDeploymentShadowingRefused(t *testing.T) {
	tr, err := New(Config{Base: newFakeNet(), Upstreams: []Upstream{
		{Name: "openai", BaseURL: "https://gw.test/v1"},
		{Name: "azure", BaseURL: "https://gw.test/v1/{deployment}"},
	}})
	if err != nil {
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("New: %v, want a *ConfigError or a Transport", err)
		}
		return // refused: fine
	}
	defer tr.Close()
	up, rest, _, _ := tr.route(mustParse(t, "https://gw.test/v1/chat/completions"))
	if up == nil || up.name != "openai" || rest != "/chat/completions" {
		name := "<nil>"
		if up != nil {
			name = up.name
		}
		t.Errorf("https://gw.test/v1/chat/completions routed to %q with rest %q; want openai, /chat/completions", name, rest)
	}
}

// A {deployment} BaseURL whose path before the placeholder is another
// BaseURL's path on the same scheme, host and port is refused, naming
// both; one under a longer path, on another port or scheme, or beside
// another {deployment} BaseURL with its own suffix is taken.
func TestDeploymentUnderBaseURL(t *testing.T) {
	for _, tt := range []struct {
		a, b  string
		field string // "": New takes them
		other string // in the reason
	}{
		{"https://gw.test/v1", "https://gw.test/v1/{deployment}", "Upstreams[1].BaseURL", "Upstreams[0].BaseURL"},
		{"https://gw.test/v1/{deployment}/chat", "https://gw.test/v1/", "Upstreams[0].BaseURL", "Upstreams[1].BaseURL"},
		{"https://GW.test:443/v1", "https://gw.test/v1/{deployment}", "Upstreams[1].BaseURL", "Upstreams[0].BaseURL"},
		{"https://gw.test", "https://gw.test/{deployment}", "Upstreams[1].BaseURL", "Upstreams[0].BaseURL"},
		{"https://gw.test/", "https://gw.test/openai/deployments/{deployment}", "", ""},
		{"https://gw.test:8443/v1", "https://gw.test/v1/{deployment}", "", ""},
		{"http://gw.test/v1", "https://gw.test/v1/{deployment}", "", ""},
		{"https://gw.test/v1/{deployment}/chat", "https://gw.test/v1/{deployment}/embed", "", ""},
	} {
		tr, err := New(Config{Base: newFakeNet(), Upstreams: []Upstream{{Name: "a", BaseURL: tt.a}, {Name: "b", BaseURL: tt.b}}})
		if tt.field == "" {
			if err != nil {
				t.Errorf("%s and %s: New: %v", tt.a, tt.b, err)
			} else {
				tr.Close()
			}
			continue
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tt.field || !strings.Contains(ce.Reason, tt.other) {
			t.Errorf("%s and %s: New: %v, want a ConfigError naming %s and %s", tt.a, tt.b, err, tt.field, tt.other)
		}
	}
}
