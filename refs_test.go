package failover

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
)

// A refCase is a request and the refs stateRefs must read in it.
type refCase struct {
	name   string
	method string
	path   string
	body   string
	want   []string
	opaque bool
}

func testRefs(t *testing.T, cases []refCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Helper()
			var body []byte
			if c.body != "" {
				body = []byte(c.body)
			}
			method := c.method
			if method == "" {
				method = "POST"
			}
			got, opaque := stateRefs(nil, method, c.path, body)
			if !slices.Equal(got, c.want) || opaque != c.opaque {
				t.Errorf("stateRefs(%s %s) = %q, %v; want %q, %v", method, c.path, got, opaque, c.want, c.opaque)
			}
		})
	}
}

func TestStateRefsOpenAIResponses(t *testing.T) {
	testRefs(t, []refCase{
		{name: "get", method: "GET", path: "/v1/responses/resp_123", want: []string{"resp_123"}},
		{name: "input items", method: "GET", path: "/responses/resp_123/input_items?limit=10", want: []string{"resp_123"}},
		{name: "cancel", path: "/openai/v1/responses/resp_123/cancel", want: []string{"resp_123"}},
		{name: "delete", method: "DELETE", path: "/responses/resp_123", want: []string{"resp_123"}},
		{name: "create", path: "/v1/responses", body: `{"model":"gpt-5","input":"hi"}`},
		{name: "input tokens", path: "/v1/responses/input_tokens", body: `{"model":"gpt-5","input":"hi"}`},
		{name: "compact", path: "/v1/responses/compact", body: `{"model":"gpt-5","input":"hi"}`},
		{name: "previous response", path: "/v1/responses",
			body: `{"model":"gpt-5","previous_response_id":"resp_abc","input":[{"role":"user","content":"and then?"}]}`,
			want: []string{"resp_abc"}},
		{name: "conversation id", path: "/v1/responses",
			body: `{"model":"gpt-5","conversation":"conv_1","input":"hi"}`, want: []string{"conv_1"}},
		{name: "conversation object", path: "/v1/responses",
			body: `{"model":"gpt-5","conversation":{"id":"conv_2"},"input":"hi"}`, want: []string{"conv_2"}},
		{name: "conversation items", path: "/v1/conversations/conv_3/items/msg_4", method: "GET", want: []string{"conv_3", "msg_4"}},
		{name: "input file", path: "/v1/responses",
			body: `{"model":"gpt-5","input":[{"role":"user","content":[{"type":"input_file","file_id":"file-A1"},{"type":"input_image","file_id":"file-B2","detail":"auto"},{"type":"input_text","text":"compare"}]}]}`,
			want: []string{"file-A1", "file-B2"}},
		{name: "file search tool", path: "/v1/responses",
			body: `{"model":"gpt-5","tools":[{"type":"file_search","vector_store_ids":["vs_1","vs_2"]}],"input":"find"}`,
			want: []string{"vs_1", "vs_2"}},
		{name: "code interpreter container", path: "/v1/responses",
			body: `{"model":"gpt-5","tools":[{"type":"code_interpreter","container":"cntr_9"}],"input":"run"}`,
			want: []string{"cntr_9"}},
		{name: "code interpreter files", path: "/v1/responses",
			body: `{"model":"gpt-5","tools":[{"type":"code_interpreter","container":{"type":"auto","file_ids":["file-C"]}}],"input":"run"}`,
			want: []string{"file-C"}},
		{name: "item reference", path: "/v1/responses",
			body: `{"model":"gpt-5","input":[{"type":"item_reference","id":"msg_77"},{"role":"user","content":"more"}]}`,
			want: []string{"msg_77"}},
		{name: "stored reasoning", path: "/v1/responses",
			body: `{"model":"o4","input":[{"type":"reasoning","id":"rs_1","summary":[]},{"type":"function_call_output","call_id":"call_1","output":"42"}]}`,
			want: []string{"rs_1"}},
		{name: "encrypted reasoning", path: "/v1/responses",
			body:   `{"model":"o4","store":false,"include":["reasoning.encrypted_content"],"input":[{"type":"reasoning","id":"rs_2","summary":[],"encrypted_content":"gAAAAB..."},{"role":"user","content":"go on"}]}`,
			opaque: true},
		{name: "encrypted compaction", path: "/v1/responses",
			body: `{"model":"gpt-5","input":[{"type":"compaction","encrypted_content":"gAAA"}]}`, opaque: true},
		{name: "prompt template", path: "/v1/responses",
			body: `{"model":"gpt-5","prompt":{"id":"pmpt_1","version":"2","variables":{"doc":{"type":"input_file","file_id":"file-D"}}}}`,
			want: []string{"pmpt_1", "file-D"}},
		{name: "once each", path: "/v1/responses/resp_1",
			body: `{"previous_response_id":"resp_1","input":[{"type":"item_reference","id":"resp_1"}]}`, want: []string{"resp_1"}},
	})
}

func TestStateRefsOpenAIChat(t *testing.T) {
	testRefs(t, []refCase{
		{name: "plain", path: "/v1/chat/completions", body: refChatBody(4 << 10)},
		{name: "file part", path: "/v1/chat/completions",
			body: `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-E"}},{"type":"text","text":"sum up"}]}]}`,
			want: []string{"file-E"}},
		{name: "inline file", path: "/v1/chat/completions",
			body: `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,AAAA"}}]}]}`},
		{name: "audio turn", path: "/v1/chat/completions",
			body: `{"model":"gpt-4o-audio-preview","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"messages":[{"role":"user","content":"hi"},{"role":"assistant","audio":{"id":"audio_1"}},{"role":"user","content":"again"}]}`,
			want: []string{"audio_1"}},
		{name: "stored completion", method: "GET", path: "/v1/chat/completions/chatcmpl-123/messages", want: []string{"chatcmpl-123"}},
		{name: "azure deployment", path: "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
			body: `{"messages":[{"role":"user","content":"hi"}]}`},
	})
}

func TestStateRefsOpenAIAssistants(t *testing.T) {
	testRefs(t, []refCase{
		{name: "assistant", method: "GET", path: "/v1/assistants/asst_1", want: []string{"asst_1"}},
		{name: "create assistant", path: "/v1/assistants",
			body: `{"model":"gpt-4o","name":"Tutor","tool_resources":{"code_interpreter":{"file_ids":["file-1"]},"file_search":{"vector_store_ids":["vs_1"]}}}`,
			want: []string{"file-1", "vs_1"}},
		{name: "run", path: "/v1/threads/thread_1/runs", body: `{"assistant_id":"asst_1"}`, want: []string{"thread_1", "asst_1"}},
		{name: "run step", method: "GET", path: "/v1/threads/thread_1/runs/run_2/steps/step_3",
			want: []string{"thread_1", "run_2", "step_3"}},
		{name: "tool outputs", path: "/v1/threads/thread_1/runs/run_2/submit_tool_outputs",
			body: `{"tool_outputs":[{"tool_call_id":"call_1","output":"{\"thread_id\":\"x\"}"}]}`,
			want: []string{"thread_1", "run_2"}},
		{name: "message", method: "GET", path: "/v1/threads/thread_1/messages/msg_5", want: []string{"thread_1", "msg_5"}},
		{name: "create and run", path: "/v1/threads/runs",
			body: `{"assistant_id":"asst_1","thread":{"messages":[{"role":"user","content":"hi","attachments":[{"file_id":"file-2","tools":[{"type":"file_search"}]}]}]}}`,
			want: []string{"asst_1", "file-2"}},
		{name: "thread", path: "/v1/threads",
			body: `{"messages":[{"role":"user","content":"hi"}],"tool_resources":{"file_search":{"vector_stores":[{"file_ids":["file-3"]}]}}}`,
			want: []string{"file-3"}},
	})
}

func TestStateRefsOpenAIFilesBatchesStores(t *testing.T) {
	testRefs(t, []refCase{
		{name: "upload file", path: "/v1/files"},
		{name: "list files", method: "GET", path: "/v1/files?purpose=batch"},
		{name: "file", method: "GET", path: "/v1/files/file-abc", want: []string{"file-abc"}},
		{name: "file content", method: "GET", path: "/files/file-abc/content", want: []string{"file-abc"}},
		{name: "upload parts", path: "/v1/uploads/upload_1/parts", want: []string{"upload_1"}},
		{name: "upload complete", path: "/v1/uploads/upload_1/complete", body: `{"part_ids":["part_1","part_2"]}`, want: []string{"upload_1"}},
		{name: "batch create", path: "/v1/batches", body: `{"input_file_id":"file-in","endpoint":"/v1/chat/completions","completion_window":"24h"}`,
			want: []string{"file-in"}},
		{name: "batch", method: "GET", path: "/v1/batches/batch_1", want: []string{"batch_1"}},
		{name: "batch cancel", path: "/v1/batches/batch_1/cancel", want: []string{"batch_1"}},
		{name: "vector store create", path: "/v1/vector_stores", body: `{"name":"docs","file_ids":["file-4","file-5"]}`,
			want: []string{"file-4", "file-5"}},
		{name: "vector store file", path: "/v1/vector_stores/vs_1/files", body: `{"file_id":"file-6"}`, want: []string{"vs_1", "file-6"}},
		{name: "vector store file batch", method: "GET", path: "/v1/vector_stores/vs_1/file_batches/vsfb_2/files",
			want: []string{"vs_1", "vsfb_2"}},
		{name: "vector store search", path: "/v1/vector_stores/vs_1/search", body: `{"query":"what"}`, want: []string{"vs_1"}},
		{name: "container file", method: "GET", path: "/v1/containers/cntr_1/files/cfile_2/content", want: []string{"cntr_1", "cfile_2"}},
		{name: "fine tuning", path: "/v1/fine_tuning/jobs", body: `{"model":"gpt-4o-mini","training_file":"file-t","validation_file":"file-v"}`,
			want: []string{"file-t", "file-v"}},
		{name: "fine tuning job", method: "GET", path: "/v1/fine_tuning/jobs/ftjob-1/events", want: []string{"ftjob-1"}},
		{name: "eval run", path: "/v1/evals/eval_1/runs",
			body: `{"data_source":{"type":"jsonl","source":{"type":"file_id","id":"file-ev"}}}`, want: []string{"eval_1", "file-ev"}},
		{name: "video", method: "GET", path: "/v1/videos/video_1/content", want: []string{"video_1"}},
		{name: "realtime call", path: "/v1/realtime/calls/rtc_1/accept", body: `{"type":"realtime","model":"gpt-realtime"}`, want: []string{"rtc_1"}},
		{name: "realtime calls", path: "/v1/realtime/calls"},
	})
}

func TestStateRefsAnthropic(t *testing.T) {
	testRefs(t, []refCase{
		{name: "plain", path: "/v1/messages",
			body: `{"model":"claude-sonnet-4-5","max_tokens":1024,"messages":[{"role":"user","content":"hi"}]}`},
		{name: "count tokens", path: "/v1/messages/count_tokens", body: `{"model":"claude-sonnet-4-5","messages":[]}`},
		{name: "file document", path: "/v1/messages",
			body: `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":[{"type":"document","source":{"type":"file","file_id":"file_011A"}},{"type":"text","text":"summarise"}]}]}`,
			want: []string{"file_011A"}},
		{name: "tool result image", path: "/v1/messages",
			body: `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"image","source":{"type":"file","file_id":"file_011B"}}]}]}]}`,
			want: []string{"file_011B"}},
		{name: "container upload", path: "/v1/messages",
			body: `{"container":"container_1","messages":[{"role":"user","content":[{"type":"container_upload","file_id":"file_011C"}]}]}`,
			want: []string{"container_1", "file_011C"}},
		{name: "container skills", path: "/v1/messages",
			body: `{"container":{"id":"container_2","skills":[{"type":"anthropic","skill_id":"pptx","version":"latest"},{"type":"custom","skill_id":"skill_01X","version":"latest"}]},"messages":[]}`,
			want: []string{"container_2", "skill_01X"}},
		{name: "file", method: "GET", path: "/v1/files/file_011A/content", want: []string{"file_011A"}},
		{name: "batches", path: "/v1/messages/batches", body: `{"requests":[{"custom_id":"a","params":{"model":"claude-sonnet-4-5","messages":[]}}]}`},
		{name: "batch results", method: "GET", path: "/v1/messages/batches/msgbatch_1/results", want: []string{"msgbatch_1"}},
		{name: "skill", method: "GET", path: "/v1/skills/skill_01X/versions", want: []string{"skill_01X"}},
	})
}

func TestStateRefsGemini(t *testing.T) {
	testRefs(t, []refCase{
		{name: "plain", path: "/v1beta/models/gemini-2.5-flash:generateContent",
			body: `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"temperature":0.2}}`},
		{name: "cached content", path: "/v1beta/models/gemini-2.5-flash:generateContent",
			body: `{"cachedContent":"cachedContents/xyz","contents":[{"parts":[{"text":"hi"}]}]}`, want: []string{"xyz"}},
		{name: "cached content snake", path: "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
			body: `{"cached_content":"cachedContents/xyz","contents":[]}`, want: []string{"xyz"}},
		{name: "vertex cached content", path: "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent",
			body: `{"cachedContent":"projects/p/locations/us-central1/cachedContents/456","contents":[]}`, want: []string{"456"}},
		{name: "cache", method: "GET", path: "/v1beta/cachedContents/xyz", want: []string{"xyz"}},
		{name: "vertex cache", method: "PATCH", path: "/v1/projects/p/locations/l/cachedContents/456", want: []string{"456"}},
		{name: "create cache", path: "/v1beta/cachedContents",
			body: `{"model":"models/gemini-2.5-flash","contents":[{"parts":[{"fileData":{"mimeType":"application/pdf","fileUri":"https://generativelanguage.googleapis.com/v1beta/files/abc123"}}]}]}`,
			want: []string{"abc123"}},
		{name: "file data snake", path: "/v1beta/models/gemini-2.5-flash:generateContent",
			body: `{"contents":[{"parts":[{"file_data":{"mime_type":"video/mp4","file_uri":"https://generativelanguage.googleapis.com/files/def456"}}]}]}`,
			want: []string{"def456"}},
		{name: "gcs file", path: "/v1beta/models/gemini-2.5-flash:generateContent",
			body: `{"contents":[{"parts":[{"fileData":{"mimeType":"image/png","fileUri":"gs://bucket/files/a.png"}},{"fileData":{"fileUri":"https://www.youtube.com/watch?v=9hE5-98ZeCg"}}]}]}`},
		{name: "file", method: "GET", path: "/v1beta/files/abc123", want: []string{"abc123"}},
		{name: "file download", method: "GET", path: "/v1beta/files/abc123:download", want: []string{"abc123"}},
		{name: "upload", path: "/upload/v1beta/files"},
		{name: "batch", path: "/v1beta/batches/123:cancel", want: []string{"123"}},
		{name: "batch from file", path: "/v1beta/models/gemini-2.5-flash:batchGenerateContent",
			body: `{"batch":{"display_name":"b","input_config":{"file_name":"files/in42"}}}`, want: []string{"in42"}},
		{name: "file search", path: "/v1beta/models/gemini-2.5-flash:generateContent",
			body: `{"contents":[],"tools":[{"fileSearch":{"fileSearchStoreNames":["fileSearchStores/store1"]}}]}`, want: []string{"store1"}},
		{name: "resumable upload", path: "/upload/v1beta/files?upload_id=AbC-123_x&upload_protocol=resumable", want: []string{"AbC-123_x"}},
		{name: "operation", method: "GET", path: "/v1beta/models/veo-3.0-generate-preview/operations/op9", want: []string{"op9"}},
		{name: "interaction", path: "/v1beta/interactions",
			body: `{"model":"gemini-2.5-flash","input":"more","previous_interaction_id":"v1_abc"}`, want: []string{"v1_abc"}},
	})
}

// TestStateRefsCompatible holds the state of APIs alike to the big three's.
func TestStateRefsCompatible(t *testing.T) {
	testRefs(t, []refCase{
		{name: "openrouter encrypted reasoning", path: "/api/v1/chat/completions",
			body:   `{"model":"openai/o4","messages":[{"role":"assistant","content":"x","reasoning_details":[{"type":"reasoning.encrypted","data":"gAAA","id":"rs_1"}]}]}`,
			opaque: true},
		{name: "openrouter reasoning text", path: "/api/v1/chat/completions",
			body: `{"messages":[{"role":"assistant","content":"x","reasoning_details":[{"type":"reasoning.text","text":"hm"}]}]}`},
		{name: "cohere conversation", path: "/v1/chat", body: `{"message":"hi","conversation_id":"user-42-chat"}`, want: []string{"user-42-chat"}},
	})
}

// TestStateRefsNotRefs holds requests that name no state, though they
// carry the names stateRefs reads in text, in the caller's own values or
// as models.
func TestStateRefsNotRefs(t *testing.T) {
	testRefs(t, []refCase{
		{name: "text", path: "/v1/chat/completions",
			body: `{"model":"gpt-4o","messages":[{"role":"user","content":"\"previous_response_id\": \"resp_x\", \"file_id\": \"file-y\""}]}`},
		{name: "text unescaped", path: "/v1/responses",
			body: `{"model":"gpt-5","input":"previous_response_id: resp_x file_id file-y cachedContent cachedContents/z"}`},
		{name: "model names", path: "/v1/chat/completions", body: `{"model":"ft:gpt-4o-mini:org::abc","messages":[]}`},
		{name: "gemini model", path: "/v1beta/models/tunedModels:generateContent", body: `{"model":"models/gemini-2.5-flash"}`},
		{name: "metadata", path: "/v1/responses",
			body: `{"model":"gpt-5","input":"hi","metadata":{"thread_id":"t-1","conversation":"c-2","file_id":"f-3"}}`},
		{name: "function schema", path: "/v1/chat/completions",
			body: `{"model":"gpt-4o","messages":[],"tools":[{"type":"function","function":{"name":"read","parameters":{"type":"object","properties":{"file_id":{"type":"string","default":"file-x"}}}}}]}`},
		{name: "anthropic tool input", path: "/v1/messages",
			body: `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"read","input":{"file_id":"doc-1","thread_id":"t"}}]}],"tools":[{"name":"read","input_schema":{"type":"object","properties":{"file_id":{"type":"string"}}}}]}`},
		{name: "gemini function", path: "/v1beta/models/gemini-2.5-flash:generateContent",
			body: `{"contents":[{"parts":[{"functionCall":{"name":"f","args":{"cachedContent":"cachedContents/x"}}},{"functionResponse":{"name":"f","response":{"file_id":"y"}}}]}]}`},
		{name: "ids and names", path: "/v1/responses",
			body: `{"model":"gpt-5","input":[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"x"}]},{"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{\"file_id\":\"file-z\"}"}]}`},
		{name: "not an id", path: "/v1/responses",
			body: `{"previous_response_id":"two words","conversation":"auto","file_id":"","thread_id":42,"file_ids":"file-1","vector_store_ids":[1,{"id":"vs"}]}`},
		{name: "reasoning config", path: "/v1/responses", body: `{"model":"o4","reasoning":{"effort":"high","summary":"auto"},"input":"hi"}`},
		{name: "empty encrypted", path: "/v1/responses", body: `{"input":[{"type":"reasoning","id":"rs_1","encrypted_content":null}]}`, want: []string{"rs_1"}},
		{name: "not json", path: "/v1/responses", body: `{"previous_response_id":"resp_1"`},
		{name: "not json either", path: "/v1/responses", body: `previous_response_id="resp_1"`},
		{name: "collections", path: "/v1/files/"},
		{name: "deployment named files", path: "/openai/deployments/files/chat/completions?api-version=1"},
		{name: "path text", method: "GET", path: "/v1/files/a%20b"},
		{name: "no path", path: ""},
	})
}

func TestStateRefsAppends(t *testing.T) {
	dst := make([]string, 1, 8)
	dst[0] = "kept"
	got, _ := stateRefs(dst, "POST", "/v1/responses/resp_1", []byte(`{"previous_response_id":"resp_1","conversation":"kept"}`))
	if want := []string{"kept", "resp_1", "kept"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestStateRefsCopies checks that a ref does not alias the body, which the
// caller may reuse.
func TestStateRefsCopies(t *testing.T) {
	body := []byte(`{"previous_response_id":"resp_1"}`)
	got, _ := stateRefs(nil, "POST", "/v1/responses", body)
	copy(body, bytes.Repeat([]byte("x"), len(body)))
	if want := []string{"resp_1"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestStateRefsHostile(t *testing.T) {
	many := func(n int, f func(i int) string) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(f(i))
		}
		return b.String()
	}
	deep := strings.Repeat(`{"a":`, 20000) + `{"previous_response_id":"resp_deep"}` + strings.Repeat("}", 20000)
	shallow := strings.Repeat(`{"a":`, 20) + `{"previous_response_id":"resp_ok"}` + strings.Repeat("}", 20)
	tooDeep := strings.Repeat(`[`, maxRefDepth+1) + `{"file_id":"file-deep"}` + strings.Repeat(`]`, maxRefDepth+1)
	manyRefs := `{"file_ids":[` + many(1000, func(i int) string { return fmt.Sprintf(`"file-%d"`, i) }) + `]}`
	manyItems := `{"input":[` + many(maxRefItems+10, func(int) string { return `{}` }) + `,{"file_id":"file-late"}]}`
	longPath := strings.Repeat("/files/f", 100)
	for _, c := range []struct {
		name, path, body string
		want             int // refs
	}{
		{"deep", "/v1/responses", deep, 0},
		{"shallow", "/v1/responses", shallow, 1},
		{"too deep", "/v1/responses", tooDeep, 0},
		{"many refs", "/v1/vector_stores", manyRefs, maxRefs},
		{"many items", "/v1/responses", manyItems, 0},
		{"long path", longPath, "", 1},
		{"long ref", "/v1/files/" + strings.Repeat("a", maxRefLen+1), `{"file_id":"` + strings.Repeat("b", maxRefLen+1) + `"}`, 0},
	} {
		got, _ := stateRefs(nil, "POST", c.path, []byte(c.body))
		if len(got) != c.want {
			t.Errorf("%s: %d refs (%.40q), want %d", c.name, len(got), got, c.want)
		}
	}
}

func TestCreatesState(t *testing.T) {
	for _, c := range []struct {
		method, path, body string
		want               bool
	}{
		{"POST", "/v1/responses", `{"model":"gpt-5","input":"hi"}`, true},
		{"POST", "/v1/responses", `{"model":"gpt-5","store":true}`, true},
		{"POST", "/v1/responses", `{"model":"gpt-5","store":false,"input":"hi"}`, false},
		{"POST", "/v1/responses", `{"model":"gpt-5","metadata":{"store":false}}`, true},
		{"POST", "/v1/responses?x=1", "", true},
		{"GET", "/v1/responses", "", false},
		{"POST", "/v1/responses/resp_1/cancel", "", false},
		{"POST", "/v1/responses/input_tokens", "", false},
		{"POST", "/v1/responses/compact", "", false},
		{"POST", "/v1/conversations", `{"items":[]}`, true},
		{"POST", "/v1/conversations/conv_1/items", `{"items":[]}`, false},
		{"POST", "/v1/files", "", true},
		{"POST", "/v1/uploads", `{"filename":"a"}`, true},
		{"POST", "/v1/uploads/upload_1/parts", "", false},
		{"POST", "/v1/uploads/upload_1/complete", `{"part_ids":["part_1"]}`, true},
		{"POST", "/v1/batches", `{"input_file_id":"file-1"}`, true},
		{"POST", "/v1/batches/batch_1/cancel", "", false},
		{"POST", "/v1/vector_stores", "", true},
		{"POST", "/v1/vector_stores/vs_1/files", `{"file_id":"file-1"}`, false},
		{"POST", "/v1/assistants", "", true},
		{"POST", "/v1/threads", "", true},
		{"POST", "/v1/threads/runs", "", true},
		{"POST", "/v1/threads/thread_1/runs", "", false},
		{"POST", "/v1/threads/thread_1/messages", "", false},
		{"POST", "/v1/containers", "", true},
		{"POST", "/v1/fine_tuning/jobs", "", true},
		{"POST", "/v1/evals", "", true},
		{"POST", "/v1/videos", "", true},
		{"POST", "/v1/realtime/sessions", "", false},
		{"POST", "/v1/realtime/client_secrets", "", false},
		{"POST", "/v1/chat/completions", `{"model":"gpt-4o"}`, false},
		{"POST", "/v1/chat/completions", `{"model":"gpt-4o","store":true}`, true},
		{"POST", "/v1/completions", `{"model":"x","store":true}`, false},
		{"POST", "/v1/embeddings", "", false},
		{"POST", "/v1/messages", `{"model":"claude"}`, false},
		{"POST", "/v1/messages/batches", "", true},
		{"POST", "/v1/files", "", true},
		{"POST", "/v1/skills", "", true},
		{"POST", "/v1beta/cachedContents", `{"model":"models/gemini-2.5-flash"}`, true},
		{"POST", "/v1/projects/p/locations/l/cachedContents", "", true},
		{"POST", "/upload/v1beta/files", "", true},
		{"POST", "/v1beta/files:register", "", false},
		{"POST", "/v1beta/models/gemini-2.5-flash:generateContent", "", false},
		{"POST", "/v1beta/models/gemini-2.5-flash:batchGenerateContent", "", true},
		{"POST", "/v1beta/fileSearchStores", "", true},
		{"POST", "/v1beta/models/veo-3.0-generate-preview:predictLongRunning", "", true},
		{"POST", "/v1beta/models/imagen-4.0-generate-001:predict", "", false},
		{"POST", "/upload/v1beta/files?upload_id=u1&upload_protocol=resumable", "", true},
		{"POST", "/v1/realtime/calls", "", false},
		{"POST", "/v1beta/interactions", `{"input":"hi"}`, true},
		{"POST", "/v1beta/interactions", `{"input":"hi","store":false}`, false},
		{"DELETE", "/v1/files/file-1", "", false},
	} {
		if got := createsState(c.method, c.path, []byte(c.body)); got != c.want {
			t.Errorf("createsState(%s %s, %s) = %v, want %v", c.method, c.path, c.body, got, c.want)
		}
	}
}

// scanRefs passes body through a refScanner, read by read, and returns
// the bytes read and the ids found.
func scanRefs(t *testing.T, body string, sse bool, read func(io.Reader) ([]byte, error)) (string, []string) {
	t.Helper()
	var ids []string
	rc := newRefScanner(io.NopCloser(strings.NewReader(body)), sse, func(id string) { ids = append(ids, id) })
	got, err := read(rc)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	if string(got) != body {
		t.Errorf("the body changed: got %.60q, want %.60q", got, body)
	}
	return string(got), ids
}

var refReads = []struct {
	name string
	read func(io.Reader) ([]byte, error)
}{
	{"All", io.ReadAll},
	{"OneByte", func(r io.Reader) ([]byte, error) { return io.ReadAll(iotest.OneByteReader(r)) }},
	{"Half", func(r io.Reader) ([]byte, error) { return io.ReadAll(iotest.HalfReader(r)) }},
}

func TestRefScannerJSON(t *testing.T) {
	big := strings.Repeat("x", 2*maxRefScan)
	for _, c := range []struct {
		name, body, want string
	}{
		{"responses", `{"id":"resp_123","object":"response","status":"completed","output":[{"id":"msg_1","content":[{"text":"hi"}]}]}`, "resp_123"},
		{"anthropic file", `{"id":"file_011A","type":"file","filename":"a.pdf"}`, "file_011A"},
		{"nested ids first", `{"object":"thread.run","tools":[{"id":"x"}],"meta":{"id":"y"},"id":"run_1"}`, "run_1"},
		{"first id", `{"id":"a_1","id":"b_2"}`, "a_1"},
		{"gemini cache", `{"name":"cachedContents/abc","model":"models/gemini-2.5-flash","usageMetadata":{"totalTokenCount":4000}}`, "abc"},
		{"gemini operation", `{"name":"models/veo-3.0-generate-preview/operations/op9"}`, "op9"},
		{"gemini batch", `{"name":"batches/123","metadata":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"}}`, "123"},
		{"gemini file", `{"file":{"name":"files/f1","mimeType":"application/pdf","uri":"https://generativelanguage.googleapis.com/v1beta/files/f1"}}`, "f1"},
		{"upload complete", `{"id":"upload_1","object":"upload","status":"completed","file":{"id":"file-xyz","object":"file"}}`, "file-xyz"},
		{"run and thread", `{"id":"run_1","object":"thread.run","assistant_id":"asst_1","thread_id":"thread_1","status":"queued"}`, "thread_1"},
		{"upload created", `{"id":"upload_1","object":"upload","status":"pending","file":null}`, "upload_1"},
		{"id after a big value", `{"object":"response","instructions":"` + big + `","id":"resp_late"}`, ""},
		{"id before a big value", `{"id":"resp_early","instructions":"` + big + `"}`, "resp_early"},
		{"plain name", `{"name":"Support FAQ","object":"vector_store"}`, ""},
		{"no id", `{"object":"list","data":[{"id":"file-1"}]}`, ""},
		{"error", `{"error":{"type":"invalid_request_error","message":"no"}}`, ""},
		{"escaped", `{"id":"resp_\u0031"}`, ""},
		{"not an id", `{"id":"two words"}`, ""},
		{"number", `{"id":12}`, ""},
		{"array", `[{"id":"x"}]`, ""},
		{"empty", ``, ""},
		{"garbage", `}}}"id":"x"`, ""},
	} {
		for _, r := range refReads {
			t.Run(c.name+"/"+r.name, func(t *testing.T) {
				_, ids := scanRefs(t, c.body, false, r.read)
				want := []string{c.want}
				if c.want == "" {
					want = nil
				}
				if !slices.Equal(ids, want) {
					t.Errorf("found %q, want %q", ids, want)
				}
			})
		}
	}
}

func TestRefScannerEventStream(t *testing.T) {
	big := strings.Repeat("y", maxRefScan/2)
	for _, c := range []struct {
		name, body, want string
	}{
		{"responses",
			"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_9\",\"object\":\"response\",\"status\":\"in_progress\",\"instructions\":\"" + big + "\"}}\n\n" +
				"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"delta\":\"hi\"}\n\n" +
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_9\"}}\n\n",
			"resp_9"},
		{"crlf and comments", ": keep-alive\r\n\r\nevent: response.created\r\ndata: {\"response\":\r\ndata: {\"id\":\"resp_crlf\"}}\r\n\r\n", "resp_crlf"},
		{"assistants", "event: thread.created\ndata: {\"id\":\"thread_1\",\"object\":\"thread\"}\n\nevent: thread.run.created\ndata: {\"id\":\"run_1\",\"thread_id\":\"thread_1\"}\n\n", "thread_1"},
		{"later event", "event: ping\ndata: {\"type\":\"ping\"}\n\nevent: response.created\ndata: {\"response\":{\"id\":\"resp_2\"}}\n\n", "resp_2"},
		{"last event without end", "data: {\"response\":{\"id\":\"resp_3\"}}", "resp_3"},
		{"no id", "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n", ""},
		{"cut", "event: response.created\ndata: {\"response\":{\"id\":\"resp_", ""},
		{"too late", "data: {\"pad\":\"" + strings.Repeat("z", maxRefScan) + "\"}\n\ndata: {\"id\":\"x_1\"}\n\n", ""},
	} {
		for _, r := range refReads {
			t.Run(c.name+"/"+r.name, func(t *testing.T) {
				_, ids := scanRefs(t, c.body, true, r.read)
				want := []string{c.want}
				if c.want == "" {
					want = nil
				}
				if !slices.Equal(ids, want) {
					t.Errorf("found %q, want %q", ids, want)
				}
			})
		}
	}
}

// TestRefScannerAtTheEvent checks that a stream's id is found as its event
// ends, before the caller reads the rest.
func TestRefScannerAtTheEvent(t *testing.T) {
	first := "event: response.created\ndata: {\"response\":{\"id\":\"resp_1\"}}\n\n"
	pr, pw := io.Pipe()
	defer pr.Close()
	var found string
	rc := newRefScanner(pr, true, func(id string) { found = id })
	go pw.Write([]byte(first))
	buf := make([]byte, 1024)
	n, err := rc.Read(buf)
	if err != nil || n != len(first) {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if found != "resp_1" {
		t.Errorf("found %q after the first event, want %q", found, "resp_1")
	}
}

// TestRefScannerCut checks bodies that end early: a JSON answer cut after
// its id reports it at the break or at Close, one cut before it does not.
func TestRefScannerCut(t *testing.T) {
	broken := errors.New("connection reset")
	for _, c := range []struct {
		name, body string
		sse, close bool
		want       string
	}{
		{"after id, broken", `{"id":"resp_1","object":"resp`, false, false, "resp_1"},
		{"after id, closed", `{"id":"resp_1","object":"resp`, false, true, "resp_1"},
		{"in id, broken", `{"object":"response","id":"resp_1`, false, false, ""},
		{"in id, closed", `{"object":"response","id":"resp_1`, false, true, ""},
		{"stream in id, closed", "data: {\"response\":{\"id\":\"resp_1", true, true, ""},
		{"stream in event, closed", "data: {\"response\":{\"id\":\"resp_1\",\"status\":\"in", true, true, "resp_1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ids []string
			var r io.Reader = strings.NewReader(c.body)
			if !c.close {
				r = io.MultiReader(r, iotest.ErrReader(broken))
			}
			rc := newRefScanner(io.NopCloser(r), c.sse, func(id string) { ids = append(ids, id) })
			got, err := io.ReadAll(iotest.OneByteReader(io.LimitReader(rc, int64(len(c.body)))))
			if string(got) != c.body || err != nil {
				t.Fatalf("read %q, %v", got, err)
			}
			if !c.close {
				if _, err := rc.Read(make([]byte, 8)); err != broken {
					t.Fatalf("Read error %v, want %v", err, broken)
				}
			}
			rc.Close()
			rc.Close()
			want := []string{c.want}
			if c.want == "" {
				want = nil
			}
			if !slices.Equal(ids, want) {
				t.Errorf("found %q, want %q", ids, want)
			}
		})
	}
}

type refBody struct {
	io.Reader
	closed int
}

func (c *refBody) Close() error { c.closed++; return nil }

func TestRefScannerCloseUnread(t *testing.T) {
	for _, sse := range []bool{false, true} {
		body := &refBody{Reader: strings.NewReader(`{"id":"resp_1"}`)}
		called := 0
		rc := newRefScanner(body, sse, func(string) { called++ })
		if err := rc.Close(); err != nil {
			t.Fatal(err)
		}
		if body.closed != 1 || called != 0 {
			t.Errorf("sse %v: body closed %d times, found called %d times; want 1, 0", sse, body.closed, called)
		}
	}
}

func TestRefScannerNothingToScan(t *testing.T) {
	if rc := newRefScanner(http.NoBody, false, func(string) {}); rc != http.NoBody {
		t.Errorf("got %T, want http.NoBody", rc)
	}
	body := io.NopCloser(strings.NewReader(`{"id":"resp_1"}`))
	if rc := newRefScanner(body, false, nil); rc != body {
		t.Errorf("got %T without found, want the body", rc)
	}
}

// TestRefScannerConcurrentClose closes the body while another goroutine
// reads it, as a caller's cancelled request does; -race checks it.
func TestRefScannerConcurrentClose(t *testing.T) {
	for _, sse := range []bool{false, true} {
		body := strings.Repeat(`{"id":"resp_1","pad":"`+strings.Repeat("p", 100)+`"}`+"\n\n", 100)
		if sse {
			body = strings.ReplaceAll(body, `{"id"`, `data: {"id"`)
		}
		var mu sync.Mutex
		called := 0
		rc := newRefScanner(io.NopCloser(iotest.OneByteReader(strings.NewReader(body))), sse, func(string) {
			mu.Lock()
			called++
			mu.Unlock()
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			io.Copy(io.Discard, rc)
		}()
		rc.Close()
		<-done
		mu.Lock()
		if called > 1 {
			t.Errorf("sse %v: found called %d times", sse, called)
		}
		mu.Unlock()
	}
}

// refChatBody is a chat completion request of about n bytes that names no
// state: a system prompt, turns of text, a tool with its schema.
func refChatBody(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"gpt-4o-mini","temperature":0.7,"stream":true,"stream_options":{"include_usage":true},`)
	b.WriteString(`"tools":[{"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],`)
	b.WriteString(`"messages":[{"role":"system","content":"You are a helpful assistant. Answer briefly, cite \"sources\" when you can."}`)
	for i := 0; b.Len() < n-200; i++ {
		fmt.Fprintf(&b, `,{"role":"user","content":"Turn %d: tell me about the weather in Paris and what to wear, and whether I need an umbrella tomorrow."}`, i)
		fmt.Fprintf(&b, `,{"role":"assistant","content":"It will be mild, about 18 degrees, with some rain in the afternoon: take a light coat and an umbrella."}`)
	}
	b.WriteString(`]}`)
	return b.String()
}

func TestStateRefsAllocs(t *testing.T) {
	body := []byte(refChatBody(4 << 10))
	dst := make([]string, 0, maxRefs)
	allocs := testing.AllocsPerRun(100, func() {
		refs, _ := stateRefs(dst[:0], "POST", "/v1/chat/completions", body)
		if len(refs) != 0 {
			t.Fatal(refs)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocs per chat request, want 0", allocs)
	}
	allocs = testing.AllocsPerRun(100, func() {
		stateRefs(dst[:0], "GET", "/v1/threads/thread_1/runs/run_2", nil)
	})
	if allocs != 0 {
		t.Errorf("%v allocs per path, want 0", allocs)
	}
}

func BenchmarkStateRefs(b *testing.B) {
	for _, c := range []struct{ name, path, body string }{
		{"Chat4KiB", "/v1/chat/completions", refChatBody(4 << 10)},
		{"Chat4KiBLongTurns", "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"system","content":"` + strings.Repeat("Be brief. ", 200) +
			`"},{"role":"user","content":"` + strings.Repeat("What is the weather? ", 50) + `"},{"role":"assistant","content":"` + strings.Repeat("Mild. ", 150) + `"}],"stream":true}`},
		{"Responses", "/v1/responses", `{"model":"gpt-5","previous_response_id":"resp_abc","input":[{"role":"user","content":[{"type":"input_text","text":"` + strings.Repeat("a", 3<<10) + `"},{"type":"input_file","file_id":"file-1"}]}]}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			body := []byte(c.body)
			dst := make([]string, 0, maxRefs)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				stateRefs(dst[:0], "POST", c.path, body)
			}
		})
	}
}

func FuzzStateRefs(f *testing.F) {
	f.Add("POST", "/v1/responses", []byte(`{"previous_response_id":"resp_1","input":[{"type":"item_reference","id":"x"},{"type":"reasoning","encrypted_content":"e"}]}`))
	f.Add("GET", "/v1/threads/thread_1/runs/run_2/steps/s", []byte(nil))
	f.Add("POST", "/v1beta/cachedContents/x:y", []byte(`{"cachedContent":"cachedContents/a","contents":[{"parts":[{"fileData":{"fileUri":"https://generativelanguage.googleapis.com/v1beta/files/b"}}]}]}`))
	f.Add("POST", "/v1/messages", []byte(`{"container":{"id":"c","skills":[{"type":"custom","skill_id":"s"}]},"messages":[{"content":[{"source":{"type":"file","file_id":"f"}}]}]}`))
	f.Add("POST", "/v1/responses", []byte(`{"id":"resp_1","file":{"id":"file-1"}}`))
	f.Add("POST", "/x", []byte("data: {\"response\":{\"id\":\"resp_1\"}}\n\n"))
	f.Fuzz(func(t *testing.T, method, path string, body []byte) {
		orig := bytes.Clone(body)
		refs, _ := stateRefs([]string{"kept"}, method, path, body)
		if len(refs) < 1 || refs[0] != "kept" || len(refs)-1 > maxRefs {
			t.Fatalf("%d refs: %q", len(refs), refs)
		}
		for i, r := range refs[1:] {
			if !validRef(r) || slices.Contains(refs[i+2:], r) {
				t.Fatalf("ref %q of %q", r, refs)
			}
		}
		createsState(method, path, body)
		if !bytes.Equal(body, orig) {
			t.Fatal("the body changed")
		}
		for _, sse := range []bool{false, true} {
			called := 0
			rc := newRefScanner(io.NopCloser(iotest.HalfReader(bytes.NewReader(body))), sse, func(id string) {
				called++
				if !validRef(id) {
					t.Fatalf("found %q", id)
				}
			})
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, body) || called > 1 {
				t.Fatalf("read %q, %v; found called %d times", got, err, called)
			}
		}
	})
}
