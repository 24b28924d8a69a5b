package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// These tests put pinning (failover.PinConfig) under the real SDKs: a
// request that references state a provider holds, a previous response or
// an uploaded file, goes only to the upstream that holds it, and fails
// rather than carry the reference to another.

// switchable is an upstream's handler that the test replaces as it goes.
type switchable struct {
	h atomic.Pointer[http.HandlerFunc]
}

func newSwitchable(h http.HandlerFunc) *switchable {
	s := new(switchable)
	s.set(h)
	return s
}

func (s *switchable) set(h http.HandlerFunc) { s.h.Store(&h) }

func (s *switchable) serve(w http.ResponseWriter, r *http.Request) { (*s.h.Load())(w, r) }

// responseObject is an OpenAI Responses API response with id and text.
func responseObject(id, status, text string) map[string]any {
	output := []any{}
	if text != "" {
		output = append(output, map[string]any{
			"type": "message", "id": "msg_" + id, "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}},
		})
	}
	return map[string]any{
		"id": id, "object": "response", "created_at": 1700000000, "status": status, "model": "gpt-test",
		"output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{},
		"usage": map[string]any{"input_tokens": 9, "output_tokens": 3, "total_tokens": 12},
	}
}

// responsesAPI answers POST /responses as OpenAI does, streamed
// (response.created, response.output_text.delta, response.completed)
// when the body asks for it, with ids prefix1, prefix2, ...; the text
// says which response it continues.
func responsesAPI(prefix string) http.HandlerFunc {
	var n atomic.Int32
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream             bool   `json:"stream"`
			PreviousResponseID string `json:"previous_response_id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !strings.HasSuffix(r.URL.Path, "/responses") {
			apiError(http.StatusBadRequest, "invalid_request_error", "want a Responses request")(w, r)
			return
		}
		id := fmt.Sprintf("%s%d", prefix, n.Add(1))
		text := "after " + req.PreviousResponseID
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(responseObject(id, "completed", text))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i, ev := range []map[string]any{
			{"type": "response.created", "response": responseObject(id, "in_progress", "")},
			{"type": "response.output_text.delta", "item_id": "msg_" + id, "output_index": 0, "content_index": 0, "delta": text, "logprobs": []any{}},
			{"type": "response.completed", "response": responseObject(id, "completed", text)},
		} {
			ev["sequence_number"] = i
			b, _ := json.Marshal(ev)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev["type"], b)
			w.(http.Flusher).Flush()
		}
	}
}

// respond makes one Responses call, plain or streamed, and returns the
// response's id and text. A stream's id is the response.created event's,
// and its events must run from response.created to response.completed.
func respond(t *testing.T, client openai.Client, stream bool, params responses.ResponseNewParams, opts ...option.RequestOption) (id, text string, err error) {
	t.Helper()
	ctx := testContext(t)
	if !stream {
		res, err := client.Responses.New(ctx, params, opts...)
		if err != nil {
			return "", "", err
		}
		if len(res.Output) == 0 || len(res.Output[0].Content) == 0 {
			t.Fatalf("response %s has no output text", res.ID)
		}
		return res.ID, res.Output[0].Content[0].Text, nil
	}
	s := client.Responses.NewStreaming(ctx, params, opts...)
	defer s.Close()
	var types []string
	for s.Next() {
		ev := s.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.created":
			id = ev.Response.ID
		case "response.output_text.delta":
			text += ev.Delta
		}
	}
	if err := s.Err(); err != nil {
		return "", "", err
	}
	if want := []string{"response.created", "response.output_text.delta", "response.completed"}; !slices.Equal(types, want) {
		t.Fatalf("got events %q, want %q", types, want)
	}
	return id, text, nil
}

// TestOpenAIResponsesPinned: a response the backup created while the
// primary was down is continued (previous_response_id) only at the
// backup, although the primary is back up; once the backup is down too,
// the SDK call fails with the Transport's refusal, a 503 that says not to
// retry, and the primary never sees the reference. Plain and streamed:
// the id is learned from the answer as the caller reads it.
func TestOpenAIResponsesPinned(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			var log requestLog
			down := apiError(http.StatusServiceUnavailable, "server_error", "The server is overloaded.", "retry-after-ms", "1")
			primaryH, backupH := newSwitchable(down), newSwitchable(responsesAPI("resp_b"))
			primary := fakeUpstream(t, &log, "primary", primaryH.serve)
			backup := fakeUpstream(t, &log, "backup", backupH.serve)
			tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
				{Name: "primary", BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + primaryKey}}},
				// The backup's circuit opens at its first failure, so
				// that "down" is one 503 away.
				{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + backupKey}},
					Breaker: &failover.BreakerConfig{FailureThreshold: 1, Cooldown: time.Hour}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tr.Close() })
			sdk := &calls{next: tr}
			client := newOpenAIClient(t, sdk, primary.URL+"/v1") // the SDK's default retries
			params := func(prev string) responses.ResponseNewParams {
				p := responses.ResponseNewParams{Model: "gpt-test", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Go on.")}}
				if prev != "" {
					p.PreviousResponseID = openai.String(prev)
				}
				return p
			}

			// The primary is down: the backup creates the response.
			first, _, err := respond(t, client, stream, params(""))
			if err != nil {
				t.Fatalf("first call: %v", err)
			}
			if !strings.HasPrefix(first, "resp_b") {
				t.Fatalf("first call: got response %q, want the backup's", first)
			}

			// The primary is back up and takes what references nothing.
			primaryH.set(responsesAPI("resp_p"))
			if id, _, err := respond(t, client, stream, params("")); err != nil || !strings.HasPrefix(id, "resp_p") {
				t.Fatalf("with the primary back: got response %q, %v; want the primary's", id, err)
			}

			// The continuation goes to the backup alone.
			var raw *http.Response
			second, text, err := respond(t, client, stream, params(first), option.WithResponseInto(&raw))
			if err != nil {
				t.Fatalf("continuation: %v", err)
			}
			if !strings.HasPrefix(second, "resp_b") || text != "after "+first {
				t.Errorf("continuation: got response %q saying %q, want the backup's after %q", second, text, first)
			}
			if s, ok := failover.ServedBy(raw); !ok || s.Upstream != "backup" || s.Attempts != 1 {
				t.Errorf("continuation: ServedBy = %+v, %v; want the backup at the first attempt", s, ok)
			}
			if got, want := log.order(), []string{"primary#0", "backup#0", "primary#0", "backup#0"}; !slices.Equal(got, want) {
				t.Fatalf("before the backup is down: got requests %q, want %q", got, want)
			}

			// The backup is down: the continuation of its response fails,
			// and the primary is not asked.
			backupH.set(down)
			sdk.n.Store(0)
			_, _, err = respond(t, client, stream, params(second))
			// The SDK's first attempt reaches the backup, whose 503 opens
			// its circuit; the SDK retries that 503, and the Transport
			// refuses the retry with a 503 that the SDK does not retry.
			if got, want := log.order(), []string{"primary#0", "backup#0", "primary#0", "backup#0", "backup#0"}; !slices.Equal(got, want) {
				t.Errorf("with the backup down: got requests %q, want %q", got, want)
			}
			if n := sdk.n.Load(); n != 2 {
				t.Errorf("with the backup down: the SDK made %d attempts, want 2", n)
			}
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("with the backup down: got %T %v, want an *openai.Error", err, err)
			}
			if apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Response.Header.Get("X-Should-Retry") != "false" || apiErr.Response.Header.Get("Retry-After") == "" {
				t.Errorf("with the backup down: got %d with headers %v, want a 503 with X-Should-Retry: false and a Retry-After", apiErr.StatusCode, apiErr.Response.Header)
			}
			refusal := failover.AnswerError(apiErr.Response)
			var pe *failover.PinnedError
			if !errors.Is(refusal, failover.ErrPinned) || !errors.Is(refusal, failover.ErrCircuitOpen) || !errors.As(refusal, &pe) {
				t.Fatalf("with the backup down: AnswerError = %v, want a PinnedError for the backup's open circuit", refusal)
			}
			if pe.Upstream != "backup" || pe.Ref != second {
				t.Errorf("with the backup down: PinnedError names %q at %q, want %q at %q", pe.Ref, pe.Upstream, second, "backup")
			}
			if !strings.Contains(apiErr.Message, "not failed over") || !strings.Contains(apiErr.Message, second) {
				t.Errorf("with the backup down: the SDK's error says %q, want the refusal", apiErr.Message)
			}
			for _, key := range []string{primaryKey, backupKey, callerKey} {
				if strings.Contains(apiErr.Message, key) || strings.Contains(refusal.Error(), key) {
					t.Errorf("with the backup down: the error quotes a key: %q", apiErr.Message)
				}
			}

			for _, r := range log.of("primary") {
				checkCredentials(t, r, primaryKey)
				if bytes.Contains(r.body, []byte("resp_b")) {
					t.Errorf("the primary got a request that references the backup's state: %s", r.body)
				}
			}
			for _, r := range log.of("backup") {
				checkCredentials(t, r, backupKey)
			}
		})
	}
}

// anthropicFileID is the id of a file uploaded to the primary's
// organisation through the Files API.
const anthropicFileID = "file_011CNha8iCJcU1wXNR6q4V8w"

// anthropicMessage answers a message request as Anthropic does, with
// text.
func anthropicMessage(text string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5",`+
			`"content":[{"type":"text","text":%q}],"stop_reason":"end_turn","stop_sequence":null,`+
			`"usage":{"input_tokens":10,"output_tokens":6}}`, text)
	}
}

// TestAnthropicFileNotFailedOver: a message that attaches a file
// (file_id) addressed to a primary that is down is not sent to the
// backup, where the file does not exist; the same message without the
// file fails over. Both through the Messages API and the beta one, with
// the Files API's beta header.
func TestAnthropicFileNotFailedOver(t *testing.T) {
	type call func(ctx context.Context, client anthropic.Client, file bool) (string, error)
	tests := []struct {
		name string
		call call
	}{
		{"Messages", func(ctx context.Context, client anthropic.Client, file bool) (string, error) {
			blocks := []anthropic.ContentBlockParamUnion{anthropic.NewTextBlock("Summarise the attached report.")}
			if file {
				blocks = append(blocks, anthropic.NewDocumentBlock(anthropic.FileDocumentSourceParam{FileID: anthropicFileID}))
			}
			msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
				Model:     anthropic.Model("claude-sonnet-4-5"),
				MaxTokens: 100,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(blocks...)},
			}, anthropicoption.WithHeader("anthropic-beta", string(anthropic.AnthropicBetaFilesAPI2025_04_14)))
			if err != nil {
				return "", err
			}
			return msg.Content[0].Text, nil
		}},
		{"Beta.Messages", func(ctx context.Context, client anthropic.Client, file bool) (string, error) {
			blocks := []anthropic.BetaContentBlockParamUnion{anthropic.NewBetaTextBlock("Summarise the attached report.")}
			if file {
				blocks = append(blocks, anthropic.NewBetaDocumentBlock(anthropic.BetaFileDocumentSourceParam{FileID: anthropicFileID}))
			}
			msg, err := client.Beta.Messages.New(ctx, anthropic.BetaMessageNewParams{
				Model:     anthropic.Model("claude-sonnet-4-5"),
				MaxTokens: 100,
				Messages:  []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(blocks...)},
				Betas:     []anthropic.AnthropicBeta{anthropic.AnthropicBetaFilesAPI2025_04_14},
			})
			if err != nil {
				return "", err
			}
			return msg.Content[0].Text, nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var log requestLog
			primary := fakeUpstream(t, &log, "primary", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, `{"type":"error","error":{"type":"api_error","message":"primary is down"}}`)
			})
			backup := fakeUpstream(t, &log, "backup", anthropicMessage("from backup"))
			tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
				{Name: "primary", BaseURL: primary.URL, Header: http.Header{"X-Api-Key": {primaryKey}}},
				{Name: "backup", BaseURL: backup.URL, Header: http.Header{"X-Api-Key": {backupKey}}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tr.Close() })
			sdk := &calls{next: tr}
			client := anthropic.NewClient(
				anthropicoption.WithoutEnvironmentDefaults(),
				anthropicoption.WithHTTPClient(&http.Client{Transport: sdk}),
				anthropicoption.WithBaseURL(primary.URL),
				anthropicoption.WithAPIKey(callerKey),
				anthropicoption.WithMaxRetries(0),
			)

			_, err = tc.call(testContext(t), client, true)
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || !strings.Contains(apiErr.Error(), "primary is down") {
				t.Fatalf("with the file: got %v, want the primary's 503", err)
			}
			if got, want := log.order(), []string{"primary#0"}; !slices.Equal(got, want) {
				t.Errorf("with the file: got requests %q, want %q", got, want)
			}
			if r := log.of("primary"); len(r) == 0 || !bytes.Contains(r[0].body, []byte(anthropicFileID)) {
				t.Errorf("with the file: the primary did not get the file block")
			}

			text, err := tc.call(testContext(t), client, false)
			if err != nil || text != "from backup" {
				t.Fatalf("without the file: got %q, %v; want the backup's answer", text, err)
			}
			if got, want := log.order(), []string{"primary#0", "primary#0", "backup#0"}; !slices.Equal(got, want) {
				t.Errorf("without the file: got requests %q, want %q", got, want)
			}
			if n := sdk.n.Load(); n != 2 {
				t.Errorf("the SDK made %d attempts, want 2", n)
			}
			for _, r := range log.all() {
				if got, want := r.header.Values("X-Api-Key"), []string{map[string]string{"primary": primaryKey, "backup": backupKey}[r.upstream]}; !slices.Equal(got, want) {
					t.Errorf("%s got x-api-key %q, want its own", r.upstream, got)
				}
				if !strings.Contains(r.header.Get("Anthropic-Beta"), "files-api-2025-04-14") {
					t.Errorf("%s got anthropic-beta %q, want the Files API's", r.upstream, r.header.Get("Anthropic-Beta"))
				}
			}
		})
	}
}
