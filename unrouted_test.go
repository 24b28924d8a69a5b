package failover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// localhost returns the URL of s with "localhost" for its 127.0.0.1: the
// same server, another spelling, which no upstream's BaseURL names.
func localhost(t *testing.T, s *server) string {
	t.Helper()
	u, ok := strings.CutPrefix(s.URL, "http://127.0.0.1:")
	if !ok {
		t.Fatalf("test server at %s, not on 127.0.0.1", s.URL)
	}
	return "http://localhost:" + u
}

// closeRecorder is a request body that records whether it was closed.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// The trap: an SDK aimed at localhost while the upstream says 127.0.0.1.
// By default the request is refused, with an error that says why and which
// BaseURLs exist; nothing is sent, the body is closed, the host is logged
// once and listed, and no credential appears in any of it.
func TestUnroutedRefusedByDefault(t *testing.T) {
	primary := newUpstreamServer(t, 200, "primary")
	backup := newUpstreamServer(t, 200, "backup")
	var logs logBuffer
	tr := newTestTransport(t, Config{Logger: newLogger(&logs), Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer upstream-own-key"}}},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	const secret = "caller-secret-zq"
	send := func(url string) error {
		body := &closeRecorder{Reader: strings.NewReader(chatBody)}
		req := httptestRequest("POST", url+"?api_key="+secret+"&x=1", "")
		req.Body = body
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("%s: got a %d response, want a refusal", url, resp.StatusCode)
		}
		if !body.closed {
			t.Errorf("%s: the refused request's body was not closed", url)
		}
		return err
	}
	trap := localhost(t, primary) + "/v1/chat/completions"
	err := send(trap)
	var ue *UnroutedError
	if !errors.Is(err, ErrUnrouted) || !errors.As(err, &ue) {
		t.Fatalf("err = %v, want an *UnroutedError wrapping ErrUnrouted", err)
	}
	msg := err.Error()
	for _, want := range []string{localhost(t, primary) + "/v1/chat/completions", "scheme and host no upstream has", primary.URL + "/v1", backup.URL + "/v1", "Config.Unrouted"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	send(trap)
	send("http://other.test/v1/models")
	if n := primary.count() + backup.count(); n != 0 {
		t.Errorf("refused requests reached the upstreams: %d", n)
	}

	out := logs.String()
	if n := strings.Count(out, "request addressed to no upstream"); n != 2 {
		t.Errorf("%d warnings for 3 requests to 2 hosts, want one per host:\n%s", n, out)
	}
	for _, want := range []string{"level=WARN", "host=" + localhost(t, primary), "host=http://other.test", "policy=refuse", primary.URL + "/v1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{secret, "upstream-own-key", "/chat/completions", "x=1"} {
		if strings.Contains(out, bad) || strings.Contains(msg, bad) && bad != "/chat/completions" {
			t.Errorf("the log or the error shows %q:\n%s\n%s", bad, out, msg)
		}
	}

	hosts := tr.UnroutedHosts()
	if len(hosts) != 2 || hosts[0].Host != localhost(t, primary) || hosts[0].Requests != 2 ||
		hosts[1].Host != "http://other.test" || hosts[1].Requests != 1 || hosts[0].First.IsZero() {
		t.Errorf("UnroutedHosts = %+v, want %s (2) then http://other.test (1)", hosts, localhost(t, primary))
	}
	if got := metricValue(t, tr, "failover_unrouted_requests_total"); got != 3 {
		t.Errorf("failover_unrouted_requests_total = %v, want 3", got)
	}
	for _, h := range tr.Health() {
		if h.Requests.Total() != 0 {
			t.Errorf("%s counted a refused request: %+v", h.Name, h.Requests)
		}
	}
}

// Each way of missing every upstream is named.
func TestUnroutedErrorSaysWhy(t *testing.T) {
	primary := newUpstreamServer(t, 200, "primary")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{BaseURL: primary.URL + "/v1"}}})
	for _, tt := range []struct{ url, why string }{
		{localhost(t, primary) + "/v1/models", "has a scheme and host no upstream has"},
		{"https" + strings.TrimPrefix(primary.URL, "http") + "/v1/models", "has a scheme and host no upstream has"},
		{primary.URL + "/v2/models", "lies under no upstream's base path on its host"},
		{primary.URL + "/v1x", "lies under no upstream's base path on its host"},
		{primary.URL + "/v1/../admin", `has a "." or ".." path segment`},
		{primary.URL + "/v1/%2e%2e/admin", `has a "." or ".." path segment`},
	} {
		_, err := tr.RoundTrip(httptestRequest("GET", tt.url, ""))
		var ue *UnroutedError
		if !errors.As(err, &ue) || ue.Why != tt.why {
			t.Errorf("%s: err = %v, want the reason %q", tt.url, err, tt.why)
		}
	}
	_, err := tr.RoundTrip(&http.Request{Method: "GET", URL: mustParse(t, "http:opaque@secret/v1"), Header: http.Header{}})
	var ue *UnroutedError
	if !errors.As(err, &ue) || ue.URL != "http:" || strings.Contains(err.Error(), "secret") {
		t.Errorf("an opaque URL: err = %v, want a refusal that shows only its scheme", err)
	}
	if primary.count() != 0 {
		t.Errorf("refused requests reached the upstream: %d", primary.count())
	}
}

// UnroutedFirst: the trap's request goes to the first upstream as if
// addressed to it, fails over like any other, and the caller's credentials
// reach only that first upstream. A path outside its base path is refused.
func TestUnroutedFirst(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "backup")
	tr := newTestTransport(t, Config{Unrouted: UnroutedFirst, Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer backup-own"}}},
	}})
	req := httptestRequest("POST", localhost(t, primary)+"/v1/chat/completions?x=1", chatBody)
	req.Header.Set("Authorization", "Bearer caller-key")
	resp, err := do(t, tr, req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "backup" {
		t.Fatalf("got %q, want the backup's answer after the primary's 503", body)
	}
	p, b := primary.requests(), backup.requests()
	if len(p) != 1 || len(b) != 1 {
		t.Fatalf("primary got %d, backup %d requests; want 1 each", len(p), len(b))
	}
	if p[0].Path != "/v1/chat/completions" || p[0].RawQuery != "x=1" || p[0].Header.Get("Authorization") != "Bearer caller-key" || p[0].Body != chatBody {
		t.Errorf("the first upstream got %+v, want the caller's request with its key", p[0])
	}
	if got := b[0].Header.Get("Authorization"); got != "Bearer backup-own" || b[0].Path != "/v1/chat/completions" {
		t.Errorf("the backup got Authorization %q, path %q; want its own key and the same path", got, b[0].Path)
	}
	if len(tr.UnroutedHosts()) != 0 {
		t.Errorf("UnroutedHosts = %+v; a request sent to the first upstream is routed", tr.UnroutedHosts())
	}

	_, err = tr.RoundTrip(httptestRequest("GET", localhost(t, primary)+"/v2/models", ""))
	var ue *UnroutedError
	if !errors.As(err, &ue) || ue.Why != "lies outside the first upstream's base path" {
		t.Errorf("a path outside the first base path: err = %v, want a refusal", err)
	}
	if primary.count() != 1 {
		t.Errorf("the refused request reached the primary")
	}
}

// A redirect hop goes where the upstream sent it, whatever the policy,
// without the caller's credentials, and is no unrouted host.
func TestUnroutedRedirectHopPasses(t *testing.T) {
	for _, policy := range []UnroutedPolicy{UnroutedRefuse, UnroutedFirst} {
		t.Run(policy.String(), func(t *testing.T) {
			elsewhere := newUpstreamServer(t, 200, "elsewhere")
			primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, elsewhere.URL+"/v1/files/1", http.StatusFound)
			})
			tr := newTestTransport(t, Config{Unrouted: policy, Upstreams: []Upstream{{BaseURL: primary.URL + "/v1"}}})
			req := httptestRequest("GET", primary.URL+"/v1/files/1", "")
			req.Header.Set("Authorization", "Bearer caller-key")
			resp, err := do(t, tr, req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "elsewhere" {
				t.Fatalf("got %q, want the redirect's target", body)
			}
			if got := elsewhere.requests()[0].Header.Get("Authorization"); got != "" {
				t.Errorf("the hop to another host carried Authorization %q", got)
			}
			if hs := tr.UnroutedHosts(); len(hs) != 0 {
				t.Errorf("UnroutedHosts = %+v, want none: a hop is the upstream's choice", hs)
			}
		})
	}
}

// A client used for every host (UnroutedPass) keeps a bounded set: 64
// hosts, then one "other" line, and one more warning saying so.
func TestUnroutedHostsBounded(t *testing.T) {
	var logs logBuffer
	n := &recordingNet{}
	tr := newTestTransport(t, Config{Base: n, Unrouted: UnroutedPass, Logger: newLogger(&logs), Upstreams: []Upstream{{BaseURL: "http://a.test/v1"}}})
	for i := range maxUnroutedHosts + 6 {
		resp, err := tr.RoundTrip(httptestRequest("GET", fmt.Sprintf("http://h%d.test/x", i), ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	hosts := tr.UnroutedHosts()
	if len(hosts) != maxUnroutedHosts+1 {
		t.Fatalf("%d hosts listed, want %d and other", len(hosts), maxUnroutedHosts)
	}
	if last := hosts[len(hosts)-1]; last.Host != "other" || last.Requests != 6 {
		t.Errorf("the last line is %+v, want other: 6", last)
	}
	out := logs.String()
	if got := strings.Count(out, "request addressed to no upstream"); got != maxUnroutedHosts {
		t.Errorf("%d warnings, want %d", got, maxUnroutedHosts)
	}
	if got := strings.Count(out, "no more are logged"); got != 1 {
		t.Errorf("%d warnings that the set is full, want 1", got)
	}
	if len(n.got) != maxUnroutedHosts+6 {
		t.Errorf("Base got %d requests, want every one passed", len(n.got))
	}
}

func TestUnroutedPolicyConfig(t *testing.T) {
	for _, p := range []UnroutedPolicy{-1, UnroutedFirst + 1, 1 << 40} {
		_, err := New(Config{Unrouted: p, Upstreams: []Upstream{{BaseURL: "http://a.test"}}})
		var cerr *ConfigError
		if !errors.As(err, &cerr) || cerr.Field != "Unrouted" {
			t.Errorf("Unrouted %d: err = %v, want a ConfigError naming Unrouted", p, err)
		}
	}
	for p, want := range map[UnroutedPolicy]string{UnroutedRefuse: "refuse", UnroutedPass: "pass", UnroutedFirst: "first", 9: "UnroutedPolicy(9)"} {
		if got := p.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(p), got, want)
		}
	}
}

// An SDK aimed at localhost while the upstream says 127.0.0.1 addresses no
// upstream: the request is refused, with an error saying why, and nothing
// is sent.
func ExampleUnroutedPolicy() {
	t, err := New(Config{Upstreams: []Upstream{
		{Name: "local", BaseURL: "http://127.0.0.1:8080/v1"},
		{Name: "openai", BaseURL: "https://api.openai.com/v1"},
	}})
	if err != nil {
		panic(err)
	}
	defer t.Close()
	client := &http.Client{Transport: t}
	_, err = client.Get("http://localhost:8080/v1/models")
	fmt.Println(errors.Is(err, ErrUnrouted))
	fmt.Println(err)
	for _, h := range t.UnroutedHosts() {
		fmt.Println(h.Host, h.Requests)
	}
	// Output:
	// true
	// Get "http://localhost:8080/v1/models": failover: request addressed to no upstream: http://localhost:8080/v1/models has a scheme and host no upstream has; the upstreams' BaseURLs are http://127.0.0.1:8080/v1, https://api.openai.com/v1 (see Config.Unrouted)
	// http://localhost:8080 1
}

// the credentials the caller meant for b.test must not go to a.test.
func TestUnroutedFirstSparesOtherUpstreamsHost(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 200, "a")
	n.status("b.test", 200, "b")
	tr := newTestTransport(t, Config{Base: n, Unrouted: UnroutedFirst, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test/v1"},
		{Name: "b", BaseURL: "http://b.test/v1beta"},
	}})
	req := httptestRequest("GET", "http://b.test/v1/models", "")
	req.Header.Set("Authorization", "Bearer b-key")
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	for _, s := range n.requests("a.test") {
		if strings.Contains(s.Header.Get("Authorization"), "b-key") {
			t.Errorf("a.test got the key the caller sent to b.test (a configured upstream's host): %+v", s)
		}
	}
}

// the caller's Trace on its context: its Done is called too.
func TestUnroutedHopCallsDone(t *testing.T) {
	n := newFakeNet()
	n.handle("a.test", func(r *http.Request) (*http.Response, error) {
		return respond(302, "", "Location", "http://elsewhere.test/files/1"), nil
	})
	n.status("elsewhere.test", 200, "elsewhere")
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}})
	var dones int
	ctx := WithTrace(context.Background(), &Trace{Done: func(TraceDone) { dones++ }})
	resp, err := do(t, tr, httptestRequest("GET", "http://a.test/v1/files/1", "").WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n.count("elsewhere.test") != 1 {
		t.Fatal("the test is broken: the hop did not reach elsewhere.test")
	}
	if dones != 2 {
		t.Errorf("Done called %d times for 2 RoundTrips (the upstream's, then the hop's)", dones)
	}
}
