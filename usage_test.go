package failover_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"github.com/failover-go/failover"
)

// usageServer answers every request with status, Content-Type ct and the
// body's pieces, each flushed apart, as a provider streams.
func usageServer(t testing.TB, status int, ct string, pieces ...string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(status)
		for _, p := range pieces {
			if _, err := io.WriteString(w, p); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// usageLog collects what OnUsage and Trace.Usage receive.
type usageLog struct {
	mu  sync.Mutex
	got []failover.Usage
}

func (l *usageLog) add(u failover.Usage) {
	l.mu.Lock()
	l.got = append(l.got, u)
	l.mu.Unlock()
}

func (l *usageLog) all() []failover.Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got)
}

// sse makes a stream's pieces: each event a piece, ending in a blank line.
func sse(events ...string) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e + "\n\n"
	}
	return out
}

// The providers' answers, as their documentation and the recordings in
// ../shared/recordings show them.
var (
	// OpenAI chat completion, pretty-printed as OpenAI sends it.
	openAIChat = `{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "The \"usage\": {\"prompt_tokens\": 999} of a JSON body is...",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 1117,
    "completion_tokens": 46,
    "total_tokens": 1163,
    "prompt_tokens_details": {
      "cached_tokens": 1024,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default",
  "system_fingerprint": "fp_fc9f1d7035"
}
`
	// OpenAI chat stream with stream_options.include_usage: every chunk
	// has "usage": null, and one more chunk with no choices has it.
	openAIStream = sse(
		`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"7PrXJpDCa"}`,
		`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"B0AJ"}`,
		`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null,"obfuscation":"Gx"}`,
		`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":14,"completion_tokens":13,"total_tokens":27,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"obfuscation":"KmpuvjDPc"}`,
		`data: [DONE]`,
	)
	// The same stream without include_usage: nothing to report.
	openAIStreamNoUsage = sse(
		`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`,
		`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`data: [DONE]`,
	)
	// OpenAI Responses API: usage after the echoed tools (one of whose
	// parameters is named usage) and before the metadata (one of whose
	// keys is).
	openAIResponse = `{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","created_at":1741476542,"status":"completed","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove beneath a silver moon...","annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[{"type":"function","name":"bill","parameters":{"type":"object","properties":{"usage":{"type":"object","properties":{"input_tokens":{"type":"integer"}}}}}}],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":4},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123},"user":null,"metadata":{"usage":"tenant-a"}}`
	// The Responses API streamed: the usage comes in response.completed.
	openAIResponseStream = sse(
		"event: response.created\n"+`data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1741290958,"status":"in_progress","model":"gpt-4.1-2025-04-14","output":[],"usage":null,"metadata":{}}}`,
		"event: response.output_text.delta\n"+`data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}`,
		"event: response.completed\n"+`data: {"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","object":"response","created_at":1741290958,"status":"completed","model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":0},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48},"metadata":{}}}`,
	)
	// The same with an answer of 10 KiB: its response.completed event is
	// too large to be held whole.
	openAIResponseStreamLarge = sse(
		openAIResponseStream[0][:len(openAIResponseStream[0])-2],
		strings.Replace(openAIResponseStream[2][:len(openAIResponseStream[2])-2], `"text":"Hi"`, `"text":"`+strings.Repeat(`Hi \"there\"\n`, 800)+`"`, 1),
	)
	openAIEmbedding = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[-0.006929283,-0.005336422,0.00047350125,-2.3541756e-05]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`
	// DeepSeek: OpenAI's shape, its cache hits counted apart.
	deepSeekChat = `{"id":"1","object":"chat.completion","created":1,"model":"deepseek-chat","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":9,"total_tokens":129,"prompt_cache_hit_tokens":64,"prompt_cache_miss_tokens":56},"system_fingerprint":"fp_1"}`
	// Anthropic's messages: input_tokens leaves out the cache.
	anthropicMessage = `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Hello!"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":13,"cache_creation_input_tokens":200,"cache_read_input_tokens":1000,"cache_creation":{"ephemeral_5m_input_tokens":200,"ephemeral_1h_input_tokens":0},"output_tokens":35,"service_tier":"standard"}}`
	// Anthropic's stream: message_start has the input, message_delta the
	// running total of the output.
	anthropicStream = sse(
		"event: message_start\n"+`data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":50,"cache_read_input_tokens":100,"cache_creation":{"ephemeral_5m_input_tokens":50,"ephemeral_1h_input_tokens":0},"output_tokens":1,"service_tier":"standard"}}}`,
		"event: content_block_start\n"+`data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		"event: ping\n"+`data: {"type": "ping"}`,
		"event: content_block_delta\n"+`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`,
		"event: content_block_stop\n"+`data: {"type":"content_block_stop","index":0}`,
		"event: message_delta\n"+`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":40}}`,
		"event: message_stop\n"+`data: {"type":"message_stop"}`,
	)
	// An Anthropic-compatible gateway that says 0 input tokens at the
	// start and the count in message_delta.
	anthropicGatewayStream = sse(
		"event: message_start\n"+`data: {"type":"message_start","message":{"id":"gen-1","type":"message","role":"assistant","model":"anthropic/claude-3.5-haiku","content":[],"usage":{"input_tokens":0,"output_tokens":0}}}`,
		"event: content_block_delta\n"+`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
		"event: message_delta\n"+`data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":9,"output_tokens":4}}`,
		"event: message_stop\n"+`data: {"type":"message_stop"}`,
	)
	// Gemini generateContent, pretty-printed, with a cache and thoughts.
	geminiContent = `{
  "candidates": [
    {
      "content": {
        "parts": [
          {
            "text": "Hello."
          }
        ],
        "role": "model"
      },
      "finishReason": "STOP",
      "index": 0
    }
  ],
  "usageMetadata": {
    "promptTokenCount": 1200,
    "candidatesTokenCount": 9,
    "totalTokenCount": 1311,
    "cachedContentTokenCount": 1000,
    "promptTokensDetails": [
      {
        "modality": "TEXT",
        "tokenCount": 1200
      }
    ],
    "thoughtsTokenCount": 102
  },
  "modelVersion": "gemini-2.5-flash",
  "responseId": "pCJlaK2tDd6jz7IPm4i1uAE"
}
`
	// Gemini streamGenerateContent?alt=sse: CRLF lines, every chunk with
	// the running usage.
	geminiStream = []string{
		"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 9,\"totalTokenCount\": 9,\"promptTokensDetails\": [{\"modality\": \"TEXT\",\"tokenCount\": 9}]},\"modelVersion\": \"gemini-2.0-flash\",\"responseId\": \"a\"}\r\n\r\n",
		"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"lo\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 8,\"candidatesTokenCount\": 578,\"toolUsePromptTokenCount\": 2,\"totalTokenCount\": 588,\"promptTokensDetails\": [{\"modality\": \"TEXT\",\"tokenCount\": 8}],\"candidatesTokensDetails\": [{\"modality\": \"TEXT\",\"tokenCount\": 578}]},\"modelVersion\": \"gemini-2.0-flash\",\"responseId\": \"a\"}\r\n\r\n",
	}
	// Gemini streamGenerateContent without alt=sse: a JSON array, written
	// as it goes.
	geminiArray = []string{
		"[{\n  \"candidates\": [\n    {\n      \"content\": {\n        \"parts\": [\n          {\n            \"text\": \"Hi\"\n          }\n        ],\n        \"role\": \"model\"\n      },\n      \"index\": 0\n    }\n  ],\n  \"usageMetadata\": {\n    \"promptTokenCount\": 20,\n    \"totalTokenCount\": 20\n  },\n  \"modelVersion\": \"gemini-1.5-flash\"\n}\n",
		",\r\n{\n  \"candidates\": [\n    {\n      \"content\": {\n        \"parts\": [\n          {\n            \"text\": \" there\"\n          }\n        ],\n        \"role\": \"model\"\n      },\n      \"finishReason\": \"STOP\",\n      \"index\": 0\n    }\n  ],\n  \"usageMetadata\": {\n    \"promptTokenCount\": 17,\n    \"candidatesTokenCount\": 6,\n    \"totalTokenCount\": 23\n  },\n  \"modelVersion\": \"gemini-1.5-flash\"\n}\n]",
	}
)

// Usage that providers report in fields or places of their own, as their
// documentation shows it.
var (
	// Groq's stream: the usage only in the last chunk's x_groq.
	groqStream = sse(
		`data: {"id":"chatcmpl-b2d8","object":"chat.completion.chunk","created":1730241104,"model":"llama-3.1-8b-instant","system_fingerprint":"fp_179b0f92c9","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"x_groq":{"id":"req_01jbd6g2qdfw2adyrt2az8hz4w"}}`,
		`data: {"id":"chatcmpl-b2d8","object":"chat.completion.chunk","created":1730241104,"model":"llama-3.1-8b-instant","system_fingerprint":"fp_179b0f92c9","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}`,
		`data: {"id":"chatcmpl-b2d8","object":"chat.completion.chunk","created":1730241104,"model":"llama-3.1-8b-instant","system_fingerprint":"fp_179b0f92c9","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"x_groq":{"id":"req_01jbd6g2qdfw2adyrt2az8hz4w","usage":{"queue_time":0.019,"prompt_tokens":40,"prompt_time":0.002,"completion_tokens":25,"completion_time":0.02,"total_tokens":65,"total_time":0.022}}}`,
		`data: [DONE]`,
	)
	// OpenRouter, serving a Claude model: what was written to the prompt
	// cache is a part of prompt_tokens, in prompt_tokens_details.
	openRouterCacheWrite = `{"id":"gen-1761231441-x","provider":"Anthropic","model":"anthropic/claude-sonnet-4.5","object":"chat.completion","created":1761231441,"choices":[{"logprobs":null,"finish_reason":"stop","native_finish_reason":"end_turn","index":0,"message":{"role":"assistant","content":"Hi","refusal":null,"reasoning":null}}],"usage":{"prompt_tokens":2400,"completion_tokens":50,"total_tokens":2450,"cost":0.016,"is_byok":false,"prompt_tokens_details":{"cached_tokens":0,"cache_write_tokens":2350,"audio_tokens":0},"cost_details":{"upstream_inference_cost":null},"completion_tokens_details":{"reasoning_tokens":0,"image_tokens":0}}}`
	// The same in a stream, read and written at once.
	openRouterCacheStream = sse(
		`data: {"id":"gen-1","provider":"Anthropic","model":"anthropic/claude-sonnet-4.5","object":"chat.completion.chunk","created":1,"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`,
		`data: {"id":"gen-1","provider":"Anthropic","model":"anthropic/claude-sonnet-4.5","object":"chat.completion.chunk","created":1,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":5000,"completion_tokens":9,"total_tokens":5009,"cost":0.002,"is_byok":false,"prompt_tokens_details":{"cached_tokens":3000,"cache_write_tokens":1900},"completion_tokens_details":{"reasoning_tokens":0}}}`,
		`data: [DONE]`,
	)
	// The Responses API's cache writes, in input_tokens_details.
	responsesCacheWrite = `{"id":"resp_1","object":"response","status":"completed","model":"gpt-5-2025-08-07","output":[],"usage":{"input_tokens":3000,"input_tokens_details":{"cached_tokens":1000,"cache_write_tokens":1500},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":3020}}`
	// A Gemini stream whose last chunk, the tally, leaves out what is 0
	// (proto3 JSON omits zeros): no candidates, no thoughts, no cache.
	geminiStreamLastOmits = []string{
		"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 1200,\"candidatesTokenCount\": 30,\"totalTokenCount\": 1330,\"cachedContentTokenCount\": 1000,\"thoughtsTokenCount\": 100,\"toolUsePromptTokenCount\": 7},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"b\"}\r\n\r\n",
		"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"\"}],\"role\": \"model\"},\"finishReason\": \"SAFETY\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 1200,\"totalTokenCount\": 1200},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"b\"}\r\n\r\n",
	}
	// Anthropic with compaction: the top-level counts leave out the
	// compaction's iteration; what is billed is the sum over iterations.
	anthropicIterations = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-4-6","content":[{"type":"compaction","content":"Summary of the conversation: ..."},{"type":"text","text":"Based on our conversation so far..."}],"stop_reason":"end_turn","usage":{"input_tokens":45000,"output_tokens":1234,"iterations":[{"type":"compaction","input_tokens":180000,"output_tokens":3500},{"type":"message","input_tokens":23000,"output_tokens":1000}]}}`
	// Iterations with the prompt cache, and a server tool's requests.
	anthropicIterationsCache = `{"id":"msg_2","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"Done."}],"stop_reason":"end_turn","usage":{"input_tokens":30,"cache_creation_input_tokens":500,"cache_read_input_tokens":20000,"cache_creation":{"ephemeral_5m_input_tokens":500,"ephemeral_1h_input_tokens":0},"output_tokens":700,"server_tool_use":{"web_search_requests":2},"service_tier":"standard","iterations":[{"type":"compaction","input_tokens":150000,"cache_creation_input_tokens":0,"cache_read_input_tokens":60000,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":4000},{"type":"message","input_tokens":20,"cache_creation_input_tokens":500,"cache_read_input_tokens":12000,"output_tokens":300},{"type":"message","input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":8000,"output_tokens":400}]}}`
	// Iterations in a stream: message_delta has them.
	anthropicIterationsStream = sse(
		"event: message_start\n"+`data: {"type":"message_start","message":{"id":"msg_3","type":"message","role":"assistant","model":"claude-opus-4-6","content":[],"stop_reason":null,"usage":{"input_tokens":23000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}`,
		"event: content_block_start\n"+`data: {"type":"content_block_start","index":0,"content_block":{"type":"compaction","content":""}}`,
		"event: content_block_delta\n"+`data: {"type":"content_block_delta","index":0,"delta":{"type":"compaction_delta","content":"Summary of the conversation: ..."}}`,
		"event: message_delta\n"+`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":23000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1000,"iterations":[{"type":"compaction","input_tokens":180000,"output_tokens":3500},{"type":"message","input_tokens":23000,"output_tokens":1000}]}}`,
		"event: message_stop\n"+`data: {"type":"message_stop"}`,
	)
	// Cohere's v2 chat: billed_units is what is billed; tokens counts the
	// prompt template too.
	cohereChat = `{"id":"c14c80c3-18eb-4519-9460-6c92edd8cfb4","finish_reason":"COMPLETE","message":{"role":"assistant","content":[{"type":"text","text":"LLMs are..."}]},"usage":{"billed_units":{"input_tokens":5,"output_tokens":418},"tokens":{"input_tokens":71,"output_tokens":418}}}`
	// Cohere's v2 stream: the usage in message-end's delta.
	cohereStream = sse(
		"event: message-start\n"+`data: {"id":"29f14a5a-11de-4cae-9800-25e4747408ea","type":"message-start","delta":{"message":{"role":"assistant","content":[],"tool_plan":"","tool_calls":[],"citations":[]}}}`,
		"event: content-delta\n"+`data: {"type":"content-delta","index":0,"delta":{"message":{"content":{"text":"Hello"}}}}`,
		"event: message-end\n"+`data: {"type":"message-end","delta":{"finish_reason":"COMPLETE","usage":{"billed_units":{"input_tokens":3,"output_tokens":10},"tokens":{"input_tokens":69,"output_tokens":10}}}}`,
	)
	// Cohere's v1 generate: billed_units in meta (as recorded).
	cohereGenerate = `{"id":"df0d8117-b88d-42b9-b87e-105d0087e6eb","generations":[{"id":"c0e39a2b","text":" a wise old owl.","finish_reason":"COMPLETE"}],"prompt":"Once upon a time","meta":{"api_version":{"version":"1"},"warnings":["Generate API is deprecated"],"billed_units":{"input_tokens":11,"output_tokens":321}}}`
	// Bedrock's Converse: camelCase, inputTokens without the cache.
	bedrockConverse = `{"metrics":{"latencyMs":1046},"output":{"message":{"content":[{"text":"Hello!"}],"role":"assistant"}},"stopReason":"end_turn","usage":{"cacheReadInputTokens":1000,"cacheWriteInputTokens":200,"inputTokens":13,"outputTokens":35,"totalTokens":1248}}`
	// Bedrock's InvokeModel of an Amazon Nova model.
	bedrockNova = `{"output":{"message":{"content":[{"text":"AI mimics human thinking."}],"role":"assistant"}},"stopReason":"end_turn","usage":{"inputTokens":20,"outputTokens":9,"totalTokens":829,"cacheReadInputTokenCount":800,"cacheWriteInputTokenCount":0}}`
	// xAI's reasoning models count the reasoning apart from
	// completion_tokens, and in total_tokens.
	xaiReasoning = `{"id":"a3d1","object":"chat.completion","created":1743770302,"model":"grok-3-mini","choices":[{"index":0,"message":{"role":"assistant","content":"101 multiplied by 3 is 303.","refusal":null},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":180,"prompt_tokens_details":{"text_tokens":12,"audio_tokens":0,"image_tokens":0,"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":165,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"system_fingerprint":"fp_d133ae3397"}`
	// OpenAI's count the reasoning within completion_tokens.
	openAIReasoning = `{"id":"chatcmpl-2","object":"chat.completion","created":1,"model":"o4-mini-2025-04-16","choices":[{"index":0,"message":{"role":"assistant","content":"303"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":200,"total_tokens":210,"completion_tokens_details":{"reasoning_tokens":150}}}`
	// A gateway's Responses API in front of Gemini: the thoughts apart.
	responsesReasoningApart = `{"id":"resp_2","object":"response","status":"completed","model":"gemini-2.5-flash","output":[],"usage":{"input_tokens":21,"input_tokens_details":{"cached_tokens":0},"output_tokens":0,"output_tokens_details":{"reasoning_tokens":60},"total_tokens":81}}`
	// Google's Code Assist API (gemini-cli's) wraps each of Gemini's
	// chunks in a response object.
	codeAssistStream = sse(
		`data: {"response": {"candidates": [{"content": {"role": "model","parts": [{"text": "Hello"}]}}],"usageMetadata": {"promptTokenCount": 5210,"totalTokenCount": 5210,"trafficType": "PROVISIONED_THROUGHPUT"},"modelVersion": "gemini-2.5-pro","createTime": "2025-09-01T10:00:00.000000Z","responseId": "c1"},"traceId": "t1"}`,
		`data: {"response": {"candidates": [{"content": {"role": "model","parts": [{"text": "!"}]},"finishReason": "STOP"}],"usageMetadata": {"promptTokenCount": 5210,"candidatesTokenCount": 12,"totalTokenCount": 5622,"trafficType": "PROVISIONED_THROUGHPUT","thoughtsTokenCount": 400},"modelVersion": "gemini-2.5-pro","createTime": "2025-09-01T10:00:00.000000Z","responseId": "c1"},"traceId": "t1"}`,
	)
	// Azure OpenAI's stream: a first chunk with the prompt's filter
	// results and no model, and the usage last, as OpenAI's.
	azureStream = sse(
		`data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}}}]}`,
		`data: {"choices":[{"content_filter_results":{},"delta":{"content":"Hi","role":"assistant"},"finish_reason":null,"index":0}],"created":1741570283,"id":"chatcmpl-3","model":"gpt-4o-2024-11-20","object":"chat.completion.chunk","system_fingerprint":"fp_b705f0c291","usage":null}`,
		`data: {"choices":[],"created":1741570283,"id":"chatcmpl-3","model":"gpt-4o-2024-11-20","object":"chat.completion.chunk","system_fingerprint":"fp_b705f0c291","usage":{"completion_tokens":7,"completion_tokens_details":{"accepted_prediction_tokens":0,"audio_tokens":0,"reasoning_tokens":0,"rejected_prediction_tokens":0},"prompt_tokens":1450,"prompt_tokens_details":{"audio_tokens":0,"cached_tokens":1280},"total_tokens":1457}}`,
		`data: [DONE]`,
	)
	// Mistral's stream: the usage in the last chunk, unasked.
	mistralStream = sse(
		`data: {"id":"cf79f7daaee244b1a0ae5c7b1444424a","object":"chat.completion.chunk","created":1711563265,"model":"mistral-small-latest","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}`,
		`data: {"id":"cf79f7daaee244b1a0ae5c7b1444424a","object":"chat.completion.chunk","created":1711563265,"model":"mistral-small-latest","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"total_tokens":13,"completion_tokens":5}}`,
		`data: [DONE]`,
	)
	// Cerebras's stream: the usage with its time_info.
	cerebrasStream = sse(
		`data: {"id":"chatcmpl-4","choices":[{"delta":{"role":"assistant","content":"Hi"},"index":0}],"created":1750000000,"model":"llama3.1-8b","system_fingerprint":"fp_1","object":"chat.completion.chunk"}`,
		`data: {"id":"chatcmpl-4","choices":[{"delta":{},"finish_reason":"stop","index":0}],"created":1750000000,"model":"llama3.1-8b","system_fingerprint":"fp_1","object":"chat.completion.chunk","usage":{"prompt_tokens":38,"completion_tokens":3,"total_tokens":41,"prompt_tokens_details":{"cached_tokens":0}},"time_info":{"queue_time":0.00012,"prompt_time":0.0016,"completion_time":0.0009,"total_time":0.0043,"created":1750000000}}`,
		`data: [DONE]`,
	)
)

// usageCase is an answer and the usage the Transport must read from it.
type usageCase struct {
	name   string
	ct     string
	pieces []string
	want   failover.Usage // Upstream "a" and Cost are filled in
	none   bool           // the answer reports no usage
}

var usageCases = []usageCase{
	{name: "openai chat", ct: "application/json", pieces: []string{openAIChat},
		want: failover.Usage{Model: "gpt-4o-2024-08-06", Tokens: failover.Tokens{Input: 1117, Output: 46, Cached: 1024}}},
	{name: "openai stream include_usage", ct: "text/event-stream; charset=utf-8", pieces: openAIStream,
		want: failover.Usage{Model: "gpt-4o-mini-2024-07-18", Tokens: failover.Tokens{Input: 14, Output: 13}}},
	{name: "openai stream without usage", ct: "text/event-stream", pieces: openAIStreamNoUsage, none: true},
	{name: "openai responses", ct: "application/json", pieces: []string{openAIResponse},
		want: failover.Usage{Model: "gpt-4.1-2025-04-14", Tokens: failover.Tokens{Input: 36, Output: 87, Cached: 4}}},
	{name: "openai responses stream", ct: "text/event-stream; charset=utf-8", pieces: openAIResponseStream,
		want: failover.Usage{Model: "gpt-4.1-2025-04-14", Tokens: failover.Tokens{Input: 37, Output: 11}}},
	{name: "openai responses stream, large event", ct: "text/event-stream; charset=utf-8", pieces: openAIResponseStreamLarge,
		want: failover.Usage{Model: "gpt-4.1-2025-04-14", Tokens: failover.Tokens{Input: 37, Output: 11}}},
	{name: "openai embeddings", ct: "application/json", pieces: []string{openAIEmbedding},
		want: failover.Usage{Model: "text-embedding-3-small", Tokens: failover.Tokens{Input: 8}}},
	{name: "deepseek cache hits", ct: "application/json", pieces: []string{deepSeekChat},
		want: failover.Usage{Model: "deepseek-chat", Tokens: failover.Tokens{Input: 120, Output: 9, Cached: 64}}},
	{name: "anthropic message", ct: "application/json", pieces: []string{anthropicMessage},
		want: failover.Usage{Model: "claude-sonnet-4-5-20250929", Tokens: failover.Tokens{Input: 1213, Output: 35, Cached: 1000, CacheWrite: 200}}},
	{name: "anthropic stream", ct: "text/event-stream; charset=utf-8", pieces: anthropicStream,
		want: failover.Usage{Model: "claude-sonnet-4-5-20250929", Tokens: failover.Tokens{Input: 175, Output: 40, Cached: 100, CacheWrite: 50}}},
	{name: "anthropic gateway stream", ct: "text/event-stream", pieces: anthropicGatewayStream,
		want: failover.Usage{Model: "anthropic/claude-3.5-haiku", Tokens: failover.Tokens{Input: 9, Output: 4}}},
	{name: "gemini generateContent", ct: "application/json; charset=UTF-8", pieces: []string{geminiContent},
		want: failover.Usage{Model: "gemini-2.5-flash", Tokens: failover.Tokens{Input: 1200, Output: 111, Cached: 1000}}},
	{name: "gemini sse", ct: "text/event-stream", pieces: geminiStream,
		want: failover.Usage{Model: "gemini-2.0-flash", Tokens: failover.Tokens{Input: 10, Output: 578}}},
	{name: "gemini json array", ct: "application/json; charset=UTF-8", pieces: geminiArray,
		want: failover.Usage{Model: "gemini-1.5-flash", Tokens: failover.Tokens{Input: 17, Output: 6}}},
	{name: "groq stream x_groq", ct: "text/event-stream", pieces: groqStream,
		want: failover.Usage{Model: "llama-3.1-8b-instant", Tokens: failover.Tokens{Input: 40, Output: 25}}},
	{name: "openrouter cache write", ct: "application/json", pieces: []string{openRouterCacheWrite},
		want: failover.Usage{Model: "anthropic/claude-sonnet-4.5", Tokens: failover.Tokens{Input: 2400, Output: 50, CacheWrite: 2350}}},
	{name: "openrouter stream cache read and write", ct: "text/event-stream", pieces: openRouterCacheStream,
		want: failover.Usage{Model: "anthropic/claude-sonnet-4.5", Tokens: failover.Tokens{Input: 5000, Output: 9, Cached: 3000, CacheWrite: 1900}}},
	{name: "responses cache write", ct: "application/json", pieces: []string{responsesCacheWrite},
		want: failover.Usage{Model: "gpt-5-2025-08-07", Tokens: failover.Tokens{Input: 3000, Output: 20, Cached: 1000, CacheWrite: 1500}}},
	{name: "gemini sse, last chunk omits zeros", ct: "text/event-stream", pieces: geminiStreamLastOmits,
		want: failover.Usage{Model: "gemini-2.5-flash", Tokens: failover.Tokens{Input: 1200}}},
	{name: "anthropic iterations", ct: "application/json", pieces: []string{anthropicIterations},
		want: failover.Usage{Model: "claude-opus-4-6", Tokens: failover.Tokens{Input: 203000, Output: 4500}}},
	{name: "anthropic iterations with cache", ct: "application/json", pieces: []string{anthropicIterationsCache},
		want: failover.Usage{Model: "claude-sonnet-4-6", Tokens: failover.Tokens{Input: 150030 + 500 + 80000, Output: 4700, Cached: 80000, CacheWrite: 500}}},
	{name: "anthropic stream iterations", ct: "text/event-stream", pieces: anthropicIterationsStream,
		want: failover.Usage{Model: "claude-opus-4-6", Tokens: failover.Tokens{Input: 203000, Output: 4500}}},
	{name: "cohere chat", ct: "application/json", pieces: []string{cohereChat},
		want: failover.Usage{Tokens: failover.Tokens{Input: 5, Output: 418}}},
	{name: "cohere stream", ct: "text/event-stream", pieces: cohereStream,
		want: failover.Usage{Tokens: failover.Tokens{Input: 3, Output: 10}}},
	{name: "cohere generate", ct: "application/json", pieces: []string{cohereGenerate},
		want: failover.Usage{Tokens: failover.Tokens{Input: 11, Output: 321}}},
	{name: "bedrock converse", ct: "application/json", pieces: []string{bedrockConverse},
		want: failover.Usage{Tokens: failover.Tokens{Input: 1213, Output: 35, Cached: 1000, CacheWrite: 200}}},
	{name: "bedrock nova", ct: "application/json", pieces: []string{bedrockNova},
		want: failover.Usage{Tokens: failover.Tokens{Input: 820, Output: 9, Cached: 800}}},
	{name: "reasoning apart from completion_tokens", ct: "application/json", pieces: []string{xaiReasoning},
		want: failover.Usage{Model: "grok-3-mini", Tokens: failover.Tokens{Input: 12, Output: 168}}},
	{name: "reasoning within completion_tokens", ct: "application/json", pieces: []string{openAIReasoning},
		want: failover.Usage{Model: "o4-mini-2025-04-16", Tokens: failover.Tokens{Input: 10, Output: 200}}},
	{name: "responses reasoning apart from output_tokens", ct: "application/json", pieces: []string{responsesReasoningApart},
		want: failover.Usage{Model: "gemini-2.5-flash", Tokens: failover.Tokens{Input: 21, Output: 60}}},
	{name: "deepseek stream, hits and misses alone", ct: "text/event-stream", pieces: sse(
		`data: {"id":"1","object":"chat.completion.chunk","created":1,"model":"deepseek-chat","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"usage":null}`,
		`data: {"id":"1","object":"chat.completion.chunk","created":1,"model":"deepseek-chat","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}],"usage":{"completion_tokens":9,"prompt_cache_hit_tokens":64,"prompt_cache_miss_tokens":56}}`,
		`data: [DONE]`),
		want: failover.Usage{Model: "deepseek-chat", Tokens: failover.Tokens{Input: 120, Output: 9, Cached: 64}}},
	{name: "gemini wrapped by code assist", ct: "text/event-stream", pieces: codeAssistStream,
		want: failover.Usage{Model: "gemini-2.5-pro", Tokens: failover.Tokens{Input: 5210, Output: 412}}},
	{name: "azure stream", ct: "text/event-stream", pieces: azureStream,
		want: failover.Usage{Model: "gpt-4o-2024-11-20", Tokens: failover.Tokens{Input: 1450, Output: 7, Cached: 1280}}},
	{name: "mistral stream", ct: "text/event-stream", pieces: mistralStream,
		want: failover.Usage{Model: "mistral-small-latest", Tokens: failover.Tokens{Input: 8, Output: 5}}},
	{name: "cerebras stream", ct: "text/event-stream", pieces: cerebrasStream,
		want: failover.Usage{Model: "llama3.1-8b", Tokens: failover.Tokens{Input: 38, Output: 3, Cached: 0}}},
	{name: "json without usage", ct: "application/json", pieces: []string{`{"object":"list","data":[{"id":"gpt-4o","object":"model"}]}`}, none: true},
}

// readModes are the ways a caller reads a body: at once, and a byte at a
// time, which splits every token and escape of the answer.
var readModes = []struct {
	name string
	read func(io.Reader) ([]byte, error)
}{
	{"ReadAll", io.ReadAll},
	{"OneByte", func(r io.Reader) ([]byte, error) { return io.ReadAll(iotest.OneByteReader(r)) }},
}

// TestUsageShapes reads each provider's answer through a metered
// Transport, whole and a byte at a time: the caller gets the body as it
// was sent, OnUsage and the Trace's Usage hook the usage and cost once,
// and Health and the metrics count them.
func TestUsageShapes(t *testing.T) {
	price := failover.Cost{Input: 2, Output: 8}
	for _, tc := range usageCases {
		for _, mode := range readModes {
			t.Run(tc.name+"/"+mode.name, func(t *testing.T) {
				srv := usageServer(t, http.StatusOK, tc.ct, tc.pieces...)
				var onUsage, traced usageLog
				tr, err := failover.New(failover.Config{
					Upstreams: []failover.Upstream{{Name: "a", BaseURL: srv.URL + "/v1", Cost: price}},
					OnUsage:   onUsage.add,
				})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				ctx := failover.WithTrace(context.Background(), &failover.Trace{Usage: traced.add})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				body, err := mode.read(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if want := strings.Join(tc.pieces, ""); string(body) != want {
					t.Fatalf("the caller got\n%q\nwant\n%q", body, want)
				}
				want := tc.want
				want.Upstream, want.Cost = "a", float64(want.Input*2+want.Output*8)/1e6
				for _, l := range []struct {
					name string
					log  *usageLog
				}{{"OnUsage", &onUsage}, {"Trace.Usage", &traced}} {
					got := l.log.all()
					switch {
					case tc.none && len(got) != 0:
						t.Errorf("%s got %+v, want no call", l.name, got)
					case !tc.none && (len(got) != 1 || got[0] != want):
						t.Errorf("%s got %+v, want once %+v", l.name, got, want)
					}
				}
				h := tr.Health()[0].Usage
				wantH := failover.UsageTotals{Answers: 1, Tokens: want.Tokens, Cost: want.Cost}
				if tc.none {
					wantH = failover.UsageTotals{}
					if strings.HasPrefix(tc.ct, "text/event-stream") {
						wantH.Unreported = 1
					}
				}
				if h != wantH {
					t.Errorf("Health().Usage = %+v, want %+v", h, wantH)
				}
				var exp strings.Builder
				tr.WritePrometheus(&exp)
				if !tc.none {
					for _, s := range []string{
						fmt.Sprintf(`failover_tokens_total{upstream="a",model=%q,kind="input"} %d`, want.Model, want.Input),
						fmt.Sprintf(`failover_tokens_total{upstream="a",model=%q,kind="output"} %d`, want.Model, want.Output),
						fmt.Sprintf(`failover_cost_total{upstream="a",model=%q} %g`, want.Model, want.Cost),
					} {
						if !strings.Contains(exp.String(), s+"\n") {
							t.Errorf("the metrics lack %s:\n%s", s, grep(exp.String(), "usage", "tokens", "cost"))
						}
					}
				} else if strings.Contains(exp.String(), "failover_tokens_total") {
					t.Errorf("tokens counted for an answer without usage:\n%s", grep(exp.String(), "tokens"))
				}
			})
		}
	}
}

// Cache writes reported in prompt_tokens_details are priced at
// Cost.CacheWrite and cache reads at Cost.CachedInput, not as plain input.
func TestUsageCacheWritePriced(t *testing.T) {
	srv := usageServer(t, http.StatusOK, "text/event-stream", openRouterCacheStream...)
	var log usageLog
	price := failover.Cost{Input: 3, Output: 15, CachedInput: 0.3, CacheWrite: 3.75}
	_, send := usageTransport(t, srv, failover.Config{
		Upstreams: []failover.Upstream{{Name: "a", BaseURL: srv.URL + "/v1", Cost: price}},
		OnUsage:   log.add,
	})
	send(context.Background(), "{}")
	want := (100*3 + 3000*0.3 + 1900*3.75 + 9*15) / 1e6
	if got := log.all(); len(got) != 1 || math.Abs(got[0].Cost-want) > 1e-12 {
		t.Errorf("reported %+v, want a cost of %v", got, want)
	}
}

// grep returns the lines of s that contain any of words.
func grep(s string, words ...string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		for _, w := range words {
			if strings.Contains(line, w) {
				b.WriteString(line)
				break
			}
		}
	}
	return b.String()
}

// Each answer's usage and cost, as its body reports them: OnUsage for the
// application's books, a Trace's Usage hook to bill one request to the
// user who made it, and Health (and the metrics) for the totals. The
// stream was asked for with stream_options.include_usage, as OpenAI needs
// to report usage in a stream. The usage is known once the caller has
// read the body: the hooks run on the goroutine that reads it.
func ExampleUsage() {
	openai := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"delta":{"content":"Hello"}}],"usage":null}`+"\n\n")
		io.WriteString(w, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini-2024-07-18","choices":[],"usage":{"prompt_tokens":1200,"completion_tokens":300,"total_tokens":1500,"prompt_tokens_details":{"cached_tokens":1024}}}`+"\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer openai.Close()

	t, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{
			// Dollars per million input and output tokens.
			{Name: "openai", BaseURL: openai.URL + "/v1", Cost: failover.Cost{Input: 0.15, Output: 0.6}},
		},
		OnUsage: func(u failover.Usage) {
			fmt.Printf("%s %s: %d tokens in (%d cached), %d out, $%.6f\n", u.Upstream, u.Model, u.Input, u.Cached, u.Output, u.Cost)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	client := &http.Client{Transport: t}

	ctx := failover.WithTrace(context.Background(), &failover.Trace{
		Usage: func(u failover.Usage) { fmt.Printf("bill alice $%.6f\n", u.Cost) },
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, openai.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[]}`))
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) // an SDK reads the stream
	resp.Body.Close()

	h := t.Health()[0].Usage
	fmt.Printf("openai so far: %d answers, %d tokens, $%.6f\n", h.Answers, h.Input+h.Output, h.Cost)
	// Output:
	// openai gpt-4o-mini-2024-07-18: 1200 tokens in (1024 cached), 300 out, $0.000360
	// bill alice $0.000360
	// openai so far: 1 answers, 1500 tokens, $0.000360
}

// TestUsageConcurrent meters answers read by many goroutines at once:
// Health, the metrics and the callback count each one once.
func TestUsageConcurrent(t *testing.T) {
	srv := usageServer(t, http.StatusOK, "text/event-stream", anthropicStream...)
	var calls atomic.Int64
	tr, send := usageTransport(t, srv, failover.Config{OnUsage: func(failover.Usage) { calls.Add(1) }})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				send(context.Background(), "{}")
			}
		})
	}
	wg.Wait()
	h := tr.Health()[0].Usage
	if calls.Load() != 160 || h.Answers != 160 || h.Input != 160*175 || h.Output != 160*40 {
		t.Errorf("%d calls, Health %+v; want 160 answers of 175 and 40 tokens", calls.Load(), h)
	}
	var exp strings.Builder
	tr.WritePrometheus(&exp)
	if want := `failover_tokens_total{upstream="a",model="claude-sonnet-4-5-20250929",kind="cached"} 16000`; !strings.Contains(exp.String(), want+"\n") {
		t.Errorf("the metrics lack %s:\n%s", want, grep(exp.String(), "tokens_total"))
	}
}

// TestUsageStreamGuard checks metering behind a StreamGuard that fails
// over: the first stream begins with Anthropic's overloaded_error and is
// dropped unread by the caller; the backup's stream, its held start
// included, is the one metered, under the backup's name. Two Traces'
// Usage hooks are both called, the newer first.
func TestUsageStreamGuard(t *testing.T) {
	overloaded := usageServer(t, http.StatusOK, "text/event-stream", sse(
		"event: message_start\n"+`data: {"type":"message_start","message":{"id":"msg_0","type":"message","role":"assistant","model":"claude-x","content":[],"usage":{"input_tokens":999,"output_tokens":1}}}`,
		"event: error\n"+`data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
	)...)
	backup := usageServer(t, http.StatusOK, "text/event-stream", anthropicStream...)
	var log usageLog
	tr, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: overloaded.URL},
			{Name: "backup", BaseURL: backup.URL},
		},
		StreamGuard: &failover.StreamGuard{},
		OnUsage:     log.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var order []string
	ctx := failover.WithTrace(context.Background(), &failover.Trace{Usage: func(failover.Usage) { order = append(order, "outer") }})
	ctx = failover.WithTrace(ctx, &failover.Trace{Usage: func(failover.Usage) { order = append(order, "inner") }})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, overloaded.URL+"/v1/messages", strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(iotest.OneByteReader(resp.Body))
	resp.Body.Close()
	if string(body) != strings.Join(anthropicStream, "") {
		t.Fatalf("the caller got %q", body)
	}
	want := failover.Usage{Upstream: "backup", Model: "claude-sonnet-4-5-20250929", Tokens: failover.Tokens{Input: 175, Output: 40, Cached: 100, CacheWrite: 50}}
	if got := log.all(); len(got) != 1 || got[0] != want {
		t.Errorf("reported %+v, want once %+v", got, want)
	}
	if got := strings.Join(order, ","); got != "inner,outer" {
		t.Errorf("the Traces' Usage hooks ran %s, want inner,outer", got)
	}
	if h := tr.Health(); h[0].Usage != (failover.UsageTotals{}) {
		t.Errorf("the dropped stream was metered: %+v", h[0].Usage)
	}
}

// recordedUsage is what a full parse of a recorded body says its usage is:
// the oracle that the Transport's reading of the bytes as they come is
// checked against. It merges each usage report of the body (the members
// "usage" and "usageMetadata" of each top-level object, of each element of
// a top-level array, and of their "response", "message" and "x_groq"
// objects, and Cohere's "meta" and "delta"), each figure's last report counting (a usageMetadata replaces
// every Gemini figure), and brings the figures to Tokens by the providers'
// rules (the sum over the last usage.iterations with entries, when one
// has them).
func recordedUsage(t *testing.T, ct string, body []byte) (failover.Tokens, string, bool) {
	t.Helper()
	var docs []any
	if strings.HasPrefix(ct, "text/event-stream") {
		for _, ev := range strings.Split(strings.ReplaceAll(string(body), "\r\n", "\n"), "\n\n") {
			var data []string
			for line := range strings.Lines(ev) {
				if v, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "data:"); ok {
					data = append(data, strings.TrimPrefix(v, " "))
				}
			}
			var doc any
			if json.Unmarshal([]byte(strings.Join(data, "\n")), &doc) == nil {
				docs = append(docs, doc)
			}
		}
	} else {
		var doc any
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Fatalf("a %s body that is not JSON: %v", ct, err)
		}
		if a, ok := doc.([]any); ok {
			docs = a
		} else {
			docs = []any{doc}
		}
	}
	fields := map[string]float64{}
	model := ""
	tallied := false           // a usageMetadata was read: its absent figures are 0
	var iters *failover.Tokens // the sum over the last usage.iterations with entries
	take := func(o map[string]any, top bool) {
		for _, k := range []string{"usage", "usageMetadata", "meta"} {
			if k == "meta" && !top {
				continue
			}
			u, _ := o[k].(map[string]any)
			if its, _ := u["iterations"].([]any); len(its) > 0 {
				var sum failover.Tokens
				for _, e := range its {
					e, _ := e.(map[string]any)
					n := func(k string) int64 { v, _ := e[k].(float64); return int64(v) }
					sum.Input += n("input_tokens") + n("cache_read_input_tokens") + n("cache_creation_input_tokens")
					sum.Output += n("output_tokens")
					sum.Cached += n("cache_read_input_tokens")
					sum.CacheWrite += n("cache_creation_input_tokens")
				}
				iters = &sum
			}
			if k == "usageMetadata" && u != nil {
				tallied = true
				for _, f := range geminiFields {
					delete(fields, f)
				}
			}
			for f, v := range u {
				if n, ok := v.(float64); ok {
					fields[f] = n
				}
				if d, ok := v.(map[string]any); ok {
					for _, sub := range []string{"cached_tokens", "cache_write_tokens", "input_tokens", "output_tokens", "reasoning_tokens"} {
						if n, ok := d[sub].(float64); ok {
							fields[f+"."+sub] = n
						}
					}
				}
			}
		}
		for _, k := range []string{"model", "modelVersion"} {
			if m, ok := o[k].(string); ok && model == "" {
				model = m
			}
		}
	}
	for _, d := range docs {
		o, ok := d.(map[string]any)
		if !ok {
			continue
		}
		take(o, true)
		for _, k := range []string{"response", "message", "x_groq", "delta"} {
			if n, ok := o[k].(map[string]any); ok {
				take(n, false)
			}
		}
	}
	if iters != nil {
		return *iters, model, true
	}
	if len(fields) == 0 && !tallied {
		return failover.Tokens{}, model, false
	}
	f := func(names ...string) (float64, bool) {
		sum, any := 0.0, false
		for _, n := range names {
			if v, ok := fields[n]; ok {
				sum, any = sum+v, true
			}
			any = any || tallied && slices.Contains(geminiFields, n) // left out of the tally: 0
		}
		return sum, any
	}
	first := func(groups ...[]string) int64 {
		for _, g := range groups {
			if v, ok := f(g...); ok {
				return int64(v)
			}
		}
		return 0
	}
	tk := failover.Tokens{
		Input: first([]string{"prompt_tokens"}, []string{"prompt_cache_hit_tokens", "prompt_cache_miss_tokens"}, []string{"promptTokenCount", "toolUsePromptTokenCount"},
			[]string{"billed_units.input_tokens"}, []string{"inputTokens", "cacheReadInputTokens", "cacheReadInputTokenCount", "cacheWriteInputTokens", "cacheWriteInputTokenCount"},
			[]string{"input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}),
		Output: first([]string{"completion_tokens"}, []string{"candidatesTokenCount", "thoughtsTokenCount"},
			[]string{"billed_units.output_tokens"}, []string{"outputTokens"}, []string{"output_tokens"}),
		Cached: first([]string{"prompt_tokens_details.cached_tokens"}, []string{"prompt_cache_hit_tokens"}, []string{"cachedContentTokenCount"},
			[]string{"input_tokens_details.cached_tokens"}, []string{"cache_read_input_tokens"}, []string{"cacheReadInputTokens", "cacheReadInputTokenCount"}),
		CacheWrite: first([]string{"prompt_tokens_details.cache_write_tokens"}, []string{"input_tokens_details.cache_write_tokens"}, []string{"cache_creation_input_tokens"},
			[]string{"cacheWriteInputTokens", "cacheWriteInputTokenCount"}),
	}
	// Reasoning that total_tokens counts apart from the output reported.
	for _, shape := range [][3]string{
		{"prompt_tokens", "completion_tokens", "completion_tokens_details.reasoning_tokens"},
		{"input_tokens", "output_tokens", "output_tokens_details.reasoning_tokens"},
	} {
		in, _ := f(shape[0])
		out, ok := f(shape[1])
		r := fields[shape[2]]
		if total, hasTotal := fields["total_tokens"]; ok && hasTotal && r > 0 && total == in+out+r && tk.Output == int64(out) {
			tk.Output += int64(r)
		}
	}
	return tk, model, true
}

// geminiFields are the figures of Gemini's usageMetadata.
var geminiFields = []string{"promptTokenCount", "toolUsePromptTokenCount", "candidatesTokenCount", "thoughtsTokenCount", "cachedContentTokenCount"}

// TestUsageRecordings replays every recorded 2xx JSON and SSE answer of
// ../shared/recordings through a metered Transport, read a byte at a time:
// the usage it reports is the full parse's, and the figures of a few
// recordings are checked by hand.
func TestUsageRecordings(t *testing.T) {
	exchanges, _ := loadRecordings(t)
	byHand := map[string]failover.Usage{
		"llms_openai_internal_openaiclient_testdata_TestClient_CreateChatCompletionStream/0": {Model: "gpt-3.5-turbo-0125", Tokens: failover.Tokens{Input: 14, Output: 13}},
		"llms_anthropic_internal_anthropicclient_testdata_TestClient_CreateMessageStream/0":  {Tokens: failover.Tokens{Input: 15, Output: 13}},
		"llms_googleai_testdata_TestGoogleAIWithStreaming/0":                                 {Tokens: failover.Tokens{Input: 8, Output: 578}},
		"llms_anthropic_internal_anthropicclient_testdata_TestClient_CreateMessage/0":        {Tokens: failover.Tokens{Input: 13, Output: 35}},
		"tools_perplexity_testdata_TestPerplexityTool/0":                                     {Tokens: failover.Tokens{Input: 12, Output: 125}},
		"llms_cohere_internal_cohereclient_testdata_TestClient_CreateGeneration/0":           {Tokens: failover.Tokens{Input: 11, Output: 321}},
	}
	metered, reported, checked := 0, 0, 0
	for i := range exchanges {
		ex := &exchanges[i]
		ct := ex.resp.Header.Get("Content-Type")
		if ex.resp.StatusCode/100 != 2 || !strings.HasPrefix(ct, "application/json") && !strings.HasPrefix(ct, "text/event-stream") {
			continue
		}
		metered++
		t.Run(ex.name, func(t *testing.T) {
			srv := newRecordingServer(t, ex)
			var log usageLog
			tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{Name: "a", BaseURL: srv.URL}}, OnUsage: log.add})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			req, _ := http.NewRequest(ex.req.Method, srv.URL+ex.req.URL.RequestURI(), bytes.NewReader(ex.reqBody))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(iotest.OneByteReader(resp.Body))
			resp.Body.Close()
			if err != nil || !bytes.Equal(body, ex.respBody) {
				t.Fatalf("the caller got %d bytes (%v), want the recorded %d", len(body), err, len(ex.respBody))
			}
			wantTokens, wantModel, ok := recordedUsage(t, ct, ex.respBody)
			got := log.all()
			if !ok {
				if len(got) != 0 {
					t.Errorf("reported %+v for a body without usage", got)
				}
				return
			}
			want := failover.Usage{Upstream: "a", Model: wantModel, Tokens: wantTokens}
			if len(got) != 1 || got[0] != want {
				t.Fatalf("reported %+v, want once %+v", got, want)
			}
			reported++
			if h, ok := byHand[ex.name]; ok {
				checked++
				if got[0].Tokens != h.Tokens || h.Model != "" && got[0].Model != h.Model {
					t.Errorf("reported %+v, want %+v", got[0], h)
				}
			}
		})
	}
	if checked != len(byHand) {
		t.Errorf("checked %d recordings by hand, want %d", checked, len(byHand))
	}
	t.Logf("%d recorded answers metered, %d of them reported usage", metered, reported)
}

// usageTransport returns a Transport over srv's one upstream "a" with
// cfg's other settings, and a function that sends a request through it
// and reads the whole answer.
func usageTransport(t *testing.T, srv *httptest.Server, cfg failover.Config) (*failover.Transport, func(ctx context.Context, body string) *http.Response) {
	t.Helper()
	if cfg.Upstreams == nil {
		cfg.Upstreams = []failover.Upstream{{Name: "a", BaseURL: srv.URL + "/v1"}}
	}
	tr, err := failover.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr, func(ctx context.Context, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
}

// TestUsageWhen checks when answers are metered: with MeterUsage, OnUsage
// or a Cost, and for one request whose Trace has a Usage hook; never a
// non-2xx answer, a body the caller asked to get compressed, or a type
// other than JSON and SSE.
func TestUsageWhen(t *testing.T) {
	chat := usageServer(t, http.StatusOK, "application/json", openAIChat)
	t.Run("off", func(t *testing.T) {
		tr, send := usageTransport(t, chat, failover.Config{})
		send(context.Background(), "{}")
		if h := tr.Health()[0].Usage; h != (failover.UsageTotals{}) {
			t.Errorf("metered with metering off: %+v", h)
		}
		var log usageLog
		send(failover.WithTrace(context.Background(), &failover.Trace{Usage: log.add}), "{}")
		if got := log.all(); len(got) != 1 || got[0].Input != 1117 {
			t.Errorf("the Trace's Usage hook got %+v, want the answer's usage", got)
		}
		if h := tr.Health()[0].Usage; h.Answers != 1 {
			t.Errorf("Health counts %d answers, want the traced one", h.Answers)
		}
	})
	for _, cfg := range []struct {
		name string
		cfg  failover.Config
	}{
		{"MeterUsage", failover.Config{MeterUsage: true}},
		{"OnUsage", failover.Config{OnUsage: func(failover.Usage) {}}},
		{"Cost", failover.Config{Upstreams: []failover.Upstream{{Name: "a", BaseURL: chat.URL + "/v1", Cost: failover.Cost{Output: 1}}}}},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			tr, send := usageTransport(t, chat, cfg.cfg)
			send(context.Background(), "{}")
			if h := tr.Health()[0].Usage; h.Answers != 1 || h.Output != 46 {
				t.Errorf("Health().Usage = %+v, want the answer's", h)
			}
		})
	}
	for _, tc := range []struct {
		name string
		srv  *httptest.Server
	}{
		{"400", usageServer(t, http.StatusBadRequest, "application/json", openAIChat)},
		{"text/plain", usageServer(t, http.StatusOK, "text/plain", openAIChat)},
		{"x-ndjson", usageServer(t, http.StatusOK, "application/x-ndjson", openAIChat)},
		{"gzip", httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			io.WriteString(zw, openAIChat)
			zw.Close()
		}))},
	} {
		t.Run("not "+tc.name, func(t *testing.T) {
			defer tc.srv.Close()
			var log usageLog
			tr, _ := usageTransport(t, tc.srv, failover.Config{OnUsage: log.add})
			req, _ := http.NewRequest(http.MethodPost, tc.srv.URL+"/v1/chat/completions", strings.NewReader("{}"))
			req.Header.Set("Accept-Encoding", "gzip") // the caller's own: the body stays compressed
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if got := log.all(); len(got) != 0 {
				t.Errorf("metered: %+v", got)
			}
		})
	}
}

// TestUsageModel checks the model an answer is counted under: the
// answer's own, else the one the request asked the upstream for (with
// Upstream.Models), and past 64 models of an upstream, "other" in the
// metrics while the callback still names each.
func TestUsageModel(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Model string }
		json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasPrefix(req.Model, "anon") {
			io.WriteString(w, `{"usage":{"prompt_tokens":3,"completion_tokens":1}}`) // names no model
			return
		}
		fmt.Fprintf(w, `{"model":%q,"usage":{"prompt_tokens":3,"completion_tokens":1}}`, req.Model+"-2025")
	}))
	defer srv.Close()
	var log usageLog
	tr, send := usageTransport(t, srv, failover.Config{
		Upstreams: []failover.Upstream{{Name: "a", BaseURL: srv.URL + "/v1", Models: map[string]string{"anon": "anon-mapped", "*": "*"}}},
		OnUsage:   log.add,
	})
	send(context.Background(), `{"model":"anon"}`)
	for i := range 70 {
		send(context.Background(), fmt.Sprintf(`{"model":"m%d"}`, i))
	}
	got := log.all()
	if len(got) != 71 || got[0].Model != "anon-mapped" || got[1].Model != "m0-2025" || got[70].Model != "m69-2025" {
		t.Fatalf("models reported: %v ... (%d)", got[:2], len(got))
	}
	var exp strings.Builder
	tr.WritePrometheus(&exp)
	series := map[string]bool{}
	for line := range strings.Lines(exp.String()) {
		if rest, ok := strings.CutPrefix(line, `failover_cost_total{upstream="a",model="`); ok {
			series[rest[:strings.IndexByte(rest, '"')]] = true
		}
	}
	if len(series) != 65 || !series["anon-mapped"] || !series["m62-2025"] || series["m63-2025"] || !series["other"] {
		t.Errorf("%d models in the metrics, want 64 and other: %v", len(series), series)
	}
	if !strings.Contains(exp.String(), `failover_tokens_total{upstream="a",model="other",kind="input"} 21`+"\n") {
		t.Errorf("other does not count the 7 answers past the 64th:\n%s", grep(exp.String(), `model="other"`))
	}
}

// TestUsageClosedEarly checks that a stream closed before its end
// reports what it said by then (Anthropic's message_start: the input),
// once, and that a body closed while another goroutine reads it is safe.
func TestUsageClosedEarly(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, anthropicStream[0])
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	var log usageLog
	// Streams pass through: the one event sent is not content.
	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{Name: "a", BaseURL: srv.URL}}, OnUsage: log.add, StreamGuard: &failover.StreamGuard{HoldEvents: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(anthropicStream[0]))
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	read := make(chan error)
	go func() {
		_, err := resp.Body.Read(make([]byte, 1024)) // blocks until Close
		read <- err
	}()
	resp.Body.Close()
	if err := <-read; err == nil {
		t.Error("a Read on a closed body did not fail")
	}
	resp.Body.Close()
	want := failover.Usage{Upstream: "a", Model: "claude-sonnet-4-5-20250929", Tokens: failover.Tokens{Input: 175, Output: 1, Cached: 100, CacheWrite: 50}}
	if got := log.all(); len(got) != 1 || got[0] != want {
		t.Errorf("reported %+v, want once %+v", got, want)
	}
	if h := tr.Health()[0].Usage; h.Unreported != 0 {
		t.Errorf("a stream closed early counted as unreported: %+v", h)
	}
}

// TestUsageStreamSplitBOM meters a stream that begins with a byte order
// mark split across the upstream's first writes, each write read apart
// before the next is sent: the BOM is dropped and the first event, whose
// message_start has the input and the model, is read.
func TestUsageStreamSplitBOM(t *testing.T) {
	start := `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":125,"output_tokens":1}}}`
	rest := sse(
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`,
		"event: message_delta\n"+`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":40}}`,
		"event: message_stop\n"+`data: {"type":"message_stop"}`,
	)
	want := failover.Usage{Upstream: "a", Model: "claude-sonnet-4-5-20250929", Tokens: failover.Tokens{Input: 125, Output: 40}}
	for _, first := range []struct{ name, event string }{
		{"event line first", "event: message_start\n" + start + "\n\n"}, // as Anthropic sends it
		{"data line first", start + "\n\n"},
	} {
		stream := "\xEF\xBB\xBF" + first.event + strings.Join(rest, "")
		for cut := 1; cut <= 2; cut++ {
			t.Run(fmt.Sprintf("%s/BOM cut after byte %d", first.name, cut), func(t *testing.T) {
				pieces := []string{stream[:cut], stream[cut:]}
				next := make(chan struct{}) // the caller read a piece: send the next
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					for i, p := range pieces {
						if i > 0 {
							select {
							case <-next:
							case <-r.Context().Done():
								return
							}
						}
						io.WriteString(w, p)
						w.(http.Flusher).Flush()
					}
				}))
				defer srv.Close()
				var log usageLog
				tr, err := failover.New(failover.Config{
					Upstreams:   []failover.Upstream{{Name: "a", BaseURL: srv.URL + "/v1"}},
					MeterUsage:  true,
					OnUsage:     log.add,
					StreamGuard: &failover.StreamGuard{HoldEvents: -1}, // the pieces come as the caller reads: none is held
				})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader("{}"))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				buf := make([]byte, 4<<10)
				n, err := resp.Body.Read(buf)
				if err != nil || string(buf[:n]) != pieces[0] {
					t.Fatalf("first read %q (%v), want %q", buf[:n], err, pieces[0])
				}
				close(next)
				tail, err := io.ReadAll(resp.Body)
				if err != nil || string(tail) != pieces[1] {
					t.Fatalf("the caller got %q (%v), want %q", tail, err, pieces[1])
				}
				if got := log.all(); len(got) != 1 || got[0] != want {
					t.Errorf("got %+v, want once %+v", got, want)
				}
			})
		}
	}
}

// TestUsageBounded checks that a usage object larger than the meter
// keeps (4 KiB) is skipped whole rather than kept or misread, and that
// what follows is still read.
func TestUsageBounded(t *testing.T) {
	pad := strings.Repeat(`"x":1,`, 1000)
	var log usageLog
	srv := usageServer(t, http.StatusOK, "text/event-stream", sse(
		`data: {"usage":{`+pad+`"prompt_tokens":999,"completion_tokens":999}}`,
		`data: {"model":"m","usage":{"prompt_tokens":5,"completion_tokens":6}}`,
	)...)
	_, send := usageTransport(t, srv, failover.Config{OnUsage: log.add})
	send(context.Background(), "{}")
	if got := log.all(); len(got) != 1 || got[0].Input != 5 || got[0].Output != 6 || got[0].Model != "m" {
		t.Errorf("reported %+v, want the second event's usage", got)
	}
}

// An iterations array of any length is summed, though it is far larger
// than the 4 KiB a usage object may take: its entries count one by one,
// in a JSON answer and in a stream's message_delta, however it is read.
func TestUsageIterationsBeyondCapture(t *testing.T) {
	const n = 250
	entry := `{"type":"message","input_tokens":1000,"cache_read_input_tokens":10,"cache_creation_input_tokens":5,"cache_creation":{"ephemeral_5m_input_tokens":5,"ephemeral_1h_input_tokens":0},"output_tokens":20}`
	its := `[` + strings.Repeat(entry+`,`, n-1) + `{"type":"compaction","input_tokens":180000,"output_tokens":3500}]`
	usage := `{"input_tokens":1000,"cache_read_input_tokens":10,"cache_creation_input_tokens":5,"output_tokens":20,"iterations":` + its + `}`
	want := failover.Usage{Upstream: "a", Model: "claude-opus-4-6", Tokens: failover.Tokens{
		Input: (n-1)*1015 + 180000, Output: (n-1)*20 + 3500, Cached: (n - 1) * 10, CacheWrite: (n - 1) * 5,
	}}
	for _, tc := range []struct {
		name, ct string
		pieces   []string
	}{
		{"json", "application/json", []string{`{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-4-6","content":[],"usage":` + usage + `}`}},
		{"stream", "text/event-stream", sse(
			"event: message_start\n"+`data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-4-6","content":[],"usage":{"input_tokens":1000,"output_tokens":1}}}`,
			"event: message_delta\n"+`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":`+usage+`}`,
			"event: message_stop\n"+`data: {"type":"message_stop"}`,
		)},
	} {
		for _, mode := range readModes {
			srv := usageServer(t, http.StatusOK, tc.ct, tc.pieces...)
			var log usageLog
			tr, _ := usageTransport(t, srv, failover.Config{OnUsage: log.add})
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader("{}"))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			mode.read(resp.Body)
			resp.Body.Close()
			if got := log.all(); len(got) != 1 || got[0] != want {
				t.Errorf("%s/%s: reported %+v, want once %+v", tc.name, mode.name, got, want)
			}
		}
	}
}

// Bedrock's InvokeModel reports what it bills in headers: they are the
// usage of an answer whose body reports none in a shape the meter reads
// (Llama's counts), and the body's usage wins when it has one.
func TestUsageBedrockHeaders(t *testing.T) {
	bedrock := func(body string, kv ...string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for i := 0; i+1 < len(kv); i += 2 {
				w.Header().Set(kv[i], kv[i+1])
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body)
		}))
		t.Cleanup(s.Close)
		return s
	}
	llama := `{"generation":" AI is a machine that thinks.","prompt_token_count":18,"generation_token_count":52,"stop_reason":"stop"}`
	for _, tc := range []struct {
		name string
		srv  *httptest.Server
		want failover.Tokens
	}{
		{"llama", bedrock(llama, "X-Amzn-Bedrock-Input-Token-Count", "18", "X-Amzn-Bedrock-Output-Token-Count", "52", "X-Amzn-Bedrock-Invocation-Latency", "320"),
			failover.Tokens{Input: 18, Output: 52}},
		{"cache headers", bedrock(`{"outputs":[{"text":"Hi","stop_reason":"stop"}]}`,
			"X-Amzn-Bedrock-Input-Token-Count", "13", "X-Amzn-Bedrock-Output-Token-Count", "35",
			"X-Amzn-Bedrock-Cache-Read-Input-Token-Count", "1000", "X-Amzn-Bedrock-Cache-Write-Input-Token-Count", "200"),
			failover.Tokens{Input: 1213, Output: 35, Cached: 1000, CacheWrite: 200}},
		{"the body's usage wins", bedrock(anthropicMessage, "X-Amzn-Bedrock-Input-Token-Count", "1", "X-Amzn-Bedrock-Output-Token-Count", "1"),
			failover.Tokens{Input: 1213, Output: 35, Cached: 1000, CacheWrite: 200}},
	} {
		var log usageLog
		_, send := usageTransport(t, tc.srv, failover.Config{OnUsage: log.add})
		send(context.Background(), "{}")
		if got := log.all(); len(got) != 1 || got[0].Tokens != tc.want {
			t.Errorf("%s: reported %+v, want once %+v", tc.name, got, tc.want)
		}
	}
}

// TestUsageFirstByte checks that a metered stream's first byte is still
// timed (the meter does what firstByteBody does, in one wrapper).
func TestUsageFirstByte(t *testing.T) {
	srv := usageServer(t, http.StatusOK, "text/event-stream", openAIStream...)
	tr, send := usageTransport(t, srv, failover.Config{MeterUsage: true})
	send(context.Background(), "{}")
	var exp strings.Builder
	tr.WritePrometheus(&exp)
	if !strings.Contains(exp.String(), `failover_stream_first_byte_seconds_count{upstream="a"} 1`+"\n") {
		t.Errorf("the first byte was not timed:\n%s", grep(exp.String(), "first_byte_seconds_count"))
	}
}

// TestUsageNoCredential checks that what the callbacks and Health get
// holds none of the keys of the request and the upstream.
func TestUsageNoCredential(t *testing.T) {
	const callerKey, upstreamKey = "sk-caller-0123456789abcdef", "sk-upstream-0123456789abcdef"
	srv := usageServer(t, http.StatusOK, "text/event-stream", openAIStream...)
	var log usageLog
	tr, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{
			{Name: "a", BaseURL: srv.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + upstreamKey}}, Cost: failover.Cost{Input: 1}},
		},
		OnUsage: log.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx := failover.WithTrace(context.Background(), &failover.Trace{Usage: log.add})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions?key="+callerKey, strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+callerKey)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h, _ := json.Marshal(tr.Health())
	all := fmt.Sprintf("%+v %s", log.all(), h)
	if len(log.all()) != 2 || strings.Contains(all, callerKey) || strings.Contains(all, upstreamKey) {
		t.Errorf("got %s", all)
	}
	if want := `"usage":{"answers":1,"input_tokens":14,"output_tokens":13,"cached_tokens":0,"cache_write_tokens":0,"cost":0.000014,"unreported":0}`; !strings.Contains(string(h), want) {
		t.Errorf("Health's JSON %s lacks %s", h, want)
	}
}

// TestScoreObservedCost checks that Score ranks by what a request costs
// once usage is observed, not only by the price: b's price is twice a's,
// but a's answers take ten times the tokens.
func TestScoreObservedCost(t *testing.T) {
	a := failover.Candidate{Index: 0, SuccessRate: 1, Cost: failover.Cost{Input: 1, Output: 4}}
	b := failover.Candidate{Index: 1, SuccessRate: 1, Cost: failover.Cost{Input: 2, Output: 8}}
	order := func(cands ...failover.Candidate) []int { return failover.Score{}.Order(nil, cands) }
	if got := order(a, b); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("by price: %v, want a first", got)
	}
	a.InputTokens, a.OutputTokens, a.RequestCost = 10_000, 4_000, (10_000*1+4_000*4)/1e6
	if got := order(a, b); !slices.Equal(got, []int{0, 1}) {
		t.Errorf("a observed, b priced at a's tokens: %v, want a first", got)
	}
	b.InputTokens, b.OutputTokens, b.RequestCost = 1_000, 400, (1_000*2+400*8)/1e6
	if got := order(a, b); !slices.Equal(got, []int{1, 0}) {
		t.Errorf("both observed: %v, want b, the cheaper per request, first", got)
	}
}

// TestScoreObservedCostTransport checks the same through a Transport: a
// and b have one price, a's answers report ten times b's tokens, and
// Score, which tried a first while nothing was observed, tries b first
// once each has answered. (Upstream.Models steers the first requests:
// only b serves "small", only a "large". The latency term is left out:
// loopback latencies would decide the ties.)
func TestScoreObservedCostTransport(t *testing.T) {
	answer := func(in, out int) *httptest.Server {
		return usageServer(t, http.StatusOK, "application/json", fmt.Sprintf(`{"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, in, out))
	}
	a, b := answer(10_000, 4_000), answer(1_000, 400)
	price := failover.Cost{Input: 1, Output: 4}
	var order []string
	tr, err := failover.New(failover.Config{
		Router: failover.Score{Success: 0.5, Cost: 0.5},
		Upstreams: []failover.Upstream{
			{Name: "a", BaseURL: a.URL + "/v1", Cost: price, Models: map[string]string{"large": "large", "both": "both"}},
			{Name: "b", BaseURL: b.URL + "/v1", Cost: price, Models: map[string]string{"small": "small", "both": "both"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	send := func(model string) string {
		t.Helper()
		var got string
		ctx := failover.WithTrace(context.Background(), &failover.Trace{Done: func(d failover.TraceDone) { got = d.Upstream }})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.URL+"/v1/chat/completions", strings.NewReader(`{"model":"`+model+`"}`))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return got
	}
	order = append(order, send("both"))  // nothing observed: a, by Index
	order = append(order, send("large")) // a's usage
	order = append(order, send("small")) // b's
	order = append(order, send("both"))  // b costs a tenth per request
	if !slices.Equal(order, []string{"a", "a", "b", "b"}) {
		t.Errorf("answered by %v, want a a b b", order)
	}
	if h := tr.Health(); h[0].Usage.Cost != 2*(10_000+4*4_000)/1e6 || h[1].Usage.Cost != 2*(1_000+4*400)/1e6 {
		t.Errorf("spend a %g, b %g", h[0].Usage.Cost, h[1].Usage.Cost)
	}
}

// bodyBase answers every request with a 200 of Content-Type ct and body,
// read from memory.
type bodyBase struct {
	ct   string
	body []byte
}

func (b bodyBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		r.Body.Close()
	}
	return &http.Response{
		StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {b.ct}},
		Body:          io.NopCloser(bytes.NewReader(b.body)),
		ContentLength: int64(len(b.body)),
		Request:       r,
	}, nil
}

// usageBodies are 1 MiB answers of the three kinds the meter reads
// differently: an OpenAI stream with include_usage (each event held and
// searched, the last one scanned), a completion whose content is one long
// string of prose (three escapes per 90 bytes, scanned eight bytes at a
// time), and an embedding's numbers (long runs without a string or a
// bracket, found with bytes.IndexByte).
func usageBodies() []bodyBase {
	const size = 1 << 20
	var stream bytes.Buffer
	for i := 0; stream.Len() < size; i++ {
		fmt.Fprintf(&stream, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":" word%d, \"quoted\""},"logprobs":null,"finish_reason":null}],"usage":null}`+"\n\n", i)
	}
	stream.WriteString(openAIStream[3] + openAIStream[4])
	var text bytes.Buffer
	text.WriteString(`{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"`)
	for text.Len() < size {
		text.WriteString(`Here is a line of an answer, with \"a quote\" in it, as prose has them; it ends here.\n`)
	}
	text.WriteString(`"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":250000}}`)
	var nums bytes.Buffer
	nums.WriteString(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[`)
	for i := 0; nums.Len() < size; i++ {
		fmt.Fprintf(&nums, "%.9f,", float64(i%1000)/1e4-0.05)
	}
	nums.WriteString(`0]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`)
	return []bodyBase{{"text/event-stream", stream.Bytes()}, {"application/json", text.Bytes()}, {"application/json", nums.Bytes()}}
}

// BenchmarkUsage is what metering costs the reader of a body: a 1 MiB
// answer read in 4 KiB reads (a bufio.Reader's) through a Transport,
// meter=off (a stream's body is timed to its first byte, a JSON one
// unwrapped) and meter=on, for each of usageBodies (MB/s: b.SetBytes).
func BenchmarkUsage(b *testing.B) {
	bodies := usageBodies()
	for i, name := range []string{"sse", "json_text", "json_numbers"} {
		for _, meter := range []string{"off", "on"} {
			b.Run("body="+name+"/meter="+meter, func(b *testing.B) {
				tr, err := failover.New(failover.Config{
					Base:       bodies[i],
					Upstreams:  []failover.Upstream{{Name: "a", BaseURL: "https://a.example/v1"}},
					MeterUsage: meter == "on",
				})
				if err != nil {
					b.Fatal(err)
				}
				defer tr.Close()
				req, _ := http.NewRequest(http.MethodPost, "https://a.example/v1/chat/completions", nil)
				buf := make([]byte, 4<<10)
				b.SetBytes(int64(len(bodies[i].body)))
				b.ReportAllocs()
				for b.Loop() {
					resp, err := tr.RoundTrip(req)
					if err != nil {
						b.Fatal(err)
					}
					for {
						if _, err := resp.Body.Read(buf); err != nil {
							break
						}
					}
					resp.Body.Close()
				}
				if h := tr.Health()[0].Usage; (meter == "on") != (h.Answers > 0) {
					b.Fatalf("metering %s, Health says %+v", meter, h)
				}
			})
		}
	}
}

// pieceReader returns r's bytes in pieces whose sizes cycle through
// sizes (each at least 1).
type pieceReader struct {
	r     io.Reader
	sizes []byte
	n     int
}

func (p *pieceReader) Read(b []byte) (int, error) {
	size := 1 + int(p.sizes[p.n%len(p.sizes)])
	p.n++
	return p.r.Read(b[:min(len(b), size)])
}

// FuzzUsage checks that the usage read from an answer does not depend on
// how its body is split into reads, and that no body crashes the meter:
// the same body read whole and in the pieces the fuzzer picks reports the
// same usage, or none both times.
func FuzzUsage(f *testing.F) {
	for _, tc := range usageCases {
		if body := strings.Join(tc.pieces, ""); len(body) < 4<<10 {
			f.Add(body, strings.HasPrefix(tc.ct, "text/event-stream"), []byte{0, 7, 3, 200, 1})
		}
	}
	f.Add(`{"usage":{"prompt_tokens":1e400,"completion_tokens":-3,"input_tokens":"7"},"model":"\u00e9\"x"}`, false, []byte{1})
	f.Add("data: {\"usage\":\r\ndata: {\"prompt_tokens\":4}}\r\rdata: [DONE]", true, []byte{2, 0})
	f.Add(`{"usage":{"input_tokens":9,"iterations":[{"input_tokens":1,"x":[}],{"output_tokens":2},3,[{}]]},"model":"m"}`, false, []byte{4, 1})
	f.Add("data: {\"usage\":{\"iterations\":[{\"input_tokens\":1}]}}\n\ndata: {\"usage\":{\"iterations\":[]}}\n\n", true, []byte{0, 9})
	var (
		log  usageLog
		base fuzzBody // the answer of the input being run
	)
	tr, err := failover.New(failover.Config{
		Base:      &base,
		Upstreams: []failover.Upstream{{Name: "a", BaseURL: "https://a.example/v1"}},
		OnUsage:   log.add,
	})
	if err != nil {
		f.Fatal(err)
	}
	defer tr.Close()
	f.Fuzz(func(t *testing.T, body string, stream bool, sizes []byte) {
		if len(sizes) == 0 {
			sizes = []byte{0}
		}
		base.b = bodyBase{"application/json", []byte(body)}
		if stream {
			base.b.ct = "text/event-stream"
		}
		read := func(split bool) []failover.Usage {
			log.mu.Lock()
			log.got = nil
			log.mu.Unlock()
			req, _ := http.NewRequest(http.MethodPost, "https://a.example/v1/chat/completions", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			var r io.Reader = resp.Body
			if split {
				r = &pieceReader{r: r, sizes: sizes}
			}
			got, err := io.ReadAll(r)
			resp.Body.Close()
			if err != nil || string(got) != body {
				t.Fatalf("the caller got %q (%v), want the body", got, err)
			}
			return log.all()
		}
		whole, split := read(false), read(true)
		if !slices.Equal(whole, split) {
			t.Fatalf("read whole: %+v; in pieces: %+v", whole, split)
		}
		if len(whole) > 1 {
			t.Fatalf("reported %d times", len(whole))
		}
		if len(whole) == 1 {
			u := whole[0]
			if u.Input < 0 || u.Output < 0 || u.Cached < 0 || u.CacheWrite < 0 || u.Cached+u.CacheWrite > u.Input || !utf8.ValidString(u.Model) {
				t.Fatalf("reported %+v", u)
			}
		}
	})
}

// fuzzBody is a Base that answers with b, which FuzzUsage sets for each
// input (the inputs of a fuzzing process run one at a time).
type fuzzBody struct{ b bodyBase }

func (f *fuzzBody) RoundTrip(r *http.Request) (*http.Response, error) { return f.b.RoundTrip(r) }

// TestUsageLargestPrice checks that the largest prices New takes, priced
// at counts past any a provider reports, cost a finite amount: Health's
// JSON encodes them (+Inf it cannot), and a price past them is refused.
func TestUsageLargestPrice(t *testing.T) {
	srv := usageServer(t, 200, "application/json", `{"usage":{"input_tokens":1e300,"output_tokens":1e300,"cache_read_input_tokens":1e300,"cache_creation_input_tokens":1e300}}`)
	cost := failover.Cost{Input: 1e100, Output: 1e100, CachedInput: 1e100, CacheWrite: 1e100}
	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{BaseURL: srv.URL, Cost: cost}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for range 3 {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/messages", strings.NewReader("{}"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if _, err := json.Marshal(tr.Health()); err != nil {
		t.Errorf("Health's JSON: %v (usage %+v)", err, tr.Health()[0].Usage)
	}
	cost.Input = 1e101
	if _, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{BaseURL: srv.URL, Cost: cost}}}); err == nil {
		t.Error("New took a price of 1e101")
	}
}
