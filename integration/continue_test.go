package integration_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/failover-go/failover"
	"github.com/failover-go/failover/failovertest"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

// These tests put stream continuation (failover.ContinueConfig) under the
// real SDKs: a streamed answer that breaks after its content began is
// continued by the backup, and the SDK's own accumulator reads one
// complete answer; where the backup refuses, the SDK reports the
// primary's own failure.

// stallBound is the primary's Timeouts.Idle in the tests whose primary
// stalls: the primary stays silent until the test ends, so a short bound
// only makes the test quick.
const stallBound = 100 * time.Millisecond

// How the primary's stream breaks, after its content began.
type streamBreak struct {
	name  string
	end   failovertest.End
	event string // an error event the primary sends last, or ""
	idle  time.Duration
}

// chatBreaks are the ways an OpenAI chat stream breaks: a cut, a stall and
// an in-band error object, as OpenAI sends one mid-stream.
var chatBreaks = []streamBreak{
	{name: "cut", end: failovertest.EndCut},
	{name: "stall", end: failovertest.EndStall, idle: stallBound},
	{name: "error event", event: `data: {"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}` + "\n\n"},
}

// messageBreaks are the ways an Anthropic Messages stream breaks: a cut, a
// stall and an overloaded_error event.
var messageBreaks = []streamBreak{
	{name: "cut", end: failovertest.EndCut},
	{name: "stall", end: failovertest.EndStall, idle: stallBound},
	{name: "error event", event: messageEvent("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)},
}

// primaryStep is the primary's answer: events, then the break. Before a
// stall the events go in one write, so that no pause of a loaded machine
// between two of them reads as the stall.
func (b streamBreak) primaryStep(events ...string) failovertest.Step {
	if b.event != "" {
		events = append(events, b.event)
	}
	if b.end == failovertest.EndStall {
		events = []string{strings.Join(events, "")}
	}
	return failovertest.Step{Chunks: events, End: b.end}
}

// chatEvent is a chat.completion.chunk event of the stream id with a delta
// of role and content, and finish as its finish reason ("" for none).
func chatEvent(id, role, content, finish string) string {
	delta := map[string]any{"content": content}
	if role != "" {
		delta["role"] = role
	}
	var reason any
	if finish != "" {
		reason = finish
	}
	b, _ := json.Marshal(map[string]any{
		"id": id, "object": "chat.completion.chunk", "created": 1700000000, "model": "gpt-test",
		"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": nil}},
	})
	return "data: " + string(b) + "\n\n"
}

// chatUsageEvent is the usage chunk of the stream id that
// stream_options.include_usage asks for: no choices, the usage.
func chatUsageEvent(id string, prompt, completion int) string {
	b, _ := json.Marshal(map[string]any{
		"id": id, "object": "chat.completion.chunk", "created": 1700000000, "model": "gpt-test", "choices": []any{},
		"usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
	})
	return "data: " + string(b) + "\n\n"
}

// messageEvent is an Anthropic Messages event.
func messageEvent(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }

// messageStart is the message_start of the message id, with its usage.
func messageStart(id string, input, output int) string {
	b, _ := json.Marshal(map[string]any{"type": "message_start", "message": map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": input, "output_tokens": output},
	}})
	return messageEvent("message_start", string(b))
}

// textStart opens the text block index.
func textStart(index int) string {
	b, _ := json.Marshal(map[string]any{"type": "content_block_start", "index": index, "content_block": map[string]any{"type": "text", "text": ""}})
	return messageEvent("content_block_start", string(b))
}

// textDelta adds text to the block index.
func textDelta(index int, text string) string {
	b, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": index, "delta": map[string]any{"type": "text_delta", "text": text}})
	return messageEvent("content_block_delta", string(b))
}

// messageEnd closes the block index and ends the message at end_turn,
// output tokens in all.
func messageEnd(index, output int) []string {
	b, _ := json.Marshal(map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}, "usage": map[string]any{"output_tokens": output}})
	return []string{
		messageEvent("content_block_stop", `{"type":"content_block_stop","index":`+strconv.Itoa(index)+`}`),
		messageEvent("message_delta", string(b)),
		messageEvent("message_stop", `{"type":"message_stop"}`),
	}
}

// continueTransport returns a Transport that continues streams, over
// primary and backup in that order.
func continueTransport(t *testing.T, primary, backup failover.Upstream) *failover.Transport {
	t.Helper()
	tr, err := failover.New(failover.Config{
		Continue:  failover.ContinueConfig{On: true},
		Upstreams: []failover.Upstream{primary, backup},
	})
	if err != nil {
		t.Fatalf("failover.New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// continuedTrace records the stream's breaks, as Trace.Continued reports
// them (on the goroutine that reads the stream).
func continuedTrace(got *[]failover.TraceContinued) *failover.Trace {
	return &failover.Trace{Continued: func(c failover.TraceContinued) { *got = append(*got, c) }}
}

// lastMessage is the trailing message of a request body: its role and
// its content as JSON.
func lastMessage(t *testing.T, body []byte) (role string, content json.RawMessage) {
	t.Helper()
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
		t.Fatalf("the backup got %s, want a body with messages (%v)", body, err)
	}
	m := req.Messages[len(req.Messages)-1]
	return m.Role, m.Content
}

// continuation returns the trailing message of the one request the
// backup received, the continuation, after checking that it carried the
// backup's own key alone in header and that the message is the
// assistant's.
func continuation(t *testing.T, backup *failovertest.Server, header, key string) (content json.RawMessage) {
	t.Helper()
	reqs := backup.Requests()
	if len(reqs) != 1 {
		t.Fatalf("the backup got %d requests, want 1: the continuation", len(reqs))
	}
	r := reqs[0]
	if got := r.Header.Values(header); len(got) != 1 || got[0] != key {
		t.Errorf("the backup got %s %q, want %q", header, got, key)
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			if strings.Contains(v, callerKey) {
				t.Errorf("the backup got the caller's key in header %s", k)
			}
		}
	}
	role, content := lastMessage(t, r.Body)
	if role != "assistant" {
		t.Errorf("the backup's trailing message is %s %s, want the assistant's", role, content)
	}
	return content
}

// checkPrefix fails unless content, a trailing message's, is prefix as
// a JSON string.
func checkPrefix(t *testing.T, content json.RawMessage, prefix string) {
	t.Helper()
	if want, _ := json.Marshal(prefix); string(content) != string(want) {
		t.Errorf("the backup's trailing assistant message has content %s, want %s", content, want)
	}
}

// openAIContinueStream reads a chat completion through client as its
// users do, with openai.ChatCompletionAccumulator, and returns what it
// accumulated and the stream's error.
func openAIContinueStream(t *testing.T, client openai.Client, trace *failover.Trace) (openai.ChatCompletionAccumulator, error) {
	t.Helper()
	params := openai.ChatCompletionNewParams{
		Model:         "gpt-test",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell a story.")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	stream := client.Chat.Completions.NewStreaming(failover.WithTrace(testContext(t), trace), params)
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		if chunk := stream.Current(); !acc.AddChunk(chunk) {
			t.Errorf("the accumulator refused chunk %s", chunk.RawJSON())
		}
	}
	return acc, stream.Err()
}

// openAIContinueUpstreams are a primary that sends "Once upon a time,"
// and breaks as b says, and a backup answered by backupStep that takes a
// trailing assistant message; each with its own key.
func openAIContinueUpstreams(t *testing.T, b streamBreak, backupStep failovertest.Step) (primary, backup *failovertest.Server, tr *failover.Transport) {
	t.Helper()
	primary = failovertest.NewServer(t, b.primaryStep(
		chatEvent("chatcmpl-primary", "assistant", "", ""),
		chatEvent("chatcmpl-primary", "", "Once upon ", ""),
		chatEvent("chatcmpl-primary", "", "a time,", ""),
	))
	backup = failovertest.NewServer(t, backupStep)
	tr = continueTransport(t,
		failover.Upstream{Name: "primary", BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + primaryKey}}, Timeouts: failover.Timeouts{Idle: b.idle}},
		failover.Upstream{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + backupKey}}, Prefill: failover.Prefill{Chat: failover.ChatTrailingAssistant}},
	)
	return primary, backup, tr
}

// TestOpenAIContinue: a chat completion stream that the primary breaks
// after "Once upon a time," is continued by the backup, and openai-go's
// ChatCompletionAccumulator reads one complete answer: the whole text,
// the primary's id, one finish reason, and the usage both upstreams
// reported. The backup gets the answer so far as a trailing assistant
// message, with its own key.
func TestOpenAIContinue(t *testing.T) {
	for _, b := range chatBreaks {
		t.Run(b.name, func(t *testing.T) {
			primary, backup, tr := openAIContinueUpstreams(t, b, failovertest.Step{Chunks: []string{
				chatEvent("chatcmpl-backup", "assistant", "", ""),
				chatEvent("chatcmpl-backup", "", " there was", ""),
				chatEvent("chatcmpl-backup", "", " a fox.", ""),
				chatEvent("chatcmpl-backup", "", "", "stop"),
				chatUsageEvent("chatcmpl-backup", 20, 5),
				"data: [DONE]\n\n",
			}})
			client := newOpenAIClient(t, tr, primary.URL+"/v1", option.WithMaxRetries(0))
			var continued []failover.TraceContinued
			acc, err := openAIContinueStream(t, client, continuedTrace(&continued))
			if err != nil {
				t.Fatalf("stream.Err() = %v, want nil", err)
			}
			if len(acc.Choices) != 1 {
				t.Fatalf("accumulated %d choices, want 1", len(acc.Choices))
			}
			c := acc.Choices[0]
			if got, want := c.Message.Content, "Once upon a time, there was a fox."; got != want {
				t.Errorf("content %q, want %q", got, want)
			}
			if acc.ID != "chatcmpl-primary" || c.FinishReason != "stop" {
				t.Errorf("id %q, finish reason %q; want chatcmpl-primary, stop", acc.ID, c.FinishReason)
			}
			// The primary was cut before its usage chunk, which OpenAI sends
			// last: the sum of what both reported is the backup's report.
			if u := acc.Usage; u.PromptTokens != 20 || u.CompletionTokens != 5 || u.TotalTokens != 25 {
				t.Errorf("usage %d+%d=%d, want 20+5=25", u.PromptTokens, u.CompletionTokens, u.TotalTokens)
			}
			checkPrefix(t, continuation(t, backup, "Authorization", "Bearer "+backupKey), "Once upon a time,")
			if len(continued) != 1 || continued[0].From != "primary" || continued[0].To != "backup" || continued[0].Err != nil {
				t.Errorf("Trace.Continued got %+v, want primary to backup", continued)
			}
		})
	}
}

// anthropicContinueUpstreams are a primary that sends "Once upon a time,"
// then tail, and breaks as b says, and a backup answered by backupStep
// that takes an assistant prefill; each with its own key.
func anthropicContinueUpstreams(t *testing.T, b streamBreak, tail string, backupStep failovertest.Step) (primary, backup *failovertest.Server, tr *failover.Transport) {
	t.Helper()
	primary = failovertest.NewServer(t, b.primaryStep(
		messageStart("msg_primary", 25, 1),
		textStart(0),
		textDelta(0, "Once upon "),
		textDelta(0, "a time,"+tail),
	))
	backup = failovertest.NewServer(t, backupStep)
	tr = continueTransport(t,
		failover.Upstream{Name: "primary", BaseURL: primary.URL, Header: http.Header{"X-Api-Key": {primaryKey}}, Timeouts: failover.Timeouts{Idle: b.idle}},
		failover.Upstream{Name: "backup", BaseURL: backup.URL, Header: http.Header{"X-Api-Key": {backupKey}}, Prefill: failover.Prefill{Messages: true}},
	)
	return primary, backup, tr
}

// anthropicContinueStream reads a message through a client of tr aimed
// at base as its users do, with Message.Accumulate, and returns what it
// accumulated and the stream's error.
func anthropicContinueStream(t *testing.T, tr http.RoundTripper, base string, trace *failover.Trace) (anthropic.Message, error) {
	t.Helper()
	client := anthropic.NewClient(
		anthropicoption.WithoutEnvironmentDefaults(),
		anthropicoption.WithHTTPClient(&http.Client{Transport: tr}),
		anthropicoption.WithBaseURL(base),
		anthropicoption.WithAPIKey(callerKey),
		anthropicoption.WithMaxRetries(0),
	)
	stream := client.Messages.NewStreaming(failover.WithTrace(testContext(t), trace), anthropic.MessageNewParams{
		Model:     anthropic.Model("claude-sonnet-4-5"),
		MaxTokens: 100,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Tell a story."))},
	})
	defer stream.Close()
	var msg anthropic.Message
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			t.Errorf("Accumulate: %v", err)
		}
	}
	return msg, stream.Err()
}

// anthropicStory is the backup's continuation of "Once upon a time,":
// 31 tokens in, 6 out.
func anthropicStory() failovertest.Step {
	return failovertest.Step{Chunks: append([]string{
		messageStart("msg_backup", 31, 1),
		textStart(0),
		textDelta(0, " there was"),
		textDelta(0, " a fox."),
	}, messageEnd(0, 6)...)}
}

// TestAnthropicContinue: a Messages stream that the primary breaks after
// "Once upon a time," is continued by the backup, and anthropic-sdk-go's
// Message.Accumulate reads one complete message: one text block with the
// whole text, the primary's id, end_turn, and the input and output tokens
// of both upstreams added. The backup gets the continuation with its own
// key (and the answer so far: TestAnthropicContinueSendsAnswerSoFar).
func TestAnthropicContinue(t *testing.T) {
	for _, b := range messageBreaks {
		t.Run(b.name, func(t *testing.T) {
			primary, backup, tr := anthropicContinueUpstreams(t, b, "", anthropicStory())
			var continued []failover.TraceContinued
			msg, err := anthropicContinueStream(t, tr, primary.URL, continuedTrace(&continued))
			if err != nil {
				t.Fatalf("stream.Err() = %v, want nil", err)
			}
			if len(msg.Content) != 1 || msg.Content[0].Type != "text" {
				t.Fatalf("accumulated content %+v, want one text block", msg.Content)
			}
			if got, want := msg.Content[0].Text, "Once upon a time, there was a fox."; got != want {
				t.Errorf("text %q, want %q", got, want)
			}
			if msg.ID != "msg_primary" || msg.StopReason != anthropic.StopReasonEndTurn {
				t.Errorf("id %q, stop reason %q; want msg_primary, end_turn", msg.ID, msg.StopReason)
			}
			// The primary's message_start reported 25 in and 1 out; the
			// backup's 31 in, and 6 out in all by its message_delta.
			if u := msg.Usage; u.InputTokens != 25+31 || u.OutputTokens != 1+6 {
				t.Errorf("usage %d in, %d out; want %d in, %d out", u.InputTokens, u.OutputTokens, 25+31, 1+6)
			}
			continuation(t, backup, "X-Api-Key", backupKey)
			if len(continued) != 1 || continued[0].From != "primary" || continued[0].To != "backup" || continued[0].Err != nil {
				t.Errorf("Trace.Continued got %+v, want primary to backup", continued)
			}
		})
	}
}

// TestAnthropicContinueSendsAnswerSoFar: the backup's prefill is the text
// the primary sent in its text_delta events, trailing whitespace trimmed
// (the API refuses it); then the backup's leading whitespace stands for
// what was trimmed, and the caller reads it once.
func TestAnthropicContinueSendsAnswerSoFar(t *testing.T) {
	for _, tail := range []string{"", " "} {
		t.Run("tail "+strconv.Quote(tail), func(t *testing.T) {
			primary, backup, tr := anthropicContinueUpstreams(t, messageBreaks[0], tail, anthropicStory())
			msg, err := anthropicContinueStream(t, tr, primary.URL, nil)
			if err != nil {
				t.Fatalf("stream.Err() = %v, want nil", err)
			}
			checkPrefix(t, continuation(t, backup, "X-Api-Key", backupKey), "Once upon a time,")
			if len(msg.Content) != 1 || msg.Content[0].Text != "Once upon a time, there was a fox." {
				t.Errorf("accumulated %+v, want one text block of the whole text", msg.Content)
			}
		})
	}
}

// checkRefusedTrace fails unless the trace reports one break of the
// primary's stream, not continued.
func checkRefusedTrace(t *testing.T, continued []failover.TraceContinued) {
	t.Helper()
	if len(continued) != 1 || continued[0].From != "primary" || continued[0].To != "" || continued[0].Err == nil {
		t.Errorf("Trace.Continued got %+v, want primary not continued", continued)
	}
}

// checkOriginalCause fails unless err, what the SDK's stream returned, is
// the cut's or the stall's own error, for the breaks other than an error
// event.
func checkOriginalCause(t *testing.T, b streamBreak, err error) {
	t.Helper()
	switch b.end {
	case failovertest.EndCut:
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("stream.Err() = %v, want the cut's io.ErrUnexpectedEOF", err)
		}
	case failovertest.EndStall:
		var stall *failover.StallError
		if !errors.As(err, &stall) || !errors.Is(err, failover.ErrStreamStalled) || stall.Upstream != "primary" {
			t.Errorf("stream.Err() = %v, want the primary's *failover.StallError", err)
		}
	}
}

// TestOpenAIContinueRefused: when the backup answers the continuation 400,
// openai-go's stream fails with the primary's own cause (the cut's
// io.ErrUnexpectedEOF, the stall's *failover.StallError, the primary's
// error object), never the backup's 400, after the text the primary sent.
func TestOpenAIContinueRefused(t *testing.T) {
	for _, b := range chatBreaks {
		t.Run(b.name, func(t *testing.T) {
			primary, backup, tr := openAIContinueUpstreams(t, b, failovertest.Step{
				Status: http.StatusBadRequest,
				Body:   `{"error":{"message":"This model does not support assistant message prefill.","type":"invalid_request_error","param":"messages","code":null}}`,
			})
			client := newOpenAIClient(t, tr, primary.URL+"/v1", option.WithMaxRetries(0))
			var continued []failover.TraceContinued
			acc, err := openAIContinueStream(t, client, continuedTrace(&continued))
			if err == nil {
				t.Fatal("stream.Err() = nil after a break not continued")
			}
			if strings.Contains(err.Error(), "prefill") {
				t.Errorf("stream.Err() = %v: the backup's refusal, want the primary's cause", err)
			}
			if b.event != "" {
				var se *ssestream.StreamError
				if !errors.As(err, &se) || !strings.Contains(string(se.Event.Data), `"server_error"`) {
					t.Errorf("stream.Err() = %v (%T), want the primary's server_error as a *ssestream.StreamError", err, err)
				}
			}
			checkOriginalCause(t, b, err)
			if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "Once upon a time," || acc.Choices[0].FinishReason != "" {
				t.Errorf("accumulated %+v, want the primary's text and no finish reason", acc.Choices)
			}
			checkPrefix(t, continuation(t, backup, "Authorization", "Bearer "+backupKey), "Once upon a time,")
			checkRefusedTrace(t, continued)
		})
	}
}

// TestAnthropicContinueRefused: when the backup refuses the prefill
// (400 invalid_request_error, as recent Claude models do),
// anthropic-sdk-go's stream fails with the primary's own cause (the cut's
// io.ErrUnexpectedEOF, the stall's *failover.StallError, the primary's
// overloaded_error as an *anthropic.Error), never the backup's 400.
func TestAnthropicContinueRefused(t *testing.T) {
	for _, b := range messageBreaks {
		t.Run(b.name, func(t *testing.T) {
			primary, backup, tr := anthropicContinueUpstreams(t, b, "", failovertest.Step{
				Status: http.StatusBadRequest,
				Body:   `{"type":"error","error":{"type":"invalid_request_error","message":"This model does not support assistant message prefill"}}`,
			})
			var continued []failover.TraceContinued
			msg, err := anthropicContinueStream(t, tr, primary.URL, continuedTrace(&continued))
			if err == nil {
				t.Fatal("stream.Err() = nil after a break not continued")
			}
			var apiErr *anthropic.Error
			isAPIErr := errors.As(err, &apiErr)
			if b.event != "" {
				// The primary's error event, as the SDK reads one: an
				// *anthropic.Error of the stream's status, 200.
				if !isAPIErr || apiErr.Type() != "overloaded_error" || apiErr.StatusCode != http.StatusOK {
					t.Errorf("stream.Err() = %v (%T), want the primary's overloaded_error", err, err)
				}
			} else if isAPIErr {
				t.Errorf("stream.Err() = %v, an API error, want the primary's cause", err)
			}
			if strings.Contains(err.Error(), "prefill") || strings.Contains(err.Error(), "invalid_request_error") {
				t.Errorf("stream.Err() = %v: the backup's refusal, want the primary's cause", err)
			}
			checkOriginalCause(t, b, err)
			if len(msg.Content) != 1 || msg.Content[0].Text != "Once upon a time," || msg.StopReason != "" {
				t.Errorf("accumulated %+v, want the primary's text and no stop reason", msg.Content)
			}
			continuation(t, backup, "X-Api-Key", backupKey) // its content: TestAnthropicContinueSendsAnswerSoFar
			checkRefusedTrace(t, continued)
		})
	}
}

// TestContinueToolCallUnderSDKs: a stream cut inside a tool call's
// arguments is continued by a backup that makes the call again, and each
// SDK's accumulator reads one call with the primary's id and the whole
// arguments, as if one upstream had sent them.
func TestContinueToolCallUnderSDKs(t *testing.T) {
	t.Run("openai-go", func(t *testing.T) {
		tool := func(id, callID, name, args string) string {
			f := map[string]any{"arguments": args}
			tc := map[string]any{"index": 0, "function": f}
			if name != "" {
				tc["id"], tc["type"], f["name"] = callID, "function", name
			}
			b, _ := json.Marshal(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
				"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"tool_calls": []any{tc}}, "finish_reason": nil}}})
			return "data: " + string(b) + "\n\n"
		}
		primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{
			chatEvent("chatcmpl-primary", "assistant", "", ""),
			tool("chatcmpl-primary", "call_primary", "get_weather", `{"city": "Pa`),
		}, End: failovertest.EndCut})
		backup := failovertest.NewServer(t, failovertest.Step{Chunks: []string{
			chatEvent("chatcmpl-backup", "assistant", "", ""),
			tool("chatcmpl-backup", "call_backup", "get_weather", ""),
			tool("chatcmpl-backup", "", "", `{"city": "Paris"}`),
			chatEvent("chatcmpl-backup", "", "", "tool_calls"),
			"data: [DONE]\n\n",
		}})
		tr := continueTransport(t,
			failover.Upstream{Name: "primary", BaseURL: primary.URL + "/v1"},
			failover.Upstream{Name: "backup", BaseURL: backup.URL + "/v1", Prefill: failover.Prefill{Chat: failover.ChatTrailingAssistant}},
		)
		client := newOpenAIClient(t, tr, primary.URL+"/v1", option.WithMaxRetries(0))
		acc, err := openAIContinueStream(t, client, nil)
		if err != nil {
			t.Fatalf("stream.Err() = %v", err)
		}
		if len(acc.Choices) != 1 || len(acc.Choices[0].Message.ToolCalls) != 1 {
			t.Fatalf("accumulated %+v, want one tool call", acc.Choices)
		}
		call := acc.Choices[0].Message.ToolCalls[0]
		if call.ID != "call_primary" || call.Function.Name != "get_weather" || call.Function.Arguments != `{"city": "Paris"}` || acc.Choices[0].FinishReason != "tool_calls" {
			t.Errorf("tool call %s %s(%s), finish %q", call.ID, call.Function.Name, call.Function.Arguments, acc.Choices[0].FinishReason)
		}
	})
	t.Run("anthropic-sdk-go", func(t *testing.T) {
		toolStart := `{"type":"content_block_start","index":%d,"content_block":{"type":"tool_use","id":"%s","name":"get_weather","input":{}}}`
		args := func(i int, partial string) string {
			b, _ := json.Marshal(partial)
			return messageEvent("content_block_delta", `{"type":"content_block_delta","index":`+strconv.Itoa(i)+`,"delta":{"type":"input_json_delta","partial_json":`+string(b)+`}}`)
		}
		primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{
			messageStart("msg_primary", 25, 1), textStart(0), textDelta(0, "Let me check."),
			messageEvent("content_block_stop", `{"type":"content_block_stop","index":0}`),
			messageEvent("content_block_start", strings.Replace(strings.Replace(toolStart, "%d", "1", 1), "%s", "toolu_primary", 1)),
			args(1, `{"city": "Pa`),
		}, End: failovertest.EndCut})
		backup := failovertest.NewServer(t, failovertest.Step{Chunks: []string{
			messageStart("msg_backup", 31, 1),
			messageEvent("content_block_start", strings.Replace(strings.Replace(toolStart, "%d", "0", 1), "%s", "toolu_backup", 1)),
			args(0, `{"city": "Paris"}`),
			messageEvent("content_block_stop", `{"type":"content_block_stop","index":0}`),
			messageEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":12}}`),
			messageEvent("message_stop", `{"type":"message_stop"}`),
		}})
		tr := continueTransport(t,
			failover.Upstream{Name: "primary", BaseURL: primary.URL},
			failover.Upstream{Name: "backup", BaseURL: backup.URL, Prefill: failover.Prefill{Messages: true}},
		)
		msg, err := anthropicContinueStream(t, tr, primary.URL, nil)
		if err != nil {
			t.Fatalf("stream.Err() = %v", err)
		}
		if len(msg.Content) != 2 || msg.Content[0].Text != "Let me check." || msg.Content[1].ID != "toolu_primary" || string(msg.Content[1].Input) != `{"city": "Paris"}` ||
			msg.StopReason != "tool_use" || msg.Usage.InputTokens != 25+31 || msg.Usage.OutputTokens != 1+12 {
			t.Errorf("accumulated %+v", msg)
		}
	})
}
