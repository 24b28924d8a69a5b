package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failover-go/failover"
	"github.com/failover-go/failover/failovertest"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// These tests put a failover.Transport under the real openai-go client, as
// users do: option.WithHTTPClient(&http.Client{Transport: t}) and
// option.WithBaseURL(the primary). openai-go checks that each request still
// goes to its base URL's origin after its own middleware, so the Transport,
// below the http.Client, is the only place the host can change.

// Keys. The caller's is the one the SDK is given (option.WithAPIKey); the
// others are the upstreams' own, set in Upstream.Header.
const (
	callerKey  = "sk-caller-0123456789"
	primaryKey = "sk-primary-0123456789"
	backupKey  = "sk-backup-0123456789"
)

// received is one request that an upstream server saw.
type received struct {
	upstream string
	method   string
	path     string
	header   http.Header
	body     []byte
}

// retryCount is the SDK's X-Stainless-Retry-Count of the request.
func (r received) retryCount() string { return r.header.Get("X-Stainless-Retry-Count") }

// requestLog records, in order, the requests every upstream server of one
// test saw.
type requestLog struct {
	mu   sync.Mutex
	reqs []received
}

func (l *requestLog) add(r received) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, r)
}

func (l *requestLog) all() []received {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// of returns the requests upstream saw.
func (l *requestLog) of(upstream string) []received {
	var out []received
	for _, r := range l.all() {
		if r.upstream == upstream {
			out = append(out, r)
		}
	}
	return out
}

// order returns "upstream#retry" for every request, in arrival order.
func (l *requestLog) order() []string {
	var out []string
	for _, r := range l.all() {
		out = append(out, r.upstream+"#"+r.retryCount())
	}
	return out
}

// fakeUpstream starts an OpenAI-compatible test server named name: it reads
// and records each request in log, then lets h answer (with the body still
// readable).
func fakeUpstream(t *testing.T, log *requestLog, name string, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("%s: reading the request body: %v", name, err)
		}
		log.add(received{upstream: name, method: r.Method, path: r.URL.EscapedPath(), header: r.Header.Clone(), body: body})
		r.Body = io.NopCloser(bytes.NewReader(body))
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// apiError answers as OpenAI does when it fails: status, an error object,
// and header pairs kv.
func apiError(status int, typ, msg string, kv ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": typ, "param": nil}})
	}
}

// completion answers a non-streaming chat completion with content, and a
// request it cannot parse with a 400.
func completion(content string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Stream || req.Model == "" {
			apiError(http.StatusBadRequest, "invalid_request_error", "want a non-streaming chat completion request")(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-test", "object": "chat.completion", "created": 1700000000, "model": req.Model,
			"choices": []any{map[string]any{
				"index": 0, "finish_reason": "stop", "logprobs": nil,
				"message": map[string]any{"role": "assistant", "content": content, "refusal": nil},
			}},
			"usage": map[string]any{"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
		})
	}
}

// sseChunk returns one chat.completion.chunk event carrying content.
func sseChunk(content string, first bool) string {
	delta := map[string]any{"content": content}
	if first {
		delta["role"] = "assistant"
	}
	b, _ := json.Marshal(map[string]any{
		"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1700000000, "model": "gpt-test",
		"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": nil}},
	})
	return "data: " + string(b) + "\n\n"
}

// hermeticOpenAIEnv unsets the variables openai.NewClient reads, so that a
// developer's environment cannot add keys, headers or a base URL.
func hermeticOpenAIEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{"OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "OPENAI_WEBHOOK_SECRET", "OPENAI_CUSTOM_HEADERS"} {
		t.Setenv(k, "") // restores the old value after the test
		os.Unsetenv(k)
	}
}

// newFailover returns a Transport over a primary at primaryBase and a
// backup at backupBase, each with its own key.
func newFailover(t *testing.T, primaryBase, backupBase string, cfg failover.Config) *failover.Transport {
	t.Helper()
	cfg.Upstreams = []failover.Upstream{
		{Name: "primary", BaseURL: primaryBase, Header: http.Header{"Authorization": {"Bearer " + primaryKey}}},
		{Name: "backup", BaseURL: backupBase, Header: http.Header{"Authorization": {"Bearer " + backupKey}}},
	}
	tr, err := failover.New(cfg)
	if err != nil {
		t.Fatalf("failover.New: %v", err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// newOpenAIClient returns the real openai-go client over tr, addressed to
// baseURL, with the caller's key.
func newOpenAIClient(t *testing.T, tr http.RoundTripper, baseURL string, opts ...option.RequestOption) openai.Client {
	t.Helper()
	hermeticOpenAIEnv(t)
	return openai.NewClient(append([]option.RequestOption{
		option.WithHTTPClient(&http.Client{Transport: tr}),
		option.WithBaseURL(baseURL),
		option.WithAPIKey(callerKey),
	}, opts...)...)
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    "gpt-test",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
	}
}

// testContext bounds a test's SDK calls, so that a hang fails instead of
// stalling the run.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// checkCredentials fails unless r carries exactly key as its bearer token
// and the caller's key in no header at all.
func checkCredentials(t *testing.T, r received, key string) {
	t.Helper()
	if got, want := r.header.Values("Authorization"), []string{"Bearer " + key}; !slices.Equal(got, want) {
		t.Errorf("%s got Authorization %q, want %q", r.upstream, got, want)
	}
	for k, vs := range r.header {
		for _, v := range vs {
			if strings.Contains(v, callerKey) {
				t.Errorf("%s got the caller's key in header %s", r.upstream, k)
			}
		}
	}
}

// TestOpenAIFailoverCredentials: a completion that the primary fails is
// served by the backup within one SDK attempt; each upstream gets its own
// key and never the caller's, and the backup gets the same body at its own
// base path.
func TestOpenAIFailoverCredentials(t *testing.T) {
	tests := []struct {
		name    string
		primary http.HandlerFunc // nil: the primary refuses connections
		served  string           // the upstream that serves the completion
	}{
		{"primary healthy", completion("from primary"), "primary"},
		{"503", apiError(http.StatusServiceUnavailable, "server_error", "The server is overloaded."), "backup"},
		{"529 overloaded", apiError(529, "overloaded_error", "Overloaded"), "backup"},
		{"500", apiError(http.StatusInternalServerError, "server_error", "internal"), "backup"},
		{"502", apiError(http.StatusBadGateway, "server_error", "bad gateway"), "backup"},
		{"408", apiError(http.StatusRequestTimeout, "timeout", "request timeout"), "backup"},
		{"401 revoked key", apiError(http.StatusUnauthorized, "invalid_api_key", "Incorrect API key provided."), "backup"},
		{"403", apiError(http.StatusForbidden, "permission_denied", "forbidden"), "backup"},
		{"connection refused", nil, "backup"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var log requestLog
			primaryBase := failovertest.ClosedURL(t) + "/v1"
			if tc.primary != nil {
				primaryBase = fakeUpstream(t, &log, "primary", tc.primary).URL + "/v1"
			}
			backupBase := fakeUpstream(t, &log, "backup", completion("from backup")).URL + "/openai/v1"
			tr := newFailover(t, primaryBase, backupBase, failover.Config{})
			// No SDK retries: a success can only come from the Transport.
			client := newOpenAIClient(t, tr, primaryBase, option.WithMaxRetries(0))

			res, err := client.Chat.Completions.New(testContext(t), chatParams())
			if err != nil {
				t.Fatalf("Chat.Completions.New: %v", err)
			}
			if got, want := res.Choices[0].Message.Content, "from "+tc.served; got != want {
				t.Errorf("got content %q, want %q", got, want)
			}

			primary, backup := log.of("primary"), log.of("backup")
			wantPrimary, wantBackup := 1, 0
			if tc.primary == nil {
				wantPrimary = 0
			}
			if tc.served == "backup" {
				wantBackup = 1
			}
			if len(primary) != wantPrimary || len(backup) != wantBackup {
				t.Fatalf("got %d requests at the primary and %d at the backup, want %d and %d", len(primary), len(backup), wantPrimary, wantBackup)
			}
			for _, r := range primary {
				checkCredentials(t, r, primaryKey)
				if r.method != http.MethodPost || r.path != "/v1/chat/completions" {
					t.Errorf("primary got %s %s, want POST /v1/chat/completions", r.method, r.path)
				}
			}
			for _, r := range backup {
				checkCredentials(t, r, backupKey)
				if r.method != http.MethodPost || r.path != "/openai/v1/chat/completions" {
					t.Errorf("backup got %s %s, want POST /openai/v1/chat/completions", r.method, r.path)
				}
				if got := r.retryCount(); got != "0" {
					t.Errorf("backup got X-Stainless-Retry-Count %q, want %q: the SDK's own headers pass through", got, "0")
				}
				if !json.Valid(r.body) || !bytes.Contains(r.body, []byte(`"gpt-test"`)) {
					t.Errorf("backup got body %q, want the SDK's request", r.body)
				}
				if len(primary) > 0 && !bytes.Equal(r.body, primary[0].body) {
					t.Errorf("backup got body %q, want the primary's %q", r.body, primary[0].body)
				}
			}
		})
	}
}

// TestOpenAIStreamingIsNotBuffered: a stream served by the backup after the
// primary failed reaches the SDK chunk by chunk. The backup writes its first
// chunk and then waits until the test has read that chunk through the SDK
// before writing the rest, so a Transport that buffered the body would
// deadlock until the test's deadline.
func TestOpenAIStreamingIsNotBuffered(t *testing.T) {
	tests := []struct {
		name           string
		attemptTimeout time.Duration
	}{
		{"no attempt timeout", 0},
		// AttemptTimeout bounds the wait for headers only: a stream that
		// pauses for longer than it must go on.
		{"pause longer than the attempt timeout", time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var log requestLog
			primary := fakeUpstream(t, &log, "primary", apiError(http.StatusServiceUnavailable, "server_error", "overloaded"))
			firstRead := make(chan struct{}) // closed when the caller has the first chunk
			var wroteLast atomic.Bool
			backup := fakeUpstream(t, &log, "backup", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Header().Set("Cache-Control", "no-cache")
				io.WriteString(w, sseChunk("Hel", true))
				w.(http.Flusher).Flush()
				select {
				case <-firstRead:
				case <-r.Context().Done(): // the caller gave up
					return
				}
				for _, s := range []string{"lo", ", ", "world"} {
					io.WriteString(w, sseChunk(s, false))
					w.(http.Flusher).Flush()
				}
				io.WriteString(w, "data: [DONE]\n\n")
				wroteLast.Store(true)
			})
			tr := newFailover(t, primary.URL+"/v1", backup.URL+"/v1", failover.Config{AttemptTimeout: tc.attemptTimeout})
			client := newOpenAIClient(t, tr, primary.URL+"/v1", option.WithMaxRetries(0))

			stream := client.Chat.Completions.NewStreaming(testContext(t), chatParams())
			defer stream.Close()
			if !stream.Next() {
				t.Fatalf("the first chunk did not reach the caller while the backup waited for it to be read (a buffered body?): %v", stream.Err())
			}
			if wroteLast.Load() {
				t.Fatal("the first chunk reached the caller only after the backup wrote the last")
			}
			var text strings.Builder
			text.WriteString(stream.Current().Choices[0].Delta.Content)
			if tc.attemptTimeout > 0 {
				// The pause under test, not a synchronization.
				<-time.After(2 * tc.attemptTimeout)
			}
			close(firstRead)
			n := 1
			for stream.Next() {
				for _, c := range stream.Current().Choices {
					text.WriteString(c.Delta.Content)
				}
				n++
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream ended with %v after %d chunks", err, n)
			}
			if got, want := text.String(), "Hello, world"; got != want || n != 4 {
				t.Errorf("got %q in %d chunks, want %q in 4", got, n, want)
			}
			if !wroteLast.Load() {
				t.Error("the stream ended before the backup wrote its last chunk")
			}
			if got, want := log.order(), []string{"primary#0", "backup#0"}; !slices.Equal(got, want) {
				t.Errorf("got requests %q, want %q", got, want)
			}
			for _, r := range log.of("backup") {
				checkCredentials(t, r, backupKey)
				if !bytes.Contains(r.body, []byte(`"stream":true`)) {
					t.Errorf("backup got body %q, want a streaming request", r.body)
				}
			}
		})
	}
}

// TestOpenAISDKRetriesOverFailover: with Config.SDKRetries, openai-go
// retries 5xx itself; each of its attempts is one round of the Transport
// over every upstream. When every upstream fails, the caller gets the last
// provider's answer as an *openai.Error, not a transport error, unless no
// upstream could be asked at all.
func TestOpenAISDKRetriesOverFailover(t *testing.T) {
	// retry-after-ms: 1 keeps the SDK's waits between its attempts short;
	// the Transport reads it only on 429s.
	fail := func(status int, msg string) http.HandlerFunc {
		return apiError(status, "server_error", msg, "retry-after-ms", "1")
	}
	tests := []struct {
		name             string
		sdkRetries       int
		transportRetries int
		threshold        uint // Breaker.FailureThreshold
		lastResortOff    bool // LastResort.Off
		primary, backup  int  // statuses
		wantOrder        []string
		wantStatus       int // of the *openai.Error; 0 when no upstream answered
		wantMessage      string
	}{
		{
			name: "no SDK retries", sdkRetries: 0, primary: 503, backup: 503,
			wantOrder:  []string{"primary#0", "backup#0"},
			wantStatus: 503, wantMessage: "backup says 503",
		},
		{
			name: "one SDK retry", sdkRetries: 1, primary: 503, backup: 503,
			wantOrder:  []string{"primary#0", "backup#0", "primary#1", "backup#1"},
			wantStatus: 503, wantMessage: "backup says 503",
		},
		{
			name: "the last answer wins", sdkRetries: 1, primary: 529, backup: 500,
			wantOrder:  []string{"primary#0", "backup#0", "primary#1", "backup#1"},
			wantStatus: 500, wantMessage: "backup says 500",
		},
		{
			name: "two SDK retries", sdkRetries: 2, primary: 502, backup: 503,
			wantOrder:  []string{"primary#0", "backup#0", "primary#1", "backup#1", "primary#2", "backup#2"},
			wantStatus: 503, wantMessage: "backup says 503",
		},
		{
			// Retries multiply: each SDK attempt gets 1+Retries rounds.
			name: "transport retries too", sdkRetries: 1, transportRetries: 1, primary: 503, backup: 503,
			wantOrder:  []string{"primary#0", "backup#0", "primary#0", "backup#0", "primary#1", "backup#1", "primary#1", "backup#1"},
			wantStatus: 503, wantMessage: "backup says 503",
		},
		{
			// Both circuits open on the first SDK attempt; without a last
			// resort the retry finds no upstream to ask and gets the
			// Transport's error.
			name: "circuits open before the SDK retry", sdkRetries: 1, threshold: 1, primary: 503, backup: 503, lastResortOff: true,
			wantOrder: []string{"primary#0", "backup#0"},
		},
		{
			// With the last resort (the default), the retry goes past the
			// circuit that opened first, the primary's, and the SDK shows
			// its answer.
			name: "circuits open, the last resort", sdkRetries: 1, threshold: 1, primary: 503, backup: 503,
			wantOrder:  []string{"primary#0", "backup#0", "primary#1"},
			wantStatus: 503, wantMessage: "primary says 503",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var log requestLog
			primary := fakeUpstream(t, &log, "primary", fail(tc.primary, fmt.Sprintf("primary says %d", tc.primary)))
			backup := fakeUpstream(t, &log, "backup", fail(tc.backup, fmt.Sprintf("backup says %d", tc.backup)))
			tr := newFailover(t, primary.URL+"/v1", backup.URL+"/v1", failover.Config{
				SDKRetries:   true,
				Retries:      tc.transportRetries,
				RetryWaitMin: time.Millisecond,
				RetryWaitMax: 10 * time.Millisecond,
				Breaker:      failover.BreakerConfig{FailureThreshold: tc.threshold},
				LastResort:   failover.LastResortConfig{Off: tc.lastResortOff},
			})
			client := newOpenAIClient(t, tr, primary.URL+"/v1", option.WithMaxRetries(tc.sdkRetries))

			_, err := client.Chat.Completions.New(testContext(t), chatParams())
			if err == nil {
				t.Fatal("Chat.Completions.New succeeded, want an error")
			}
			if got := log.order(); !slices.Equal(got, tc.wantOrder) {
				t.Errorf("got requests %q, want %q", got, tc.wantOrder)
			}
			var apiErr *openai.Error
			var ferr *failover.Error
			if tc.wantStatus == 0 {
				if errors.As(err, &apiErr) {
					t.Fatalf("got an *openai.Error with status %d, want the Transport's error", apiErr.StatusCode)
				}
				if !errors.As(err, &ferr) || !errors.Is(err, failover.ErrCircuitOpen) {
					t.Fatalf("got %v, want a *failover.Error matching ErrCircuitOpen", err)
				}
				if len(ferr.Attempts) != 2 || ferr.RetryAfter() <= 0 {
					t.Errorf("got %d attempts and RetryAfter %v, want 2 skipped upstreams and a positive RetryAfter", len(ferr.Attempts), ferr.RetryAfter())
				}
				return
			}
			if !errors.As(err, &apiErr) {
				t.Fatalf("got %T %v, want an *openai.Error", err, err)
			}
			if errors.As(err, &ferr) {
				t.Errorf("got a *failover.Error inside the *openai.Error: %v", ferr)
			}
			if apiErr.StatusCode != tc.wantStatus || apiErr.Message != tc.wantMessage {
				t.Errorf("got status %d, message %q; want %d, %q", apiErr.StatusCode, apiErr.Message, tc.wantStatus, tc.wantMessage)
			}
		})
	}
}

// TestOpenAIRateLimitedPrimaryCoolsDown: a 429 from the primary is served
// by the backup at once, and the next request within the cooldown goes
// straight to the backup.
func TestOpenAIRateLimitedPrimaryCoolsDown(t *testing.T) {
	const rateLimited = "Rate limit reached for gpt-test in organization org-test on requests per min (RPM): Limit 3, Used 3, Requested 1."
	tests := []struct {
		name       string
		kv         []string // headers of the 429
		typ        string   // error.type and error.code of the 429
		rate       failover.RateLimitConfig
		wantReason failover.CooldownReason
		want       time.Duration // the cooldown asked for
	}{
		{"retry-after-ms", []string{"retry-after-ms", "40000", "retry-after", "40"}, "rate_limit_exceeded", failover.RateLimitConfig{}, failover.CooldownRateLimited, 40 * time.Second},
		{"Retry-After seconds", []string{"Retry-After", "40"}, "rate_limit_exceeded", failover.RateLimitConfig{}, failover.CooldownRateLimited, 40 * time.Second},
		{"no header", nil, "rate_limit_exceeded", failover.RateLimitConfig{DefaultCooldown: 40 * time.Second}, failover.CooldownRateLimited, 40 * time.Second},
		{"quota exhausted", []string{"retry-after-ms", "20"}, "insufficient_quota", failover.RateLimitConfig{MaxCooldown: 50 * time.Second}, failover.CooldownQuotaExhausted, 50 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var log requestLog
			primary := fakeUpstream(t, &log, "primary", apiError(http.StatusTooManyRequests, tc.typ, rateLimited, tc.kv...))
			backup := fakeUpstream(t, &log, "backup", completion("from backup"))
			tr := newFailover(t, primary.URL+"/v1", backup.URL+"/v1", failover.Config{RateLimit: tc.rate})
			// No SDK retries: had the 429 reached it, the SDK would wait
			// out the retry-after itself.
			client := newOpenAIClient(t, tr, primary.URL+"/v1", option.WithMaxRetries(0))
			ctx := testContext(t)

			for i := range 2 {
				res, err := client.Chat.Completions.New(ctx, chatParams())
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if got := res.Choices[0].Message.Content; got != "from backup" {
					t.Errorf("request %d: got content %q, want %q", i, got, "from backup")
				}
				if i == 0 {
					h := tr.Health()[0]
					if h.Name != "primary" || h.CooldownReason != tc.wantReason || h.Cooldown <= tc.want/2 || h.Cooldown > tc.want {
						t.Errorf("after the 429: %s cools down for %v (%q), want up to %v (%q)", h.Name, h.Cooldown, h.CooldownReason, tc.want, tc.wantReason)
					}
					if h.State != "closed" || h.Available || h.Requests.RateLimited != 1 || h.Requests.Failed != 0 {
						t.Errorf("after the 429: primary is %s, available %v, with %+v; want closed, unavailable, one rate-limited attempt and no failure", h.State, h.Available, h.Requests)
					}
				}
			}
			if got, want := log.order(), []string{"primary#0", "backup#0", "backup#0"}; !slices.Equal(got, want) {
				t.Errorf("got requests %q, want %q: the second must skip the cooling primary", got, want)
			}
			for _, r := range log.of("backup") {
				checkCredentials(t, r, backupKey)
			}
		})
	}
}

// Why host failover lives in the Transport: openai-go checks, after its own
// middleware, that the request still goes to its base URL's origin, so a
// middleware that moves it to the backup is refused before anything is
// sent. The same move inside the http.Client's RoundTripper works.
func TestOpenAIMiddlewareCannotChangeHost(t *testing.T) {
	var log requestLog
	primary := fakeUpstream(t, &log, "primary", apiError(503, "server_error", "down"))
	backup := fakeUpstream(t, &log, "backup", completion("from backup"))
	backupURL, err := url.Parse(backup.URL)
	if err != nil {
		t.Fatal(err)
	}
	moveToBackup := option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		r.URL.Host, r.Host = backupURL.Host, backupURL.Host
		return next(r)
	})
	client := newOpenAIClient(t, http.DefaultTransport, primary.URL+"/v1", moveToBackup, option.WithMaxRetries(0))
	if _, err := client.Chat.Completions.New(testContext(t), chatParams()); err == nil {
		t.Fatal("openai-go let a middleware move the request to another host")
	}
	if n := len(log.all()); n != 0 {
		t.Fatalf("%d requests were sent; the SDK should refuse before sending", n)
	}

	tr := newFailover(t, primary.URL+"/v1", backup.URL+"/v1", failover.Config{})
	client = newOpenAIClient(t, tr, primary.URL+"/v1", option.WithMaxRetries(0))
	got, err := client.Chat.Completions.New(testContext(t), chatParams())
	if err != nil {
		t.Fatalf("through the Transport: %v", err)
	}
	if got.Choices[0].Message.Content != "from backup" {
		t.Fatalf("content %q", got.Choices[0].Message.Content)
	}
}
