package integration_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/failover-go/failover"
	"github.com/failover-go/failover/failovertest"
	goopenai "github.com/sashabaranov/go-openai"
)

// These tests put a failover.Transport under github.com/sashabaranov/go-openai
// as its users do: ClientConfig.HTTPClient = &http.Client{Transport: t},
// ClientConfig.BaseURL = the primary. go-openai does not retry on its own,
// so every failover below is the Transport's.

// newGoOpenAIClient returns a go-openai client with the caller's key,
// addressed to baseURL, over tr.
func newGoOpenAIClient(tr http.RoundTripper, baseURL string) *goopenai.Client {
	cfg := goopenai.DefaultConfig(callerKey)
	cfg.BaseURL = baseURL
	cfg.HTTPClient = &http.Client{Transport: tr}
	return goopenai.NewClientWithConfig(cfg)
}

// goOpenAIRequest is the chat completion the tests send.
func goOpenAIRequest(stream bool) goopenai.ChatCompletionRequest {
	return goopenai.ChatCompletionRequest{
		Model:    "gpt-4o-mini",
		Messages: []goopenai.ChatCompletionMessage{{Role: goopenai.ChatMessageRoleUser, Content: "Say hello."}},
		Stream:   stream,
	}
}

// checkOwnKey fails unless r carries exactly key as its bearer token and
// the caller's key in no header at all.
func checkOwnKey(t *testing.T, upstream string, r failovertest.Request, key string) {
	t.Helper()
	if got, want := r.Header.Values("Authorization"), []string{"Bearer " + key}; !slices.Equal(got, want) {
		t.Errorf("%s got Authorization %q, want %q", upstream, got, want)
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			if strings.Contains(v, callerKey) {
				t.Errorf("%s got the caller's key in header %s", upstream, k)
			}
		}
	}
}

// TestGoOpenAIFailover: a chat completion that the primary fails is served
// by the backup, at the backup's base path, with the backup's own key and
// never the caller's.
func TestGoOpenAIFailover(t *testing.T) {
	const served = `{"id":"chatcmpl-go","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"from backup"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`
	apiErr := func(typ, msg string) string {
		return fmt.Sprintf(`{"error":{"message":%q,"type":%q,"param":null,"code":%q}}`, msg, typ, typ)
	}
	tests := []struct {
		name    string
		primary failovertest.Step
	}{
		{"503", failovertest.Step{Status: http.StatusServiceUnavailable, Body: apiErr("server_error", "The server is overloaded or not ready yet.")}},
		{"529 overloaded", failovertest.Step{Status: 529, Body: apiErr("overloaded_error", "Overloaded")}},
		{"429 with Retry-After", failovertest.Step{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"20"}}, Body: apiErr("rate_limit_exceeded", "Rate limit reached")}},
		{"401 revoked key", failovertest.Step{Status: http.StatusUnauthorized, Body: apiErr("invalid_api_key", "Incorrect API key provided.")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			primary := failovertest.NewServer(t, tc.primary)
			backup := failovertest.NewServer(t, failovertest.Step{Body: served})
			tr := newFailover(t, primary.URL+"/v1", backup.URL+"/openai/v1", failover.Config{})
			client := newGoOpenAIClient(tr, primary.URL+"/v1")

			res, err := client.CreateChatCompletion(testContext(t), goOpenAIRequest(false))
			if err != nil {
				t.Fatalf("CreateChatCompletion: %v", err)
			}
			if res.ID != "chatcmpl-go" || len(res.Choices) != 1 || res.Choices[0].Message.Content != "from backup" {
				t.Errorf("got %+v, want the backup's completion", res)
			}

			if primary.Calls() != 1 || backup.Calls() != 1 {
				t.Fatalf("got %d requests at the primary and %d at the backup, want 1 and 1", primary.Calls(), backup.Calls())
			}
			p, b := primary.Requests()[0], backup.Requests()[0]
			checkOwnKey(t, "primary", p, primaryKey)
			checkOwnKey(t, "backup", b, backupKey)
			if p.Method != http.MethodPost || p.Path != "/v1/chat/completions" {
				t.Errorf("primary got %s %s, want POST /v1/chat/completions", p.Method, p.Path)
			}
			if b.Method != http.MethodPost || b.Path != "/openai/v1/chat/completions" {
				t.Errorf("backup got %s %s, want POST /openai/v1/chat/completions", b.Method, b.Path)
			}
			if !strings.Contains(string(b.Body), `"model":"gpt-4o-mini"`) || string(b.Body) != string(p.Body) {
				t.Errorf("backup got body %q, want the primary's %q", b.Body, p.Body)
			}
		})
	}
}

// TestGoOpenAIStream: a streamed completion that the primary fails is
// served by the backup, and CreateChatCompletionStream reads it chunk by
// chunk: one delta per Recv, in order, then io.EOF.
func TestGoOpenAIStream(t *testing.T) {
	deltas := []string{"Hel", "lo", ", ", "world"}
	var chunks []string
	for i, d := range deltas {
		chunks = append(chunks, sseChunk(d, i == 0))
	}
	chunks = append(chunks, "data: [DONE]\n\n")
	primary := failovertest.NewServer(t, failovertest.Step{Status: http.StatusServiceUnavailable, Body: `{"error":{"message":"overloaded","type":"server_error"}}`})
	backup := failovertest.NewServer(t, failovertest.Step{Header: http.Header{"Cache-Control": {"no-cache"}}, Chunks: chunks})
	tr := newFailover(t, primary.URL+"/v1", backup.URL+"/v1", failover.Config{})
	client := newGoOpenAIClient(tr, primary.URL+"/v1")

	stream, err := client.CreateChatCompletionStream(testContext(t), goOpenAIRequest(true))
	if err != nil {
		t.Fatalf("CreateChatCompletionStream: %v", err)
	}
	defer stream.Close()
	var got []string
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Recv after %d chunks: %v", len(got), err)
		}
		if len(chunk.Choices) != 1 {
			t.Fatalf("chunk %d has %d choices, want 1", len(got), len(chunk.Choices))
		}
		got = append(got, chunk.Choices[0].Delta.Content)
	}
	if !slices.Equal(got, deltas) {
		t.Errorf("got deltas %q, want %q, one per Recv", got, deltas)
	}

	if primary.Calls() != 1 || backup.Calls() != 1 {
		t.Fatalf("got %d requests at the primary and %d at the backup, want 1 and 1", primary.Calls(), backup.Calls())
	}
	b := backup.Requests()[0]
	checkOwnKey(t, "backup", b, backupKey)
	if !strings.Contains(string(b.Body), `"stream":true`) {
		t.Errorf("backup got body %q, want a streaming request", b.Body)
	}
	if got := b.Header.Get("Accept"); got != "text/event-stream" {
		t.Errorf("backup got Accept %q, want text/event-stream", got)
	}
}
