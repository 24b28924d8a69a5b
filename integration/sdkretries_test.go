package integration_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3"
)

// These tests put a failover.Transport under the real Stainless SDKs,
// openai-go and anthropic-sdk-go, which retry 408, 409, 429, 5xx and
// every transport error on their own, twice by default: the SDK's retries
// must not multiply the Transport's attempts, nor wait out an error the
// Transport made itself, unless Config.SDKRetries asks for them.

// calls counts the SDK's attempts: the RoundTrips of its http.Client.
type calls struct {
	next http.RoundTripper
	n    atomic.Int32
}

func (c *calls) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// stainlessSDK is one SDK under test.
type stainlessSDK struct {
	name string
	// base is the SDK's base URL for an upstream's server URL, and path
	// the path its call is sent to under it.
	base func(server string) string
	path string
	// fail answers as the provider does when it fails with status, its
	// message msg and retry-after-ms: 1 (short SDK waits when it retries).
	fail func(status int, msg string) http.HandlerFunc
	// call makes one call through rt to base, with the SDK's default
	// retries; it returns the SDK's error.
	call func(t *testing.T, rt http.RoundTripper, base string) error
	// apiError returns the status, the message and the response of the
	// SDK's API error, and whether err is one.
	apiError func(err error) (status int, msg string, resp *http.Response, ok bool)
}

var stainlessSDKs = []stainlessSDK{
	{
		name: "openai-go",
		base: func(server string) string { return server + "/v1" },
		path: "/v1/chat/completions",
		fail: func(status int, msg string) http.HandlerFunc {
			return apiError(status, "server_error", msg, "retry-after-ms", "1")
		},
		call: func(t *testing.T, rt http.RoundTripper, base string) error {
			client := newOpenAIClient(t, rt, base)
			_, err := client.Chat.Completions.New(testContext(t), chatParams())
			return err
		},
		apiError: func(err error) (int, string, *http.Response, bool) {
			// openai-go's Error() is the status alone: the message is
			// in the error's Message.
			var e *openai.Error
			if !errors.As(err, &e) {
				return 0, "", nil, false
			}
			return e.StatusCode, e.Message, e.Response, true
		},
	},
	{
		name: "anthropic-sdk-go",
		base: func(server string) string { return server },
		path: "/v1/messages",
		fail: func(status int, msg string) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After-Ms", "1")
				w.WriteHeader(status)
				fmt.Fprintf(w, `{"type":"error","error":{"type":"api_error","message":%q}}`, msg)
			}
		},
		call: func(t *testing.T, rt http.RoundTripper, base string) error {
			client := anthropic.NewClient(
				anthropicoption.WithoutEnvironmentDefaults(),
				anthropicoption.WithHTTPClient(&http.Client{Transport: rt}),
				anthropicoption.WithBaseURL(base),
				anthropicoption.WithAPIKey(callerKey),
			)
			_, err := client.Messages.New(testContext(t), anthropic.MessageNewParams{
				Model:     anthropic.Model("claude-sonnet-4-5"),
				MaxTokens: 100,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
			})
			return err
		},
		apiError: func(err error) (int, string, *http.Response, bool) {
			// anthropic-sdk-go's Error() carries the body: the message
			// must surface there.
			var e *anthropic.Error
			if !errors.As(err, &e) {
				return 0, "", nil, false
			}
			return e.StatusCode, e.Error(), e.Response, true
		},
	},
}

// Two upstreams both answering 503 under an SDK with its default retries:
// one pass over the upstreams, two attempts in all, and the SDK's error
// carries the last 503; with Config.SDKRetries the SDK retries each pass
// as before, (1+2) × 2 attempts.
func TestSDKRetriesBoth503(t *testing.T) {
	for _, sdk := range stainlessSDKs {
		for _, sdkRetries := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/SDKRetries=%v", sdk.name, sdkRetries), func(t *testing.T) {
				var log requestLog
				primary := fakeUpstream(t, &log, "primary", sdk.fail(503, "primary says 503"))
				backup := fakeUpstream(t, &log, "backup", sdk.fail(503, "backup says 503"))
				tr := newFailover(t, sdk.base(primary.URL), sdk.base(backup.URL), failover.Config{SDKRetries: sdkRetries})
				rt := &calls{next: tr}
				err := sdk.call(t, rt, sdk.base(primary.URL))
				want := []string{"primary#0", "backup#0"}
				if sdkRetries {
					want = []string{"primary#0", "backup#0", "primary#1", "backup#1", "primary#2", "backup#2"}
				}
				if got := log.order(); !slices.Equal(got, want) {
					t.Errorf("upstreams got %q, want %q", got, want)
				}
				if got, want := int(rt.n.Load()), len(want)/2; got != want {
					t.Errorf("the SDK made %d attempts, want %d", got, want)
				}
				status, msg, _, ok := sdk.apiError(err)
				if !ok || status != 503 || !strings.Contains(msg, "backup says 503") {
					t.Errorf("got %v (status %d, message %q), want the SDK's error for the backup's 503", err, status, msg)
				}
			})
		}
	}
}

// A request the Transport fails without asking any upstream, addressed to
// none or with every circuit open, reaches an SDK as an answer it does
// not retry: one SDK attempt, no upstream attempt, no SDK backoff; the
// SDK's error says why and failover.AnswerError gives the Transport's
// error back. With Config.SDKRetries the SDK gets the error and retries
// it.
func TestSDKRetriesTransportErrors(t *testing.T) {
	tests := []struct {
		name     string
		unrouted bool // the SDK is aimed at another spelling of the primary's host
		status   int
		message  []string // what the SDK's error says
		is       error
	}{
		{name: "unrouted", unrouted: true, status: http.StatusMisdirectedRequest, message: []string{"addressed to no upstream", "Config.Unrouted"}, is: failover.ErrUnrouted},
		{name: "every circuit open", status: http.StatusServiceUnavailable, message: []string{"upstream primary: failover: circuit open", "upstream backup: failover: circuit open"}, is: failover.ErrCircuitOpen},
	}
	for _, sdk := range stainlessSDKs {
		for _, tc := range tests {
			for _, sdkRetries := range []bool{false, true} {
				if sdkRetries && tc.unrouted {
					continue // the SDK would wait its own 0.5s and 1s between the same refusals
				}
				t.Run(fmt.Sprintf("%s/%s/SDKRetries=%v", sdk.name, tc.name, sdkRetries), func(t *testing.T) {
					var log requestLog
					primary := fakeUpstream(t, &log, "primary", sdk.fail(503, "primary says 503"))
					backup := fakeUpstream(t, &log, "backup", sdk.fail(503, "backup says 503"))
					tr := newFailover(t, sdk.base(primary.URL), sdk.base(backup.URL), failover.Config{
						SDKRetries: sdkRetries,
						Breaker:    failover.BreakerConfig{FailureThreshold: 1, Cooldown: time.Hour},
						LastResort: failover.LastResortConfig{Off: true},
					})
					base := sdk.base(primary.URL)
					if tc.unrouted {
						base = strings.Replace(base, "127.0.0.1", "localhost", 1)
					} else {
						openEveryCircuit(t, tr, primary.URL+sdk.path)
					}
					before := len(log.all())
					rt := &calls{next: tr}
					err := sdk.call(t, rt, base)
					if n := len(log.all()) - before; n != 0 {
						t.Errorf("upstreams got %d attempts, want none", n)
					}
					if sdkRetries {
						if n := rt.n.Load(); n != 3 {
							t.Errorf("the SDK made %d attempts, want 3: its own retries", n)
						}
						if !errors.Is(err, tc.is) {
							t.Errorf("got %v, want the Transport's error", err)
						}
						return
					}
					if n := rt.n.Load(); n != 1 {
						t.Errorf("the SDK made %d attempts, want 1", n)
					}
					status, msg, resp, ok := sdk.apiError(err)
					if !ok || status != tc.status {
						t.Fatalf("got %T %v, want the SDK's error for a %d", err, err, tc.status)
					}
					for _, m := range tc.message {
						if !strings.Contains(msg, m) {
							t.Errorf("the SDK's error says %q, want it to say %q", msg, m)
						}
					}
					for _, key := range []string{primaryKey, backupKey, callerKey} {
						if strings.Contains(msg, key) {
							t.Errorf("the SDK's error quotes a key: %q", msg)
						}
					}
					if aerr := failover.AnswerError(resp); !errors.Is(aerr, tc.is) {
						t.Errorf("AnswerError = %v, want it to match %v", aerr, tc.is)
					}
				})
			}
		}
	}
}

// openEveryCircuit opens both upstreams' circuits (FailureThreshold 1)
// with one plain request to url, which both answer 503.
func openEveryCircuit(t *testing.T, tr *failover.Transport, url string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), "POST", url, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, h := range tr.Health() {
		if h.State != failover.Open.String() {
			t.Fatalf("setup: %s is %s, want open", h.Name, h.State)
		}
	}
}
