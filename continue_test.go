package failover

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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
