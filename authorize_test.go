package failover

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// bodySum is the hex SHA-256 of what req's GetBody gives, as a signer
// computes it.
func bodySum(req *http.Request) (string, error) {
	if req.GetBody == nil {
		return "", errors.New("no GetBody")
	}
	rc, err := req.GetBody()
	if err != nil {
		return "", err
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return "", err
	}
	if int64(len(data)) != req.ContentLength {
		return "", fmt.Errorf("GetBody gives %d bytes, ContentLength is %d", len(data), req.ContentLength)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// The Authorizer sees the attempt's request as it goes: its upstream's
// URL, Host, Header and Query, and the body with the model Models mapped,
// which it signs through GetBody and the upstream verifies. Each
// upstream's credentials reach that upstream only, and the caller's
// request is left as it was.
func TestAuthorizerSignsFinalRequest(t *testing.T) {
	const tokA = "Bearer tok-a-0123456789"
	primary := newUpstreamServer(t, 503, "down")
	backup := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(body)
		if r.Header.Get("X-Signature") != hex.EncodeToString(sum[:]) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "signed")
	})
	var callsA, callsB atomic.Int32
	var hookErr atomic.Value
	fail := func(format string, args ...any) error {
		err := fmt.Errorf(format, args...)
		hookErr.Store(err)
		return err
	}
	backupURL, _ := url.Parse(backup.URL)
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "a", BaseURL: primary.URL + "/v1", Authorizer: AuthorizerFunc(func(req *http.Request) error {
			callsA.Add(1)
			req.Header.Set("Authorization", tokA)
			return nil
		})},
		{Name: "b", BaseURL: backup.URL + "/v2", Header: http.Header{"X-Up": {"b"}}, Query: url.Values{"api-version": {"2024-10-21"}},
			Models: map[string]string{"gpt-4o-mini": "mapped-model"},
			Authorizer: AuthorizerFunc(func(req *http.Request) error {
				callsB.Add(1)
				switch {
				case req.URL.Host != backupURL.Host || req.Host != backupURL.Host || req.URL.Path != "/v2/chat/completions":
					return fail("URL %s, Host %s: not the backup's", req.URL, req.Host)
				case req.Header.Get("X-Up") != "b" || req.URL.Query().Get("api-version") != "2024-10-21":
					return fail("the backup's Header or Query is not set yet")
				case req.Header.Get("Authorization") != "":
					return fail("Authorization %q reached the backup's Authorizer", req.Header.Get("Authorization"))
				}
				sum, err := bodySum(req)
				if err != nil {
					return fail("%v", err)
				}
				req.Header.Set("X-Signature", sum)
				req.Header.Add("X-Up", "signed") // an append: must not reach the Header's slice
				return nil
			})},
	}})
	for range 2 {
		req := httptestRequest("POST", primary.URL+"/v1/chat/completions", chatBody)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); resp.StatusCode != 200 || got != "signed" {
			t.Fatalf("status %d %q, want the backup's 200 (Authorizer: %v)", resp.StatusCode, got, hookErr.Load())
		}
		if len(req.Header) != 0 {
			t.Errorf("the caller's request now has headers %v", req.Header)
		}
		if v := resp.Request.Header.Get("X-Signature"); v != "" {
			t.Errorf("the answer's Request shows the backup's signature %q", v)
		}
	}
	// a's 503 is retried there once before the model changes (Retry).
	if callsA.Load() != 4 || callsB.Load() != 2 {
		t.Errorf("Authorizers called %d and %d times, want once per attempt: 4 and 2", callsA.Load(), callsB.Load())
	}
	p, b := primary.requests(), backup.requests()
	if len(p) != 4 || p[0].Header.Get("Authorization") != tokA {
		t.Fatalf("primary got %d requests, first %+v", len(p), p)
	}
	if len(b) != 2 || b[1].Header.Get("Authorization") != "" || !strings.Contains(b[1].Body, `"mapped-model"`) {
		t.Fatalf("backup got %d requests, last %+v; want the mapped body without a's token", len(b), b)
	}
	if got := b[1].Header.Values("X-Up"); !slices.Equal(got, []string{"b", "signed"}) {
		t.Errorf("backup got X-Up %q, want [b signed]", got)
	}
	if got := tr.upstreams[1].header["X-Up"]; !slices.Equal(got[:cap(got)], []string{"b"}) {
		t.Errorf("the backup's Header now holds %q", got[:cap(got)])
	}
}

// The credentials an Authorizer sets reach its upstream only: the next
// upstream gets none of them, and the answer's Request shows the caller's
// headers, not the token, even from the upstream the caller addressed;
// the caller's URL and header values are not written.
func TestAuthorizerCredentialsStayOut(t *testing.T) {
	const tok = "Bearer rotating-token-0123456789"
	var fail atomic.Bool
	fail.Store(true)
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			w.WriteHeader(500)
		}
	})
	backup := newUpstreamServer(t, 200, "b")
	// Without timeouts, an attempt at the upstream the caller addressed
	// shares the caller's URL.
	none := Timeouts{Headers: -1, FirstContent: -1, Idle: -1, Attempt: -1}
	tr := newTestTransport(t, Config{Timeouts: none, Upstreams: []Upstream{
		{Name: "a", BaseURL: primary.URL, Authorizer: AuthorizerFunc(func(req *http.Request) error {
			req.Header.Set("Authorization", tok)
			req.Header.Add("X-Trace", "signed") // an append: must not write the caller's slice
			req.URL.RawQuery = "signature=0123456789"
			return nil
		})},
		{Name: "b", BaseURL: backup.URL},
	}})
	req := httptestRequest("GET", primary.URL+"/models", "")
	trace := make([]string, 1, 2)
	trace[0] = "t"
	req.Header["X-Trace"] = trace
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if req.URL.RawQuery != "" || trace[:2][1] != "" {
		t.Errorf("the caller's request changed: query %q, X-Trace %q", req.URL.RawQuery, trace[:2])
	}
	if got := backup.requests(); len(got) != 1 || got[0].Header.Get("Authorization") != "" {
		t.Fatalf("backup got %+v, want one request without a's token", got)
	}
	fail.Store(false)
	resp = mustGet(t, tr, primary.URL+"/models")
	resp.Body.Close()
	if s, _ := ServedBy(resp); s.Upstream != "a" {
		t.Fatalf("served by %q, want a", s.Upstream)
	}
	if v := resp.Request.Header.Get("Authorization"); v != "" {
		t.Errorf("the answer's Request shows %q", v)
	}
	if got := primary.requests(); got[1].Header.Get("Authorization") != tok {
		t.Errorf("primary got Authorization %q, want the Authorizer's", got[1].Header.Get("Authorization"))
	}
}

// An Authorizer's error sends nothing to its upstream: the request fails
// over to the next, and the upstream is blamed for nothing (its circuit
// stays closed, no cooldown) but its last error says why, scrubbed of
// the token the Authorizer had set.
func TestAuthorizerErrorFailsOver(t *testing.T) {
	const secret = "tok-expired-0123456789"
	primary := newUpstreamServer(t, 200, "a")
	backup := newUpstreamServer(t, 200, "b")
	var logs logBuffer
	tr := newTestTransport(t, Config{Logger: newLogger(&logs), Breaker: BreakerConfig{FailureThreshold: 2},
		Upstreams: []Upstream{
			{Name: "a", BaseURL: primary.URL, Authorizer: AuthorizerFunc(func(req *http.Request) error {
				req.Header.Set("Authorization", "Bearer "+secret)
				return fmt.Errorf("token %s expired", secret)
			})},
			{Name: "b", BaseURL: backup.URL},
		}})
	for range 5 {
		resp := mustPost(t, tr, primary.URL+"/chat/completions", chatBody)
		if got := readBody(t, resp); got != "b" {
			t.Fatalf("answer %q, want the backup's", got)
		}
	}
	if primary.count() != 0 {
		t.Errorf("primary got %d requests, want none", primary.count())
	}
	h := tr.Health()[0]
	if h.State != "closed" || h.BreakerFailures != 0 || h.Cooldown != 0 || h.Requests.Failed != 0 || h.Requests.Unservable != 5 {
		t.Errorf("a: state %s, breaker failures %d, cooldown %v, counts %+v; want closed, blamed for nothing, 5 unservable",
			h.State, h.BreakerFailures, h.Cooldown, h.Requests)
	}
	if !strings.HasPrefix(h.LastError, "failover: Authorizer failed: token ") || strings.Contains(h.LastError, secret) {
		t.Errorf("a's last error %q, want the Authorizer's, scrubbed", h.LastError)
	}
	if out := logs.String(); strings.Contains(out, secret) || !strings.Contains(out, "Authorizer failed") {
		t.Errorf("the log shows the token, or not the failure:\n%s", out)
	}
}

// With no other upstream, the Authorizer's error is the request's: an
// *Error naming the upstream, matching ErrAuthorize and the Authorizer's
// error, its message scrubbed. A body that cannot be replayed comes
// without GetBody, and the caller's body is closed.
func TestAuthorizerErrorAlone(t *testing.T) {
	const secret = "sig-0123456789abcdef"
	errSTS := errors.New("sts unavailable")
	srv := newUpstreamServer(t, 200, "a")
	tr := newTestTransport(t, Config{MaxBodyBuffer: -1, Upstreams: []Upstream{
		{Name: "a", BaseURL: srv.URL, Authorizer: AuthorizerFunc(func(req *http.Request) error {
			if req.GetBody != nil {
				return errors.New("GetBody is set for a body that cannot be replayed")
			}
			req.Header.Set("X-Amz-Security-Token", secret)
			return fmt.Errorf("signing with %s: %w", secret, errSTS)
		})},
	}})
	body := &closeCounter{Reader: strings.NewReader(chatBody)}
	req := httptestRequest("POST", srv.URL+"/chat/completions", "")
	req.Body = body
	resp, err := tr.RoundTrip(req)
	if resp != nil {
		resp.Body.Close()
		t.Fatalf("got a %d answer, want an error", resp.StatusCode)
	}
	var e *Error
	if !errors.As(err, &e) || len(e.Attempts) != 1 || e.Attempts[0].Upstream != "a" {
		t.Fatalf("err %v, want an *Error with a's attempt", err)
	}
	if !errors.Is(err, ErrAuthorize) || !errors.Is(err, errSTS) {
		t.Errorf("err %v matches ErrAuthorize %v and the Authorizer's error %v, want both",
			err, errors.Is(err, ErrAuthorize), errors.Is(err, errSTS))
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the error shows the token: %v", err)
	}
	if body.closed == 0 {
		t.Error("the caller's body was not closed")
	}
	if srv.count() != 0 {
		t.Errorf("the upstream got %d requests, want none", srv.count())
	}
}

// A panic in an Authorizer is an error: the request fails over, the panic
// is reported scrubbed, and the circuit's permit goes back, so that a
// half-open circuit whose probe panicked lets the next request probe.
func TestAuthorizerPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const secret = "tok-panic-0123456789"
		n := newFakeNet()
		var down atomic.Bool
		down.Store(true)
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if down.Load() {
				return respond(503, "down"), nil
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		var panics atomic.Bool
		var logs logBuffer
		cfg := twoUpstreams(n, Config{Logger: newLogger(&logs), Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second}})
		cfg.Upstreams[0].Authorizer = AuthorizerFunc(func(req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+secret)
			if panics.Load() {
				panic("cannot sign with " + secret)
			}
			return nil
		})
		tr := newTestTransport(t, cfg)
		defer tr.Close()
		send := func() string {
			t.Helper()
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/models", ""))
			if err != nil {
				t.Fatal(err)
			}
			return readBody(t, resp)
		}
		send() // a's 503 opens its circuit
		if h := tr.Health()[0]; h.State != "open" {
			t.Fatalf("a is %s, want open", h.State)
		}
		time.Sleep(2 * time.Second)
		down.Store(false)
		panics.Store(true)
		if got := send(); got != "b" {
			t.Fatalf("answer %q, want b's after a's Authorizer panicked", got)
		}
		panics.Store(false)
		if got := send(); got != "a" {
			t.Fatalf("answer %q, want a's: its probe permit went back", got)
		}
		out := logs.String()
		if !strings.Contains(out, "panic in the Authorizer of a") || strings.Contains(out, secret) {
			t.Errorf("the panic is not reported, or shows the token:\n%s", out)
		}
		if got := n.count("a.test"); got != 2 {
			t.Errorf("a got %d requests, want 2", got)
		}
	})
}

// A probe carries the Authorizer's credentials; when the Authorizer
// fails, the probe is not sent and the failure is logged, scrubbed.
func TestAuthorizerProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const secret = "tok-probe-0123456789"
		n := newFakeNet()
		n.status("a.test", 200, "a")
		n.status("b.test", 200, "b")
		var failing atomic.Bool
		var logs logBuffer
		cfg := twoUpstreams(n, Config{Logger: newLogger(&logs), Probe: ProbeConfig{Interval: time.Second}})
		cfg.Upstreams[0].Authorizer = AuthorizerFunc(func(req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+secret)
			if failing.Load() {
				return errors.New("refused " + secret)
			}
			return nil
		})
		tr := newTestTransport(t, cfg)
		defer tr.Close()
		time.Sleep(1500 * time.Millisecond)
		got := n.requests("a.test")
		if len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+secret {
			t.Fatalf("a got %+v, want one probe with the Authorizer's token", got)
		}
		failing.Store(true)
		time.Sleep(time.Second)
		if got := n.count("a.test"); got != 1 {
			t.Errorf("a got %d probes, want none more once its Authorizer fails", got-1)
		}
		out := logs.String()
		if !strings.Contains(out, "probe: failover: Authorizer failed: refused") || strings.Contains(out, secret) {
			t.Errorf("the probe's failure is not logged, or shows the token:\n%s", out)
		}
		if h := tr.Health()[0]; h.State != "closed" {
			t.Errorf("a is %s, want closed", h.State)
		}
	})
}

// An upstream with an Authorizer has credentials of its own: its 401 is an
// answer like any upstream's (AuthFailed), not the refusal of a backup
// with none.
func TestAuthorizerCountsAsCredentials(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 401, `{"error":"bad token"}`)
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Authorizer: AuthorizerFunc(func(req *http.Request) error {
			req.Header.Set("Authorization", "Bearer backup-token-0123456789")
			return nil
		})},
	}})
	req := httptestRequest("GET", primary.URL+"/v1/models", "")
	req.Header.Set("Authorization", "Bearer caller-key-123")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("status %d, want the backup's 401", resp.StatusCode)
	}
	if h := tr.Health()[1]; len(h.Problems) != 0 || h.Requests.AuthFailed != 1 {
		t.Errorf("backup: problems %q, AuthFailed %d; want none and 1", h.Problems, h.Requests.AuthFailed)
	}
}

// New refuses an Authorizer that holds a nil func.
func TestNewRefusesNilAuthorizer(t *testing.T) {
	_, err := New(Config{Upstreams: []Upstream{
		{BaseURL: "http://a.test"},
		{BaseURL: "http://b.test", Authorizer: AuthorizerFunc(nil)},
	}})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Upstreams[1].Authorizer" {
		t.Fatalf("New: %v, want a *ConfigError for Upstreams[1].Authorizer", err)
	}
}

// A hedge is an attempt like any other: its upstream's Authorizer signs
// it, on the hedge's goroutine, and the first attempt's token stays with
// the first upstream.
func TestAuthorizerHedged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done() // silent until the hedge wins
			return nil, r.Context().Err()
		})
		n.status("b.test", 200, "b")
		cfg := twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 100 * time.Millisecond, Percent: 100}})
		for i, name := range []string{"a", "b"} {
			cfg.Upstreams[i].Authorizer = AuthorizerFunc(func(req *http.Request) error {
				req.Header.Set("Authorization", "Bearer tok-"+name+"-0123456789")
				return nil
			})
		}
		tr := newTestTransport(t, cfg)
		defer tr.Close()
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/chat/completions", chatBody))
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); got != "b" {
			t.Fatalf("answer %q, want the hedge's", got)
		}
		a, b := n.requests("a.test"), n.requests("b.test")
		if len(a) != 1 || a[0].Header.Get("Authorization") != "Bearer tok-a-0123456789" {
			t.Errorf("a got %+v", a)
		}
		if len(b) != 1 || b[0].Header.Get("Authorization") != "Bearer tok-b-0123456789" {
			t.Errorf("b got %+v, want the hedge with b's token only", b)
		}
	})
}

// A slow Authorizer (a token endpoint that hangs) is bounded by the
// attempt's timeout, as the upstream's answer would be: its request's
// context ends, the request moves on to the next upstream, and the
// upstream, which was sent nothing, is not blamed.
func TestAuthorizerSlowTimesOut(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Timeouts
		ctx  func(context.Context) context.Context
	}{
		{"Timeouts.Attempt", Timeouts{Attempt: 5 * time.Second}, func(ctx context.Context) context.Context { return ctx }},
		{"WithAttemptTimeout", Timeouts{}, func(ctx context.Context) context.Context { return WithAttemptTimeout(ctx, 5*time.Second) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				n.status("a.test", 200, "a")
				n.status("b.test", 200, "b")
				cfg := twoUpstreams(n, Config{Timeouts: tt.cfg})
				cfg.Upstreams[0].Authorizer = AuthorizerFunc(func(req *http.Request) error {
					<-req.Context().Done()
					return req.Context().Err()
				})
				tr := newTestTransport(t, cfg)
				ctx, cancel := context.WithTimeout(tt.ctx(context.Background()), time.Minute)
				defer cancel()
				start := time.Now()
				resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", "").WithContext(ctx))
				if err != nil {
					t.Fatalf("after %v: %v, want the backup's answer", time.Since(start), err)
				}
				if got := readBody(t, resp); got != "b" || time.Since(start) != 5*time.Second {
					t.Fatalf("answered %q after %v, want b after the attempt's 5s", got, time.Since(start))
				}
				if n.count("a.test") != 0 {
					t.Fatal("a was sent the request")
				}
				if h := tr.Health()[0]; h.BreakerFailures != 0 || h.Requests.Failed != 0 || !strings.Contains(h.LastError, ErrAttemptTimeout.Error()) {
					t.Fatalf("a: breaker failures %d, counts %+v, last error %q; want not blamed, timed out", h.BreakerFailures, h.Requests, h.LastError)
				}
			})
		})
	}
}
