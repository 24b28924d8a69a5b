package failover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A provider's answer, as its server sends it: status, headers and body.
type providerAnswer struct {
	name   string
	status int
	header []string // key, value, ...
	body   string
}

// Headers as the providers send them with their errors (the recordings in
// ../shared/recordings: OpenAI's and Anthropic's 200s, Gemini's 403).
var (
	openaiHeaders = []string{
		"Content-Type", "application/json",
		"Openai-Organization", "org-test", "Openai-Processing-Ms", "41", "Openai-Version", "2020-10-01",
		"X-Ratelimit-Limit-Requests", "10000", "X-Ratelimit-Remaining-Requests", "9999",
		"X-Ratelimit-Reset-Requests", "6ms", "X-Request-Id", "req_7997c69c86b744538a2884c8d777754b",
		"Server", "cloudflare",
	}
	azureHeaders     = []string{"Content-Type", "application/json", "Apim-Request-Id", "6b1d6f4e-7f3a-4c55-9a56-0d0f3f1a8b21", "X-Ms-Region", "East US", "X-Ms-Client-Request-Id", "6b1d6f4e-7f3a-4c55-9a56-0d0f3f1a8b21"}
	anthropicHeaders = []string{"Content-Type", "application/json", "Request-Id", "req_011CSFCDzbeWe2qGKAeNMhfZ", "Anthropic-Organization-Id", "2277c511-5523-4a62-83bd-b847b0c4b121", "X-Should-Retry", "false", "Server", "cloudflare"}
	googleHeaders    = []string{"Content-Type", "application/json; charset=UTF-8", "Server", "scaffolding on HTTPServer2", "Vary", "Origin", "X-Content-Type-Options", "nosniff", "X-Xss-Protection", "0"}
	jsonHeaders      = []string{"Content-Type", "application/json"}
)

// unservableAnswers are the answers that say the prompt is too long for
// the upstream's model, one per provider shape; unservable.go cites where
// each comes from.
var unservableAnswers = []providerAnswer{
	{"openai context_length_exceeded", 400, openaiHeaders, `{
  "error": {
    "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 204308 tokens. Please reduce the length of the messages.",
    "type": "invalid_request_error",
    "param": "messages",
    "code": "context_length_exceeded"
  }
}
`},
	{"azure context_length_exceeded", 400, azureHeaders, `{
  "error": {
    "message": "This model's maximum context length is 32768 tokens. However, you requested 35969 tokens (9969 in the messages, 26000 in the completion). Please reduce the length of the messages or completion.",
    "type": "invalid_request_error",
    "param": "messages",
    "code": "context_length_exceeded"
  }
}`},
	{"anthropic prompt is too long", 400, anthropicHeaders, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"},"request_id":"req_011CVQe1dLrGNMJyE1ghG1av"}`},
	{"anthropic on vertex 413", 413, googleHeaders, `{"type":"error","error":{"type":"invalid_request_error","message":"Prompt is too long"}}`},
	{"gemini token limit", 400, googleHeaders, `{
  "error": {
    "code": 400,
    "message": "The input token count (132478) exceeds the maximum number of tokens allowed (131072).",
    "status": "INVALID_ARGUMENT"
  }
}
`},
	{"gemini token limit, with errors", 400, googleHeaders, `{
  "error": {
    "code": 400,
    "message": "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).",
    "errors": [
      {
        "message": "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).",
        "domain": "global",
        "reason": "badRequest"
      }
    ],
    "status": "INVALID_ARGUMENT"
  }
}
`},
	{"gemini stream token limit", 400, googleHeaders, `[{
  "error": {
    "code": 400,
    "message": "The input token count (2551556) exceeds the maximum number of tokens allowed (1048576).",
    "status": "INVALID_ARGUMENT"
  }
}
]`},
	{"vertex token limit", 400, googleHeaders, `{"error":{"code":400,"message":"Unable to submit request because the input token count is 1251952 but model only supports up to 1048576. Reduce the input token count and try again. You can also use the CountTokens API to calculate prompt token count and billable characters. Learn more: https://cloud.google.com/vertex-ai/generative-ai/docs/learn/models","status":"INVALID_ARGUMENT"}}`},
	{"deepseek", 400, jsonHeaders, `{"error":{"message":"This model's maximum context length is 65536 tokens. However, you requested 66343 tokens (62247 in the messages, 4096 in the completion). Please reduce the length of the messages or completion.","type":"invalid_request_error","param":null,"code":"invalid_request_error"}}`},
	{"mistral", 400, jsonHeaders, `{"object":"error","message":"Prompt contains 300000 tokens, too large for model with 131072 maximum context length","type":"invalid_request_error","param":null,"code":null}`},
	{"groq context_length_exceeded", 400, jsonHeaders, `{"error":{"message":"Please reduce the length of the messages or completion.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`},
	{"groq 413 tokens per minute", 413, jsonHeaders, `{"error":{"message":"Request too large for model ` + "`llama-3.1-70b-versatile`" + ` in organization ` + "`org_01hsmce9vqehtt30cz5h7ebmk7`" + ` on tokens per minute (TPM): Limit 6000, Requested 18993, please reduce your message size and try again. Visit https://console.groq.com/docs/rate-limits for more information.","type":"tokens","code":"rate_limit_exceeded"}}`},
	{"openrouter context length", 400, jsonHeaders, `{"error":{"message":"This endpoint's maximum context length is 131072 tokens. However, you requested about 141607 tokens (10535 of text input, 131072 in the output). Please reduce the length of either one, or use the \"middle-out\" transform to compress your prompt automatically.","code":400,"metadata":{"provider_name":"Chutes"}}}`},
	{"vllm", 400, jsonHeaders, `{"object":"error","message":"This model's maximum context length is 32768 tokens. However, you requested 41648 tokens (37552 in the messages, 4096 in the completion). Please reduce the length of the messages or completion. None","type":"BadRequestError","param":null,"code":400}`},
	{"vllm max_tokens past the context", 400, jsonHeaders, `{"error":{"message":"'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None","type":"BadRequestError","param":null,"code":400}}`},
	{"sglang", 400, jsonHeaders, `{"object":"error","message":"The input (9000 tokens) is longer than the model's context length (8192 tokens).","type":"BadRequestError","param":null,"code":400}`},
	{"gemini 2.5, without the count", 400, googleHeaders, `{"error":{"code":400,"message":"The input token count exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}`},
	{"litellm proxy context window", 400, jsonHeaders, `{"error":{"message":"litellm.BadRequestError: litellm.ContextWindowExceededError: AnthropicError - {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long: 200480 tokens > 200000 maximum\"}}\nReceived Model Group=anthropic/claude-3-5-sonnet-20241022\nAvailable Model Group Fallbacks=None","type":null,"param":null,"code":"400"}}`},
}

// refusalAnswers are the answers that say the provider's content policy
// refused the request, one per provider shape; unservable.go cites where
// each comes from.
var refusalAnswers = []providerAnswer{
	{"openai invalid_prompt", 400, openaiHeaders, `{
  "error": {
    "message": "Invalid prompt: your prompt was flagged as potentially violating our usage policy. Please try again with a different prompt: https://platform.openai.com/docs/guides/reasoning#advice-on-prompting",
    "type": "invalid_request_error",
    "param": null,
    "code": "invalid_prompt"
  }
}
`},
	{"openai content_policy_violation", 400, openaiHeaders, `{
  "error": {
    "code": "content_policy_violation",
    "message": "Your request was rejected as a result of our safety system. Your prompt may contain text that is not allowed by our safety system.",
    "param": null,
    "type": "invalid_request_error"
  }
}
`},
	{"azure content_filter", 400, azureHeaders, `{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":false,"severity":"safe"},"jailbreak":{"filtered":false,"detected":false},"self_harm":{"filtered":true,"severity":"medium"},"sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":false,"severity":"safe"}}}}}`},
	{"anthropic content filtering policy", 400, anthropicHeaders, `{"type":"error","error":{"type":"invalid_request_error","message":"Output blocked by content filtering policy"},"request_id":"req_011CZibekJwDaAz4R8V6Qc5m"}`},
	{"openrouter moderation 403", 403, jsonHeaders, `{"error":{"code":403,"message":"Your chosen model requires moderation and your input was flagged","metadata":{"reasons":["harassment"],"flagged_input":"you are ...","provider_name":"OpenAI","model_slug":"openai/gpt-4o"}}}`},
	{"litellm proxy content policy", 400, jsonHeaders, `{"error":{"message":"litellm.ContentPolicyViolationError: AzureException - The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":null,"code":"400"}}`},
}

// nearMisses are a caller's own errors, and other answers that look like
// the ones above without saying the same: they keep their outcome (no
// failover for the caller's own 4xx).
var nearMisses = []struct {
	providerAnswer
	want Outcome
}{
	{providerAnswer{"openai bad parameter", 400, openaiHeaders, `{"error":{"message":"Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 200 instead.","type":"invalid_request_error","param":"temperature","code":"decimal_above_max_value"}}`}, Rejected},
	{providerAnswer{"openai string too long", 400, openaiHeaders, `{"error":{"message":"Invalid 'messages[0].content': string too long. Expected a string with maximum length 10485760, but got a string with length 10485761 instead.","type":"invalid_request_error","param":"messages[0].content","code":"string_above_max_length"}}`}, Rejected},
	{providerAnswer{"openai max_tokens too large", 400, openaiHeaders, `{"error":{"message":"max_tokens is too large: 100000. This model supports at most 16384 completion tokens, whereas you provided 100000.","type":"invalid_request_error","param":"max_tokens","code":"invalid_value"}}`}, Rejected},
	{providerAnswer{"a marker as a parameter's name", 400, openaiHeaders, `{"error":{"message":"Unrecognized request argument supplied: context_length_exceeded","type":"invalid_request_error","param":"context_length_exceeded","code":null}}`}, Rejected},
	{providerAnswer{"a marker in the param, not the code", 400, jsonHeaders, `{"error":{"message":"Invalid value","param":"content_filter","code":"invalid_value"}}`}, Rejected},
	{providerAnswer{"anthropic max_tokens", 400, anthropicHeaders, `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-4-5-20250929"}}`}, Rejected},
	{providerAnswer{"anthropic request_too_large", 413, anthropicHeaders, `{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}`}, Rejected},
	{providerAnswer{"mistral batch too large", 400, jsonHeaders, `{"object":"error","message":"Too many tokens in batch. Max is 16384 got 17555","type":"invalid_request_error","param":null,"code":null}`}, Rejected},
	{providerAnswer{"gemini bad argument", 400, googleHeaders, `{"error":{"code":400,"message":"* GenerateContentRequest.generation_config.max_output_tokens: max_output_tokens must be positive.\n","status":"INVALID_ARGUMENT"}}`}, Rejected},
	// A caller's own mistake whose message quotes what the caller sent:
	// a marker phrase in the caller's text is not the upstream's word.
	{providerAnswer{"vllm validation quoting the prompt", 400, jsonHeaders, `{"object":"error","message":"1 validation error for ChatCompletionRequest\nmessages.0.content\n  Input should be a valid string [type=string_type, input_value={'text': 'What is the maximum context length of gpt-4?'}, input_type=dict]","type":"BadRequestError","param":null,"code":400}`}, Rejected},
	{providerAnswer{"vllm validation quoting a marker's whole sentence", 400, jsonHeaders, `{"object":"error","message":"1 validation error for ChatCompletionRequest\n  Value error, prompt is too long: 9 tokens > 5 maximum [type=value_error, input_value={'messages': 'prompt is too long'}, input_type=dict]","type":"BadRequestError","param":null,"code":400}`}, Rejected},
	{providerAnswer{"openai invalid value quoting the caller", 400, openaiHeaders, `{"error":{"message":"Invalid value: 'This model's maximum context length is 5 tokens'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.","type":"invalid_request_error","param":"messages[0].role","code":"invalid_value"}}`}, Rejected},
	{providerAnswer{"a gateway's unknown model quoting the caller", 400, jsonHeaders, `{"error":{"message":"Unknown model: prompt is too long","type":"invalid_request_error"}}`}, Rejected},
	{providerAnswer{"litellm proxy, a caller's mistake whose fallback overflowed", 400, jsonHeaders, `{"error":{"message":"litellm.BadRequestError: BedrockException - {\"message\":\"messages.32.content: Conversation blocks and tool result blocks cannot be provided in the same turn.\"}\nError doing the fallback: litellm.BadRequestError: litellm.ContextWindowExceededError: AnthropicError - prompt is too long: 209303 tokens > 200000 maximum","type":null,"param":null,"code":"400"}}`}, Rejected},
	// Messages that begin with what the caller sent: OpenRouter's unknown
	// model (github.com/OpenRouterTeam/openrouter-examples issue 74),
	// Anthropic's unknown field (github.com/anthropics/claude-code issue
	// 4378), the caller's words reading as a pattern.
	{providerAnswer{"openrouter unknown model named as a pattern", 400, jsonHeaders, `{"error":{"message":"This model's maximum context length is 1 tokens is not a valid model ID","code":400},"user_id":"user_39ktqAYU0JZKhG1fder8F40HVSC"}`}, Rejected},
	{providerAnswer{"anthropic extra field named as a pattern", 400, anthropicHeaders, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: Extra inputs are not permitted"},"request_id":"req_011CSFCDzbeWe2qGKAeNMhfZ"}`}, Rejected},
	{providerAnswer{"anthropic extra field named as a phrase", 400, anthropicHeaders, `{"type":"error","error":{"type":"invalid_request_error","message":"output blocked by content filtering policy_x: Extra inputs are not permitted"}}`}, Rejected},
	{providerAnswer{"a marker phrase without its numbers", 400, jsonHeaders, `{"error":{"message":"This model's maximum context length is unknown.","type":"invalid_request_error"}}`}, Rejected},
	{providerAnswer{"not JSON", 400, []string{"Content-Type", "text/plain"}, "prompt is too long"}, Rejected},
	{providerAnswer{"empty", 400, jsonHeaders, ""}, Rejected},
	{providerAnswer{"a status that is not read", 422, jsonHeaders, `{"error":{"code":"context_length_exceeded"}}`}, Rejected},
	{providerAnswer{"gemini 403 (recorded)", 403, googleHeaders, `{
  "error": {
    "code": 403,
    "message": "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
    "status": "PERMISSION_DENIED"
  }
}
`}, AuthFailed},
	{providerAnswer{"azure resource blocked", 403, azureHeaders, `{"error":{"code":"Forbidden","message":"Your resource has been temporarily blocked because we detected behavior that may violate our content policy. For more details on Azure OpenAI service content policy, please visit https://aka.ms/aoaicodeofconduct"}}`}, AuthFailed},
}

// serve answers every request with a, exactly: its status, its headers,
// its body.
func (a providerAnswer) serve(w http.ResponseWriter, _ *http.Request) {
	for i := 0; i+1 < len(a.header); i += 2 {
		w.Header().Add(a.header[i], a.header[i+1])
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

// outcomeTrace records a request's Trace.
type outcomeTrace struct {
	attempts []Outcome
	done     TraceDone
}

func (r *outcomeTrace) context(ctx context.Context) context.Context {
	return WithTrace(ctx, &Trace{
		AttemptDone: func(d TraceAttemptDone) { r.attempts = append(r.attempts, d.Outcome) },
		Done:        func(d TraceDone) { r.done = d },
	})
}

// postTraced sends chatBody to tr at url with a Trace, and returns what came back
// and the trace.
func postTraced(t *testing.T, tr *Transport, url string) (*http.Response, *outcomeTrace) {
	t.Helper()
	var tc outcomeTrace
	req := httptestRequest("POST", url, chatBody)
	resp, err := tr.RoundTrip(req.WithContext(tc.context(req.Context())))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	return resp, &tc
}

// Each provider's answer that the upstream cannot serve the request fails
// over at once to a backup, which serves it; alone, the upstream's answer
// reaches the caller as it came. Either way the upstream is blamed for
// nothing, and the Trace and failover_requests_total say the same.
func TestUnservableProviders(t *testing.T) {
	for _, a := range unservableAnswers {
		t.Run(a.name, func(t *testing.T) {
			t.Run("with a backup", func(t *testing.T) {
				primary := newServer(t, a.serve)
				backup := newUpstreamServer(t, 200, "from backup")
				tr := newTestTransport(t, Config{Upstreams: []Upstream{
					{Name: "primary", BaseURL: primary.URL},
					{Name: "backup", BaseURL: backup.URL},
				}})
				resp, tc := postTraced(t, tr, primary.URL+"/v1/chat/completions")
				if got := readBody(t, resp); resp.StatusCode != 200 || got != "from backup" {
					t.Fatalf("got %d %q, want the backup's 200", resp.StatusCode, got)
				}
				checkUnblamed(t, tr.Health()[0], 1)
				if got, want := fmt.Sprint(tc.attempts), "[unservable success]"; got != want {
					t.Errorf("Trace attempts %s, want %s", got, want)
				}
				if tc.done.Outcome != RequestFailedOver || tc.done.Upstream != "backup" {
					t.Errorf("Trace done %s from %q, want failed_over from backup", tc.done.Outcome, tc.done.Upstream)
				}
				for series, want := range map[string]float64{
					`failover_requests_total{upstream="backup",outcome="failed_over"}`: 1,
					`failover_attempts_total{upstream="primary",outcome="unservable"}`: 1,
					`failover_attempts_total{upstream="primary",outcome="rejected"}`:   0,
					`failover_failovers_total{from="primary",to="backup"}`:             1,
				} {
					if got := metricValue(t, tr, series); got != want {
						t.Errorf("%s = %v, want %v", series, got, want)
					}
				}
			})
			t.Run("alone", func(t *testing.T) {
				primary := newServer(t, a.serve)
				tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "primary", BaseURL: primary.URL}}})
				resp, tc := postTraced(t, tr, primary.URL+"/v1/chat/completions")
				checkAnswer(t, resp, a)
				checkUnblamed(t, tr.Health()[0], 1)
				if tc.done.Outcome != RequestFailed || tc.done.StatusCode != a.status || tc.done.Upstream != "primary" {
					t.Errorf("Trace done %+v, want failed with the primary's %d", tc.done, a.status)
				}
				if got := metricValue(t, tr, `failover_requests_total{upstream="primary",outcome="failed"}`); got != 1 {
					t.Errorf("failed requests = %v, want 1", got)
				}
			})
		})
	}
}

// checkAnswer checks that resp is a, byte for byte, with a's headers.
func checkAnswer(t *testing.T, resp *http.Response, a providerAnswer) {
	t.Helper()
	body := readBody(t, resp)
	if resp.StatusCode != a.status || body != a.body {
		t.Fatalf("got %d %q, want %d %q", resp.StatusCode, body, a.status, a.body)
	}
	for i := 0; i+1 < len(a.header); i += 2 {
		if got := resp.Header.Get(a.header[i]); got != a.header[i+1] {
			t.Errorf("header %s = %q, want %q", a.header[i], got, a.header[i+1])
		}
	}
}

// checkUnblamed checks that h counts n unservable attempts and nothing
// against its upstream: no breaker failure, no cooldown, no last error, no
// figure of the window.
func checkUnblamed(t *testing.T, h UpstreamHealth, n uint64) {
	t.Helper()
	if h.Requests.Unservable != n || h.Requests.Total() != n {
		t.Errorf("%s counted %+v, want %d unservable", h.Name, h.Requests, n)
	}
	if h.BreakerFailures != 0 || h.State != "closed" || h.Trips != 0 || !h.Available {
		t.Errorf("%s: breaker failures %d, state %s, trips %d, available %v: want nothing counted", h.Name, h.BreakerFailures, h.State, h.Trips, h.Available)
	}
	if h.Cooldown != 0 || h.LastError != "" {
		t.Errorf("%s: cooldown %v, last error %q: want none", h.Name, h.Cooldown, h.LastError)
	}
	if h.Window != 0 || h.SuccessRate != 1 || h.P99 != 0 {
		t.Errorf("%s: window %d, success rate %v, p99 %v: want no figures", h.Name, h.Window, h.SuccessRate, h.P99)
	}
}

// A caller's own 400 stays the caller's: no failover, the primary's answer
// as it came, counted as rejected (or auth_failed for a 403 that says
// nothing of content).
func TestUnservableNearMisses(t *testing.T) {
	for _, nm := range nearMisses {
		t.Run(nm.name, func(t *testing.T) {
			primary := newServer(t, nm.serve)
			backup := newUpstreamServer(t, 200, "from backup")
			tr := newTestTransport(t, Config{Upstreams: []Upstream{
				{Name: "primary", BaseURL: primary.URL},
				{Name: "backup", BaseURL: backup.URL},
			}})
			resp, _ := postTraced(t, tr, primary.URL+"/v1/chat/completions")
			h := tr.Health()[0]
			if got := countOf(h.Requests, nm.want); got != 1 || h.Requests.Total() != 1 {
				t.Errorf("primary counted %+v, want one %v", h.Requests, nm.want)
			}
			if nm.want == AuthFailed { // fails over, as a 403 always did
				if got := readBody(t, resp); got != "from backup" {
					t.Errorf("got %d %q, want the backup's", resp.StatusCode, got)
				}
				return
			}
			checkAnswer(t, resp, nm.providerAnswer)
			if backup.count() != 0 {
				t.Errorf("the backup was tried after the caller's own %d", nm.status)
			}
		})
	}
}

// DefaultClassifier decides from the peeked body only: the same 400
// without one (a Breaker, a response made by hand) is Rejected.
func TestDefaultClassifierUnservable(t *testing.T) {
	for _, a := range unservableAnswers {
		resp := &http.Response{StatusCode: a.status, Body: io.NopCloser(strings.NewReader(a.body))}
		want := Rejected
		if a.status == http.StatusForbidden {
			want = AuthFailed
		}
		if got := DefaultClassifier(resp, nil); got != want {
			t.Errorf("%s, not peeked: DefaultClassifier = %v, want %v", a.name, got, want)
		}
		peekBody(resp)
		if got := DefaultClassifier(resp, nil); got != Unservable {
			t.Errorf("%s, peeked: DefaultClassifier = %v, want unservable", a.name, got)
		}
	}
	for _, a := range refusalAnswers {
		resp := &http.Response{StatusCode: a.status, Body: io.NopCloser(strings.NewReader(a.body))}
		peekBody(resp)
		if got := DefaultClassifier(resp, nil); got != Rejected {
			t.Errorf("%s, peeked: DefaultClassifier = %v, want rejected", a.name, got)
		}
	}
	for _, code := range []int{200, 201, 301, 404, 422, 429, 500, 503} {
		if peekable(code) {
			t.Errorf("peekable(%d): the body of a %d must not be read", code, code)
		}
	}
}

// bodyProbe is a response body that records whether it was read, and
// when it was closed.
type bodyProbe struct {
	io.Reader
	reads  atomic.Int32
	closed atomic.Bool
}

func (b *bodyProbe) Read(p []byte) (int, error) {
	b.reads.Add(1)
	return b.Reader.Read(p)
}

func (b *bodyProbe) Close() error { b.closed.Store(true); return nil }

// Only a 400, 403 or 413 has its body read before RoundTrip returns; a
// 2xx and every other status reach the caller unread.
func TestUnservableNoPeek(t *testing.T) {
	for _, code := range []int{200, 201, 206, 304, 400, 403, 404, 409, 413, 422, 500, 503, 529} {
		var probe *bodyProbe
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			probe = &bodyProbe{Reader: strings.NewReader(`{"error":{"code":"invalid_value"}}`)}
			resp := respond(code, "")
			resp.Body = probe
			return resp, nil
		})
		tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}})
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", chatBody))
		if err != nil {
			t.Fatalf("%d: %v", code, err)
		}
		read := probe.reads.Load() > 0
		if read != peekable(code) {
			t.Errorf("%d: body read before the caller: %v, want %v", code, read, peekable(code))
		}
		if got := readBody(t, resp); got != `{"error":{"code":"invalid_value"}}` {
			t.Errorf("%d: body %q, want it whole", code, got)
		}
	}
}

// A body larger than the peek is judged by its first 4 KiB and handed back
// whole: the bytes read first, then the rest, from the connection.
func TestUnservableLargeBody(t *testing.T) {
	pad := strings.Repeat("x", 100<<10)
	cases := []struct {
		name string
		body string
		want Outcome
	}{
		{"marker first", `{"error":{"message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded","detail":"` + pad + `"}}`, Unservable},
		{"marker past the peek", `{"error":{"detail":"` + pad + `","code":"context_length_exceeded"}}`, Rejected},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := providerAnswer{tc.name, 400, openaiHeaders, tc.body}
			primary := newServer(t, a.serve)
			tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "primary", BaseURL: primary.URL}}})
			resp, _ := postTraced(t, tr, primary.URL+"/v1/chat/completions")
			if _, ok := resp.Body.(*peekedBody); !ok {
				t.Errorf("body %T, want the peeked body", resp.Body)
			}
			checkAnswer(t, resp, a)
			if got := countOf(tr.Health()[0].Requests, tc.want); got != 1 {
				t.Errorf("counted %+v, want one %v", tr.Health()[0].Requests, tc.want)
			}
		})
	}
}

// A body is peeked for as long as it takes to come, up to drainTimeout,
// and is never cut: a body that stalls is judged by what arrived, the
// failover is not held up for longer, and the caller of the only upstream
// reads the rest when it comes. An error body that comes in parts, or
// trickles, arrives whole; a whole JSON object ends the peek at once.
func TestUnservableSlowBody(t *testing.T) {
	// The message arrives at once; the object's end stalls.
	const first = `{"error":{"message":"prompt is too long: 208310 tokens > 200000 maximum","type":"invalid_request_error"`
	const rest = `}}`
	const stall = 20 * time.Second // far past drainTimeout: a peek that waited for it shows
	parts := func(first, rest string, release <-chan struct{}) func(w http.ResponseWriter, r *http.Request) {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			io.WriteString(w, first)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			case <-time.After(stall):
			}
			io.WriteString(w, rest)
		}
	}
	t.Run("stalls, with a backup", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		primary := newServer(t, parts(first, rest, release))
		backup := newUpstreamServer(t, 200, "from backup")
		tr := newTestTransport(t, Config{Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL},
			{Name: "backup", BaseURL: backup.URL},
		}})
		start := time.Now()
		resp, tc := postTraced(t, tr, primary.URL+"/v1/chat/completions")
		if got := readBody(t, resp); got != "from backup" {
			t.Fatalf("got %q, want the backup's", got)
		}
		if took := time.Since(start); took >= stall {
			t.Errorf("the failover took %v: the peek waited for the stalled body", took)
		}
		if got := fmt.Sprint(tc.attempts); got != "[unservable success]" {
			t.Errorf("attempts %s, want [unservable success]", got)
		}
		checkUnblamed(t, tr.Health()[0], 1)
	})
	t.Run("stalls, alone", func(t *testing.T) {
		release := make(chan struct{})
		primary := newServer(t, parts(first, rest, release))
		tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "primary", BaseURL: primary.URL}}})
		resp, _ := postTraced(t, tr, primary.URL+"/v1/chat/completions")
		defer resp.Body.Close()
		if p, ok := BodyPrefix(resp); !ok || string(p) != first {
			t.Errorf("BodyPrefix %q, %v; want the bytes that arrived, %q", p, ok, first)
		}
		close(release) // the rest comes after the answer was judged
		got, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || string(got) != first+rest || err != nil {
			t.Fatalf("got %d %q, %v; want the 400 whole", resp.StatusCode, got, err)
		}
		checkUnblamed(t, tr.Health()[0], 1)
	})
	t.Run("closed while it stalls", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		primary := newServer(t, parts(first, rest, release))
		tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "primary", BaseURL: primary.URL}}})
		resp, _ := postTraced(t, tr, primary.URL+"/v1/chat/completions")
		resp.Body.Close() // ends the read pending behind the body
		if _, err := io.ReadAll(resp.Body); err == nil {
			t.Error("a closed body read without an error")
		}
	})
	t.Run("an ordinary 400 in parts", func(t *testing.T) {
		// The caller's own mistake, its body flushed in two parts further
		// apart than drainTimeout: Rejected on what arrived, and whole.
		const first = `{"error":{"message":"Invalid 'temperature': `
		const rest = `decimal above maximum value.","type":"invalid_request_error"}}`
		release := make(chan struct{})
		primary := newServer(t, parts(first, rest, release))
		tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "primary", BaseURL: primary.URL}}})
		resp, tc := postTraced(t, tr, primary.URL+"/v1/chat/completions")
		defer resp.Body.Close()
		close(release)
		got, err := io.ReadAll(resp.Body)
		if string(got) != first+rest || err != nil {
			t.Errorf("400's body read %q, %v; want it whole", got, err)
		}
		if fmt.Sprint(tc.attempts) != "[rejected]" {
			t.Errorf("attempts %v, want [rejected]", tc.attempts)
		}
	})
	t.Run("a whole object, then a stall", func(t *testing.T) {
		// The object's end ends the peek: nothing waits for the stall
		// behind it, and the caller still reads the body to its end.
		release := make(chan struct{})
		primary := newServer(t, parts(first+rest, "\n", release))
		tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "primary", BaseURL: primary.URL}}})
		resp, _ := postTraced(t, tr, primary.URL+"/v1/chat/completions")
		defer resp.Body.Close()
		if p, ok := BodyPrefix(resp); !ok || string(p) != first+rest {
			t.Errorf("BodyPrefix %q, %v; want the object, %q", p, ok, first+rest)
		}
		close(release)
		if got, err := io.ReadAll(resp.Body); string(got) != first+rest+"\n" || err != nil {
			t.Errorf("read %q, %v; want the body whole", got, err)
		}
	})
	t.Run("trickles in time", func(t *testing.T) {
		// In a bubble: over a real server, the parts, 5ms apart, had to
		// arrive within the peek's 250ms of wall clock, which a loaded
		// machine could overrun.
		synctest.Test(t, func(t *testing.T) {
			const head = first + rest
			a := providerAnswer{"trickle", 400, jsonHeaders, head}
			n := newFakeNet()
			n.handle("a.test", func(*http.Request) (*http.Response, error) {
				pr, pw := io.Pipe()
				go func() {
					for i := 0; i < len(head); i += 16 {
						if _, err := io.WriteString(pw, head[i:min(i+16, len(head))]); err != nil {
							return
						}
						time.Sleep(5 * time.Millisecond)
					}
					pw.Close()
				}()
				resp := respond(400, "", "Content-Type", "application/json")
				resp.Body, resp.ContentLength = pr, -1
				return resp, nil
			})
			tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{Name: "primary", BaseURL: "http://a.test"}}})
			resp, _ := postTraced(t, tr, "http://a.test/v1/chat/completions")
			checkAnswer(t, resp, a)
			checkUnblamed(t, tr.Health()[0], 1)
		})
	})
}

// When every upstream says it cannot serve the request, the caller gets
// the last one's answer as it came; nobody is blamed, nothing trips or
// cools down however often it happens, and Retries do not send the request
// round again: every upstream would say the same.
func TestUnservableEverywhere(t *testing.T) {
	answers := []providerAnswer{unservableAnswers[0], unservableAnswers[2], unservableAnswers[4]} // OpenAI, Anthropic, Gemini
	var ups []Upstream
	var servers []*server
	for i, a := range answers {
		s := newServer(t, a.serve)
		servers = append(servers, s)
		ups = append(ups, Upstream{Name: fmt.Sprint("u", i), BaseURL: s.URL})
	}
	tr := newTestTransport(t, Config{Upstreams: ups, Retries: 2, Breaker: BreakerConfig{FailureThreshold: 2}})
	const requests = 5
	for range requests {
		resp, tc := postTraced(t, tr, servers[0].URL+"/v1/chat/completions")
		checkAnswer(t, resp, answers[2])
		if got, want := fmt.Sprint(tc.attempts), "[unservable unservable unservable]"; got != want {
			t.Fatalf("Trace attempts %s, want %s", got, want)
		}
		if tc.done.Outcome != RequestFailed || tc.done.Upstream != "u2" || tc.done.Attempts != 3 {
			t.Fatalf("Trace done %+v, want failed with u2's answer after 3 attempts", tc.done)
		}
	}
	for i, h := range tr.Health() {
		checkUnblamed(t, h, requests)
		if n := servers[i].count(); n != requests {
			t.Errorf("%s got %d requests, want %d: one a request", h.Name, n, requests)
		}
	}
	if got := metricValue(t, tr, `failover_requests_total{upstream="u2",outcome="failed"}`); got != requests {
		t.Errorf("failed requests = %v, want %d", got, requests)
	}
}

// An upstream that answered Unservable is not asked again by a later
// round (Config.Retries) when another upstream failed beside it, nor as
// the last resort: it said it cannot serve this request, and a refused
// prompt sent again is one more refusal on the account.
func TestUnservableNotAskedAgain(t *testing.T) {
	for name, cfg := range map[string]Config{
		"retries":     {Retries: 2},
		"last resort": {Retries: 1, Breaker: BreakerConfig{FailureThreshold: 1}}, // b's circuit opens
		"hedged":      {Retries: 1, Hedge: &HedgeConfig{Delay: time.Hour}},
	} {
		n := newFakeNet()
		n.status("a.test", 400, unservableAnswers[0].body, "Content-Type", "application/json") // context_length_exceeded
		n.status("b.test", 503, "b down")
		cfg.Retry.Off = true // one a round, not one more at b
		tr := newTestTransport(t, twoUpstreams(n, cfg))
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", chatBody))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := n.count("a.test"); got != 1 {
			t.Errorf("%s: a (Unservable) got the request %d times, want 1", name, got)
		}
		if got := n.count("b.test"); got != 2 && name != "retries" || got != 3 && name == "retries" {
			t.Errorf("%s: b got %d requests, want one a round", name, got)
		}
	}
}

// An upstream that answered Unservable leaves the others to serve the
// request; when every one of those cools down after a 429, the request
// waits for the first to come back (RateLimit.MaxWait), as it does when
// every upstream was skipped, rather than ending on the 400 (found by
// review).
func TestUnservableThenWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 400, unservableAnswers[0].body, "Content-Type", "application/json") // context_length_exceeded
		var busy atomic.Bool
		busy.Store(true)
		n.handle("b.test", func(*http.Request) (*http.Response, error) {
			if busy.Load() {
				return respond(429, "busy", "Retry-After", "2"), nil
			}
			return respond(200, "from b"), nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{RateLimit: RateLimitConfig{MaxWait: 10 * time.Second}}))
		// b cools down for 2s.
		req := httptestRequest("POST", "http://a.test/v1/chat/completions", chatBody)
		resp, err := tr.RoundTrip(req.WithContext(WithUpstreams(req.Context(), "b")))
		if err != nil || resp.StatusCode != 429 {
			t.Fatalf("setup: %v %v", resp, err)
		}
		resp.Body.Close()
		busy.Store(false)

		start := time.Now()
		resp, err = tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", chatBody))
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		if resp.StatusCode != 200 || body != "from b" {
			t.Errorf("got %d %.40q after %v; want b's 200 after waiting 2s for its cooldown (MaxWait 10s)", resp.StatusCode, body, time.Since(start))
		}
	})
}

// The same with b's circuit open: the last resort goes to b, the upstream
// left (found by review).
func TestUnservableThenLastResort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 400, unservableAnswers[0].body, "Content-Type", "application/json")
		var down atomic.Bool
		down.Store(true)
		n.handle("b.test", func(*http.Request) (*http.Response, error) {
			if down.Load() {
				return respond(503, "down"), nil
			}
			return respond(200, "from b"), nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		req := httptestRequest("POST", "http://a.test/v1/chat/completions", chatBody)
		resp, err := tr.RoundTrip(req.WithContext(WithUpstreams(req.Context(), "b")))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if s := tr.Health()[1].State; s != Open.String() {
			t.Fatalf("setup: b is %v, want open", s)
		}
		down.Store(false)

		resp, err = tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", chatBody))
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(t, resp)
		if resp.StatusCode != 200 || n.count("b.test") != 2 {
			t.Errorf("got %d %.40q, b asked %d times; want the last resort to b (its circuit open, a unable to serve)", resp.StatusCode, body, n.count("b.test"))
		}
	})
}

// Unservable, then a failure: the caller gets the latest answer held, as
// for any two failures; the failure alone counts against its upstream.
func TestUnservableThenFailure(t *testing.T) {
	primary := newServer(t, unservableAnswers[0].serve)
	backup := newUpstreamServer(t, 503, `{"error":"overloaded"}`)
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL},
		{Name: "backup", BaseURL: backup.URL},
	}})
	resp, tc := postTraced(t, tr, primary.URL+"/v1/chat/completions")
	if got := readBody(t, resp); resp.StatusCode != 503 {
		t.Fatalf("got %d %q, want the backup's 503", resp.StatusCode, got)
	}
	checkUnblamed(t, tr.Health()[0], 1)
	if h := tr.Health()[1]; h.Requests.Failed != 1 || h.BreakerFailures != 1 {
		t.Errorf("backup %+v, breaker failures %d: want its failure counted", h.Requests, h.BreakerFailures)
	}
	if tc.done.Outcome != RequestFailed {
		t.Errorf("Trace done %s, want failed", tc.done.Outcome)
	}
}

// A hedged round moves on from an unservable answer as a plain one does.
func TestUnservableHedged(t *testing.T) {
	primary := newServer(t, unservableAnswers[2].serve)
	backup := newUpstreamServer(t, 200, "from backup")
	tr := newTestTransport(t, Config{Hedge: &HedgeConfig{Delay: time.Minute}, Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL},
		{Name: "backup", BaseURL: backup.URL},
	}})
	resp, tc := postTraced(t, tr, primary.URL+"/v1/chat/completions")
	if got := readBody(t, resp); got != "from backup" {
		t.Fatalf("got %d %q, want the backup's", resp.StatusCode, got)
	}
	checkUnblamed(t, tr.Health()[0], 1)
	if tc.done.Outcome != RequestFailedOver {
		t.Errorf("Trace done %s, want failed_over", tc.done.Outcome)
	}
}

// A custom Classifier returns Unservable for its own upstreams' wording
// through BodyPrefix, and defers to DefaultClassifier for the rest.
func TestClassifierUnservable(t *testing.T) {
	gateway := newServer(t, providerAnswer{"gateway", 400, jsonHeaders, `{"detail":"this deployment takes no images"}`}.serve)
	backup := newUpstreamServer(t, 200, "from backup")
	var saw atomic.Value
	classify := func(resp *http.Response, err error) Outcome {
		if p, ok := BodyPrefix(resp); ok {
			saw.Store(string(p))
			if bytes.Contains(p, []byte("takes no images")) {
				return Unservable
			}
		}
		return DefaultClassifier(resp, err)
	}
	tr := newTestTransport(t, Config{Classify: classify, Upstreams: []Upstream{
		{Name: "gateway", BaseURL: gateway.URL},
		{Name: "backup", BaseURL: backup.URL},
	}})
	resp, _ := postTraced(t, tr, gateway.URL+"/v1/chat/completions")
	if got := readBody(t, resp); got != "from backup" {
		t.Fatalf("got %d %q, want the backup's", resp.StatusCode, got)
	}
	if got, _ := saw.Load().(string); got != `{"detail":"this deployment takes no images"}` {
		t.Errorf("BodyPrefix = %q, want the gateway's body", got)
	}
	checkUnblamed(t, tr.Health()[0], 1)
	if _, ok := BodyPrefix(&http.Response{StatusCode: 400, Body: http.NoBody}); ok {
		t.Error("BodyPrefix of a response that did not come through a Transport: ok, want none")
	}
	if _, ok := BodyPrefix(nil); ok {
		t.Error("BodyPrefix(nil): ok, want none")
	}
}

// A custom Classifier's Unservable for an error (no response) moves on,
// and the request ends with an *Error that carries it.
func TestClassifierUnservableError(t *testing.T) {
	errNoImages := errors.New("no images here")
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) { return nil, errNoImages })
	tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"}},
		Classify: func(*http.Response, error) Outcome { return Unservable }})
	_, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", chatBody))
	var ferr *Error
	if !errors.As(err, &ferr) || len(ferr.Attempts) != 2 || !errors.Is(err, errNoImages) {
		t.Fatalf("err %v, want an *Error of both attempts", err)
	}
	for _, h := range tr.Health() {
		checkUnblamed(t, h, 1)
	}
}

// Neither kind of marker ever panics, and each says the same of the same
// bytes; what a body cut short says, the whole body says too.
func FuzzMarkers(f *testing.F) {
	for _, a := range unservableAnswers {
		f.Add([]byte(a.body))
	}
	for _, a := range refusalAnswers {
		f.Add([]byte(a.body))
	}
	for _, nm := range nearMisses {
		f.Add([]byte(nm.body))
	}
	f.Add([]byte(`{"a":[{"b":{"c":[1,2,{"code":"content_filter"}]}}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for name, m := range map[string]*markers{"contextLength": &contextLength, "contentPolicy": &contentPolicy} {
			got := m.in(body)
			if again := m.in(body); again != got {
				t.Fatalf("%s.in(%q) = %v, then %v", name, body, got, again)
			}
			for _, cut := range []int{len(body) / 2, len(body) - 1} {
				if cut >= 0 && m.in(body[:cut]) && !got {
					t.Fatalf("%s: %q: a prefix says so, the whole does not", name, body)
				}
			}
		}
	})
}

// The next upstream is tried whatever model it serves the request with:
// the same model elsewhere may have a larger context (another provider,
// another tier) or another content policy. With Models, the request goes
// to each upstream with its own model, as any failover does.
func TestUnservableSameModel(t *testing.T) {
	for _, models := range []map[string]string{nil, {"gpt-4o-mini": "gpt-4o-mini"}, {"gpt-4o-mini": "gpt-4.1-mini"}} {
		primary := newServer(t, unservableAnswers[0].serve)
		backup := newUpstreamServer(t, 200, "from backup")
		tr := newTestTransport(t, Config{Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL},
			{Name: "backup", BaseURL: backup.URL, Models: models},
		}})
		resp, _ := postTraced(t, tr, primary.URL+"/v1/chat/completions")
		if got := readBody(t, resp); got != "from backup" {
			t.Fatalf("Models %v: got %d %q, want the backup's", models, resp.StatusCode, got)
		}
		want := chatBody
		if m := models["gpt-4o-mini"]; m != "" {
			want = strings.Replace(chatBody, "gpt-4o-mini", m, 1)
		}
		if got := backup.requests()[0].Body; got != want {
			t.Errorf("Models %v: backup got %s, want %s", models, got, want)
		}
	}
}

// A content-policy refusal is the caller's answer: it reaches the caller
// from the first upstream after one attempt, nothing else is tried and
// nobody is blamed; with Config.FailoverContentPolicy, or a Classifier
// that defers to DefaultClassifier under it, it fails over as an
// Unservable answer does. A prompt too long fails over either way.
func TestContentPolicy(t *testing.T) {
	deferring := func(resp *http.Response, err error) Outcome { return DefaultClassifier(resp, err) }
	type setup struct {
		name     string
		cfg      Config
		failover bool // whether a refusal fails over
	}
	setups := []setup{
		{"default", Config{}, false},
		{"deferring classifier", Config{Classify: deferring}, false},
		{"FailoverContentPolicy", Config{FailoverContentPolicy: true}, true},
		{"FailoverContentPolicy, deferring classifier", Config{FailoverContentPolicy: true, Classify: deferring}, true},
	}
	type answer struct {
		providerAnswer
		refusal bool
	}
	var answers []answer
	for _, a := range refusalAnswers {
		answers = append(answers, answer{a, true})
	}
	answers = append(answers, answer{unservableAnswers[0], false}, answer{unservableAnswers[2], false})
	for _, st := range setups {
		for _, a := range answers {
			t.Run(st.name+"/"+a.name, func(t *testing.T) {
				runContentPolicy(t, st.cfg, a.providerAnswer, st.failover || !a.refusal)
			})
		}
	}
}

// runContentPolicy sends a request to a primary that answers a, with a
// backup behind it, and checks that it failed over when failover says so,
// and otherwise that the caller got a from one attempt, nobody blamed.
func runContentPolicy(t *testing.T, cfg Config, a providerAnswer, failover bool) {
	t.Helper()
	primary := newServer(t, a.serve)
	backup := newUpstreamServer(t, 200, "from backup")
	cfg.Upstreams = []Upstream{{Name: "primary", BaseURL: primary.URL}, {Name: "backup", BaseURL: backup.URL}}
	tr := newTestTransport(t, cfg)
	resp, tc := postTraced(t, tr, primary.URL+"/v1/chat/completions")
	h := tr.Health()[0]
	if failover {
		if got := readBody(t, resp); resp.StatusCode != 200 || got != "from backup" {
			t.Fatalf("got %d %q, want the backup's 200", resp.StatusCode, got)
		}
		checkUnblamed(t, h, 1)
		return
	}
	checkAnswer(t, resp, a)
	if got, want := fmt.Sprint(tc.attempts), "[rejected]"; got != want || tc.done.Attempts != 1 {
		t.Errorf("Trace attempts %s (%d), want %s (1)", got, tc.done.Attempts, want)
	}
	if n := backup.count(); n != 0 {
		t.Errorf("the backup got %d requests, want none", n)
	}
	if h.Requests.Rejected != 1 || h.Requests.Total() != 1 {
		t.Errorf("primary counted %+v, want one rejected", h.Requests)
	}
	if h.BreakerFailures != 0 || h.State != "closed" || h.Cooldown != 0 || h.LastError != "" || !h.Available {
		t.Errorf("primary: breaker failures %d, state %s, cooldown %v, last error %q, available %v: want nothing against it",
			h.BreakerFailures, h.State, h.Cooldown, h.LastError, h.Available)
	}
}
