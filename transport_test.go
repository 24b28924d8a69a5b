package failover

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/VictoriaMetrics/metrics"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/failovertest"
	"go.uber.org/goleak"
)

func TestFailoverOn5xx(t *testing.T) {
	for _, code := range []int{500, 502, 503, 504, 529, 408} {
		primary := newUpstreamServer(t, code, `{"error":{"type":"overloaded_error"}}`)
		backup := newUpstreamServer(t, 200, `{"id":"chatcmpl-1"}`)
		tr := newTestTransport(t, Config{Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/openai/v1"},
		}})
		resp := mustPost(t, tr, primary.URL+"/v1/chat/completions?api-version=2024", chatBody)
		if resp.StatusCode != 200 || readBody(t, resp) != `{"id":"chatcmpl-1"}` {
			t.Fatalf("%d: got %d, want the backup's 200", code, resp.StatusCode)
		}
		got := backup.requests()
		if len(got) != 1 {
			t.Fatalf("%d: backup got %d requests, want 1", code, len(got))
		}
		if got[0].Path != "/openai/v1/chat/completions" || got[0].RawQuery != "api-version=2024" || got[0].Body != chatBody || got[0].Method != "POST" {
			t.Errorf("%d: backup saw %s %s?%s body %q", code, got[0].Method, got[0].Path, got[0].RawQuery, got[0].Body)
		}
		if got[0].Host != strings.TrimPrefix(backup.URL, "http://") {
			t.Errorf("%d: backup saw Host %q", code, got[0].Host)
		}
		if h := tr.Health(); h[0].Requests.Failed != 1 || h[1].Requests.Success != 1 {
			t.Errorf("%d: health counts %+v %+v", code, h[0].Requests, h[1].Requests)
		}
	}
}

func TestCallerErrorIsReturnedAsIs(t *testing.T) {
	for _, code := range []int{400, 404, 409, 413, 422} {
		primary := newUpstreamServer(t, code, `{"error":{"message":"bad request"}}`)
		backup := newUpstreamServer(t, 200, "ok")
		tr := newTestTransport(t, Config{Upstreams: []Upstream{{BaseURL: primary.URL}, {BaseURL: backup.URL}}})
		resp := mustPost(t, tr, primary.URL+"/v1/chat/completions", chatBody)
		if resp.StatusCode != code || readBody(t, resp) != `{"error":{"message":"bad request"}}` {
			t.Fatalf("got %d, want the primary's %d", resp.StatusCode, code)
		}
		if backup.count() != 0 {
			t.Fatalf("%d: backup got %d requests, want none", code, backup.count())
		}
		h := tr.Health()[0]
		if h.Requests.Rejected != 1 || h.SuccessRate != 1 {
			t.Errorf("%d: primary health %+v, want 1 rejected and success rate 1", code, h)
		}
	}
}

func TestAuthFailure(t *testing.T) {
	const key1, key2 = "sk-primary-secret-1111", "sk-backup-secret-2222"
	primary := newUpstreamServer(t, 401, `{"error":{"code":"invalid_api_key"}}`)
	backup := newUpstreamServer(t, 200, "served")
	var logs logBuffer
	tr := newTestTransport(t, Config{
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL, Header: http.Header{"Authorization": {"Bearer " + key1}}},
			{Name: "backup", BaseURL: backup.URL, Header: http.Header{"Authorization": {"Bearer " + key2}}},
		},
		Breaker: BreakerConfig{FailureThreshold: 2},
		Logger:  newLogger(&logs),
	})
	for range 5 {
		resp := mustGet(t, tr, primary.URL+"/v1/models")
		if got := readBody(t, resp); got != "served" {
			t.Fatalf("body %q, want the backup's", got)
		}
	}
	// After Auth.Threshold (3) refusals in a row the primary is tried
	// last, so the last two requests go to the backup first.
	h := tr.Health()
	if h[0].State != "closed" || h[0].Trips != 0 || h[0].Requests.AuthFailed != 3 || h[0].Demoted != ReasonAuthFailing {
		t.Fatalf("primary after 5 requests: state %s trips %d auth %d demoted %q; a 401 must never trip, 3 must demote", h[0].State, h[0].Trips, h[0].Requests.AuthFailed, h[0].Demoted)
	}
	out := logs.String()
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "upstream=primary") || !strings.Contains(out, "status=401") {
		t.Errorf("auth failure not logged at error level with the upstream's name:\n%s", out)
	}
	if strings.Contains(out, key1) || strings.Contains(out, key2) {
		t.Errorf("a key appears in the log:\n%s", out)
	}

	// When no upstream accepts its key, the caller sees the answer of the
	// last one tried: the demoted primary's 401, after the backup's 403.
	backup.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(403)
		io.WriteString(w, "forbidden")
	})
	resp := mustGet(t, tr, primary.URL+"/v1/models")
	if resp.StatusCode != 401 || readBody(t, resp) != `{"error":{"code":"invalid_api_key"}}` {
		t.Fatalf("every upstream refusing: got %d, want the last answer, the primary's 401", resp.StatusCode)
	}
}

func TestEveryUpstreamUnavailable(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 429, "a busy", "Retry-After", "20")
	n.status("b.test", 429, "b busy", "Retry-After-Ms", "7000")
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test"}}})

	// The last attempt got a response: the caller gets it, not an error.
	resp := mustGet(t, tr, "http://a.test/x")
	if resp.StatusCode != 429 || readBody(t, resp) != "b busy" {
		t.Fatalf("got %d, want the last upstream's 429", resp.StatusCode)
	}
	// Now both cool down: nothing is sent, and the error says when to
	// come back.
	_, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/x", ""))
	var ferr *Error
	if !errors.As(err, &ferr) || !errors.Is(err, ErrRateLimited) || errors.Is(err, ErrCircuitOpen) {
		t.Fatalf("err = %v, want an *Error matching ErrRateLimited only", err)
	}
	if ra := ferr.RetryAfter(); ra <= 6*time.Second || ra > 7*time.Second {
		t.Fatalf("RetryAfter = %v, want the earliest cooldown, about 7s", ra)
	}
	if len(ferr.Attempts) != 2 || ferr.Attempts[0].Upstream != "a" || ferr.Attempts[1].Upstream != "b" {
		t.Fatalf("attempts = %v", ferr.Attempts)
	}
	if n.count("a.test") != 1 || n.count("b.test") != 1 {
		t.Fatal("a cooling upstream was sent a request")
	}
}

func TestLastResponseWinsOverLaterError(t *testing.T) {
	primary := newUpstreamServer(t, 503, "primary down")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{BaseURL: primary.URL}, {BaseURL: failovertest.ClosedURL(t)}}})
	resp := mustGet(t, tr, primary.URL+"/v1/models")
	if resp.StatusCode != 503 || readBody(t, resp) != "primary down" {
		t.Fatalf("got %d, want the primary's 503 (an upstream answered)", resp.StatusCode)
	}
}

func TestNoUpstreamAnswered(t *testing.T) {
	const key = "sk-caller-secret-xyz"
	a, b := failovertest.ClosedURL(t), failovertest.ClosedURL(t)
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "a", BaseURL: a, Header: http.Header{"Authorization": {"Bearer sk-config-secret-123"}}},
		{Name: "b", BaseURL: b},
	}})
	req := httptestRequest("GET", a+"/v1/models?key="+key, "")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := tr.RoundTrip(req)
	if resp != nil {
		t.Fatalf("got a response from closed ports: %d", resp.StatusCode)
	}
	var ferr *Error
	if !errors.As(err, &ferr) || len(ferr.Attempts) != 2 {
		t.Fatalf("err = %v, want an *Error with two attempts", err)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("err = %v, want it to match ECONNREFUSED", err)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		t.Errorf("RoundTrip returned a *url.Error: http.Client adds that")
	}
	if msg := err.Error(); strings.Contains(msg, key) || strings.Contains(msg, "sk-config") {
		t.Errorf("error message carries a key: %s", msg)
	}
	for _, h := range tr.Health() {
		if h.LastError == "" || strings.Contains(h.LastError, key) {
			t.Errorf("health last error %q", h.LastError)
		}
	}
}

func TestCallerCancellation(t *testing.T) {
	release := make(chan struct{})
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{BaseURL: primary.URL}, {BaseURL: backup.URL}}})
	ctx, cancel := context.WithCancel(context.Background())
	req := httptestRequest("POST", primary.URL+"/v1/chat/completions", chatBody).WithContext(ctx)
	go func() {
		for primary.count() == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	resp, err := tr.RoundTrip(req)
	if resp != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, %v; want context.Canceled", resp, err)
	}
	if backup.count() != 0 {
		t.Fatal("a canceled request failed over")
	}
	h := tr.Health()[0]
	if h.Requests.Canceled != 1 || h.Requests.Failed != 0 || h.BreakerFailures != 0 {
		t.Fatalf("primary counts %+v, breaker failures %d: a cancellation is nobody's failure", h.Requests, h.BreakerFailures)
	}

	// A context that is already done sends nothing.
	req = httptestRequest("GET", primary.URL+"/v1/models", "").WithContext(ctx)
	if _, err := tr.RoundTrip(req); !errors.Is(err, context.Canceled) {
		t.Fatalf("done context: err = %v", err)
	}
	if primary.count() != 1 {
		t.Fatal("a request with a done context was sent")
	}
}

// Closing the request's Cancel channel (deprecated, but what http.Client
// closes for its Timeout in front of a RoundTripper not its own) is the
// caller's cancellation too: it blames no upstream and fails over to none.
func TestCallerCancelChannel(t *testing.T) {
	release := make(chan struct{})
	hang := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
	primary, backup := newServer(t, hang), newServer(t, hang)
	defer close(release)
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{BaseURL: primary.URL}, {BaseURL: backup.URL}}})
	cancel := make(chan struct{})
	req := httptestRequest("POST", primary.URL+"/v1/chat/completions", chatBody)
	req.Cancel = cancel
	go func() {
		for primary.count() == 0 {
			time.Sleep(time.Millisecond)
		}
		close(cancel)
	}()
	resp, err := tr.RoundTrip(req)
	var e *Error
	if resp != nil || err == nil || errors.As(err, &e) {
		t.Fatalf("got %v, %v; want net/http's own error for the cancellation", resp, err)
	}
	if backup.count() != 0 {
		t.Fatal("a canceled request failed over")
	}
	if h := tr.Health()[0]; h.Requests.Canceled != 1 || h.Requests.Failed != 0 || h.BreakerFailures != 0 {
		t.Fatalf("primary counts %+v, breaker failures %d: a cancellation is nobody's failure", h.Requests, h.BreakerFailures)
	}

	// http.Client's Timeout closes the channel as its deadline passes.
	client := &http.Client{Transport: tr, Timeout: 20 * time.Millisecond}
	for range 20 {
		if resp, err := client.Get(primary.URL + "/v1/models"); err == nil {
			resp.Body.Close()
		}
	}
	for _, h := range tr.Health() {
		if h.Requests.Failed != 0 || h.BreakerFailures != 0 {
			t.Errorf("%s counts %+v, breaker failures %d after Client.Timeout: the caller's deadline is nobody's failure", h.Name, h.Requests, h.BreakerFailures)
		}
	}
}

func TestUnroutedRequestPassesThrough(t *testing.T) {
	other := newUpstreamServer(t, 200, "other")
	primary := newUpstreamServer(t, 200, "primary")
	tr := newTestTransport(t, Config{Unrouted: UnroutedPass, Upstreams: []Upstream{
		{BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer upstream-key-1234"}}},
	}})
	for _, u := range []string{
		other.URL + "/v1/models",   // another host
		primary.URL + "/v2/models", // outside the base path
		primary.URL + "/v1x",       // a prefix that is not a path segment
		primary.URL + "/v1/../admin",
		primary.URL + "/v1/%2e%2e/admin",
		primary.URL + "/v1/..%5Cadmin", // some servers read '\' as '/'
	} {
		req := httptestRequest("GET", u, "")
		req.Header.Set("Authorization", "Bearer caller")
		resp, err := do(t, tr, req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for _, s := range append(other.requests(), primary.requests()...) {
		if got := s.Header.Get("Authorization"); got != "Bearer caller" {
			t.Errorf("unrouted request to %s got Authorization %q, want the caller's own", s.Path, got)
		}
	}
	if got := tr.Health()[0].Requests.Total(); got != 0 {
		t.Errorf("unrouted requests counted against the upstream: %d", got)
	}
}

// The caller's request, headers and body are unchanged after RoundTrip, even
// across failovers and retries (run with -race: attempts must not write to
// shared state).
func TestRequestUnchanged(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer primary-key-1234"}, "X-Extra": {"1"}}},
		{BaseURL: backup.URL + "/compat/v1", Header: http.Header{"Authorization": {"Bearer backup-key-5678"}}},
	}})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", primary.URL+"/v1/chat/completions?x=1", strings.NewReader(chatBody))
			req.Header.Set("Authorization", "Bearer caller-key")
			req.Header.Set("X-Api-Key", "caller-key-2")
			req.Header["lowercase-key"] = []string{"v"}
			before := snapshot(req)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if after := snapshot(req); !reflect.DeepEqual(before, after) {
				t.Errorf("request changed:\nbefore %+v\nafter  %+v", before, after)
			}
			b, _ := req.GetBody()
			if got, _ := io.ReadAll(b); string(got) != chatBody {
				t.Errorf("GetBody now gives %q", got)
			}
		}()
	}
	wg.Wait()
}

type reqSnapshot struct {
	Method, URL, Host string
	Header            http.Header
	ContentLength     int64
	Body              io.ReadCloser
}

func snapshot(r *http.Request) reqSnapshot {
	return reqSnapshot{r.Method, r.URL.String(), r.Host, r.Header.Clone(), r.ContentLength, r.Body}
}

type readCounter struct {
	r io.Reader
	n int64
}

func (c *readCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
func (c *readCounter) Close() error { return nil }

// A stream reaches the caller event by event: the caller reads the first
// event while the upstream has not yet written the second, and an attempt
// timeout shorter than the stream does not cut it.
func TestStreamingPassesThrough(t *testing.T) {
	// In a bubble, over a body that fails once its request's context is
	// done, as net/http's does: the backup's headers had to come within
	// the 50ms AttemptTimeout of wall clock, which a loaded machine could
	// overrun.
	synctest.Test(t, func(t *testing.T) {
		firstRead := make(chan struct{})
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.handle("b.test", func(r *http.Request) (*http.Response, error) {
			pr, pw := io.Pipe()
			go func() {
				ctx := r.Context()
				io.WriteString(pw, "data: one\n\n") // content: no holding
				select {
				case <-firstRead:
				case <-ctx.Done():
					pw.CloseWithError(ctx.Err())
					return
				}
				select {
				case <-time.After(150 * time.Millisecond): // longer than AttemptTimeout
				case <-ctx.Done():
					pw.CloseWithError(ctx.Err())
					return
				}
				io.WriteString(pw, "data: {\"n\":2}\n\ndata: [DONE]\n\n")
				pw.Close()
			}()
			resp := respond(200, "", "Content-Type", "text/event-stream")
			resp.Body, resp.ContentLength = pr, -1
			return resp, nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{AttemptTimeout: 50 * time.Millisecond}))
		resp := mustPost(t, tr, "http://a.test/v1/chat/completions", `{"stream":true}`)
		defer resp.Body.Close()
		buf := make([]byte, 64)
		n0, err := resp.Body.Read(buf)
		if err != nil || !bytes.HasPrefix(buf[:n0], []byte("data: one")) {
			t.Fatalf("first read %q, %v", buf[:n0], err)
		}
		close(firstRead)
		rest, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("the stream was cut: %v", err)
		}
		if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
			t.Fatalf("rest of stream %q", rest)
		}
	})
}

func TestReset(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 429, "busy", "Retry-After", "60")
	tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1}, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test"},
	}})
	resp, _ := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
	resp.Body.Close()
	if h := tr.Health(); h[0].State != "open" || h[1].Cooldown == 0 {
		t.Fatalf("setup: %+v", h)
	}
	if err := tr.Reset("a"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Reset("b"); err != nil {
		t.Fatal(err)
	}
	if h := tr.Health(); h[0].State != "closed" || !h[0].Available || h[1].Cooldown != 0 || !h[1].Available {
		t.Fatalf("after Reset: %+v", h)
	}
	if err := tr.Reset("nope"); err == nil {
		t.Fatal("Reset of an unknown name succeeded")
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	ok := Upstream{BaseURL: "https://api.example.com/v1"}
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"no upstreams", Config{}, "Upstreams"},
		{"empty base", Config{Upstreams: []Upstream{{}}}, "Upstreams[0].BaseURL"},
		{"relative", Config{Upstreams: []Upstream{{BaseURL: "/v1"}}}, "Upstreams[0].BaseURL"},
		{"ftp", Config{Upstreams: []Upstream{ok, {BaseURL: "ftp://x/v1"}}}, "Upstreams[1].BaseURL"},
		{"no host", Config{Upstreams: []Upstream{{BaseURL: "https:///v1"}}}, "Upstreams[0].BaseURL"},
		{"user info", Config{Upstreams: []Upstream{{BaseURL: "https://u:p@x/v1"}}}, "Upstreams[0].BaseURL"},
		{"query", Config{Upstreams: []Upstream{{BaseURL: "https://x/v1?key=k"}}}, "Upstreams[0].BaseURL"},
		{"dot segment", Config{Upstreams: []Upstream{{BaseURL: "https://x/v1/../v2"}}}, "Upstreams[0].BaseURL"},
		{"duplicate name", Config{Upstreams: []Upstream{{Name: "x", BaseURL: "https://a"}, {Name: "x", BaseURL: "https://b"}}}, "Upstreams[1].Name"},
		{"duplicate host", Config{Upstreams: []Upstream{ok, ok}}, "Upstreams[1].Name"},
		{"header name", Config{Upstreams: []Upstream{{BaseURL: "https://a", Header: http.Header{"Bad Name": {"v"}}}}}, "Upstreams[0].Header"},
		{"header value", Config{Upstreams: []Upstream{{BaseURL: "https://a", Header: http.Header{"Authorization": {"k\r\nX: y"}}}}}, "Upstreams[0].Header"},
		{"negative timeout", Config{Upstreams: []Upstream{ok}, AttemptTimeout: -1}, "AttemptTimeout"},
		{"negative retries", Config{Upstreams: []Upstream{ok}, Retries: -1}, "Retries"},
		{"retry wait order", Config{Upstreams: []Upstream{ok}, RetryWaitMin: time.Minute, RetryWaitMax: time.Second}, "RetryWaitMin"},
		{"negative cooldown", Config{Upstreams: []Upstream{ok}, Breaker: BreakerConfig{Cooldown: -1}}, "Breaker.Cooldown"},
		{"negative breaker max cooldown", Config{Upstreams: []Upstream{ok}, Breaker: BreakerConfig{MaxCooldown: -1}}, "Breaker.MaxCooldown"},
		{"negative period", Config{Upstreams: []Upstream{ok}, Breaker: BreakerConfig{FailurePeriod: -1}}, "Breaker.FailurePeriod"},
		{"rate above 1", Config{Upstreams: []Upstream{ok}, Breaker: BreakerConfig{FailureRate: 1.5}}, "Breaker.FailureRate"},
		{"negative max wait", Config{Upstreams: []Upstream{ok}, RateLimit: RateLimitConfig{MaxWait: -1}}, "RateLimit.MaxWait"},
		{"negative max cooldown", Config{Upstreams: []Upstream{ok}, RateLimit: RateLimitConfig{MaxCooldown: -1}}, "RateLimit.MaxCooldown"},
		{"default above max", Config{Upstreams: []Upstream{ok}, RateLimit: RateLimitConfig{DefaultCooldown: time.Hour, MaxCooldown: time.Minute}}, "RateLimit.DefaultCooldown"},
		{"negative hedge delay", Config{Upstreams: []Upstream{ok}, Hedge: &HedgeConfig{Delay: -1}}, "Hedge.Delay"},
		{"hedge percent", Config{Upstreams: []Upstream{ok}, Hedge: &HedgeConfig{Percent: 150}}, "Hedge.Percent"},
		{"hedge delays", Config{Upstreams: []Upstream{ok}, Hedge: &HedgeConfig{MinDelay: time.Minute}}, "Hedge.MinDelay"},
		{"negative shared sync", Config{Upstreams: []Upstream{ok}, SharedSync: -1}, "SharedSync"},
		{"negative hedges", Config{Upstreams: []Upstream{ok}, Hedge: &HedgeConfig{MaxHedges: -1}}, "Hedge.MaxHedges"},
		{"negative continuations", Config{Upstreams: []Upstream{ok}, Continue: ContinueConfig{On: true, Max: -1}}, "Continue.Max"},
		{"many continuations", Config{Upstreams: []Upstream{ok}, Continue: ContinueConfig{Max: 5}}, "Continue.Max"},
		{"chat prefill", Config{Upstreams: []Upstream{{BaseURL: "https://a", Prefill: Prefill{Chat: 9}}}}, "Upstreams[0].Prefill.Chat"},
		{"prefill model", Config{Upstreams: []Upstream{ok, {BaseURL: "https://a", Prefill: Prefill{Messages: true, Models: []string{"m", ""}}}}}, "Upstreams[1].Prefill.Models[1]"},
		// Values that New accepted and that then crashed, spun or
		// exhausted memory (issue 12): a period of 5ns divided by zero in
		// failsafe-go on every request; failsafe-go keeps a bit per counted
		// execution; a 1ns probe interval or SharedSync spins.
		{"period in nanoseconds", Config{Upstreams: []Upstream{ok}, Breaker: BreakerConfig{FailureRate: 0.5, FailurePeriod: 5}}, "Breaker.FailurePeriod"},
		{"huge failure threshold", Config{Upstreams: []Upstream{ok}, Breaker: BreakerConfig{FailureThreshold: 1 << 40}}, "Breaker.FailureThreshold"},
		{"huge success threshold", Config{Upstreams: []Upstream{ok}, Breaker: BreakerConfig{SuccessThreshold: 1 << 40}}, "Breaker.SuccessThreshold"},
		{"probe interval in nanoseconds", Config{Upstreams: []Upstream{ok}, Probe: ProbeConfig{Interval: 1}}, "Probe.Interval"},
		{"shared sync in nanoseconds", Config{Upstreams: []Upstream{ok}, SharedSync: 1}, "SharedSync"},
		// 3×SharedSync, the rates' lifetime in the store, wrapped negative.
		{"shared sync of centuries", Config{Upstreams: []Upstream{ok}, SharedSync: math.MaxInt64}, "SharedSync"},
		{"shared sync past an hour", Config{Upstreams: []Upstream{ok}, SharedSync: time.Hour + 1}, "SharedSync"},
		{"huge retries", Config{Upstreams: []Upstream{ok}, Retries: 1 << 40}, "Retries"},
		{"huge hold", Config{Upstreams: []Upstream{ok}, StreamGuard: &StreamGuard{HoldBytes: 1 << 40}}, "StreamGuard.HoldBytes"},
		{"NaN cost", Config{Upstreams: []Upstream{{BaseURL: "https://a", Cost: Cost{Input: math.NaN()}}}}, "Upstreams[0].Cost"},
		{"infinite cost", Config{Upstreams: []Upstream{{BaseURL: "https://a", Cost: Cost{Output: math.Inf(1)}}}}, "Upstreams[0].Cost"},
		// A finite price whose answers cost +Inf: Health's JSON failed.
		{"huge cost", Config{Upstreams: []Upstream{{BaseURL: "https://a", Cost: Cost{Input: math.MaxFloat64}}}}, "Upstreams[0].Cost"},
		{"huge cache price", Config{Upstreams: []Upstream{{BaseURL: "https://a", Cost: Cost{CacheWrite: 1e101}}}}, "Upstreams[0].Cost"},
		{"NaN hang multiple", Config{Upstreams: []Upstream{ok}, Hang: HangConfig{Multiple: math.NaN()}}, "Hang.Multiple"},
		{"negative auth threshold", Config{Upstreams: []Upstream{ok}, Auth: AuthConfig{Threshold: -1}}, "Auth.Threshold"},
		{"negative auth for", Config{Upstreams: []Upstream{ok}, Auth: AuthConfig{For: -time.Second}}, "Auth.For"},
		// An interface that is not nil but holds a nil pointer or func:
		// New took it, and the first request (or the fleet's goroutine)
		// panicked.
		{"nil *http.Transport", Config{Upstreams: []Upstream{ok}, Base: (*http.Transport)(nil)}, "Base"},
		{"nil func Base", Config{Upstreams: []Upstream{ok}, Base: roundTripFunc(nil)}, "Base"},
		{"nil *Weighted", Config{Upstreams: []Upstream{ok}, Router: (*Weighted)(nil)}, "Router"},
		{"nil *LeastLatency", Config{Upstreams: []Upstream{ok}, Router: (*LeastLatency)(nil)}, "Router"},
		{"nil shared", Config{Upstreams: []Upstream{ok}, Shared: (*memShared)(nil)}, "Shared"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg)
		if err == nil {
			t.Errorf("%s: New succeeded", tt.name)
			continue
		}
		var cerr *ConfigError
		if !errors.As(err, &cerr) || cerr.Field != tt.field {
			t.Errorf("%s: error %q does not name Config.%s", tt.name, err, tt.field)
		}
		if strings.Contains(err.Error(), "k\r\n") {
			t.Errorf("%s: error quotes a header value", tt.name)
		}
	}
}

// A New that refuses its Config leaves the caller's metrics Set as it
// was: no series of a Transport that does not exist.
func TestNewRefusedRegistersNoMetrics(t *testing.T) {
	set := metrics.NewSet()
	_, err := New(Config{
		Metrics:   set,
		Hedge:     &HedgeConfig{Delay: time.Second},
		Shared:    newMemShared(),
		Upstreams: []Upstream{{BaseURL: "https://a.example/v1"}, {BaseURL: "ftp://b.example/v1"}},
	})
	if err == nil {
		t.Fatal("New took an ftp BaseURL")
	}
	var out strings.Builder
	set.WritePrometheus(&out)
	if out.Len() != 0 {
		t.Errorf("a refused New registered series:\n%s", out.String())
	}
}

// NewBreaker and NewRateLimiter refuse a next that is a nil pointer, which
// would panic at the first request; a nil next is http.DefaultTransport.
func TestLayersRefuseNilNext(t *testing.T) {
	if _, err := NewBreaker((*http.Transport)(nil), BreakerConfig{}, nil); err == nil || !strings.Contains(err.Error(), "*http.Transport") {
		t.Errorf("NewBreaker: %v, want an error naming the nil *http.Transport", err)
	}
	if _, err := NewRateLimiter((*http.Transport)(nil), RateLimitConfig{}); err == nil || !strings.Contains(err.Error(), "*http.Transport") {
		t.Errorf("NewRateLimiter: %v, want an error naming the nil *http.Transport", err)
	}
	if _, err := NewBreaker(nil, BreakerConfig{}, nil); err != nil {
		t.Errorf("NewBreaker(nil, ...): %v", err)
	}
}

// A hand-built request with no Header map is routed like any other.
func TestRequestWithoutHeader(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 200, "ok")
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{BaseURL: "http://a.test", Header: http.Header{"X-Api-Key": {"upstream-key"}}}}})
	u, _ := url.Parse("http://a.test/v1")
	resp, err := tr.RoundTrip(&http.Request{Method: "GET", URL: u})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := n.requests("a.test")[0].Header.Get("X-Api-Key"); got != "upstream-key" {
		t.Fatalf("X-Api-Key = %q", got)
	}
}

// The Transport composes with RoundTrippers below it (a recorder as Base)
// and above it (an SDK's middleware that sets the caller's key).
func TestComposesWithOtherRoundTrippers(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "ok")
	var mu sync.Mutex
	var recorded []string
	real := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(real.CloseIdleConnections)
	recorder := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		recorded = append(recorded, r.URL.String()+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		return real.RoundTrip(r)
	})
	tr := newTestTransport(t, Config{Base: recorder, Upstreams: []Upstream{
		{BaseURL: primary.URL + "/v1"},
		{BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer backup"}}},
	}})
	middleware := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer caller")
		return tr.RoundTrip(r)
	})
	resp := mustGet(t, middleware, primary.URL+"/v1/models")
	if readBody(t, resp) != "ok" {
		t.Fatal("not served by the backup")
	}
	want := []string{primary.URL + "/v1/models Bearer caller", backup.URL + "/v1/models Bearer backup"}
	if !reflect.DeepEqual(recorded, want) {
		t.Fatalf("recorded %q, want %q", recorded, want)
	}
}

// Memory stays bounded whatever the traffic: per-upstream state is fixed
// in size (windows, counters, metric handles), so heap in use after many
// more requests is where it was.
func TestMemoryBounded(t *testing.T) {
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Header.Get("X-Fail") != "" {
			return respond(503, "down"), nil
		}
		return respond(200, "ok"), nil
	})
	tr := newTestTransport(t, Config{Base: base, Retry: RetryConfig{Off: true}, Upstreams: []Upstream{{BaseURL: "http://a.test"}, {BaseURL: "http://b.test"}}})
	run := func(n int) {
		for i := range n {
			req := httptestRequest("POST", "http://a.test/v1/chat", chatBody)
			if i%100 == 0 {
				req.Header.Set("X-Fail", "1")
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	run(10_000)
	before := heap()
	run(100_000)
	after := heap()
	if after > before+2<<20 {
		t.Fatalf("heap in use grew from %d to %d bytes over 100,000 requests", before, after)
	}
	if got := tr.Health()[0].Requests.Total(); got != 110_000 {
		t.Fatalf("counted %d attempts at a, want 110000", got)
	}
}

// The healthy path allocates the attempt's parts (the clone of the
// request and the answer's Request among them), the clone's header map
// and the map's entries: nothing more. A change that moves the call, an attempt
// or a closure to the heap fails here, not only in a benchmark nobody
// reads.
//
// Each request is measured alone, only those that take nothing new from a
// pool count (perRequestAllocs), and of those the median: a pool's refill comes when the
// garbage collector emptied it, every cancelerUses requests (see ownCtx),
// and under -race at random (sync.Pool drops a quarter of what it is
// given), and work done once in a while (a new second of the health
// window) falls on whichever request is in flight, more often the slower
// the machine, so a count averaged over requests varied from run to run.
// The test runs in a process of its own, on one P: the counts are the
// whole process's, and goroutines that earlier tests left winding down
// counted too.
func TestHealthyPathAllocations(t *testing.T) {
	if os.Getenv(allocsChildEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHealthyPathAllocations$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), allocsChildEnv+"=1", "GOMAXPROCS=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestHealthyPathAllocations") {
			t.Fatalf("the measuring process: %v\n%s", err, out)
		}
		return
	}
	resp := respond(200, "")
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp.Body, resp.Request = http.NoBody, r // as net/http sets them
		return resp, nil
	})
	two := []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"}}
	for _, c := range []struct {
		cfg    Config
		allocs uint64
		bytes  uint64
	}{
		// The attempt, bounded by the default Timeouts, takes its parts
		// (the clone among them, and the answer's Request, which
		// ServedBy reads), its own context and the watch of its headers
		// in one allocation (timedParts, 1536 B), and the watch's timer
		// from a pool; then the header map (48 B) and its entries
		// (352 B).
		{Config{Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}}, 3, 1936},
		{Config{Base: base, Upstreams: two}, 3, 1936},
		// A Hedge that does not fire costs no allocation more (issue
		// 15): the attempt on the caller's goroutine, its parts, its own
		// context and its watch in one allocation with the round's
		// call, and its timers from pools.
		{Config{Base: base, Upstreams: two, Hedge: &HedgeConfig{Delay: time.Hour}}, 3, 2448},
	} {
		tr := newTestTransport(t, c.cfg)
		req := httptestRequest("GET", "http://a.test/v1/models", "")
		req.Header.Set("Authorization", "Bearer k")
		send := func() {
			// The caller closes the body, as it must: a hedged
			// attempt's context goes back to its pool only then.
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		send() // warm up: the health window and metrics
		name := fmt.Sprintf("%d upstreams, hedged %v", len(c.cfg.Upstreams), c.cfg.Hedge != nil)
		allocs, bytes := perRequestAllocs(t, 1001, send)
		if a := allocs[len(allocs)/2]; a > c.allocs {
			t.Errorf("%s: %d allocations for a request, want at most %d", name, a, c.allocs)
		}
		if b := bytes[len(bytes)/2]; b > c.bytes {
			t.Errorf("%s: %d bytes allocated for a request, want at most %d", name, b, c.bytes)
		}
	}
}

// allocsChildEnv marks the process TestHealthyPathAllocations measures in.
const allocsChildEnv = "FAILOVER_ALLOCS_CHILD"

var soakLong = flag.Bool("soak.long", false, "run the long soak: 100,000 requests instead of 5,000")

// soakUpstream is a loopback upstream that fails at random, on a seeded
// schedule, and checks every request it receives.
type soakUpstream struct {
	*httptest.Server
	name string

	mu     sync.Mutex
	rng    *rand.Rand
	seen   map[int]int                 // request id: attempts received
	wrong  []string                    // requests whose body is not their own
	active map[net.Conn]http.ConnState // open connections, idle ones too
}

func newSoakUpstream(t *testing.T, name string, seed uint64) *soakUpstream {
	u := &soakUpstream{name: name, rng: rand.New(rand.NewPCG(seed, seed)), seen: map[int]int{}, active: map[net.Conn]http.ConnState{}}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.Config.ConnState = func(c net.Conn, s http.ConnState) {
		u.mu.Lock()
		defer u.mu.Unlock()
		if s == http.StateClosed || s == http.StateHijacked {
			delete(u.active, c)
		} else {
			u.active[c] = s
		}
	}
	u.Start()
	t.Cleanup(u.Close)
	return u
}

func (u *soakUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	id, _ := strconv.Atoi(r.Header.Get("X-Req-Id"))
	u.mu.Lock()
	u.seen[id]++
	if !bytes.Equal(body, soakBody(id)) {
		u.wrong = append(u.wrong, fmt.Sprintf("request %d got body %.40q", id, body))
	}
	p := u.rng.IntN(100)
	u.mu.Unlock()
	switch {
	case p < 2:
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":"overloaded"}`)
	case p < 3:
		w.Header().Set("Retry-After-Ms", "20")
		w.WriteHeader(http.StatusTooManyRequests)
	case p < 4: // hangs until the attempt times out
		<-r.Context().Done()
	case p < 5: // resets the connection
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	default:
		fmt.Fprintf(w, `{"id":%d,"upstream":%q}`, id, u.name)
	}
}

func (u *soakUpstream) openConns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.active)
}

func soakBody(id int) []byte {
	return fmt.Appendf(nil, `{"model":"m","id":%d,"messages":[{"role":"user","content":"%s"}]}`, id, strings.Repeat("x", id%200))
}

// attemptCounter counts what reaches Base, to check Health and the metrics
// against.
type attemptCounter struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *attemptCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// Three upstreams failing at random (a seeded schedule), 50 concurrent
// callers: every request ends in exactly one documented way, no body goes
// to the wrong upstream, or twice to one but as its retry, the counts add up, and goroutines,
// connections and memory return to where they were.
func TestSoak(t *testing.T) {
	requests := 5_000
	if *soakLong {
		requests = 100_000
	}
	if testing.Short() {
		requests = 1_000
	}
	leaks := goleak.IgnoreCurrent()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	ups := []*soakUpstream{newSoakUpstream(t, "a", 1), newSoakUpstream(t, "b", 2), newSoakUpstream(t, "c", 3)}
	real := http.DefaultTransport.(*http.Transport).Clone()
	real.MaxIdleConnsPerHost = 64
	base := &attemptCounter{next: real}
	tr := newTestTransport(t, Config{
		Base:           base,
		AttemptTimeout: 300 * time.Millisecond,
		Breaker:        BreakerConfig{Cooldown: 200 * time.Millisecond},
		RateLimit:      RateLimitConfig{MaxWait: 100 * time.Millisecond},
		Upstreams: []Upstream{
			{Name: "a", BaseURL: ups[0].URL + "/v1", Header: http.Header{"Authorization": {"Bearer key-a-0123456789"}}},
			{Name: "b", BaseURL: ups[1].URL + "/v1", Header: http.Header{"Authorization": {"Bearer key-b-0123456789"}}},
			{Name: "c", BaseURL: ups[2].URL + "/v1", Header: http.Header{"Authorization": {"Bearer key-c-0123456789"}}},
		},
	})

	const deadline = 2 * time.Second
	var ok, answered, failed, timedOut atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				id := int(next.Add(1))
				if id > requests {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				req, _ := http.NewRequestWithContext(ctx, "POST", ups[0].URL+"/v1/chat/completions", bytes.NewReader(soakBody(id)))
				req.Header.Set("X-Req-Id", strconv.Itoa(id))
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				var ferr *Error
				switch {
				case err == nil && resp.StatusCode == 200:
					b, rerr := io.ReadAll(resp.Body)
					if rerr != nil || !bytes.HasPrefix(b, fmt.Appendf(nil, `{"id":%d,`, id)) {
						t.Errorf("request %d: got %q, %v", id, b, rerr)
					}
					ok.Add(1)
				case err == nil:
					answered.Add(1) // the provider's own 503 or 429
				case errors.As(err, &ferr):
					failed.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					timedOut.Add(1)
				default:
					t.Errorf("request %d: undocumented error %T %v", id, err, err)
				}
				if resp != nil {
					resp.Body.Close()
				}
				cancel()
				// A hang would be unbounded; the slack only absorbs a loaded
				// machine stalling the whole process (seen with -race).
				if took := time.Since(start); took > deadline+10*time.Second {
					t.Errorf("request %d took %v, past its %v deadline", id, took, deadline)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d requests: %d ok, %d provider answers, %d *Error, %d deadline", requests, ok.Load(), answered.Load(), failed.Load(), timedOut.Load())

	if sum := ok.Load() + answered.Load() + failed.Load() + timedOut.Load(); sum != int64(requests) {
		t.Fatalf("%d outcomes for %d requests", sum, requests)
	}
	// Three upstreams each failing 5 % leave about 0.01 % to fail, on an
	// idle machine; a loaded one (-race, other jobs) times out more and
	// trips breakers. The invariants above and below are the point; this
	// floor only catches a transport that stopped serving.
	if ok.Load() < int64(requests)/2 {
		t.Errorf("only %d of %d succeeded with three upstreams each failing 5%%", ok.Load(), requests)
	}
	for _, u := range ups {
		u.mu.Lock()
		for _, w := range u.wrong {
			t.Errorf("upstream %s: %s", u.name, w)
		}
		again := 0 // requests sent there twice: once more after a failure (RetryConfig)
		for id, n := range u.seen {
			if n > 2 {
				t.Errorf("upstream %s got request %d %d times", u.name, id, n)
			}
			again += n - 1
		}
		u.mu.Unlock()
		if retries := metricValue(t, tr, `failover_retries_total{upstream="`+u.name+`"}`); float64(again) > retries {
			t.Errorf("upstream %s got %d requests twice, but retried %v", u.name, again, retries)
		}
	}

	// Health, the metrics and Base agree on the attempts made.
	var health uint64
	for _, h := range tr.Health() {
		health += h.Requests.Total()
	}
	var m strings.Builder
	tr.WritePrometheus(&m)
	var metered uint64
	sc := bufio.NewScanner(strings.NewReader(m.String()))
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "failover_attempts_total{") {
			n, _ := strconv.ParseUint(line[strings.LastIndexByte(line, ' ')+1:], 10, 64)
			metered += n
		}
	}
	if sent := uint64(base.n.Load()); health != sent || metered != sent {
		t.Fatalf("attempts: Health %d, metrics %d, Base %d", health, metered, sent)
	}

	// Connections, goroutines and memory return to where they were.
	real.CloseIdleConnections() // the counter in between does not pass it on
	for _, u := range ups {
		for i := 0; u.openConns() > 0 && i < 100; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if n := u.openConns(); n != 0 {
			t.Errorf("upstream %s: %d connections still active", u.name, n)
		}
		u.Close()
	}
	goleak.VerifyNone(t, leaks)
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if after.HeapInuse > before.HeapInuse+8<<20 {
		t.Errorf("heap in use grew from %d to %d bytes", before.HeapInuse, after.HeapInuse)
	}
}

// A MaxBodyBuffer of the largest int64 buffers bodies like any other:
// MaxBodyBuffer+1 wrapped to a negative limit, which read nothing, and the
// request went out with an empty body.
func TestHugeMaxBodyBuffer(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 200, "b")
	tr := newTestTransport(t, twoUpstreams(n, Config{MaxBodyBuffer: math.MaxInt64}))
	req := httptestRequest("POST", "http://a.test/v1", "")
	req.Body = io.NopCloser(strings.NewReader(`{"model":"m"}`)) // no GetBody: the Transport buffers it
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, host := range []string{"a.test", "b.test"} {
		if got := n.requests(host)[0].Body; got != `{"model":"m"}` {
			t.Errorf("%s got body %q", host, got)
		}
	}
}

// A Retry-After too large for a Duration, on a 503 held between rounds,
// waits MaxCooldown: go-retryablehttp's DefaultBackoff multiplied it past
// int64 into a negative wait, and the rounds ran back to back.
func TestHugeRetryAfterBetweenRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		for _, h := range []string{"a.test", "b.test"} {
			n.status(h, 503, "down", "Retry-After", "9223372036854775807")
		}
		tr := newTestTransport(t, twoUpstreams(n, Config{Retries: 2, Breaker: BreakerConfig{FailureThreshold: 100}, RateLimit: RateLimitConfig{MaxCooldown: time.Minute}}))
		start := time.Now()
		code, err := get(t, tr, "http://a.test/")
		if code != 503 || err != nil {
			t.Fatalf("%d %v, want the held 503", code, err)
		}
		if got := time.Since(start); got != 2*time.Minute {
			t.Fatalf("2 more rounds after %v, want 2 waits of MaxCooldown", got)
		}
	})
}

// fuzzReader hands out the fuzzer's bytes as choices.
type fuzzReader struct {
	data []byte
	i    int
}

func (r *fuzzReader) byte() byte {
	if len(r.data) == 0 {
		return 0
	}
	b := r.data[r.i%len(r.data)]
	r.i++
	return b
}

func (r *fuzzReader) bool() bool { return r.byte()&1 == 1 }

// The values of each kind that break code written for the usual ones.
var (
	fuzzDurations = []time.Duration{0, 1, -1, 5, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second, time.Minute, time.Hour, 1<<63 - 1, -1 << 63}
	fuzzFloats    = []float64{0, 0.5, 1, -1, 2, 100, 1e-300, 1e300, math.NaN(), math.Inf(1), math.Inf(-1)}
	fuzzInts      = []int{0, 1, -1, 3, 20, 1000, 1001, math.MaxInt, math.MinInt}
	fuzzUints     = []uint{0, 1, 2, 5, 1000, 1001, math.MaxUint}
	fuzzInt64s    = []int64{0, -1, 1, 100, 64 << 10, math.MaxInt64, math.MinInt64}
)

func (r *fuzzReader) duration() time.Duration { return fuzzDurations[int(r.byte())%len(fuzzDurations)] }
func (r *fuzzReader) float() float64          { return fuzzFloats[int(r.byte())%len(fuzzFloats)] }
func (r *fuzzReader) int() int                { return fuzzInts[int(r.byte())%len(fuzzInts)] }
func (r *fuzzReader) uint() uint              { return fuzzUints[int(r.byte())%len(fuzzUints)] }
func (r *fuzzReader) int64() int64            { return fuzzInt64s[int(r.byte())%len(fuzzInt64s)] }

// fuzzConfig builds a whole Config from r: every numeric field of every
// config from the kinds' extreme values.
func fuzzConfig(r *fuzzReader, base http.RoundTripper) Config {
	cfg := Config{
		Base: base,
		Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test/v1", Weight: r.float(), Cost: Cost{Input: r.float(), Output: r.float()}},
			{Name: "b", BaseURL: "http://b.test/v1", Weight: r.float(), Models: map[string]string{"*": "*"}},
		},
		Breaker: BreakerConfig{
			FailureThreshold: r.uint(), FailureRate: r.float(), MinRequests: r.uint(),
			FailurePeriod: r.duration(), Cooldown: r.duration(), SuccessThreshold: r.uint(),
		},
		RateLimit:      RateLimitConfig{DefaultCooldown: r.duration(), MaxCooldown: r.duration(), MaxWait: r.duration()},
		Retries:        r.int(),
		RetryWaitMin:   r.duration(),
		RetryWaitMax:   r.duration(),
		Hang:           HangConfig{Off: r.bool(), MinInFlight: r.int(), Multiple: r.float(), Floor: r.duration(), Window: r.duration(), MinSamples: r.int()},
		Auth:           AuthConfig{Off: r.bool(), Threshold: r.int(), For: r.duration()},
		Degraded:       DegradedConfig{Latency: r.duration(), SuccessRate: r.float(), Window: r.duration(), MinSamples: r.int()},
		AttemptTimeout: r.duration(),
		MaxBodyBuffer:  r.int64(),
		Unrouted:       UnroutedPolicy(r.int()),
	}
	if r.bool() {
		cfg.Probe = ProbeConfig{Interval: r.duration(), Timeout: r.duration()}
	}
	if r.bool() {
		cfg.StreamGuard = &StreamGuard{FirstByteTimeout: r.duration(), HoldEvents: r.int(), HoldBytes: r.int()}
	}
	if r.bool() {
		cfg.Hedge = &HedgeConfig{Delay: r.duration(), MinDelay: r.duration(), MaxDelay: r.duration(), MaxHedges: r.int(), Percent: r.float(), Window: r.duration(), MinSamples: r.int()}
	}
	switch r.byte() % 5 {
	case 1:
		cfg.Router = Priority{}
	case 2:
		cfg.Router = &Weighted{}
	case 3:
		cfg.Router = LeastLatency{}
	case 4:
		cfg.Router = Score{}
	}
	// Each upstream's own policy, read last, so that the seeds' first
	// bytes make the configs they made before.
	for i := range cfg.Upstreams {
		if r.bool() {
			cfg.Upstreams[i].Breaker = &BreakerConfig{
				FailureThreshold: r.uint(), FailureRate: r.float(), MinRequests: r.uint(),
				FailurePeriod: r.duration(), Cooldown: r.duration(), SuccessThreshold: r.uint(),
			}
		}
		cfg.Upstreams[i].AttemptTimeout = r.duration()
	}
	// Read after all else, for the same reason.
	cfg.Breaker.MaxCooldown = r.duration()
	for i := range cfg.Upstreams {
		if b := cfg.Upstreams[i].Breaker; b != nil {
			b.MaxCooldown = r.duration()
		}
	}
	return cfg
}

// fuzzRetryAfters are Retry-After values an upstream may send.
var fuzzRetryAfters = []string{"", "0", "-1", "1", "1.5", "99999999999999999999", "9223372036854775807", "Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 1900 00:00:00 GMT", "abc"}

// scriptedBase answers as the script in r says: successes, 5xx, 529, 429s with
// odd Retry-After and retry-after-ms values, refused connections, hangs
// until the attempt ends, and event streams.
func scriptedBase(r *fuzzReader) roundTripFunc {
	var mu sync.Mutex
	return func(req *http.Request) (*http.Response, error) {
		if req.Body != nil {
			io.Copy(io.Discard, req.Body)
			req.Body.Close()
		}
		mu.Lock()
		kind, ra, ms := r.byte()%8, fuzzRetryAfters[int(r.byte())%len(fuzzRetryAfters)], r.float()
		mu.Unlock()
		switch kind {
		case 0, 1:
			return respond(200, `{"choices":[]}`, "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", ra), nil
		case 2:
			return respond(503, "down", "Retry-After", ra), nil
		case 3:
			return respond(529, `{"type":"error","error":{"type":"overloaded_error"}}`), nil
		case 4:
			return respond(429, `{"error":{"retryDelay":"`+ra+`s"}}`, "Retry-After", ra, "Retry-After-Ms", strconv.FormatFloat(ms, 'g', -1, 64)), nil
		case 5:
			return nil, errors.New("dial tcp: connection refused")
		case 6:
			<-req.Context().Done()
			return nil, req.Context().Err()
		}
		return respond(200, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n", "Content-Type", "text/event-stream"), nil
	}
}

// No Config makes New panic, and every Config New accepts serves a few
// hundred requests through a scripted Base without a panic or a hang: each
// request ends, by its deadline at the latest (in virtual time, so that
// a minute of timeouts, probes and cooldowns passes at once), and Close
// ends every goroutine the Transport started (synctest fails on one left).
func FuzzConfig(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add([]byte("the 5ns period: rate 0.5, period 5"))
	f.Add([]byte{0xff, 0x00, 0x7f, 0x80, 0x01, 0xfe, 0x10, 0x20, 0x33, 0x44, 0x55, 0x66, 0x77})
	// Every other field zero (fuzzConfig reads 33 bytes before the
	// upstreams' policies), the primary with FailureThreshold 2, the
	// longest Cooldown and a 1ns AttemptTimeout, the backup with
	// FailureThreshold 1, a 1ns Cooldown and the longest AttemptTimeout.
	f.Add(append(make([]byte, 33), 1, 2, 0, 0, 0, 10, 0, 1, 1, 1, 0, 0, 0, 1, 0, 10))
	f.Fuzz(func(t *testing.T, data []byte) {
		synctest.Test(t, func(t *testing.T) {
			r := &fuzzReader{data: data}
			cfg := fuzzConfig(r, scriptedBase(&fuzzReader{data: data, i: len(data) / 2}))
			tr, err := New(cfg)
			if err != nil {
				var cerr *ConfigError
				if !errors.As(err, &cerr) || cerr.Field == "" {
					t.Fatalf("New refused a config with %v, not a ConfigError naming the field", err)
				}
				return
			}
			defer tr.Close()
			const deadline = time.Minute
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 50 {
						ctx, cancel := context.WithTimeout(context.Background(), deadline)
						req := httptestRequest("POST", "http://a.test/v1/chat/completions", `{"model":"m","stream":true}`)
						if (w+i)%2 == 0 {
							req.GetBody = nil // the Transport buffers it, or not
						}
						start := time.Now()
						resp, err := tr.RoundTrip(req.WithContext(ctx))
						if resp != nil {
							io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
							resp.Body.Close()
						}
						if resp == nil && err == nil {
							t.Errorf("no response and no error")
						}
						if took := time.Since(start); took > deadline {
							t.Errorf("a request took %v, past its deadline of %v", took, deadline)
						}
						cancel()
					}
				}()
			}
			wg.Wait()
			tr.Health()
			tr.WritePrometheus(io.Discard)
		})
	})
}

// Close closes the idle connections of the http.Transport New made for a
// nil Base: 10 cycles of New, one request and Close left 30 goroutines
// until the 90s idle timeout. A Base of the caller's keeps its connections.
func TestCloseClosesOwnIdleConnections(t *testing.T) {
	srv := newUpstreamServer(t, 200, "ok")
	leaks := goleak.IgnoreCurrent()
	for range 10 {
		tr, err := New(Config{Upstreams: []Upstream{{BaseURL: srv.URL}}})
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, mustGet(t, tr, srv.URL+"/v1"))
		tr.Close()
	}
	goleak.VerifyNone(t, leaks)

	own := &http.Transport{}
	defer own.CloseIdleConnections()
	tr, err := New(Config{Base: own, Upstreams: []Upstream{{BaseURL: srv.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, mustGet(t, tr, srv.URL+"/v1"))
	tr.Close()
	if got := srv.connections(); got != 11 {
		t.Fatalf("%d connections, want 11", got)
	}
	readBody(t, mustGet(t, tr, srv.URL+"/v1"))
	if got := srv.connections(); got != 11 {
		t.Fatalf("the caller's Base lost its idle connection at Close: %d connections, want 11", got)
	}
}

// TestFirstSnippet checks that the README's first snippet, the package
// doc's and the one integration's Example runs are the same code: the
// Example's only differences are the two BaseURLs, local servers there.
func TestFirstSnippet(t *testing.T) {
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	_, readme, ok := strings.Cut(read("README.md"), "<!-- first snippet")
	_, readme, ok2 := strings.Cut(readme, "```go\n")
	readme, _, ok3 := strings.Cut(readme, "```\n")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README.md has no first snippet after its <!-- first snippet --> marker")
	}

	var doc strings.Builder
	for line := range strings.Lines(read("transport.go")) {
		if strings.HasPrefix(line, "package ") {
			break
		}
		switch {
		case strings.HasPrefix(line, "//\t"):
			doc.WriteString(strings.TrimPrefix(line, "//\t"))
		case line == "//\n" && doc.Len() > 0:
			doc.WriteString("\n")
		}
	}
	if got := strings.TrimRight(doc.String(), "\n") + "\n"; got != readme {
		t.Errorf("the package doc's snippet:\n%s\nthe README's:\n%s", got, readme)
	}

	_, ex, ok := strings.Cut(read("integration/readme_example_test.go"), "\t// first snippet\n")
	ex, _, ok2 = strings.Cut(ex, "\t// end of first snippet\n")
	if !ok || !ok2 {
		t.Fatal("integration/readme_example_test.go has no first snippet between its markers")
	}
	var b strings.Builder
	for line := range strings.Lines(ex) {
		b.WriteString(strings.TrimPrefix(line, "\t"))
	}
	got := strings.NewReplacer("openaiURL", `"https://api.openai.com/v1"`, "openrouterURL", `"https://openrouter.ai/api/v1"`).Replace(b.String())
	if got != readme {
		t.Errorf("the Example's snippet:\n%s\nthe README's:\n%s", got, readme)
	}
}
