package failover

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Timeouts of Base are the upstream's failures, not the caller's
// cancellation: a dial timeout and ResponseHeaderTimeout fail over and count
// toward the breaker.
func TestBaseTimeoutsFailOver(t *testing.T) {
	backup := newUpstreamServer(t, 200, "from backup")
	t.Run("dial timeout", func(t *testing.T) {
		base := http.DefaultTransport.(*http.Transport).Clone()
		base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if strings.HasPrefix(addr, "blackhole.test") {
				// What a blackholed host gives after Dialer.Timeout.
				d := net.Dialer{Deadline: time.Now().Add(-time.Second)}
				return d.DialContext(ctx, network, "127.0.0.1:9")
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{
			{Name: "primary", BaseURL: "http://blackhole.test/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1"},
		}})
		resp := mustGet(t, tr, "http://blackhole.test/v1/models")
		if got := readBody(t, resp); got != "from backup" {
			t.Fatalf("body %q, want the backup's", got)
		}
		if h := tr.Health()[0]; h.Requests.Failed != 1 || h.BreakerFailures != 1 {
			t.Fatalf("primary %+v: a dial timeout is a failure", h.Requests)
		}
	})
	t.Run("response header timeout", func(t *testing.T) {
		slow := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		base := http.DefaultTransport.(*http.Transport).Clone()
		base.ResponseHeaderTimeout = 50 * time.Millisecond
		tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{
			{Name: "primary", BaseURL: slow.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1"},
		}})
		resp := mustGet(t, tr, slow.URL+"/v1/models")
		if got := readBody(t, resp); got != "from backup" {
			t.Fatalf("body %q, want the backup's", got)
		}
		if h := tr.Health()[0]; h.Requests.Failed != 1 {
			t.Fatalf("primary %+v: a header timeout is a failure", h.Requests)
		}
	})
}

// A panic in Base during the probe does not hold the probe gate: the next
// request probes.
func TestProbeGateSurvivesPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mode atomic.Value
		mode.Store("fail")
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			switch mode.Load() {
			case "panic":
				panic("boom")
			case "ok":
				return respond(200, "ok"), nil
			}
			return respond(503, "down"), nil
		})
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		get(t, tr, "http://a.test/")
		time.Sleep(time.Second)
		mode.Store("panic")
		func() {
			defer func() {
				if recover() == nil {
					t.Error("Base's panic did not reach the caller")
				}
			}()
			get(t, tr, "http://a.test/")
		}()
		mode.Store("ok")
		if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("after a panicking probe: %d, %v; want the next request to probe", code, err)
		}
	})
}

// A probe that never returns (no AttemptTimeout, a caller without a
// deadline) is presumed hung after Cooldown, and Reset frees its gate.
func TestHungProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mode atomic.Value
		mode.Store("fail")
		release := make(chan struct{})
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			switch mode.Load() {
			case "hang":
				<-release
				return respond(200, "late"), nil
			case "ok":
				return respond(200, "ok"), nil
			}
			return respond(503, "down"), nil
		})
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: 10 * time.Second},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		get(t, tr, "http://a.test/")
		time.Sleep(10 * time.Second)
		mode.Store("hang")
		done := make(chan struct{})
		go func() { defer close(done); get(t, tr, "http://a.test/") }()
		synctest.Wait()
		mode.Store("ok")
		if _, err := get(t, tr, "http://a.test/"); !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("while the probe is young: %v, want ErrCircuitOpen", err)
		}
		time.Sleep(10 * time.Second)
		if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("a Cooldown after the probe hung: %d, %v; want a new probe", code, err)
		}

		// Trip again, hang a probe, Reset: the gate is free at once.
		mode.Store("fail")
		get(t, tr, "http://a.test/")
		time.Sleep(10 * time.Second)
		mode.Store("hang")
		done2 := make(chan struct{})
		go func() { defer close(done2); get(t, tr, "http://a.test/") }()
		synctest.Wait()
		tr.Reset("a")
		mode.Store("fail")
		get(t, tr, "http://a.test/") // trips again
		time.Sleep(10 * time.Second)
		mode.Store("ok")
		if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("after Reset and a new trip: %d, %v", code, err)
		}
		close(release)
		<-done
		<-done2
	})
}

// With Retries, the caller still gets the provider's answer when no
// upstream comes back in time, and that answer survives the wait whole.
func TestRetriesKeepTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, `{"error":"a overloaded"}`)
		n.status("b.test", 503, `{"error":"b overloaded"}`)
		tr := newTestTransport(t, twoUpstreams(n, Config{Retries: 1,
			Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: 2 * time.Minute}}))
		start := time.Now()
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/x", ""))
		if err != nil {
			t.Fatalf("got %v after %v, want the last 503", err, time.Since(start))
		}
		if got := readBody(t, resp); resp.StatusCode != 503 || got != `{"error":"b overloaded"}` {
			t.Fatalf("got %d %q", resp.StatusCode, got)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("waited %v for circuits that stay open for 2m", waited)
		}
	})
}

// A Rejected error (a request no upstream can send) says nothing of the
// upstream: it does not close a half-open circuit whose upstream is down.
func TestInvalidHeaderLeavesBreakerAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if r.Header.Get("X-Bad") != "" {
				return nil, errors.New(`net/http: invalid header field value for "X-Bad"`)
			}
			return nil, errors.New("connection refused")
		})
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		get(t, tr, "http://a.test/")
		time.Sleep(time.Second)
		req := httptestRequest("GET", "http://a.test/", "")
		req.Header.Set("X-Bad", "1")
		if _, err := tr.RoundTrip(req); err == nil {
			t.Fatal("no error")
		}
		if h := tr.Health()[0]; h.State != "half-open" || !h.Available {
			t.Fatalf("after a rejected probe: %s available %v; want half-open, probe handed on", h.State, h.Available)
		}
	})
}

// A caller's key= value and URL password never appear in errors or Health,
// even when Base quotes the URL.
func TestQueryKeyRedacted(t *testing.T) {
	const key, pass = "AIzaSyCALLERSECRET0123456789", "callerpassword99"
	n := newFakeNet()
	n.handle("gen.test", func(r *http.Request) (*http.Response, error) {
		return nil, &url.Error{Op: "Post", URL: "https://u:" + pass + "@gen.test" + r.URL.RequestURI(), Err: io.ErrUnexpectedEOF}
	})
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{Name: "g", BaseURL: "https://gen.test/v1"}}})
	req := httptestRequest("POST", "https://u:"+pass+"@gen.test/v1/models/x:generateContent?key="+key, "{}")
	// The addressed upstream keeps the caller's key: the fake quotes it.
	_, err := tr.RoundTrip(req)
	if err == nil {
		t.Fatal("no error")
	}
	for _, s := range []string{err.Error(), tr.Health()[0].LastError} {
		if strings.Contains(s, key) || strings.Contains(s, pass) {
			t.Errorf("a secret leaked: %s", s)
		}
	}
}

// resp.Request shows where the answer came from, with the caller's own
// headers: the upstream's key stays inside the Transport.
func TestResponseRequestHidesUpstreamKey(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.handle("b.test", func(r *http.Request) (*http.Response, error) {
		resp := respond(200, "ok")
		resp.Request = r
		return resp, nil
	})
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test", Header: http.Header{"Authorization": {"Bearer sk-aaaaaaaaaaaa"}}},
		{Name: "b", BaseURL: "http://b.test", Header: http.Header{"Authorization": {"Bearer sk-bbbbbbbbbbbb"}}},
	}})
	req := httptestRequest("GET", "http://a.test/x", "")
	req.Header.Set("Authorization", "Bearer caller")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Host != "b.test" || resp.Request.Header.Get("Authorization") != "Bearer caller" {
		t.Fatalf("resp.Request: %s with Authorization %q; want b.test with the caller's own", resp.Request.URL, resp.Request.Header.Get("Authorization"))
	}
}

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
		{"http://a.test/v1/files/a%2Fb", "/proxy%2Fopenai/v1/files/a%2Fb"},
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
	if up, _, _ := tr.route(mustParse(t, "http://a.test/v1%2Fx")); up != nil {
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
		if up, _, _ := tr.route(mustParse(t, tt.url)); (up != nil) != tt.routed {
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
