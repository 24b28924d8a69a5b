package failover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/failovertest"
)

// stainlessHeaders are the headers openai-go and anthropic-sdk-go send
// with every request.
var stainlessHeaders = map[string]string{"X-Stainless-Lang": "go", "X-Stainless-Retry-Count": "0"}

// sdkRequest is a POST to url with the Stainless SDKs' headers when
// stainless is set.
func sdkRequest(url string, stainless bool) *http.Request {
	req := httptestRequest("POST", url, chatBody)
	if stainless {
		for k, v := range stainlessHeaders {
			req.Header.Set(k, v)
		}
	}
	return req
}

// An answer the Transport returns after it failed over, retried or passed
// an upstream over says "X-Should-Retry: false" when an SDK would retry its
// status, to plain callers and SDKs alike; the answer of one attempt at the
// only upstream (its retry off) is left as it came, as is every answer
// with SDKRetries.
func TestSDKNoRetryHeader(t *testing.T) {
	tests := []struct {
		name            string
		primary, backup int // statuses; 0: no such upstream
		primaryHeader   []string
		cfg             Config
		setup           func(t *testing.T, tr *Transport, primaryURL string) // before the request
		want            string                                               // X-Should-Retry of the answer
	}{
		{name: "both 503", primary: 503, backup: 503, want: "false"},
		{name: "503 then 500", primary: 503, backup: 500, want: "false"},
		{name: "503 then 429", primary: 503, backup: 429, want: "false"},
		{name: "503 then 409", primary: 503, backup: 409, want: "false"},
		{name: "503 then 408", primary: 503, backup: 408, want: "false"},
		{name: "the upstream says true", primary: 503, backup: 503, primaryHeader: []string{"X-Should-Retry", "true"}, want: "false"},
		{name: "503 then 200", primary: 503, backup: 200, want: ""},
		{name: "503 then 400", primary: 503, backup: 400, want: ""},
		{name: "alone, 503, not retried", primary: 503, cfg: Config{Retry: RetryConfig{Off: true}}, want: ""},
		{name: "alone, 429, not retried", primary: 429, cfg: Config{Retry: RetryConfig{Off: true}}, want: ""},
		// Alone, the Transport retries the upstream once (RetryConfig).
		{name: "alone, 503", primary: 503, cfg: Config{RetryWaitMin: time.Millisecond, RetryWaitMax: time.Millisecond}, want: "false"},
		{name: "alone, 429", primary: 429, want: "false"},
		{name: "alone, retried", primary: 503, cfg: Config{Retries: 1, RetryWaitMin: time.Millisecond, RetryWaitMax: time.Millisecond}, want: "false"},
		{name: "SDKRetries, both 503", primary: 503, backup: 503, cfg: Config{SDKRetries: true}, want: ""},
		{
			// The primary's circuit is open: the backup's 503 is the only
			// attempt, but an SDK's retry would find the same.
			name: "the primary open", primary: 503, backup: 503,
			cfg:   Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Hour}},
			setup: openPrimary,
			want:  "false",
		},
		{
			name: "the primary cooling down", primary: 429, backup: 503,
			primaryHeader: []string{"Retry-After", "3600"},
			setup:         openPrimary,
			want:          "false",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, stainless := range []bool{false, true} {
				primary := newServer(t, providerAnswer{"primary", tc.primary, append([]string{"Content-Type", "application/json"}, tc.primaryHeader...), `{"error":{"message":"primary"}}`}.serve)
				cfg := tc.cfg
				cfg.Upstreams = []Upstream{{Name: "primary", BaseURL: primary.URL}}
				if tc.backup != 0 {
					backup := newUpstreamServer(t, tc.backup, `{"error":{"message":"backup"}}`)
					cfg.Upstreams = append(cfg.Upstreams, Upstream{Name: "backup", BaseURL: backup.URL})
				}
				tr := newTestTransport(t, cfg)
				if tc.setup != nil {
					tc.setup(t, tr, primary.URL)
				}
				resp, err := tr.RoundTrip(sdkRequest(primary.URL+"/v1/chat/completions", stainless))
				if err != nil {
					t.Fatalf("stainless %v: %v", stainless, err)
				}
				resp.Body.Close()
				if got := resp.Header.Get("X-Should-Retry"); got != tc.want {
					t.Errorf("stainless %v: got %d with X-Should-Retry %q, want %q", stainless, resp.StatusCode, got, tc.want)
				}
			}
		})
	}
}

// openPrimary sends one request to the primary alone, which opens its
// circuit (FailureThreshold 1) or cools it down (a 429).
func openPrimary(t *testing.T, tr *Transport, primaryURL string) {
	t.Helper()
	req := httptestRequest("POST", primaryURL+"/v1/chat/completions", chatBody)
	resp, err := tr.RoundTrip(req.WithContext(WithUpstreams(req.Context(), "primary")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if h := tr.Health()[0]; h.Available {
		t.Fatalf("setup: the primary is still available: %+v", h)
	}
}

// sdkError is the JSON error body the Transport answers a Stainless SDK
// with, in the shape both SDKs read.
type sdkError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// A request from a Stainless SDK that the Transport would fail with an
// error of its own gets an answer that says the same instead, which no
// SDK retries, and AnswerError gives the error back; a plain caller, and
// every caller with SDKRetries, gets the error as before.
func TestSDKErrorAnswer(t *testing.T) {
	const key = "sk-upstream-secret-0123"
	type want struct {
		status     int
		retryAfter bool
		is         error  // what AnswerError's error matches
		message    string // in the message, besides the upstream names
	}
	tests := []struct {
		name  string
		setup func(t *testing.T) (cfg Config, url string)
		open  bool // open every circuit first
		want  want
	}{
		{"unrouted", func(t *testing.T) (Config, string) {
			s := newUpstreamServer(t, 200, "ok")
			return Config{Upstreams: []Upstream{{Name: "a", BaseURL: s.URL + "/v1"}}}, strings.Replace(s.URL, "127.0.0.1", "localhost", 1) + "/v1/chat/completions"
		}, false, want{status: 421, is: ErrUnrouted, message: "addressed to no upstream"}},
		{"every upstream refused the connection", func(t *testing.T) (Config, string) {
			a, b := failovertest.ClosedURL(t), failovertest.ClosedURL(t)
			return Config{Upstreams: []Upstream{{Name: "a", BaseURL: a, Header: http.Header{"Authorization": {"Bearer " + key}}}, {Name: "b", BaseURL: b}}}, a + "/v1/chat/completions"
		}, false, want{status: 502, is: syscall.ECONNREFUSED, message: "no upstream answered"}},
		{"every attempt timed out", func(t *testing.T) (Config, string) {
			stop := make(chan struct{})
			hang := func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-stop:
				case <-r.Context().Done():
				}
			}
			a, b := newServer(t, hang), newServer(t, hang)
			t.Cleanup(func() { close(stop) }) // before the servers close
			return Config{AttemptTimeout: 10 * time.Millisecond, Hang: HangConfig{Off: true},
				Upstreams: []Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}}}, a.URL + "/v1/chat/completions"
		}, false, want{status: 504, is: ErrAttemptTimeout, message: "attempt timed out"}},
		{"every circuit open", func(t *testing.T) (Config, string) {
			a, b := newUpstreamServer(t, 503, "a down"), newUpstreamServer(t, 503, "b down")
			return Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Hour}, LastResort: LastResortConfig{Off: true},
				Upstreams: []Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}}}, a.URL + "/v1/chat/completions"
		}, true, want{status: 503, retryAfter: true, is: ErrCircuitOpen, message: "circuit open"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, sdkRetries := range []bool{false, true} {
				for _, stainless := range []bool{false, true} {
					cfg, url := tc.setup(t)
					cfg.SDKRetries = sdkRetries
					tr := newTestTransport(t, cfg)
					if tc.open {
						openCircuits(t, tr, url)
					}
					req := sdkRequest(url, stainless)
					resp, err := tr.RoundTrip(req)
					if !stainless || sdkRetries {
						if resp != nil || !errors.Is(err, tc.want.is) {
							t.Fatalf("stainless %v, SDKRetries %v: got %v, %v; want no answer and an error matching %v", stainless, sdkRetries, resp, err, tc.want.is)
						}
						continue
					}
					if err != nil {
						t.Fatalf("got error %v, want an answer", err)
					}
					checkErrorAnswer(t, req, resp, tc.want.status, tc.want.retryAfter, tc.want.is, tc.want.message, key)
				}
			}
		})
	}
}

// openCircuits opens the circuits of tr's upstreams (FailureThreshold 1),
// which answer 503, with a request to each.
func openCircuits(t *testing.T, tr *Transport, url string) {
	t.Helper()
	resp, err := tr.RoundTrip(httptestRequest("POST", url, chatBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, h := range tr.Health() {
		if h.State != Open.String() {
			t.Fatalf("setup: %s is %s, want open", h.Name, h.State)
		}
	}
}

// checkErrorAnswer checks that resp is the Transport's answer to req for
// an error matching is: its status, X-Should-Retry: false, JSON whose
// message says msg and names the upstreams, never key, and AnswerError.
func checkErrorAnswer(t *testing.T, req *http.Request, resp *http.Response, status int, retryAfter bool, is error, msg, key string) {
	t.Helper()
	body := readBody(t, resp)
	if resp.StatusCode != status || resp.Status != fmt.Sprint(status, " ", http.StatusText(status)) {
		t.Errorf("status %d %q, want %d", resp.StatusCode, resp.Status, status)
	}
	for k, v := range map[string]string{"X-Should-Retry": "false", "Content-Type": "application/json"} {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if got := resp.Header.Get("Retry-After"); (got != "") != retryAfter {
		t.Errorf("Retry-After = %q, want one: %v", got, retryAfter)
	}
	var e sdkError
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" {
		t.Fatalf("body %q: %v, want a JSON error with a message", body, err)
	}
	if !strings.Contains(e.Error.Message, msg) || strings.Contains(body, key) {
		t.Errorf("message %q, want it to say %q and never the key", e.Error.Message, msg)
	}
	if status != 421 && !(strings.Contains(e.Error.Message, "upstream a") && strings.Contains(e.Error.Message, "upstream b")) {
		t.Errorf("message %q, want it to name both upstreams", e.Error.Message)
	}
	if resp.Request == nil || resp.Request.URL != req.URL || resp.Request.Header.Get("X-Stainless-Lang") != "go" {
		t.Errorf("Request %v, want the caller's", resp.Request)
	}
	err := AnswerError(resp)
	if !errors.Is(err, is) {
		t.Errorf("AnswerError = %v, want it to match %v", err, is)
	}
	var ferr *Error
	var uerr *UnroutedError
	if !errors.As(err, &ferr) && !errors.As(err, &uerr) {
		t.Errorf("AnswerError = %T, want an *Error or an *UnroutedError", err)
	}
}

// The caller's own ending stays the caller's: a canceled context is an
// error, Stainless headers or not; and AnswerError of an upstream's answer
// is nil.
func TestSDKErrorAnswerNotForTheCaller(t *testing.T) {
	s := newUpstreamServer(t, 503, "down")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: s.URL}}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp, err := tr.RoundTrip(sdkRequest(s.URL+"/v1/chat/completions", true).WithContext(ctx))
	if resp != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, %v; want context.Canceled", resp, err)
	}
	resp, err = tr.RoundTrip(sdkRequest(s.URL+"/v1/chat/completions", true))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err := AnswerError(resp); err != nil {
		t.Errorf("AnswerError of an upstream's answer = %v, want nil", err)
	}
	if AnswerError(nil) != nil || AnswerError(&http.Response{}) != nil {
		t.Error("AnswerError of no answer: want nil")
	}
}

// An SDK's request whose every attempt ran out of Timeouts.FirstContent
// gets a 504, as attempts that timed out do.
func TestSDKFirstContentTimeoutIs504(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mute := func(r *http.Request) (*http.Response, error) {
			return sseAnswer(r, func(ctx context.Context, pw *io.PipeWriter) {
				io.WriteString(pw, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n")
				<-ctx.Done()
			}), nil
		}
		n := newFakeNet()
		n.handle("a.test", mute)
		n.handle("b.test", mute)
		tr := newTestTransport(t, twoUpstreams(n, Config{Timeouts: Timeouts{FirstContent: time.Minute}}))
		req := httptestRequest("POST", "http://a.test/v1/chat/completions", streamBody)
		req.Header.Set("X-Stainless-Lang", "go")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Errorf("status %d after every attempt ran out of FirstContent (%v), want 504", resp.StatusCode, AnswerError(resp))
		}
	})
}
