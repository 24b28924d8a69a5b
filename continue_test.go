package failover

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/failover-go/failover/failovertest"
	"github.com/tidwall/gjson"
)

// chatChunk is one chat completion chunk event.
func chatChunk(id, content, finish string) string {
	delta := map[string]any{}
	if content != "" {
		delta["content"] = content
	}
	c := map[string]any{"index": 0, "delta": delta, "finish_reason": nil}
	if finish != "" {
		c["finish_reason"] = finish
	}
	b, _ := json.Marshal(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": []any{c}})
	return "data: " + string(b) + "\n\n"
}

func chatRole(id string) string {
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
}

func chatUsage(id string, in, out int) string {
	b, _ := json.Marshal(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": []any{},
		"usage": map[string]any{"prompt_tokens": in, "completion_tokens": out, "total_tokens": in + out}})
	return "data: " + string(b) + "\n\n"
}

// chatRead is what a reader of a chat stream makes of it, as the SDKs do.
type chatRead struct {
	ids     map[string]bool
	roles   int
	text    string
	finish  []string
	usage   gjson.Result
	done    bool
	errData string
}

func readChat(t *testing.T, body string) chatRead {
	t.Helper()
	r := chatRead{ids: map[string]bool{}}
	for _, ev := range strings.Split(body, "\n\n") {
		data, ok := strings.CutPrefix(strings.TrimSpace(ev), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			r.done = true
			continue
		}
		if r.done {
			t.Errorf("an event after [DONE]: %s", data)
		}
		j := gjson.Parse(data)
		if j.Get("error").Exists() {
			r.errData = data
			continue
		}
		r.ids[j.Get("id").Str] = true
		j.Get("choices").ForEach(func(_, c gjson.Result) bool {
			if c.Get("delta.role").Exists() {
				r.roles++
			}
			r.text += c.Get("delta.content").Str
			if f := c.Get("finish_reason").Str; f != "" {
				r.finish = append(r.finish, f)
			}
			return true
		})
		if u := j.Get("usage"); u.IsObject() {
			r.usage = u
		}
	}
	return r
}

const contBody = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"count"}]}`

// pairTransport is a Transport over the servers at primary and backup, continuation on
// and the backup taking a prefix as p says.
func pairTransport(t *testing.T, primary, backup string, p Prefill) *Transport {
	t.Helper()
	return newTestTransport(t, Config{
		Continue: ContinueConfig{On: true},
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary + "/v1"},
			{Name: "backup", BaseURL: backup + "/v1", Prefill: p},
		},
	})
}

// continuedPair is a primary whose stream ends as end after "one two ",
// and a backup that takes a trailing assistant message and answers
// "three four".
func continuedPair(t *testing.T, end failovertest.End, prefill Prefill) (cfg Config, primary, backup *failovertest.Server) {
	t.Helper()
	primary = failovertest.NewServer(t, failovertest.Step{
		Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", ""), chatChunk("p1", "two ", "")},
		End:    end,
	})
	backup = failovertest.NewServer(t, failovertest.Step{
		Chunks: []string{chatRole("b1"), chatChunk("b1", "three ", ""), chatChunk("b1", "four", ""), chatChunk("b1", "", "stop"), chatUsage("b1", 12, 2), "data: [DONE]\n\n"},
	})
	cfg = Config{
		Continue: ContinueConfig{On: true},
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer primary-key-123"}}},
			{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer backup-key-456"}}, Prefill: prefill},
		},
	}
	return cfg, primary, backup
}

func TestContinueChatAcrossCut(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  ChatPrefill
		check func(t *testing.T, last gjson.Result, body gjson.Result)
	}{
		{"trailing assistant", ChatTrailingAssistant, func(t *testing.T, last, body gjson.Result) {
			if last.Get("prefix").Exists() || body.Get("continue_final_message").Exists() {
				t.Errorf("marks a plain trailing message: %s", body.Raw)
			}
		}},
		{"prefix flag", ChatPrefixFlag, func(t *testing.T, last, body gjson.Result) {
			if !last.Get("prefix").Bool() {
				t.Errorf("no prefix: true: %s", last.Raw)
			}
		}},
		{"continue final", ChatContinueFinal, func(t *testing.T, last, body gjson.Result) {
			if !body.Get("continue_final_message").Bool() || body.Get("add_generation_prompt").Bool() || !body.Get("add_generation_prompt").Exists() {
				t.Errorf("no continue_final_message: %s", body.Raw)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, primary, backup := continuedPair(t, failovertest.EndCut, Prefill{Chat: tc.mode})
			var continued []TraceContinued
			tr := newTestTransport(t, cfg)
			req := httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody)
			req = req.WithContext(WithTrace(req.Context(), &Trace{Continued: func(c TraceContinued) { continued = append(continued, c) }}))
			req.Header.Set("Authorization", "Bearer caller-key-789")
			resp, err := do(t, tr, req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("read: %v (got %q)", err, body)
			}
			r := readChat(t, string(body))
			if r.text != "one two three four" || len(r.ids) != 1 || !r.ids["p1"] || r.roles != 1 || len(r.finish) != 1 || !r.done {
				t.Errorf("read text %q, ids %v, %d roles, finish %v, done %v; want one stream", r.text, r.ids, r.roles, r.finish, r.done)
			}
			if r.usage.Get("prompt_tokens").Int() != 12 || r.usage.Get("completion_tokens").Int() != 2 {
				t.Errorf("usage %s, want what the backup billed (the primary reported none)", r.usage.Raw)
			}
			reqs := backup.Requests()
			if len(reqs) != 1 {
				t.Fatalf("backup got %d requests, want 1", len(reqs))
			}
			got := gjson.ParseBytes(reqs[0].Body)
			msgs := got.Get("messages").Array()
			last := msgs[len(msgs)-1]
			if len(msgs) != 2 || last.Get("role").Str != "assistant" || last.Get("content").Str != "one two " {
				t.Errorf("backup's messages %s, want the answer so far as a trailing assistant message", got.Get("messages").Raw)
			}
			tc.check(t, last, got)
			if a := reqs[0].Header.Get("Authorization"); a != "Bearer backup-key-456" {
				t.Errorf("backup got Authorization %q", a)
			}
			if len(continued) != 1 || continued[0].From != "primary" || continued[0].To != "backup" || continued[0].Err != nil {
				t.Errorf("Trace.Continued got %+v", continued)
			}
		})
	}
}

func TestContinueNotWhenNoUpstreamTakesPrefix(t *testing.T) {
	cfg, primary, backup := continuedPair(t, failovertest.EndCut, Prefill{})
	tr := newTestTransport(t, cfg)
	resp, err := do(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("read error %v, want the cut's io.ErrUnexpectedEOF", err)
	}
	if r := readChat(t, string(body)); r.text != "one two " || r.done {
		t.Errorf("read %q, done %v", r.text, r.done)
	}
	if backup.Calls() != 0 {
		t.Errorf("backup got %d requests", backup.Calls())
	}
}

func TestContinueChatAcrossStall(t *testing.T) {
	cfg, primary, _ := continuedPair(t, failovertest.EndStall, Prefill{Chat: ChatTrailingAssistant})
	cfg.Upstreams[0].Timeouts = Timeouts{Idle: 50 * time.Millisecond}
	tr := newTestTransport(t, cfg)
	resp, err := do(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if r := readChat(t, string(body)); r.text != "one two three four" || !r.done {
		t.Errorf("read %q, done %v", r.text, r.done)
	}
}

func msgEvent(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }

func msgStart(id string, in, out int) string {
	return msgEvent("message_start", `{"type":"message_start","message":{"id":"`+id+`","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"usage":{"input_tokens":`+strconv.Itoa(in)+`,"output_tokens":`+strconv.Itoa(out)+`}}}`)
}

func msgBlockStart(i int) string {
	return msgEvent("content_block_start", `{"type":"content_block_start","index":`+strconv.Itoa(i)+`,"content_block":{"type":"text","text":""}}`)
}

func msgText(i int, text string) string {
	b, _ := json.Marshal(text)
	return msgEvent("content_block_delta", `{"type":"content_block_delta","index":`+strconv.Itoa(i)+`,"delta":{"type":"text_delta","text":`+string(b)+`}}`)
}

func msgBlockStop(i int) string {
	return msgEvent("content_block_stop", `{"type":"content_block_stop","index":`+strconv.Itoa(i)+`}`)
}

func msgEnd(out int) []string {
	return []string{
		msgEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":`+strconv.Itoa(out)+`}}`),
		msgEvent("message_stop", `{"type":"message_stop"}`),
	}
}

// msgRead is what a reader of a Messages stream makes of it, as
// anthropic-sdk-go's Accumulate does: it fails where the SDK does.
type msgRead struct {
	ids    []string
	blocks []string
	stop   string
	in     int64
	out    int64
	ended  bool
	err    string
}

func readMessages(t *testing.T, body string) msgRead {
	t.Helper()
	var r msgRead
	for _, ev := range strings.Split(body, "\n\n") {
		var data string
		for _, line := range strings.Split(ev, "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				data = d
			}
		}
		if data == "" {
			continue
		}
		j := gjson.Parse(data)
		switch j.Get("type").Str {
		case "message_start":
			r.ids = append(r.ids, j.Get("message.id").Str)
			r.in, r.out = j.Get("message.usage.input_tokens").Int(), j.Get("message.usage.output_tokens").Int()
		case "content_block_start":
			if int(j.Get("index").Int()) != len(r.blocks) {
				t.Errorf("block %d starts after %d blocks", j.Get("index").Int(), len(r.blocks))
			}
			r.blocks = append(r.blocks, j.Get("content_block.text").Str)
		case "content_block_delta":
			i := int(j.Get("index").Int())
			if i >= len(r.blocks) {
				t.Errorf("delta of block %d, of %d", i, len(r.blocks))
				continue
			}
			r.blocks[i] += j.Get("delta.text").Str
		case "message_delta":
			r.stop = j.Get("delta.stop_reason").Str
			r.out = j.Get("usage.output_tokens").Int()
			if v := j.Get("usage.input_tokens"); v.Exists() {
				r.in = v.Int()
			}
		case "message_stop":
			r.ended = true
		case "error":
			r.err = j.Get("error.type").Str
		}
	}
	return r
}

const msgBody = `{"model":"claude","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"count"}]}`

func TestContinueMessagesAcrossBreaks(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  failovertest.End
		tail []string // after the primary's content
	}{
		{"cut", failovertest.EndCut, nil},
		{"stall", failovertest.EndStall, nil},
		{"error event", failovertest.EndDone, []string{msgEvent("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)}},
		{"truncated", failovertest.EndDone, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := failovertest.NewServer(t, failovertest.Step{
				Chunks: append([]string{msgStart("msg_p", 25, 1), msgBlockStart(0), msgText(0, "one "), msgText(0, "two ")}, tc.tail...),
				End:    tc.end,
			})
			backup := failovertest.NewServer(t, failovertest.Step{
				Chunks: append([]string{msgStart("msg_b", 31, 1), msgBlockStart(0), msgText(0, " three"), msgText(0, " four"), msgBlockStop(0)}, msgEnd(3)...),
			})
			tr := newTestTransport(t, Config{
				Continue: ContinueConfig{On: true},
				Upstreams: []Upstream{
					{Name: "primary", BaseURL: primary.URL + "/v1", Header: http.Header{"X-Api-Key": {"primary-key-123"}}, Timeouts: Timeouts{Idle: 50 * time.Millisecond}},
					{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"X-Api-Key": {"backup-key-456"}}, Prefill: Prefill{Messages: true}},
				},
			})
			resp, err := do(t, tr, httptestRequest("POST", primary.URL+"/v1/messages", msgBody))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			r := readMessages(t, string(body))
			if len(r.ids) != 1 || r.ids[0] != "msg_p" || len(r.blocks) != 1 || r.blocks[0] != "one two three four" || r.stop != "end_turn" || !r.ended || r.err != "" {
				t.Errorf("read %+v; want one message, one block \"one two three four\"\n%s", r, body)
			}
			if r.in != 25+31 || r.out != 1+3 {
				t.Errorf("usage in %d out %d, want the sum of what both reported, 56 and 4", r.in, r.out)
			}
			reqs := backup.Requests()
			if len(reqs) != 1 {
				t.Fatalf("backup got %d requests", len(reqs))
			}
			last := gjson.GetBytes(reqs[0].Body, "messages.1")
			if last.Get("role").Str != "assistant" || last.Get("content").Str != "one two" {
				t.Errorf("backup's prefill %s, want the answer so far without its trailing whitespace", last.Raw)
			}
		})
	}
}

// readAll reads resp's body to its end or its error.
func readAll(t *testing.T, tr http.RoundTripper, req *http.Request) (string, error) {
	t.Helper()
	resp, err := do(t, tr, req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

func TestContinueRefusedEndsInOriginalCause(t *testing.T) {
	refusal := failovertest.Step{Status: 400, Body: `{"type":"error","error":{"type":"invalid_request_error","message":"This model does not support assistant message prefill"}}`}
	overloaded := msgEvent("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
	for _, tc := range []struct {
		name  string
		path  string
		step  failovertest.Step
		check func(t *testing.T, body string, err error)
	}{
		{"chat cut", "/v1/chat/completions", failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndCut},
			func(t *testing.T, body string, err error) {
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Errorf("read error %v, want the cut's", err)
				}
			}},
		{"chat stall", "/v1/chat/completions", failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndStall},
			func(t *testing.T, body string, err error) {
				var se *StallError
				if !errors.As(err, &se) || se.Upstream != "primary" {
					t.Errorf("read error %v, want the primary's *StallError", err)
				}
			}},
		{"chat truncated", "/v1/chat/completions", failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}},
			func(t *testing.T, body string, err error) {
				if !errors.Is(err, ErrStreamTruncated) {
					t.Errorf("read error %v, want ErrStreamTruncated", err)
				}
			}},
		{"messages error event", "/v1/messages", failovertest.Step{Chunks: []string{msgStart("msg_p", 25, 1), msgBlockStart(0), msgText(0, "one "), overloaded}},
			func(t *testing.T, body string, err error) {
				if err != nil || !strings.HasSuffix(body, overloaded) || strings.Contains(body, "prefill") {
					t.Errorf("read %q, %v; want the primary's own error event last", body, err)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := failovertest.NewServer(t, tc.step)
			backup := failovertest.NewServer(t, refusal)
			var continued []TraceContinued
			tr := newTestTransport(t, Config{
				Continue: ContinueConfig{On: true},
				Upstreams: []Upstream{
					{Name: "primary", BaseURL: primary.URL + "/v1", Timeouts: Timeouts{Idle: 50 * time.Millisecond, FirstContent: 50 * time.Millisecond}},
					{Name: "backup", BaseURL: backup.URL + "/v1", Prefill: Prefill{Chat: ChatTrailingAssistant, Messages: true}},
				},
			})
			body := contBody
			if strings.HasSuffix(tc.path, "messages") {
				body = msgBody
			}
			req := httptestRequest("POST", primary.URL+tc.path, body)
			req = req.WithContext(WithTrace(req.Context(), &Trace{Continued: func(c TraceContinued) { continued = append(continued, c) }}))
			got, err := readAll(t, tr, req)
			tc.check(t, got, err)
			if backup.Calls() != 1 {
				t.Errorf("backup got %d requests, want the continuation", backup.Calls())
			}
			if len(continued) != 1 || continued[0].To != "" || continued[0].Err == nil || continued[0].Cause == nil {
				t.Errorf("Trace.Continued got %+v, want one that says why not", continued)
			}
		})
	}
}

func TestContinueNotWhatCannotBeContinued(t *testing.T) {
	two := `data: {"id":"p1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":1,"delta":{"content":"x"},"finish_reason":null}]}` + "\n\n"
	for _, tc := range []struct {
		name  string
		chunk string
		body  string
		ctx   func(*http.Request) *http.Request
	}{
		{"several choices", two, contBody, nil},
		{"n=2", "", `{"model":"m","stream":true,"n":2,"messages":[{"role":"user","content":"count"}]}`, nil},
		{"sent once", "", contBody, func(r *http.Request) *http.Request { return r.WithContext(WithoutFailover(r.Context())) }},
		{"pinned", "", `{"model":"m","stream":true,"messages":[{"role":"user","content":"count"}]}`, func(r *http.Request) *http.Request {
			return r.WithContext(WithPinned(r.Context(), "primary"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chunks := []string{chatRole("p1"), chatChunk("p1", "one ", "")}
			if tc.chunk != "" {
				chunks = append(chunks, tc.chunk)
			}
			primary := failovertest.NewServer(t, failovertest.Step{Chunks: chunks, End: failovertest.EndCut})
			backup := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatChunk("b1", "more", "stop"), "data: [DONE]\n\n"}})
			tr := pairTransport(t, primary.URL, backup.URL, Prefill{Chat: ChatTrailingAssistant})
			req := httptestRequest("POST", primary.URL+"/v1/chat/completions", tc.body)
			if tc.ctx != nil {
				req = tc.ctx(req)
			}
			_, err := readAll(t, tr, req)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("read error %v, want the cut's", err)
			}
			if backup.Calls() != 0 {
				t.Errorf("backup got %d requests, want none", backup.Calls())
			}
		})
	}
}

func TestContinueKeepsCallersPrefill(t *testing.T) {
	primary := failovertest.NewServer(t, failovertest.Step{
		Chunks: []string{msgStart("msg_p", 25, 1), msgBlockStart(0), msgText(0, `"a": 1,`)},
		End:    failovertest.EndCut,
	})
	backup := failovertest.NewServer(t, failovertest.Step{
		Chunks: append([]string{msgStart("msg_b", 31, 1), msgBlockStart(0), msgText(0, ` "b": 2}`), msgBlockStop(0)}, msgEnd(3)...),
	})
	tr := pairTransport(t, primary.URL, backup.URL, Prefill{Messages: true})
	body := `{"model":"claude","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"json"},{"role":"assistant","content":[{"type":"text","text":"{"}]}]}`
	got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/messages", body))
	if err != nil {
		t.Fatal(err)
	}
	if r := readMessages(t, got); len(r.blocks) != 1 || r.blocks[0] != `"a": 1, "b": 2}` {
		t.Errorf("read %+v", r)
	}
	msgs := gjson.GetBytes(backup.Requests()[0].Body, "messages").Array()
	if len(msgs) != 2 || msgs[1].Get("role").Str != "assistant" || msgs[1].Get("content").Str != `{"a": 1,` {
		t.Errorf("backup's messages %v, want the caller's prefill and the answer so far in one", msgs)
	}
}

func TestContinueTwice(t *testing.T) {
	primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndCut})
	second := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("s1"), chatChunk("s1", "two ", ""), chatUsage("s1", 5, 1)}, End: failovertest.EndCut})
	third := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("t1"), chatChunk("t1", "three", "stop"), chatUsage("t1", 7, 1), "data: [DONE]\n\n"}})
	ups := []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "second", BaseURL: second.URL + "/v1", Prefill: Prefill{Chat: ChatTrailingAssistant}},
		{Name: "third", BaseURL: third.URL + "/v1", Prefill: Prefill{Chat: ChatTrailingAssistant}},
	}
	t.Run("Max 2", func(t *testing.T) {
		tr := newTestTransport(t, Config{Continue: ContinueConfig{On: true, Max: 2}, Upstreams: ups})
		got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
		if err != nil {
			t.Fatal(err)
		}
		r := readChat(t, got)
		if r.text != "one two three" || len(r.ids) != 1 || !r.ids["p1"] || r.roles != 1 || !r.done {
			t.Errorf("read %+v", r)
		}
		// The second reported its usage before its cut: the sum has it.
		if r.usage.Get("prompt_tokens").Int() != 12 || r.usage.Get("completion_tokens").Int() != 2 || r.usage.Get("total_tokens").Int() != 14 {
			t.Errorf("usage %s, want 12, 2, 14", r.usage.Raw)
		}
		if last := gjson.GetBytes(third.Requests()[0].Body, "messages.1.content").Str; last != "one two " {
			t.Errorf("third's prefix %q", last)
		}
	})
	t.Run("Max 1", func(t *testing.T) {
		n := third.Calls()
		tr := newTestTransport(t, Config{Continue: ContinueConfig{On: true}, Upstreams: ups})
		got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
		if !errors.Is(err, io.ErrUnexpectedEOF) || readChat(t, got).text != "one two " {
			t.Errorf("read %q, %v; want the second's cut after one continuation", got, err)
		}
		if third.Calls() != n {
			t.Errorf("a second continuation was sent")
		}
	})
}

func TestContinuePassesWholeStreamAsIs(t *testing.T) {
	chunks := []string{chatRole("p1"), ": keep-alive\r\n\r\n", chatChunk("p1", "one ", ""), "event: x\ndata: {\"id\":\"p1\",\n\ndata: [1,2]\r\r", chatChunk("p1", "two", "stop"), chatUsage("p1", 3, 2), "data: [DONE]\n\n"}
	primary := failovertest.NewServer(t, failovertest.Step{Chunks: chunks})
	backup := failovertest.NewServer(t)
	tr := pairTransport(t, primary.URL, backup.URL, Prefill{Chat: ChatTrailingAssistant})
	got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
	if err != nil || got != strings.Join(chunks, "") {
		t.Errorf("read %q, %v; want the stream byte for byte", got, err)
	}
}

func TestContinueCloseEndsContinuation(t *testing.T) {
	primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndCut})
	backup := failovertest.NewServer(t, failovertest.Step{Delay: time.Hour})
	tr := pairTransport(t, primary.URL, backup.URL, Prefill{Chat: ChatTrailingAssistant})
	resp, err := do(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		done <- err
	}()
	<-backup.Received(1) // the continuation waits for its headers
	resp.Body.Close()
	if err := <-done; err == nil {
		t.Errorf("read of a closed stream ended with no error")
	}
}

// TestContinueCounted: a continued stream counts in
// failover_stream_continuations_total, with hedging configured (and never
// needed: the streams answer at once); TestContinueHedged hedges.
func TestContinueCounted(t *testing.T) {
	cfg, primary, backup := continuedPair(t, failovertest.EndCut, Prefill{Chat: ChatTrailingAssistant})
	cfg.Hedge = &HedgeConfig{Delay: time.Hour}
	set := metrics.NewSet()
	cfg.Metrics = set
	tr := newTestTransport(t, cfg)
	got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
	if err != nil {
		t.Fatal(err)
	}
	if r := readChat(t, got); r.text != "one two three four" || !r.done {
		t.Errorf("read %+v", r)
	}
	if backup.Calls() != 1 {
		t.Errorf("backup got %d requests", backup.Calls())
	}
	var b strings.Builder
	set.WritePrometheus(&b)
	if !strings.Contains(b.String(), `failover_stream_continuations_total{upstream="primary",result="continued"} 1`) {
		t.Errorf("metrics lack the continuation:\n%s", b.String())
	}
}

func TestContinueMetersBoth(t *testing.T) {
	primary := failovertest.NewServer(t, failovertest.Step{
		Chunks: []string{msgStart("msg_p", 25, 1), msgBlockStart(0), msgText(0, "one ")},
		End:    failovertest.EndCut,
	})
	backup := failovertest.NewServer(t, failovertest.Step{
		Chunks: append([]string{msgStart("msg_b", 31, 1), msgBlockStart(0), msgText(0, "two"), msgBlockStop(0)}, msgEnd(3)...),
	})
	var mu sync.Mutex
	got := map[string]Tokens{}
	tr := newTestTransport(t, Config{
		Continue: ContinueConfig{On: true},
		OnUsage: func(u Usage) {
			mu.Lock()
			got[u.Upstream] = u.Tokens
			mu.Unlock()
		},
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1", Prefill: Prefill{Messages: true}},
		},
	})
	body, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/messages", msgBody))
	if err != nil {
		t.Fatal(err)
	}
	r := readMessages(t, body)
	mu.Lock()
	defer mu.Unlock()
	p, b := got["primary"], got["backup"]
	if p.Input != 25 || p.Output != 1 || b.Input != 31 || b.Output != 3 {
		t.Errorf("metered %+v, want each upstream's own report", got)
	}
	if r.in != p.Input+b.Input || r.out != p.Output+b.Output {
		t.Errorf("the caller read usage %d in, %d out; the metering says %d and %d", r.in, r.out, p.Input+b.Input, p.Output+b.Output)
	}
}

func TestContinueHedged(t *testing.T) {
	primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndCut})
	slow := failovertest.NewServer(t, failovertest.Step{Delay: time.Hour})
	fast := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("f1"), chatChunk("f1", "two", "stop"), "data: [DONE]\n\n"}})
	tr := newTestTransport(t, Config{
		Continue: ContinueConfig{On: true},
		Hedge:    &HedgeConfig{Delay: time.Millisecond}, // one hedge a request: the caller's own can only go to slow, which never answers
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "slow", BaseURL: slow.URL + "/v1", Prefill: Prefill{Chat: ChatTrailingAssistant}},
			{Name: "fast", BaseURL: fast.URL + "/v1", Prefill: Prefill{Chat: ChatPrefixFlag}},
		},
	})
	got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
	if err != nil {
		t.Fatal(err)
	}
	if r := readChat(t, got); r.text != "one two" || !r.done || len(r.ids) != 1 {
		t.Errorf("read %+v", r)
	}
	// The hedge carries the body in its own upstream's dialect.
	if last := gjson.GetBytes(fast.Requests()[0].Body, "messages.1"); !last.Get("prefix").Bool() || last.Get("content").Str != "one " {
		t.Errorf("the hedge's trailing message %s", last.Raw)
	}
	for _, r := range slow.Requests() { // (the race may end before its request arrives whole)
		if !json.Valid(r.Body) || !gjson.GetBytes(r.Body, "messages.1").Exists() {
			continue // or the hedge of the caller's own request, the primary being slow
		}
		if last := gjson.GetBytes(r.Body, "messages.1"); last.Get("prefix").Exists() || last.Get("content").Str != "one " {
			t.Errorf("the first continuation's trailing message %s", last.Raw)
		}
	}
}

func TestContinueBounded(t *testing.T) {
	t.Run("an event too large", func(t *testing.T) {
		primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndCut})
		huge := "data: " + strings.Repeat("x", 3*maxSpliceEvent) // never ends
		backup := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("b1"), chatChunk("b1", "two ", ""), huge}, End: failovertest.EndStall})
		tr := pairTransport(t, primary.URL, backup.URL, Prefill{Chat: ChatTrailingAssistant})
		got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
		if !errors.Is(err, errEventTooLarge) || readChat(t, got).text != "one two " {
			t.Errorf("read %d bytes, %v", len(got), err)
		}
	})
	t.Run("tool arguments too long", func(t *testing.T) {
		args := strings.Repeat("a", 2000)
		chunks := []string{chatRole("p1"), chatTool("p1", 0, "call_p", "f", args)}
		primary := failovertest.NewServer(t, failovertest.Step{Chunks: chunks, End: failovertest.EndCut})
		backup := failovertest.NewServer(t)
		tr := newTestTransport(t, Config{
			Continue:      ContinueConfig{On: true},
			MaxBodyBuffer: 1024,
			Upstreams: []Upstream{
				{Name: "primary", BaseURL: primary.URL + "/v1"},
				{Name: "backup", BaseURL: backup.URL + "/v1", Prefill: Prefill{Chat: ChatTrailingAssistant}},
			},
		})
		got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
		if !errors.Is(err, io.ErrUnexpectedEOF) || got != strings.Join(chunks, "") || backup.Calls() != 0 {
			t.Errorf("read %d bytes, %v, %d continuations; want the stream as it came, its cut, none", len(got), err, backup.Calls())
		}
	})
	t.Run("after the finish", func(t *testing.T) {
		primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one", "stop")}, End: failovertest.EndCut})
		backup := failovertest.NewServer(t)
		tr := pairTransport(t, primary.URL, backup.URL, Prefill{Chat: ChatTrailingAssistant})
		_, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
		if !errors.Is(err, io.ErrUnexpectedEOF) || backup.Calls() != 0 {
			t.Errorf("read error %v, %d continuations; want the cut's, none: the answer was whole", err, backup.Calls())
		}
	})
}

func TestContinueCapabilities(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefill  Prefill
		models   map[string]string
		want     bool
		wantSent string // the model the continuation names
	}{
		{"messages only", Prefill{Messages: true}, nil, false, ""},
		{"model listed", Prefill{Chat: ChatTrailingAssistant, Models: []string{"m"}}, nil, true, "m"},
		{"model not listed", Prefill{Chat: ChatTrailingAssistant, Models: []string{"other"}}, nil, false, ""},
		{"mapped model listed", Prefill{Chat: ChatTrailingAssistant, Models: []string{"m-large"}}, map[string]string{"m": "m-large"}, true, "m-large"},
		{"mapped from a listed name", Prefill{Chat: ChatTrailingAssistant, Models: []string{"m"}}, map[string]string{"m": "m-large"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, primary, backup := continuedPair(t, failovertest.EndCut, tc.prefill)
			cfg.Upstreams[1].Models = tc.models
			tr := newTestTransport(t, cfg)
			got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
			if tc.want != (err == nil) || tc.want != (backup.Calls() == 1) {
				t.Fatalf("read %q, %v; backup got %d requests", got, err, backup.Calls())
			}
			if tc.want {
				if m := gjson.GetBytes(backup.Requests()[0].Body, "model").Str; m != tc.wantSent {
					t.Errorf("continuation names model %q, want %q", m, tc.wantSent)
				}
			}
		})
	}
}

func TestContinueTraced(t *testing.T) {
	cfg, primary, _ := continuedPair(t, failovertest.EndCut, Prefill{Chat: ChatTrailingAssistant})
	set := metrics.NewSet()
	cfg.Metrics = set
	tr := newTestTransport(t, cfg)
	var mu sync.Mutex
	var attempts []string
	dones := 0
	req := httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody)
	req = req.WithContext(WithTrace(req.Context(), &Trace{
		AttemptStart: func(a TraceAttempt) {
			mu.Lock()
			attempts = append(attempts, a.Upstream+" "+strconv.Itoa(a.Attempt))
			mu.Unlock()
		},
		Done: func(TraceDone) { dones++ },
	}))
	if _, err := readAll(t, tr, req); err != nil {
		t.Fatal(err)
	}
	if strings.Join(attempts, ", ") != "primary 1, backup 2" || dones != 1 {
		t.Errorf("attempts %v, %d Dones; want primary 1, backup 2, and one Done", attempts, dones)
	}
	var b strings.Builder
	set.WritePrometheus(&b)
	if !strings.Contains(b.String(), `failover_requests_total{upstream="primary",outcome="answered"} 1`) || !strings.Contains(b.String(), `failover_requests_total{upstream="backup",outcome="answered"} 0`) {
		t.Errorf("requests counted:\n%s", grepLines(b.String(), "failover_requests_total"))
	}
}

func TestContinueAnswerPastLimitPassesAsIs(t *testing.T) {
	chunks := []string{chatRole("p1"), chatChunk("p1", strings.Repeat("a", 700), ""), chatChunk("p1", strings.Repeat("b", 700), ""), chatChunk("p1", "c", "stop"), "data: [DONE]\n\n"}
	primary := failovertest.NewServer(t, failovertest.Step{Chunks: chunks})
	backup := failovertest.NewServer(t)
	tr := newTestTransport(t, Config{
		Continue:      ContinueConfig{On: true},
		MaxBodyBuffer: 1024,
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1", Prefill: Prefill{Chat: ChatTrailingAssistant}},
		},
	})
	got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
	if err != nil || got != strings.Join(chunks, "") {
		t.Errorf("read %d bytes, %v; want the stream byte for byte (%d bytes)", len(got), err, len(strings.Join(chunks, "")))
	}
}

// sseEvents parses an event stream as the WHATWG spec (and the SDKs) do:
// lines end in CRLF, LF or CR, a blank line dispatches the event, data
// lines join with "\n", and what follows the last blank line is dropped.
func sseEvents(body string) (events []string) {
	var data []string
	seen := false
	for len(body) > 0 {
		i := strings.IndexAny(body, "\r\n")
		if i < 0 {
			break // no line ending: not a line, dropped at the end
		}
		line := body[:i]
		if body[i] == '\r' && i+1 < len(body) && body[i+1] == '\n' {
			i++
		}
		body = body[i+1:]
		if line == "" {
			if seen {
				events = append(events, strings.Join(data, "\n"))
			}
			data, seen = nil, false
			continue
		}
		name, value, _ := strings.Cut(line, ":")
		if name == "data" {
			data, seen = append(data, strings.TrimPrefix(value, " ")), true
		}
	}
	return events
}

func TestContinueAfterEventCutBeforeBlankLine(t *testing.T) {
	for _, tc := range []struct{ name, eol string }{{"LF", "\n"}, {"CRLF", "\r\n"}, {"CR", "\r"}} {
		t.Run(tc.name, func(t *testing.T) {
			two := strings.TrimSuffix(chatChunk("p1", "two ", ""), "\n\n") + tc.eol // its blank line never comes
			cfg, _, _ := continuedPair(t, failovertest.EndCut, Prefill{Chat: ChatTrailingAssistant})
			primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", ""), two}, End: failovertest.EndCut})
			cfg.Upstreams[0].BaseURL = primary.URL + "/v1"
			tr := newTestTransport(t, cfg)
			got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
			if err != nil {
				t.Fatal(err)
			}
			text := ""
			for _, ev := range sseEvents(got) {
				if ev == "[DONE]" {
					continue
				}
				if !json.Valid([]byte(ev)) {
					t.Errorf("an event the SDK cannot read: %q", ev)
				}
				text += gjson.Get(ev, "choices.0.delta.content").Str
			}
			if text != "one two three four" {
				t.Errorf("the SDK reads %q\n%q", text, got)
			}
		})
	}
}

func TestContinuationFailingBeforeContentEndsInOriginalCause(t *testing.T) {
	overloaded := msgEvent("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
	for _, tc := range []struct {
		name          string
		first, second failovertest.Step
		check         func(t *testing.T, body string, err error)
	}{
		{"cut, then an error event",
			failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndCut},
			failovertest.Step{Chunks: []string{chatRole("b1"), `data: {"error":{"message":"backup overloaded","type":"server_error"}}` + "\n\n"}},
			func(t *testing.T, body string, err error) {
				if !errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(body, "backup overloaded") {
					t.Errorf("read %q, %v; want the primary's cut", body, err)
				}
			}},
		{"stall, then a cut",
			failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndStall},
			failovertest.Step{Chunks: []string{chatRole("b1")}, End: failovertest.EndCut},
			func(t *testing.T, body string, err error) {
				var se *StallError
				if !errors.As(err, &se) || se.Upstream != "primary" {
					t.Errorf("read error %v, want the primary's *StallError", err)
				}
			}},
		{"error event, then a truncation",
			failovertest.Step{Chunks: []string{msgStart("msg_p", 25, 1), msgBlockStart(0), msgText(0, "one "), overloaded}},
			failovertest.Step{Chunks: []string{msgStart("msg_b", 31, 1)}},
			func(t *testing.T, body string, err error) {
				if err != nil || !strings.HasSuffix(body, overloaded) {
					t.Errorf("read %q, %v; want the primary's own error event last", body, err)
				}
			}},
	} {
		for _, guard := range []*StreamGuard{nil, {HoldEvents: -1}} {
			if guard != nil && tc.first.End == failovertest.EndStall {
				continue // a stream passed on before its content is bound by FirstContent, not Idle
			}
			t.Run(fmt.Sprintf("%s, guard %v", tc.name, guard), func(t *testing.T) {
				primary := failovertest.NewServer(t, tc.first)
				backup := failovertest.NewServer(t, tc.second)
				tr := newTestTransport(t, Config{
					Continue:    ContinueConfig{On: true},
					StreamGuard: guard,
					Upstreams: []Upstream{
						{Name: "primary", BaseURL: primary.URL + "/v1", Timeouts: Timeouts{Idle: 50 * time.Millisecond}},
						{Name: "backup", BaseURL: backup.URL + "/v1", Prefill: Prefill{Chat: ChatTrailingAssistant, Messages: true}},
					},
				})
				path := "/v1/chat/completions"
				body := contBody
				if strings.Contains(tc.first.Chunks[0], "message_start") {
					path, body = "/v1/messages", msgBody
				}
				got, err := readAll(t, tr, httptestRequest("POST", primary.URL+path, body))
				tc.check(t, got, err)
				if backup.Calls() != 1 {
					t.Errorf("backup got %d requests, want the continuation", backup.Calls())
				}
			})
		}
	}
}

func TestContinueKeepsFractionalUsage(t *testing.T) {
	primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndCut})
	usage := `data: {"id":"b1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14,"cost":0.5,"cost_details":{"upstream_inference_cost":0.25},"prompt_tokens_details":{"cached_tokens":3}}}` + "\n\n"
	backup := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("b1"), chatChunk("b1", "two", "stop"), usage, "data: [DONE]\n\n"}})
	tr := pairTransport(t, primary.URL, backup.URL, Prefill{Chat: ChatTrailingAssistant})
	got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
	if err != nil {
		t.Fatal(err)
	}
	u := readChat(t, got).usage
	if u.Get("cost").Float() != 0.5 || u.Get("cost_details.upstream_inference_cost").Float() != 0.25 ||
		u.Get("prompt_tokens").Int() != 12 || u.Get("prompt_tokens_details.cached_tokens").Int() != 3 {
		t.Errorf("usage %s, want the backup's as it reported it", u.Raw)
	}
}

func TestContinueNotACallersEnd(t *testing.T) {
	for _, how := range []string{"cancel", "close"} {
		t.Run(how, func(t *testing.T) {
			cfg, primary, backup := continuedPair(t, failovertest.EndStall, Prefill{Chat: ChatTrailingAssistant})
			set := metrics.NewSet()
			cfg.Metrics = set
			var logs logBuffer
			cfg.Logger = newLogger(&logs)
			entered := make(chan struct{}, 1) // a read of the primary's stream began
			base := http.DefaultTransport.(*http.Transport).Clone()
			cfg.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := base.RoundTrip(r)
				if err == nil && r.URL.Host == strings.TrimPrefix(primary.URL, "http://") {
					resp.Body = &enteredBody{resp.Body, entered}
				}
				return resp, err
			})
			tr := newTestTransport(t, cfg)
			var mu sync.Mutex
			var continued []TraceContinued
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody)
			req = req.WithContext(WithTrace(ctx, &Trace{Continued: func(c TraceContinued) {
				mu.Lock()
				continued = append(continued, c)
				mu.Unlock()
			}}))
			resp, err := do(t, tr, req)
			if err != nil {
				t.Fatal(err)
			}
			var got []byte
			buf := make([]byte, 64)
			for !strings.Contains(string(got), "two ") {
				n, err := resp.Body.Read(buf)
				if err != nil {
					t.Fatalf("read %q, %v", got, err)
				}
				got = append(got, buf[:n]...)
			}
			select {
			case <-entered:
			default:
			}
			done := make(chan error, 1)
			go func() {
				_, err := io.ReadAll(resp.Body) // waits in the stall
				done <- err
			}()
			<-entered
			if how == "cancel" {
				cancel()
			} else {
				resp.Body.Close()
			}
			if err := <-done; err == nil {
				t.Errorf("read of an ended stream ended with no error")
			}
			resp.Body.Close()
			var b strings.Builder
			set.WritePrometheus(&b)
			mu.Lock()
			defer mu.Unlock()
			if len(continued) != 0 || backup.Calls() != 0 || strings.Contains(b.String(), `result="not_continued"} 1`) || strings.Contains(logs.String(), "not continued") {
				t.Errorf("the caller's own end taken for a break: Trace %+v, %d continuations, log %s\n%s", continued, backup.Calls(), logs.String(), b.String())
			}
		})
	}
}

// enteredBody signals each Read it begins.
type enteredBody struct {
	io.ReadCloser
	entered chan struct{}
}

func (b *enteredBody) Read(p []byte) (int, error) {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	return b.ReadCloser.Read(p)
}

func TestContinueKeepsCallersCredentials(t *testing.T) {
	const secret = "caller-secret-789"
	for _, tc := range []struct {
		name        string
		addressedOK bool // the addressed upstream takes a prefix: it continues
	}{
		{"to another", false},
		{"to the addressed", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addressed := failovertest.NewServer(t, failovertest.Step{Status: 500, Body: `{"error":{"message":"down"}}`},
				failovertest.Step{Chunks: []string{chatRole("a1"), chatChunk("a1", "three", "stop"), "data: [DONE]\n\n"}})
			second := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("s1"), chatChunk("s1", "one ", "")}, End: failovertest.EndCut})
			third := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("t1"), chatChunk("t1", "three", "stop"), "data: [DONE]\n\n"}})
			var prefill Prefill
			if tc.addressedOK {
				prefill.Chat = ChatTrailingAssistant
			}
			var mu sync.Mutex
			var traced []string
			var logs logBuffer
			tr := newTestTransport(t, Config{
				Continue: ContinueConfig{On: true},
				Retry:    RetryConfig{Off: true},
				Logger:   newLogger(&logs),
				Upstreams: []Upstream{
					{Name: "addressed", BaseURL: addressed.URL + "/v1", Prefill: prefill},
					{Name: "second", BaseURL: second.URL + "/v1", Header: http.Header{"Authorization": {"Bearer second-key"}}, Prefill: Prefill{Chat: ChatTrailingAssistant}},
					{Name: "third", BaseURL: third.URL + "/v1", Header: http.Header{"Authorization": {"Bearer third-key"}}, Prefill: Prefill{Chat: ChatTrailingAssistant}},
				},
			})
			req := httptestRequest("POST", addressed.URL+"/v1/chat/completions?key="+secret+"&api-key="+secret, contBody)
			for _, h := range []string{"Authorization", "X-Api-Key", "Api-Key"} {
				req.Header.Set(h, "Bearer "+secret)
			}
			req = req.WithContext(WithTrace(req.Context(), &Trace{Continued: func(c TraceContinued) {
				mu.Lock()
				traced = append(traced, fmt.Sprint(c))
				mu.Unlock()
			}}))
			got, err := readAll(t, tr, req)
			if err != nil || readChat(t, got).text != "one three" {
				t.Fatalf("read %q, %v", got, err)
			}
			leaked := func(s *failovertest.Server) bool {
				for _, r := range s.Requests() {
					if strings.Contains(fmt.Sprint(r.Header), secret) || strings.Contains(r.RawQuery, secret) {
						return true
					}
				}
				return false
			}
			if leaked(second) || leaked(third) {
				t.Errorf("the caller's credentials reached an upstream it did not address")
			}
			if tc.addressedOK && (addressed.Calls() != 2 || !strings.Contains(fmt.Sprint(addressed.Requests()[1].Header), secret)) {
				t.Errorf("the addressed upstream continued without the caller's credentials (%d calls)", addressed.Calls())
			}
			if !tc.addressedOK && third.Calls() != 1 {
				t.Errorf("third got %d requests", third.Calls())
			}
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(fmt.Sprint(traced), secret) || strings.Contains(logs.String(), secret) {
				t.Errorf("a key in the trace or the log: %v\n%s", traced, logs.String())
			}
		})
	}
}

func TestContinueMessagesBlocks(t *testing.T) {
	toolStart := msgEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}`)
	toolDelta := msgEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{}"}}`)
	for _, tc := range []struct {
		name        string
		first, cont []string
		blocks      []string
	}{
		{"a tool call after the open text",
			[]string{msgStart("msg_p", 5, 1), msgBlockStart(0), msgText(0, "one ")},
			append([]string{msgStart("msg_b", 7, 1), toolStart, toolDelta, msgBlockStop(0)}, msgEnd(2)...),
			[]string{"one ", ""}},
		{"the caller's block closed",
			[]string{msgStart("msg_p", 5, 1), msgBlockStart(0), msgText(0, "one"), msgBlockStop(0)},
			append([]string{msgStart("msg_b", 7, 1), msgBlockStart(0), msgText(0, "two"), msgBlockStop(0)}, msgEnd(2)...),
			[]string{"one", "two"}},
		{"no block",
			[]string{msgStart("msg_p", 5, 1), msgBlockStart(0), msgText(0, "one")},
			append([]string{msgStart("msg_b", 7, 1)}, msgEnd(2)...),
			[]string{"one"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := failovertest.NewServer(t, failovertest.Step{Chunks: tc.first, End: failovertest.EndCut})
			backup := failovertest.NewServer(t, failovertest.Step{Chunks: tc.cont})
			tr := pairTransport(t, primary.URL, backup.URL, Prefill{Messages: true})
			got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/messages", msgBody))
			if err != nil {
				t.Fatal(err)
			}
			r := readMessages(t, got)
			if len(r.ids) != 1 || fmt.Sprint(r.blocks) != fmt.Sprint(tc.blocks) || r.stop != "end_turn" || !r.ended || r.in != 12 || r.out != 3 {
				t.Errorf("read %+v\n%s", r, got)
			}
			// Every block started is stopped once, before the message ends.
			open := map[int64]bool{}
			for _, ev := range sseEvents(got) {
				j := gjson.Parse(ev)
				switch i := j.Get("index").Int(); j.Get("type").Str {
				case "content_block_start":
					open[i] = true
				case "content_block_stop":
					if !open[i] {
						t.Errorf("block %d stopped, not open", i)
					}
					delete(open, i)
				case "message_delta":
					if len(open) > 0 {
						t.Errorf("blocks %v open at the message's end", open)
					}
				}
			}
		})
	}
}

func TestContinueReadsACompressedContinuation(t *testing.T) {
	primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndCut})
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		stream := chatRole("b1") + chatChunk("b1", "two", "stop") + "data: [DONE]\n\n"
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			io.WriteString(w, stream)
			return
		}
		w.Header().Set("Content-Encoding", "gzip") // as a CDN in front of a provider may
		zw := gzip.NewWriter(w)
		io.WriteString(zw, stream)
		zw.Close()
	}))
	t.Cleanup(backup.Close)
	tr := pairTransport(t, primary.URL, backup.URL, Prefill{Chat: ChatTrailingAssistant})
	req := httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody)
	req.Header.Set("Accept-Encoding", "gzip, deflate") // as Python's httpx sends, forwarded
	got, err := readAll(t, tr, req)
	if r := readChat(t, got); err != nil || r.text != "one two" || !r.done {
		t.Errorf("read %q, %v", got, err)
	}
}

func TestContinueBudgetBalanced(t *testing.T) {
	for _, tc := range []struct {
		name string
		cont failovertest.Step
		max  int
	}{
		{"continued", failovertest.Step{Chunks: []string{chatRole("b1"), chatChunk("b1", "two", "stop"), "data: [DONE]\n\n"}}, 1},
		{"refused", failovertest.Step{Status: 400, Body: `{"error":{"message":"no prefix"}}`}, 1},
		{"broken again", failovertest.Step{Chunks: []string{chatRole("b1"), chatChunk("b1", "two ", "")}, End: failovertest.EndCut}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chatRole("p1"), chatChunk("p1", "one ", "")}, End: failovertest.EndCut})
			backup := failovertest.NewServer(t, tc.cont)
			tr := newTestTransport(t, Config{
				Continue: ContinueConfig{On: true, Max: tc.max},
				Retry:    RetryConfig{BudgetMin: 1},
				Upstreams: []Upstream{
					{Name: "primary", BaseURL: primary.URL + "/v1"},
					{Name: "backup", BaseURL: backup.URL + "/v1", Prefill: Prefill{Chat: ChatTrailingAssistant}},
				},
			})
			for range 3 { // a place leaked would deny the next continuation
				readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
				if r, a := tr.retry.budget.retrying.Load(), tr.retry.budget.active.Load(); r != 0 || a != 0 {
					t.Fatalf("after the stream, %d retry places taken, %d requests active", r, a)
				}
			}
			if backup.Calls() != 3 {
				t.Errorf("backup got %d requests, want 3", backup.Calls())
			}
		})
	}
}

func TestContinueFailureKeepsKeysOut(t *testing.T) {
	const secret = "caller-secret-789"
	var mu sync.Mutex
	calls := map[string]int{}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		calls[r.URL.Host]++
		n := calls[r.URL.Host]
		mu.Unlock()
		switch {
		case r.URL.Host == "addressed.test" && n == 1:
			return respond(500, `{"error":{"message":"down"}}`), nil
		case r.URL.Host == "addressed.test":
			return nil, &url.Error{Op: "Post", URL: r.URL.String(), Err: errors.New("connection refused " + r.Header.Get("Authorization"))}
		}
		body := chatRole("s1") + chatChunk("s1", "one ", "")
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Request: r,
			Body: &piecesBody{data: []byte(body), end: io.ErrUnexpectedEOF}}, nil
	})
	var logs logBuffer
	var traced []string
	tr := newTestTransport(t, Config{
		Base:     base,
		Continue: ContinueConfig{On: true},
		Retry:    RetryConfig{Off: true},
		Logger:   newLogger(&logs),
		Upstreams: []Upstream{
			{Name: "addressed", BaseURL: "http://addressed.test/v1", Prefill: Prefill{Chat: ChatTrailingAssistant}},
			{Name: "second", BaseURL: "http://second.test/v1", Header: http.Header{"Authorization": {"Bearer second-key"}}},
		},
	})
	req := httptestRequest("POST", "http://addressed.test/v1/chat/completions?key="+secret, contBody)
	req.Header.Set("Authorization", "Bearer "+secret)
	req = req.WithContext(WithTrace(req.Context(), &Trace{Continued: func(c TraceContinued) { traced = append(traced, fmt.Sprint(c)) }}))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("read %q, %v; want the cut's", got, err)
	}
	if len(traced) == 0 || strings.Contains(fmt.Sprint(traced), secret) || strings.Contains(logs.String(), secret) || strings.Contains(fmt.Sprint(err), secret) {
		t.Errorf("a key in the trace, the log or the error: %v\n%s", traced, logs.String())
	}
}

// chatTool is a chat chunk with a tool call's delta.
func chatTool(id string, i int, callID, name, args string) string {
	f := map[string]any{"arguments": args}
	tc := map[string]any{"index": i, "function": f}
	if name != "" {
		tc["id"], tc["type"], f["name"] = callID, "function", name
	}
	b, _ := json.Marshal(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1, "model": "m",
		"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"tool_calls": []any{tc}}, "finish_reason": nil}}})
	return "data: " + string(b) + "\n\n"
}

// A stream cut inside a tool call's arguments: the continuation goes on
// from the text and makes the call again; the caller gets only the
// arguments it lacks, under its own call's id. A continuation that makes
// another call leaves the caller with the original cause, and nothing of
// its own.
func TestContinueToolCalls(t *testing.T) {
	t.Run("chat", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			regen []string
			want  string // the arguments the caller reads; "" for the cut's error
		}{
			{"same call", []string{chatTool("b1", 0, "call_b", "weather", ""), chatTool("b1", 0, "", "", `{"city":`), chatTool("b1", 0, "", "", ` "Paris"}`)}, `{"city": "Paris"}`},
			{"in one piece", []string{chatTool("b1", 0, "call_b", "weather", `{"city": "Paris"}`)}, `{"city": "Paris"}`},
			{"other arguments", []string{chatTool("b1", 0, "call_b", "weather", `{"city": "Rome"}`)}, ""},
			{"other function", []string{chatTool("b1", 0, "call_b", "time", `{"city": "Paris"}`)}, ""},
			{"text instead", []string{chatChunk("b1", "It is sunny.", "")}, ""},
			{"the call short", []string{chatTool("b1", 0, "call_b", "weather", `{"ci`)}, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				primary := failovertest.NewServer(t, failovertest.Step{
					Chunks: []string{chatRole("p1"), chatChunk("p1", "Checking.", ""), chatTool("p1", 0, "call_p", "weather", `{"ci`), chatTool("p1", 0, "", "", `ty": "Pa`)},
					End:    failovertest.EndCut,
				})
				backup := failovertest.NewServer(t, failovertest.Step{Chunks: append(append([]string{chatRole("b1")}, tc.regen...), chatChunk("b1", "", "tool_calls"), "data: [DONE]\n\n")})
				tr := pairTransport(t, primary.URL, backup.URL, Prefill{Chat: ChatTrailingAssistant})
				got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/chat/completions", contBody))
				var args, ids, names []string
				for _, ev := range strings.Split(got, "\n\n") {
					j := gjson.Parse(strings.TrimPrefix(ev, "data: "))
					j.Get("choices.0.delta.tool_calls").ForEach(func(_, c gjson.Result) bool {
						args = append(args, c.Get("function.arguments").Str)
						if id := c.Get("id").Str; id != "" {
							ids = append(ids, id)
						}
						if n := c.Get("function.name").Str; n != "" {
							names = append(names, n)
						}
						return true
					})
				}
				if tc.want == "" {
					if !errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(got, `"b1"`) || strings.Contains(got, "sunny") || strings.Contains(got, `"finish_reason":"tool_calls"`) {
						t.Errorf("read %q, %v; want the cut's error and nothing of the backup's", got, err)
					}
					return
				}
				r := readChat(t, got)
				if err != nil || strings.Join(args, "") != tc.want || strings.Join(ids, ",") != "call_p" || strings.Join(names, ",") != "weather" ||
					r.text != "Checking." || len(r.ids) != 1 || strings.Join(r.finish, ",") != "tool_calls" || !r.done {
					t.Errorf("read %v: arguments %q, ids %v, names %v, %+v\n%s", err, strings.Join(args, ""), ids, names, r, got)
				}
				if last := gjson.GetBytes(backup.Requests()[0].Body, "messages.1"); last.Get("content").Str != "Checking." || last.Get("tool_calls").Exists() {
					t.Errorf("backup's trailing message %s, want the text alone", last.Raw)
				}
			})
		}
	})
	t.Run("messages", func(t *testing.T) {
		toolStart := func(i int, name string) string {
			return msgEvent("content_block_start", `{"type":"content_block_start","index":`+strconv.Itoa(i)+`,"content_block":{"type":"tool_use","id":"toolu_`+name+`","name":"`+name+`","input":{}}}`)
		}
		toolArgs := func(i int, partial string) string {
			b, _ := json.Marshal(partial)
			return msgEvent("content_block_delta", `{"type":"content_block_delta","index":`+strconv.Itoa(i)+`,"delta":{"type":"input_json_delta","partial_json":`+string(b)+`}}`)
		}
		toolEnd := []string{
			msgEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}`),
			msgEvent("message_stop", `{"type":"message_stop"}`),
		}
		for _, tc := range []struct {
			name  string
			regen []string
			want  string
		}{
			{"same call", []string{toolStart(0, "weather"), toolArgs(0, `{"city":`), toolArgs(0, ` "Paris"}`), msgBlockStop(0)}, `{"city": "Paris"}`},
			{"other arguments", []string{toolStart(0, "weather"), toolArgs(0, `{"city": "Rome"}`), msgBlockStop(0)}, ""},
			{"text first", []string{msgBlockStart(0), msgText(0, "Sure."), msgBlockStop(0), toolStart(1, "weather"), toolArgs(1, `{"city": "Paris"}`), msgBlockStop(1)}, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				primary := failovertest.NewServer(t, failovertest.Step{
					Chunks: []string{msgStart("msg_p", 25, 1), msgBlockStart(0), msgText(0, "Checking."), msgBlockStop(0), toolStart(1, "weather"), toolArgs(1, `{"city": "Pa`)},
					End:    failovertest.EndCut,
				})
				backup := failovertest.NewServer(t, failovertest.Step{Chunks: append(append([]string{msgStart("msg_b", 31, 1)}, tc.regen...), toolEnd...)})
				tr := pairTransport(t, primary.URL, backup.URL, Prefill{Messages: true})
				got, err := readAll(t, tr, httptestRequest("POST", primary.URL+"/v1/messages", msgBody))
				if tc.want == "" {
					if !errors.Is(err, io.ErrUnexpectedEOF) || strings.Contains(got, "Rome") || strings.Contains(got, "Sure") || strings.Contains(got, "message_delta") {
						t.Errorf("read %q, %v; want the cut's error and nothing of the backup's", got, err)
					}
					return
				}
				var input string
				starts, stops := 0, 0
				for _, ev := range strings.Split(got, "\n\n") {
					_, data, _ := strings.Cut(ev, "data: ")
					j := gjson.Parse(data)
					switch j.Get("type").Str {
					case "content_block_start":
						starts++
					case "content_block_stop":
						stops++
					case "content_block_delta":
						if j.Get("index").Int() == 1 {
							input += j.Get("delta.partial_json").Str
						}
					}
				}
				r := readMessages(t, got)
				if err != nil || input != tc.want || starts != 2 || stops != 2 || r.stop != "tool_use" || !r.ended || r.in != 25+31 || r.out != 1+9 {
					t.Errorf("read %v: input %q, %d starts, %d stops, %+v\n%s", err, input, starts, stops, r, got)
				}
				if last := gjson.GetBytes(backup.Requests()[0].Body, "messages.1"); last.Get("content").Str != "Checking." {
					t.Errorf("backup's prefill %s, want the text alone", last.Raw)
				}
			})
		}
	})
}
