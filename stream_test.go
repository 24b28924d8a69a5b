package failover

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"
)

// Streams as the providers send them (shapes from the recordings in
// ../shared/recordings and the providers' documentation).
const (
	sseChatRole    = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1755691077,"model":"gpt-4o-mini","service_tier":"default","system_fingerprint":null,"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
	sseChatContent = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1755691077,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"1"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
	sseChatStop    = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1755691077,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}` + "\n\n"
	sseChatUsage   = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1755691077,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":14,"completion_tokens":13,"total_tokens":27}}` + "\n\n"
	sseChatTool    = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}],"refusal":null},"finish_reason":null}]}` + "\n\n"
	sseChatRefusal = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"refusal":"I can't"},"finish_reason":null}]}` + "\n\n"
	sseChatNullErr = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","error":null,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	sseChatError   = `data: {"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}` + "\n\n"
	sseDone        = "data: [DONE]\n\n"

	sseDeepseekReasoning = `data: {"id":"1","object":"chat.completion.chunk","created":1,"model":"deepseek-reasoner","choices":[{"index":0,"delta":{"content":null,"reasoning_content":"Okay"},"logprobs":null,"finish_reason":null}]}` + "\n\n"

	sseOpenRouterComment = ": OPENROUTER PROCESSING\n\n"
	sseOpenRouterRole    = `data: {"id":"gen-1754667632-NNYO","provider":"Venice","model":"meta-llama/llama-3.2-3b-instruct:free","object":"chat.completion.chunk","created":1754667632,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]}` + "\n\n"
	sseOpenRouterContent = `data: {"id":"gen-1754667632-NNYO","provider":"Venice","model":"meta-llama/llama-3.2-3b-instruct:free","object":"chat.completion.chunk","created":1754667632,"choices":[{"index":0,"delta":{"role":"assistant","content":"test response"},"finish_reason":"stop","native_finish_reason":"stop","logprobs":null}]}` + "\n\n"
	sseOpenRouterError   = `data: {"id":"gen-1","object":"chat.completion.chunk","created":1754667632,"model":"m","provider":"Venice","error":{"code":502,"message":"Provider returned error"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}` + "\n\n"

	sseAnthropicStart      = "event: message_start\n" + `data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":15,"output_tokens":1}}}` + "\n\n"
	sseAnthropicBlockStart = "event: content_block_start\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}  }` + "\n\n"
	sseAnthropicToolStart  = "event: content_block_start\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{}}}` + "\n\n"
	sseAnthropicPing       = "event: ping\n" + `data: {"type": "ping"}` + "\n\n"
	sseAnthropicDelta      = "event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"1"}  }` + "\n\n"
	sseAnthropicStop       = "event: message_stop\n" + `data: {"type":"message_stop"}` + "\n\n"
	sseAnthropicOverloaded = "event: error\n" + `data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}` + "\n\n"

	sseResponsesCreated    = "event: response.created\n" + `data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1741290958,"status":"in_progress","error":null,"incomplete_details":null,"model":"gpt-4.1-2025-04-14","output":[]}}` + "\n\n"
	sseResponsesInProgress = "event: response.in_progress\n" + `data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","object":"response","created_at":1741290958,"status":"in_progress","error":null,"output":[]}}` + "\n\n"
	sseResponsesReasoning  = "event: response.output_item.added\n" + `data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}` + "\n\n"
	sseResponsesMessage    = "event: response.output_item.added\n" + `data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}}` + "\n\n"
	sseResponsesTextDelta  = "event: response.output_text.delta\n" + `data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}` + "\n\n"
	sseResponsesQuota      = "event: error\n" + `data: {"type":"error","sequence_number":2,"code":"insufficient_quota","message":"You exceeded your current quota, please check your plan and billing details.","param":null}` + "\n\n"
	sseResponsesFailed     = "event: response.failed\n" + `data: {"type":"response.failed","sequence_number":3,"response":{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"output":[]}}` + "\n\n"

	sseGeminiContent = `data: {"candidates": [{"content": {"parts": [{"text": "Hello"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 9},"modelVersion": "gemini-2.5-flash","responseId": "VB-jaN"}` + "\r\n\r\n"
	sseGeminiError   = `data: {"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}` + "\r\n\r\n"
)

// ssePings is n Anthropic ssePings.
func ssePings(n int) string { return strings.Repeat(sseAnthropicPing, n) }

// sseCRLF and sseCR reframe a stream's LF line ends.
func sseCRLF(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }
func sseCR(s string) string   { return strings.ReplaceAll(s, "\n", "\r") }

type guardCase struct {
	name   string
	g      StreamGuard
	stream string
	// err is the error the guard returns (nil: the stream is returned),
	// code the error code it must name.
	err  error
	code string
	// atEnd says the guard decides only at the end of the stream; others
	// decide the same when the stream goes on.
	atEnd bool
}

var guardCases = []guardCase{
	{name: "openai/content first", stream: sseChatContent + sseChatStop + sseDone},
	{name: "openai/role then content", stream: sseChatRole + sseChatContent + sseChatStop + sseChatUsage + sseDone},
	{name: "openai/role then error", stream: sseChatRole + sseChatError, err: ErrStreamError, code: "insufficient_quota"},
	{name: "openai/error after content passes", stream: sseChatRole + sseChatContent + sseChatError},
	{name: "openai/tool call first", stream: sseChatTool + sseChatError},
	{name: "openai/refusal first", stream: sseChatRefusal + sseChatError},
	{name: "openai/null error member is no error", stream: sseChatNullErr + sseChatContent + sseDone},
	{name: "openai/finish and usage only", stream: sseChatRole + sseChatStop + sseChatUsage + sseDone},
	{name: "deepseek/reasoning is content", stream: sseDeepseekReasoning + sseChatError},
	{name: "sseDone only", stream: sseDone},
	{name: "sseDone then error is past the end", stream: sseChatRole + sseDone + sseChatError},
	{name: "openrouter/comments then content", stream: sseOpenRouterComment + sseOpenRouterComment + sseOpenRouterRole + sseOpenRouterContent + sseDone},
	{name: "openrouter/error chunk", stream: sseOpenRouterComment + sseOpenRouterError + sseDone, err: ErrStreamError, code: "502"},
	{name: "anthropic/content", stream: sseAnthropicStart + sseAnthropicBlockStart + sseAnthropicPing + sseAnthropicDelta + sseAnthropicStop},
	{name: "anthropic/overloaded first", stream: sseAnthropicOverloaded, err: ErrStreamError, code: "overloaded_error"},
	{name: "anthropic/overloaded after message_start", stream: sseAnthropicStart + sseAnthropicPing + sseAnthropicOverloaded, err: ErrStreamError, code: "overloaded_error"},
	{name: "anthropic/overloaded after empty text block", stream: sseAnthropicStart + sseAnthropicBlockStart + sseAnthropicOverloaded, err: ErrStreamError, code: "overloaded_error"},
	{name: "anthropic/tool block is content", stream: sseAnthropicStart + sseAnthropicToolStart + sseAnthropicOverloaded},
	{name: "anthropic/error after content passes", stream: sseAnthropicStart + sseAnthropicBlockStart + sseAnthropicDelta + sseAnthropicOverloaded},
	{name: "anthropic/sseCRLF", stream: sseCRLF(sseAnthropicStart + sseAnthropicOverloaded), err: ErrStreamError, code: "overloaded_error"},
	{name: "anthropic/sseCR", stream: sseCR(sseAnthropicStart + sseAnthropicOverloaded), err: ErrStreamError, code: "overloaded_error"},
	{name: "anthropic/sseCRLF content", stream: sseCRLF(sseAnthropicStart + sseAnthropicDelta + sseAnthropicOverloaded)},
	{name: "responses/insufficient_quota after response.created", stream: sseResponsesCreated + sseResponsesInProgress + sseResponsesQuota, err: ErrStreamError, code: "insufficient_quota"},
	{name: "responses/nested error", stream: sseResponsesCreated + "event: error\n" + `data: {"type":"error","sequence_number":1,"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"quota","param":null}}` + "\n\n", err: ErrStreamError, code: "insufficient_quota"},
	{name: "responses/failed", stream: sseResponsesCreated + sseResponsesInProgress + sseResponsesFailed, err: ErrStreamError, code: "server_error"},
	{name: "responses/failed after reasoning item", stream: sseResponsesCreated + sseResponsesReasoning + sseResponsesFailed, err: ErrStreamError, code: "server_error"},
	{name: "responses/message item is content", stream: sseResponsesCreated + sseResponsesInProgress + sseResponsesMessage + sseResponsesFailed},
	{name: "responses/text delta", stream: sseResponsesCreated + sseResponsesReasoning + sseResponsesTextDelta + sseResponsesFailed},
	{name: "gemini/content", stream: sseGeminiContent + sseGeminiError},
	{name: "gemini/error first", stream: sseGeminiError, err: ErrStreamError, code: "UNAVAILABLE"},
	{name: "event error without data", stream: sseAnthropicStart + "event: error\n\n", err: ErrStreamError},
	{name: "event error with text", stream: "event: error\ndata: upstream exploded\n\n", err: ErrStreamError},
	{name: "plain text data is content", stream: "data: Hello\n\n" + sseAnthropicOverloaded},
	{name: "multi-line data", stream: sseAnthropicStart + "data: {\"type\": \"error\",\ndata:  \"error\": {\"type\": \"overloaded_error\"}}\n\n", err: ErrStreamError, code: "overloaded_error"},
	{name: "multi-line data, CRLF", stream: sseCRLF(sseAnthropicStart + "data: {\"type\": \"error\",\ndata:  \"error\": {\"type\": \"overloaded_error\"}}\n\n"), err: ErrStreamError, code: "overloaded_error"},
	{name: "byte order mark", stream: "\xEF\xBB\xBF" + sseChatError, err: ErrStreamError, code: "insufficient_quota"},
	{name: "ids, retry and unknown fields", stream: "id: 1\nretry: 100\nfoo: bar\n" + sseAnthropicOverloaded, err: ErrStreamError, code: "overloaded_error"},
	{name: "comment in an event", stream: "event: error\n: keep-alive\ndata: {\"error\":{\"type\":\"overloaded_error\"}}\n\n", err: ErrStreamError, code: "overloaded_error"},
	{name: "unterminated error at the end", atEnd: true, stream: sseAnthropicStart + strings.TrimSuffix(sseAnthropicOverloaded, "\n\n"), err: ErrStreamError, code: "overloaded_error"},
	{name: "unterminated error at the end, CR", atEnd: true, stream: sseAnthropicStart + strings.TrimSuffix(sseAnthropicOverloaded, "\n\n") + "\r", err: ErrStreamError, code: "overloaded_error"},
	{name: "empty stream", stream: "", atEnd: true},
	{name: "ended early", stream: sseAnthropicStart + sseAnthropicPing, atEnd: true},
	{name: "ended mid-event", stream: sseAnthropicStart + "event: content_block_st", atEnd: true},
	{name: "blank lines only", stream: "\n\n\r\n\r\r", atEnd: true},
	{name: "not JSON after all", stream: "data: {\"type\": \"error\n\n"},
	{name: "64 ssePings then error passes", stream: ssePings(64) + sseAnthropicOverloaded},
	{name: "63 ssePings then error", stream: ssePings(63) + sseAnthropicOverloaded, err: ErrStreamError, code: "overloaded_error"},
	{name: "HoldEvents 2", g: StreamGuard{HoldEvents: 2}, stream: sseChatRole + sseChatRole + sseChatError},
	{name: "HoldEvents 3", g: StreamGuard{HoldEvents: 3}, stream: sseChatRole + sseChatRole + sseChatError, err: ErrStreamError, code: "insufficient_quota"},
	{name: "comments do not count as events", g: StreamGuard{HoldEvents: 1}, stream: sseOpenRouterComment + sseOpenRouterComment + sseOpenRouterError, err: ErrStreamError, code: "502"},
	{name: "HoldBytes reached", g: StreamGuard{HoldBytes: len(sseAnthropicStart) + 10}, stream: sseAnthropicStart + sseAnthropicOverloaded},
	{name: "HoldBytes just enough", g: StreamGuard{HoldBytes: len(sseAnthropicStart + sseAnthropicOverloaded)}, stream: sseAnthropicStart + sseAnthropicOverloaded, err: ErrStreamError, code: "overloaded_error"},
	{name: "HoldBytes an event too large", g: StreamGuard{HoldBytes: 100}, stream: sseAnthropicOverloaded},
	{name: "holding disabled, first event error", g: StreamGuard{HoldEvents: -1, FirstByteTimeout: time.Hour}, stream: sseAnthropicOverloaded, err: ErrStreamError, code: "overloaded_error"},
	{name: "holding disabled, error second", g: StreamGuard{HoldEvents: -1, FirstByteTimeout: time.Hour}, stream: sseAnthropicStart + sseAnthropicOverloaded},
	{name: "holding disabled, comment first", g: StreamGuard{HoldBytes: -1, FirstByteTimeout: time.Hour}, stream: sseOpenRouterComment + sseOpenRouterError},
	{name: "large content event", stream: `data: {"choices":[{"delta":{"content":"` + strings.Repeat("x", 300<<10) + `"}}]}` + "\n\n"},
	// An event nested as deep as the guard reads is read; one level more
	// is not validated (gjson.Valid recurses per level), and counts as
	// content, as data that is not JSON does. Brackets in strings, escaped
	// quotes among them, do not count.
	{name: "error nested 10,000 deep", stream: sseNested(maxJSONDepth, `"[{\"[{"`), err: ErrStreamError, code: "overloaded_error"},
	{name: "error nested 10,001 deep is content", stream: sseNested(maxJSONDepth+1, `""`)},
	{name: "brackets in strings do not nest", stream: sseNested(maxJSONDepth, `"`+strings.Repeat(`[{\\\"`, 2*maxJSONDepth)+`"`), err: ErrStreamError, code: "overloaded_error"},
}

// sseNested is an error event whose JSON nests depth levels: the object
// and, in its "pad" member, arrays and objects in turn around leaf.
func sseNested(depth int, leaf string) string {
	var b strings.Builder
	b.WriteString(`data: {"error":{"type":"overloaded_error"},"pad":`)
	for i := 1; i < depth; i++ {
		if i%2 == 1 {
			b.WriteString("[")
		} else {
			b.WriteString(`{"a":`)
		}
	}
	b.WriteString(leaf)
	for i := depth - 1; i >= 1; i-- {
		if i%2 == 1 {
			b.WriteString("]")
		} else {
			b.WriteString("}")
		}
	}
	b.WriteString("}\n\n")
	return b.String()
}

// deepChildEnv marks the child process of TestGuardDeepNesting.
const deepChildEnv = "FAILOVER_TEST_DEEP_NESTING_CHILD"

// One event of eight million '[' under a HoldBytes of 16 MiB. Before the
// nesting guard, classify handed it to gjson.Valid, which recursed once per
// level until the child died with "fatal error: stack overflow" (at about
// five million levels; three million under -race), which no recover
// catches: an upstream could kill the process. Now the event is content,
// and the stream passes intact. An error event as deep goes through
// newStreamError, which reads it without recursion. The guard runs in a
// child process so that a regression fails this test instead of killing
// the test binary.
func TestGuardDeepNesting(t *testing.T) {
	const depth = 8 << 20
	g := StreamGuard{HoldBytes: 16 << 20}
	if os.Getenv(deepChildEnv) == "1" {
		deep := "{\"a\":" + strings.Repeat("[", depth)
		content := "data: " + deep + "\n\n" + sseChatContent
		resp, err := g.guard(sseResponse(newGuardBody(strings.NewReader(content))))
		if err != nil {
			t.Fatalf("deep event: %v, want the stream", err)
		}
		if got, _ := io.ReadAll(resp.Body); string(got) != content {
			t.Fatalf("deep event: the stream changed")
		}
		_, err = g.guard(sseResponse(newGuardBody(strings.NewReader("event: error\ndata: " + deep + "\n\n"))))
		if !errors.Is(err, ErrStreamError) {
			t.Fatalf("deep error event: %v, want %v", err, ErrStreamError)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestGuardDeepNesting$", "-test.count=1")
	cmd.Env = append(os.Environ(), deepChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child died: %v\n%s", err, out[:min(len(out), 2000)])
	}
}

// errGoesOn is a read error after a stream, where the stream would go on.
var errGoesOn = errors.New("the stream goes on")

// splits are the ways a test delivers a stream to the guard.
var splits = []struct {
	name  string
	split func(io.Reader) io.Reader
}{
	{"whole", func(r io.Reader) io.Reader { return r }},
	{"bytes", iotest.OneByteReader},
	{"random", func(r io.Reader) io.Reader { return &randomReads{r: r, rnd: rand.New(rand.NewPCG(1, 2))} }},
	{"data with EOF", iotest.DataErrReader},
}

func TestGuardStreams(t *testing.T) {
	for _, c := range guardCases {
		for _, s := range splits {
			for _, async := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s/async=%v", c.name, s.name, async)
				g := c.g
				if async && g.FirstByteTimeout == 0 {
					g.FirstByteTimeout = time.Hour // reads through the goroutine; never fires
				}
				t.Run(name, func(t *testing.T) {
					runGuardCase(t, g, c, s.split)
					if !c.atEnd {
						// The same stream going on (and failing) must
						// not change what the guard decides.
						goesOn := func(r io.Reader) io.Reader {
							return s.split(io.MultiReader(r, iotest.ErrReader(errGoesOn)))
						}
						runGuardCase(t, g, c, goesOn)
					}
				})
			}
		}
	}
}

func runGuardCase(t *testing.T, g StreamGuard, c guardCase, split func(io.Reader) io.Reader) {
	t.Helper()
	body := newGuardBody(split(strings.NewReader(c.stream)))
	resp, err := g.guard(sseResponse(body))
	if !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
		t.Fatalf("guard: got %v, want %v", err, c.err)
	}
	if err != nil {
		if resp != nil {
			t.Errorf("got a response with error %v", err)
		}
		if got := body.closes.Load(); got != 1 {
			t.Errorf("original body closed %d times, want 1", got)
		}
		var se *streamError
		if errors.As(err, &se) && se.code != c.code {
			t.Errorf("code: got %q, want %q (%v)", se.code, c.code, err)
		}
		if !strings.Contains(err.Error(), c.code) {
			t.Errorf("error %q does not name %q", err, c.code)
		}
		return
	}
	if body.closes.Load() != 0 {
		t.Fatal("guard closed the body of a stream it returned")
	}
	got, rerr := io.ReadAll(resp.Body)
	if rerr != nil && rerr != errGoesOn {
		t.Errorf("reading the stream: %v", rerr)
	}
	if !bytes.Equal(got, []byte(c.stream)) {
		t.Errorf("stream changed: got %d bytes, want %d; first difference at %d", len(got), len(c.stream), firstDiff(got, []byte(c.stream)))
	}
	checkCloseOnce(t, resp.Body, body)
}

// checkCloseOnce closes the guarded body twice and checks that the
// original was closed once.
func checkCloseOnce(t *testing.T, rc io.Closer, orig *guardBody) {
	t.Helper()
	for range 2 {
		if err := rc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if got := orig.closes.Load(); got != 1 {
		t.Errorf("original body closed %d times, want 1", got)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestGuardLeavesOtherResponsesAlone(t *testing.T) {
	sse := func(code int, ct string) *http.Response {
		r := respond(code, sseAnthropicOverloaded, "Content-Type", ct)
		return r
	}
	for _, c := range []struct {
		name string
		g    StreamGuard
		resp *http.Response
	}{
		{"json", StreamGuard{}, sse(200, "application/json")},
		{"no content type", StreamGuard{}, sse(200, "")},
		{"500 event stream", StreamGuard{}, sse(500, "text/event-stream")},
		{"429 event stream", StreamGuard{}, sse(429, "text/event-stream")},
		{"holding disabled, no timeout", StreamGuard{HoldEvents: -1}, sse(200, "text/event-stream")},
		{"negative bytes, no timeout", StreamGuard{HoldBytes: -1}, sse(200, "text/event-stream")},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := c.resp.Body
			got, err := c.g.guard(c.resp)
			if err != nil || got != c.resp || got.Body != body {
				t.Fatalf("got %v, %v; want the response untouched", got, err)
			}
			if b, _ := io.ReadAll(got.Body); string(b) != sseAnthropicOverloaded {
				t.Errorf("body read: got %q", b)
			}
		})
	}
	for _, body := range []io.ReadCloser{nil, http.NoBody} {
		r := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body}
		if got, err := (StreamGuard{}).guard(r); got != r || err != nil || got.Body != body {
			t.Errorf("body %v: got %v, %v", body, got, err)
		}
	}
	if got, err := (StreamGuard{}).guard(nil); got != nil || err != nil {
		t.Errorf("nil: got %v, %v", got, err)
	}
	r := respond(200, sseAnthropicOverloaded, "Content-Type", "Text/Event-Stream; charset=utf-8")
	if _, err := (StreamGuard{}).guard(r); !errors.Is(err, ErrStreamError) {
		t.Errorf("Content-Type with parameters: got %v, want %v", err, ErrStreamError)
	}
}

// TestGuardReturnsAtFirstContent checks that the guard returns as soon as
// the first content event is in, without waiting for more of the stream.
// If it waited, every goroutine of the bubble would block and synctest
// would report a deadlock.
func TestGuardReturnsAtFirstContent(t *testing.T) {
	for _, fbt := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprint("FirstByteTimeout=", fbt), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				head := sseOpenRouterComment + sseOpenRouterRole + sseOpenRouterContent
				rest := sseOpenRouterContent + sseDone
				pr, pw := io.Pipe()
				more := make(chan struct{})
				go func() {
					io.WriteString(pw, head)
					<-more
					io.WriteString(pw, rest)
					pw.Close()
				}()
				body := newGuardBody(pr)
				resp, err := StreamGuard{FirstByteTimeout: fbt}.guard(sseResponse(body))
				if err != nil {
					t.Fatal(err)
				}
				close(more)
				got, _ := io.ReadAll(resp.Body)
				if string(got) != head+rest {
					t.Errorf("got %q, want %q", got, head+rest)
				}
				checkCloseOnce(t, resp.Body, body)
			})
		})
	}
}

// TestGuardFirstByteTimeout runs in virtual time: in-memory streams whose
// events arrive at scripted moments.
func TestGuardFirstByteTimeout(t *testing.T) {
	const fbt = 50 * time.Millisecond
	type step struct {
		at   time.Duration // since the headers
		data string
	}
	for _, c := range []struct {
		name   string
		g      StreamGuard
		steps  []step
		err    error
		waited time.Duration // how long guard takes
	}{
		{name: "silence", steps: nil, err: ErrFirstByteTimeout, waited: fbt},
		{name: "half an event", steps: []step{{10 * time.Millisecond, "event: message_start\ndata: {"}}, err: ErrFirstByteTimeout, waited: fbt},
		{name: "content in time", steps: []step{{40 * time.Millisecond, sseChatContent}, {time.Second, sseDone}}, waited: 40 * time.Millisecond},
		{name: "error in time", steps: []step{{10 * time.Millisecond, sseResponsesCreated}, {20 * time.Millisecond, sseResponsesQuota}}, err: ErrStreamError, waited: 20 * time.Millisecond},
		{name: "role chunk then slow content", steps: []step{{10 * time.Millisecond, sseChatRole}, {time.Second, sseChatContent + sseDone}}, waited: fbt},
		{name: "comment then slow content", steps: []step{{10 * time.Millisecond, sseOpenRouterComment}, {time.Second, sseOpenRouterRole + sseOpenRouterContent + sseDone}}, waited: fbt},
		{name: "late error reaches the caller", steps: []step{{10 * time.Millisecond, sseAnthropicStart}, {time.Second, sseAnthropicOverloaded}}, waited: fbt},
		{name: "holding disabled", g: StreamGuard{HoldEvents: -1}, steps: []step{{10 * time.Millisecond, sseAnthropicStart}, {20 * time.Millisecond, sseAnthropicOverloaded}}, waited: 10 * time.Millisecond},
		{name: "holding disabled, silence", g: StreamGuard{HoldEvents: -1}, err: ErrFirstByteTimeout, waited: fbt},
		{name: "ended in time", steps: []step{{10 * time.Millisecond, sseAnthropicStart}}, waited: 10 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pr, pw := io.Pipe()
				var want strings.Builder
				for _, s := range c.steps {
					want.WriteString(s.data)
				}
				go func() {
					start := time.Now()
					for _, s := range c.steps {
						time.Sleep(s.at - time.Since(start))
						if _, err := io.WriteString(pw, s.data); err != nil {
							return // the guard gave up on the stream
						}
					}
					if c.err == nil || c.err == ErrStreamError {
						pw.Close()
					}
				}()
				body := newGuardBody(pr)
				g := c.g
				g.FirstByteTimeout = fbt
				start := time.Now()
				resp, err := g.guard(sseResponse(body))
				if waited := time.Since(start); waited != c.waited {
					t.Errorf("guard took %v, want %v", waited, c.waited)
				}
				if !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
					t.Fatalf("got %v, want %v", err, c.err)
				}
				if err != nil {
					if n := body.closes.Load(); n != 1 {
						t.Errorf("original body closed %d times, want 1", n)
					}
					return
				}
				got, err := io.ReadAll(resp.Body)
				if err != nil || string(got) != want.String() {
					t.Errorf("read %q, %v; want %q", got, err, want.String())
				}
				checkCloseOnce(t, resp.Body, body)
			})
		})
	}
}

// TestGuardCloseWhileHeld closes a stream handed over with a read in flight
// before reading it: the read ends, no goroutine is left, and the body
// reads nothing more, as net/http's does after Close.
func TestGuardCloseWhileHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pr, pw := io.Pipe()
		go io.WriteString(pw, sseChatRole)
		body := newGuardBody(pr)
		resp, err := StreamGuard{FirstByteTimeout: time.Second}.guard(sseResponse(body))
		if err != nil {
			t.Fatal(err)
		}
		checkCloseOnce(t, resp.Body, body)
		got, err := io.ReadAll(resp.Body)
		if len(got) != 0 || err != errReadOnClosedBody {
			t.Errorf("after Close: read %q, %v; want nothing, %v", got, err, errReadOnClosedBody)
		}
		synctest.Wait()
	})
}

// TestGuardFirstByteTimeoutHTTP abandons a real stream whose upstream sends
// its headers and then nothing.
func TestGuardFirstByteTimeoutHTTP(t *testing.T) {
	more := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if r.URL.Path == "/stall" {
			<-r.Context().Done() // the guard hangs up
			return
		}
		io.WriteString(w, sseOpenRouterComment)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-more:
			io.WriteString(w, sseOpenRouterRole+sseOpenRouterContent+sseDone)
		}
	}))
	defer srv.Close()

	const fbt = 50 * time.Millisecond
	g := StreamGuard{FirstByteTimeout: fbt}
	resp, err := srv.Client().Get(srv.URL + "/stall")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, err := g.guard(resp)
	if elapsed := time.Since(start); elapsed < fbt || elapsed > fbt+5*time.Second {
		t.Errorf("guard took %v, want about %v", elapsed, fbt)
	}
	if got != nil || !errors.Is(err, ErrFirstByteTimeout) {
		t.Fatalf("got %v, %v; want %v", got, err, ErrFirstByteTimeout)
	}

	// A comment proves the upstream alive: the stream is the caller's at
	// the deadline, and reads on when the content comes.
	resp, err = srv.Client().Get(srv.URL + "/comment")
	if err != nil {
		t.Fatal(err)
	}
	got, err = g.guard(resp)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(sseOpenRouterComment))
	if _, err := io.ReadFull(got.Body, buf); err != nil || string(buf) != sseOpenRouterComment {
		t.Fatalf("read %q, %v; want %q", buf, err, sseOpenRouterComment)
	}
	close(more)
	rest, err := io.ReadAll(got.Body)
	if err != nil || string(rest) != sseOpenRouterRole+sseOpenRouterContent+sseDone {
		t.Errorf("read %q, %v", rest, err)
	}
	got.Body.Close()
}

func TestGuardReadError(t *testing.T) {
	errReset := errors.New("connection reset by peer")
	for _, async := range []bool{false, true} {
		g := StreamGuard{}
		if async {
			g.FirstByteTimeout = time.Hour
		}
		t.Run(fmt.Sprint("async=", async), func(t *testing.T) {
			// Before content: the stream is abandoned with the error.
			body := newGuardBody(io.MultiReader(strings.NewReader(sseChatRole), iotest.ErrReader(errReset)))
			if resp, err := g.guard(sseResponse(body)); resp != nil || !errors.Is(err, errReset) {
				t.Errorf("before content: got %v, %v; want %v", resp, err, errReset)
			}
			if n := body.closes.Load(); n != 1 {
				t.Errorf("original body closed %d times, want 1", n)
			}

			// After content: the caller reads the bytes, then the error.
			body = newGuardBody(io.MultiReader(strings.NewReader(sseChatRole+sseChatContent), iotest.ErrReader(errReset)))
			resp, err := g.guard(sseResponse(body))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			if string(got) != sseChatRole+sseChatContent || !errors.Is(err, errReset) {
				t.Errorf("after content: read %q, %v", got, err)
			}
			checkCloseOnce(t, resp.Body, body)
		})
	}
}

// TestGuardNoProgress abandons a body whose reads return nothing forever.
func TestGuardNoProgress(t *testing.T) {
	body := newGuardBody(emptyReads{})
	if _, err := (StreamGuard{}).guard(sseResponse(body)); !errors.Is(err, io.ErrNoProgress) {
		t.Errorf("got %v, want %v", err, io.ErrNoProgress)
	}
}

type emptyReads struct{}

func (emptyReads) Read([]byte) (int, error) { return 0, nil }

func TestStreamErrorMessage(t *testing.T) {
	long := strings.Repeat("é", 500)
	for _, c := range []struct {
		name, stream, code, want string
	}{
		{"anthropic", sseAnthropicOverloaded, "overloaded_error", "overloaded_error: Overloaded"},
		{"responses", sseResponsesQuota, "insufficient_quota", "insufficient_quota: You exceeded your current quota"},
		{"responses failed", sseResponsesFailed, "server_error", "server_error: The model failed to generate a response."},
		{"openai", sseChatError, "insufficient_quota", "insufficient_quota: You exceeded"},
		{"gemini", sseGeminiError, "UNAVAILABLE", "UNAVAILABLE: The model is overloaded."},
		{"openrouter", sseOpenRouterError, "502", "502: Provider returned error"},
		{"plain", "event: error\ndata: upstream\ndata: exploded\n\n", "", "upstream exploded"},
		{"no detail", "event: error\n\n", "", ""},
		{"long", "event: error\ndata: {\"error\":{\"type\":\"overloaded_error\",\"message\":\"" + long + "\"}}\n\n", "overloaded_error", "overloaded_error: éé"},
		{"long code", "event: error\ndata: {\"error\":{\"type\":\"" + long + "\"}}\n\n", strings.Repeat("é", 100), "éé"},
		{"long text", "event: error\ndata: " + long + "\n\n", "", "éé"},
		{"error string", "data: {\"error\": \"overloaded\"}\n\n", "", "overloaded"},
		{"invalid UTF-8", "event: error\ndata: {\"error\":{\"message\":\"\xff\xfe\"}}\n\n", "", "\uFFFD"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := StreamGuard{}.guard(sseResponse(newGuardBody(strings.NewReader(c.stream))))
			if !errors.Is(err, ErrStreamError) || errors.Is(err, ErrFirstByteTimeout) {
				t.Fatalf("got %v, want %v", err, ErrStreamError)
			}
			var se *streamError
			if !errors.As(err, &se) {
				t.Fatalf("got %T, want *streamError", err)
			}
			if se.code != c.code {
				t.Errorf("code: got %q, want %q", se.code, c.code)
			}
			msg := err.Error()
			prefix := ErrStreamError.Error()
			if c.want == "" && msg != prefix {
				t.Errorf("got %q, want %q", msg, prefix)
			}
			if !strings.HasPrefix(msg, prefix+": "+c.want) && c.want != "" {
				t.Errorf("got %q, want it to begin %q", msg, prefix+": "+c.want)
			}
			if n := len(msg) - len(prefix+": "); n > maxErrorDetail {
				t.Errorf("error carries %d bytes of the event, want at most %d", n, maxErrorDetail)
			}
			if !utf8Valid(msg) || strings.ContainsAny(msg, "\n\r") {
				t.Errorf("error is not one line of valid UTF-8: %q", msg)
			}
		})
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }

// TestGuardRecordedStreams passes every recorded event stream through the
// guard: each is returned, byte for byte.
func TestGuardRecordedStreams(t *testing.T) {
	const dir = "../shared/recordings"
	paths, _ := filepath.Glob(filepath.Join(dir, "*.httprr"))
	if len(paths) == 0 {
		t.Skipf("no recordings in %s: they live outside the repository", dir)
	}
	streams := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i, resp := range recordedResponses(t, p, data) {
			if !isEventStream(resp.Header.Get("Content-Type")) {
				continue
			}
			streams++
			t.Run(fmt.Sprintf("%s/%d", filepath.Base(p), i), func(t *testing.T) {
				want, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range splits {
					// The read error after the recorded stream proves
					// that the guard returned at the stream's content,
					// not at its end.
					body := newGuardBody(s.split(io.MultiReader(bytes.NewReader(want), iotest.ErrReader(errGoesOn))))
					resp.Body = body
					got, err := StreamGuard{FirstByteTimeout: time.Hour}.guard(resp)
					if err != nil {
						t.Fatalf("%s: %v", s.name, err)
					}
					b, err := io.ReadAll(got.Body)
					if err != errGoesOn || !bytes.Equal(b, want) {
						t.Errorf("%s: stream changed (%v): first difference at %d", s.name, err, firstDiff(b, want))
					}
					checkCloseOnce(t, got.Body, body)
				}
			})
		}
	}
	if streams < 5 {
		t.Errorf("found %d recorded event streams, want at least 5", streams)
	}
}

// recordedResponses parses the responses of an httprr trace: "httprr trace
// v1", then per exchange a line "N M", N bytes of request and M bytes of
// response.
func recordedResponses(t *testing.T, name string, data []byte) []*http.Response {
	t.Helper()
	line, rest, ok := bytes.Cut(data, []byte("\n"))
	if !ok || string(line) != "httprr trace v1" {
		t.Fatalf("%s: not an httprr trace", name)
	}
	var out []*http.Response
	for len(rest) > 0 {
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		ns, ms, _ := strings.Cut(string(line), " ")
		n, err1 := strconv.Atoi(ns)
		m, err2 := strconv.Atoi(ms)
		if err1 != nil || err2 != nil || n < 0 || m < 0 || n+m > len(rest) {
			t.Fatalf("%s: bad size line %q", name, line)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(rest[n:n+m])), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, resp)
		rest = rest[n+m:]
	}
	return out
}

// sseResponse is a 200 event stream with body.
func sseResponse(body io.ReadCloser) *http.Response {
	return &http.Response{
		StatusCode:    http.StatusOK,
		Status:        "200 OK",
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}},
		Body:          body,
		ContentLength: -1,
	}
}

// guardBody is an original body: it counts its Close calls, and closing it
// ends a read in flight on an io.Pipe.
type guardBody struct {
	r      io.Reader
	closes atomic.Int32
}

func newGuardBody(r io.Reader) *guardBody { return &guardBody{r: r} }

func (b *guardBody) Read(p []byte) (int, error) {
	if b.closes.Load() > 0 {
		if pr, ok := b.r.(*io.PipeReader); ok {
			return pr.Read(p) // io.ErrClosedPipe
		}
		return 0, errors.New("read on closed body")
	}
	return b.r.Read(p)
}

func (b *guardBody) Close() error {
	b.closes.Add(1)
	if pr, ok := b.r.(*io.PipeReader); ok {
		pr.Close()
	}
	return nil
}

// randomReads returns what r has in reads of random sizes, some empty.
type randomReads struct {
	r   io.Reader
	rnd *rand.Rand
}

func (r *randomReads) Read(p []byte) (int, error) {
	n := r.rnd.IntN(len(p) + 1)
	if n > 300 {
		n = r.rnd.IntN(300)
	}
	return r.r.Read(p[:n])
}

// BenchmarkGuard measures what the guard adds to a stream: holding its
// first events until content, and the wrapped body.
func BenchmarkGuard(b *testing.B) {
	stream := []byte(sseOpenRouterComment + sseChatRole + sseChatContent + sseChatContent + sseChatStop + sseDone)
	for _, c := range []struct {
		name string
		g    StreamGuard
	}{
		{"hold", StreamGuard{}},
		{"hold+FirstByteTimeout", StreamGuard{FirstByteTimeout: time.Minute}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				resp, err := c.g.guard(sseResponse(io.NopCloser(bytes.NewReader(stream))))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// FuzzGuardStream gives the stream guard arbitrary bytes, in reads of
// arbitrary sizes, under arbitrary limits. It never panics; what it decides
// does not depend on how the reads split the stream; a stream it returns
// reads back exactly as sent; a stream it abandons is closed exactly once,
// with an error that carries at most 200 bytes of the event. The seed
// corpus is the table of TestGuardStreams and testdata/fuzz/FuzzGuardStream.
func FuzzGuardStream(f *testing.F) {
	for i, c := range guardCases {
		if len(c.stream) > 64<<10 {
			continue
		}
		f.Add([]byte(c.stream), []byte{byte(i), 1, 200, 3}, c.g.HoldEvents, c.g.HoldBytes, i%2 == 0)
	}
	f.Fuzz(func(t *testing.T, stream, sizes []byte, holdEvents, holdBytes int, async bool) {
		g := StreamGuard{HoldEvents: holdEvents % 80, HoldBytes: holdBytes % (8 << 10)}
		if async {
			g.FirstByteTimeout = time.Hour // reads through the goroutine; never fires
		}

		// What the guard decides with the whole stream in one read.
		want, wantErr := g.guard(sseResponse(newGuardBody(bytes.NewReader(stream))))
		if want != nil {
			want.Body.Close()
		}

		body := newGuardBody(&guardReads{data: stream, sizes: sizes})
		resp, err := g.guard(sseResponse(body))
		if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("split into reads of %v: got %v, want %v", sizes, err, wantErr)
		}
		if err != nil {
			if resp != nil {
				t.Errorf("got a response with error %v", err)
			}
			if !errors.Is(err, ErrStreamError) {
				t.Errorf("got %v, want %v", err, ErrStreamError)
			}
			prefix := ErrStreamError.Error()
			if msg := err.Error(); msg != prefix && (!strings.HasPrefix(msg, prefix+": ") || len(msg)-len(prefix)-2 > maxErrorDetail) {
				t.Errorf("error carries more than %d bytes of the event: %q", maxErrorDetail, msg)
			}
			if n := body.closes.Load(); n != 1 {
				t.Errorf("original body closed %d times, want 1", n)
			}
			return
		}
		if resp.Header.Get("Content-Type") == "" || resp.StatusCode != http.StatusOK {
			t.Fatalf("response changed: %d %v", resp.StatusCode, resp.Header)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Errorf("reading the stream: %v", err)
		}
		if !bytes.Equal(got, stream) {
			t.Errorf("stream changed: got %q, want %q", got, stream)
		}
		if resp.Body == io.ReadCloser(body) {
			// Left alone: holding disabled and no FirstByteTimeout.
			if g.FirstByteTimeout > 0 || g.HoldEvents >= 0 && g.HoldBytes >= 0 {
				t.Errorf("guard %+v left the stream alone", g)
			}
			resp.Body.Close()
			return
		}
		checkCloseOnce(t, resp.Body, body)
	})
}

// guardReads returns data in reads of the sizes given (each size byte plus
// one, in turn; all at once when there are none). With an odd number of
// sizes, the last read returns io.EOF with the last bytes.
type guardReads struct {
	data  []byte
	sizes []byte
	i     int
}

func (r *guardReads) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := len(p)
	if len(r.sizes) > 0 {
		n = min(n, 1+int(r.sizes[r.i%len(r.sizes)]))
		r.i++
	}
	n = copy(p, r.data[:min(n, len(r.data))])
	r.data = r.data[n:]
	if len(r.data) == 0 && len(r.sizes)%2 == 1 {
		return n, io.EOF
	}
	return n, nil
}

func sseServer(t *testing.T, events ...string) *server {
	t.Helper()
	return newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush() // headers first, as providers do
		for _, e := range events {
			if e == "STALL" {
				<-r.Context().Done()
				return
			}
			io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	})
}

const (
	overloadedEvent = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	roleEvent       = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n"
	contentEvent    = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n"
	doneEvent       = "data: [DONE]\n\n"
)

// With a StreamGuard, a stream that begins with an error event, or says
// nothing within FirstByteTimeout, fails over before the caller sees a
// byte; once content flows, an error passes through to the caller.
func TestStreamGuardFailsOver(t *testing.T) {
	backup := sseServer(t, roleEvent, contentEvent, doneEvent)
	for _, tt := range []struct {
		name     string
		primary  []string
		failover bool
		cause    error
	}{
		{"error event first", []string{roleEvent, overloadedEvent}, true, ErrStreamError},
		{"stalls before the first event", []string{"STALL"}, true, ErrFirstByteTimeout},
		{"content first", []string{roleEvent, contentEvent, overloadedEvent}, false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			primary := sseServer(t, tt.primary...)
			tr := newTestTransport(t, Config{
				StreamGuard: &StreamGuard{FirstByteTimeout: 200 * time.Millisecond},
				Upstreams:   []Upstream{{Name: "primary", BaseURL: primary.URL}, {Name: "backup", BaseURL: backup.URL}},
			})
			resp := mustPost(t, tr, primary.URL+"/v1/chat/completions", `{"stream":true}`)
			body := readBody(t, resp)
			want := strings.Join(tt.primary, "")
			if tt.failover {
				want = roleEvent + contentEvent + doneEvent
			}
			if body != want {
				t.Fatalf("caller read %q, want %q", body, want)
			}
			h := tr.Health()[0]
			if tt.failover && (h.Requests.Failed != 1 || !strings.Contains(h.LastError, tt.cause.Error()[len("failover: "):])) {
				t.Fatalf("primary %+v, last error %q; want one failure: %v", h.Requests, h.LastError, tt.cause)
			}
			if !tt.failover && h.Requests.Success != 1 {
				t.Fatalf("primary %+v", h.Requests)
			}
		})
	}
}

// Alone, the caller gets the guard's error.
func TestStreamGuardAlone(t *testing.T) {
	primary := sseServer(t, overloadedEvent)
	tr := newTestTransport(t, Config{
		StreamGuard: &StreamGuard{},
		Upstreams:   []Upstream{{BaseURL: primary.URL}},
	})
	_, err := tr.RoundTrip(httptestRequest("POST", primary.URL+"/v1/messages", `{"stream":true}`))
	if !errors.Is(err, ErrStreamError) || !strings.Contains(err.Error(), "overloaded_error") {
		t.Fatalf("err = %v, want ErrStreamError naming overloaded_error", err)
	}
	if _, err := New(Config{Upstreams: []Upstream{{BaseURL: "http://a.test"}}, StreamGuard: &StreamGuard{FirstByteTimeout: -1}}); err == nil {
		t.Fatal("New accepted a negative FirstByteTimeout")
	}
}

// A Responses API stream that begins with a reasoning summary may then
// think for a minute before its answer: Idle does not cut it, the
// FirstContent bound holds until the answer.
func TestReasoningStreamKeepsFirstContentBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			return sseAnswer(r, func(ctx context.Context, pw *io.PipeWriter) {
				io.WriteString(pw, "event: response.created\ndata: {\"type\":\"response.created\"}\n\n")
				io.WriteString(pw, "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"item\":{\"type\":\"reasoning\"}}\n\n")
				io.WriteString(pw, "event: response.reasoning_summary_text.delta\ndata: {\"type\":\"response.reasoning_summary_text.delta\",\"delta\":\"**Planning**\"}\n\n")
				if waitOr(ctx, time.Minute) { // reasoning on, silently
					io.WriteString(pw, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n")
				}
			}), nil
		})
		n.status("b.test", 200, "backup")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/responses", streamBody))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Errorf("a reasoning stream silent for a minute between summary and answer: %v", err)
		}
		resp.Body.Close()
	})
}

// Which content events are a model's reasoning rather than its answer.
func TestThinkingEvents(t *testing.T) {
	for _, c := range []struct {
		data string
		want bool
	}{
		{`{"type":"response.reasoning_summary_text.delta","delta":"**Plan**"}`, true},
		{`{"type":"response.output_text.delta","delta":"hi"}`, false},
		{`{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`, true},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}`, true},
		{`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}`, false},
		{`{"choices":[{"delta":{"reasoning_content":"First,"}}]}`, true},
		{`{"choices":[{"delta":{"reasoning":"First,","content":"Hi"}}]}`, false},
		{`{"choices":[{"delta":{"content":"Hi"}}]}`, false},
		{`{"candidates":[{"content":{"parts":[{"text":"hmm","thought":true}]}}]}`, true},
		{`{"candidates":[{"content":{"parts":[{"text":"Hi"}]}}]}`, false},
		{`plain text`, false},
	} {
		if got := thinking([]byte(c.data)); got != c.want {
			t.Errorf("thinking(%s) = %v, want %v", c.data, got, c.want)
		}
	}
}
