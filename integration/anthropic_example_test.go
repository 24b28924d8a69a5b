package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/failover-go/failover"
	"github.com/failover-go/failover/failovertest"
)

// anthropic-sdk-go over a failover.Transport. Two things differ from
// openai-go:
//
//   - Anthropic reads the key from the X-Api-Key header, so that is what
//     each Upstream.Header sets. Here the keys live in the Transport only,
//     and the SDK has none: option.WithoutEnvironmentDefaults also keeps
//     it from reading ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL. A key
//     given to the SDK instead (option.WithAPIKey) reaches only the
//     upstream the SDK is aimed at.
//   - The SDK's base URL has no /v1: its paths begin with v1/. Give
//     option.WithBaseURL and every Upstream.BaseURL the provider's root
//     (https://api.anthropic.com) or the gateway's prefix, never with
//     /v1, so that the path after the base (/v1/messages) is the same for
//     every upstream.
//
// The primary is overloaded (529 overloaded_error) and the backup answers.
// anthropic-sdk-go retries 529 and 5xx twice by default, but not what the
// Transport already failed over, as for openai-go (see
// Example_openaiRetries): its retries stay on.
func Example_anthropic() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("primary got", r.Method, r.URL.Path, "with x-api-key", r.Header.Get("X-Api-Key"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(529)
		io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("backup got", r.Method, r.URL.Path, "with x-api-key", r.Header.Get("X-Api-Key"))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5",`+
			`"content":[{"type":"text","text":"Hello from the backup."}],"stop_reason":"end_turn","stop_sequence":null,`+
			`"usage":{"input_tokens":10,"output_tokens":6}}`)
	}))
	defer backup.Close()

	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "anthropic", BaseURL: primary.URL, Header: http.Header{"X-Api-Key": {"sk-ant-primary"}}},
		{Name: "gateway", BaseURL: backup.URL + "/anthropic", Header: http.Header{"X-Api-Key": {"sk-ant-backup"}}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()

	client := anthropic.NewClient(
		option.WithoutEnvironmentDefaults(),
		option.WithHTTPClient(&http.Client{Transport: t}),
		option.WithBaseURL(primary.URL), // no /v1
	)
	msg, err := client.Messages.New(context.Background(), anthropic.MessageNewParams{
		Model:     anthropic.Model("claude-sonnet-4-5"),
		MaxTokens: 100,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(msg.Content[0].Text)
	// Output:
	// primary got POST /v1/messages with x-api-key sk-ant-primary
	// backup got POST /anthropic/v1/messages with x-api-key sk-ant-backup
	// Hello from the backup.
}

// Anthropic may answer a streamed request with a 200 whose stream begins
// with an error event, overloaded_error, before any text. The status
// says success. By default the Transport holds the stream back until its
// first content event (Config.StreamGuard): the error event comes first,
// so the primary's stream is dropped, counted as the primary's failure,
// and the request goes to the backup, whose stream the SDK reads from its
// start. Once content has reached the caller, a stream is never switched.
// A StreamGuard with HoldEvents -1 hands streams on at once: then the
// SDK's stream fails with that error, and nothing fails over.
func Example_anthropicStreamGuard() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("primary got", r.Method, r.URL.Path)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message_start\n"+
			`data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}`+"\n\n"+
			"event: error\n"+
			`data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`+"\n\n")
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("backup got", r.Method, r.URL.Path)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range [][2]string{
			{"message_start", `{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}`},
			{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
			{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`},
			{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" from the backup."}}`},
			{"content_block_stop", `{"type":"content_block_stop","index":0}`},
			{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":6}}`},
			{"message_stop", `{"type":"message_stop"}`},
		} {
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev[0], ev[1])
		}
	}))
	defer backup.Close()

	stream := func(guard *failover.StreamGuard) (string, error) {
		t, err := failover.New(failover.Config{
			Upstreams: []failover.Upstream{
				{Name: "anthropic", BaseURL: primary.URL, Header: http.Header{"X-Api-Key": {"sk-ant-primary"}}},
				{Name: "backup", BaseURL: backup.URL, Header: http.Header{"X-Api-Key": {"sk-ant-backup"}}},
			},
			StreamGuard: guard,
		})
		if err != nil {
			log.Fatal(err)
		}
		defer t.Close()
		client := anthropic.NewClient(
			option.WithoutEnvironmentDefaults(),
			option.WithHTTPClient(&http.Client{Transport: t}),
			option.WithBaseURL(primary.URL),
		)
		s := client.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{
			Model:     anthropic.Model("claude-sonnet-4-5"),
			MaxTokens: 100,
			Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
		})
		defer s.Close()
		var msg anthropic.Message
		for s.Next() {
			if err := msg.Accumulate(s.Current()); err != nil {
				return "", err
			}
		}
		if err := s.Err(); err != nil {
			return "", err
		}
		return msg.Content[0].Text, nil
	}

	_, err := stream(&failover.StreamGuard{HoldEvents: -1})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) {
		log.Fatalf("got %v, want the primary's overloaded_error", err)
	}
	fmt.Printf("passed through: the SDK's stream fails with %s, status %d\n", apiErr.Type(), apiErr.StatusCode)

	text, err := stream(nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("by default:", text)
	// Output:
	// primary got POST /v1/messages
	// passed through: the SDK's stream fails with overloaded_error, status 200
	// primary got POST /v1/messages
	// backup got POST /v1/messages
	// by default: Hello from the backup.
}

// Config.Continue under anthropic-sdk-go: the primary cuts its stream
// after "Once upon a time,", and the backup, whose Upstream.Prefill takes
// an assistant prefill (Messages: true), gets the request again with that
// text as a trailing assistant message. Message.Accumulate makes one
// message of the stream the SDK reads: one text block, the primary's id,
// one stop reason, and the tokens of both upstreams added. Recent Claude
// models refuse prefill: name the models that take it in
// Prefill.Models. Where the backup refuses, the SDK's stream fails with
// the primary's own cause, as without Continue.
func Example_anthropicContinue() {
	var t cleanups // in a test: t *testing.T
	defer t.run()

	event := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	primary := failovertest.NewServer(&t, failovertest.Step{
		Chunks: []string{
			event("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}`),
			event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
			event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Once upon "}}`),
			event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a time,"}}`),
		},
		End: failovertest.EndCut,
	})
	backup := failovertest.NewServer(&t, failovertest.Step{Chunks: []string{
		event("message_start", `{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":31,"output_tokens":1}}}`),
		event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there was a fox."}}`),
		event("content_block_stop", `{"type":"content_block_stop","index":0}`),
		event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":6}}`),
		event("message_stop", `{"type":"message_stop"}`),
	}})

	tr, err := failover.New(failover.Config{
		Continue: failover.ContinueConfig{On: true},
		Upstreams: []failover.Upstream{
			{Name: "anthropic", BaseURL: primary.URL, Header: http.Header{"X-Api-Key": {"sk-ant-primary"}}},
			{Name: "gateway", BaseURL: backup.URL + "/anthropic", Header: http.Header{"X-Api-Key": {"sk-ant-backup"}},
				Prefill: failover.Prefill{Messages: true}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	client := anthropic.NewClient(
		option.WithoutEnvironmentDefaults(),
		option.WithHTTPClient(&http.Client{Transport: tr}),
		option.WithBaseURL(primary.URL),
	)
	stream := client.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{
		Model:     anthropic.Model("claude-sonnet-4-5"),
		MaxTokens: 100,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Tell a story."))},
	})
	defer stream.Close()
	var msg anthropic.Message
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			log.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(msg.Content[0].Text)
	fmt.Println(msg.ID, msg.StopReason, msg.Usage.InputTokens, "in", msg.Usage.OutputTokens, "out")

	r := backup.Requests()[0]
	var sent struct {
		Messages []struct{ Role, Content string }
	}
	json.Unmarshal(r.Body, &sent)
	last := sent.Messages[len(sent.Messages)-1]
	fmt.Printf("gateway got %s with x-api-key %s, ending in the %s's %q\n", r.Path, r.Header.Get("X-Api-Key"), last.Role, last.Content)
	// Output:
	// Once upon a time, there was a fox.
	// msg_1 end_turn 56 in 7 out
	// gateway got /anthropic/v1/messages with x-api-key sk-ant-backup, ending in the assistant's "Once upon a time,"
}
