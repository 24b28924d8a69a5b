package failover

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// Content-aware fallback: an answer that says this upstream cannot serve
// this request while another may (the prompt is too long for its model, or
// its provider's policy refused the content) is [Unservable]. The Transport
// reads the first bytes of the statuses that carry these answers before it
// classifies (peekBody), the classifier reads them through [BodyPrefix],
// and DefaultClassifier decides from them (unservable).

// unservablePeek is how much of a 400's, 403's or 413's body is read before
// the attempt is classified. The error bodies that say a request cannot be
// served are a few hundred bytes (Azure's content filter, the largest, about
// 700).
const unservablePeek = 4 << 10

// peekable reports whether a response with status code can say that its
// upstream cannot serve the request: a 400 (every provider), a 403
// (OpenRouter's moderation) or a 413 (Groq's per-minute token limit,
// Anthropic's "Prompt is too long" on Vertex AI). No other status, and no
// 2xx, has its body read.
func peekable(code int) bool {
	return code == http.StatusBadRequest || code == http.StatusForbidden || code == http.StatusRequestEntityTooLarge
}

// peekBody reads at most unservablePeek bytes of resp's body, for at most
// drainTimeout, and gives resp a body that reads the same bytes: those read,
// then the rest (see peek). It stops at the end of the JSON object the body
// begins with, or at once when the body begins with anything else, so an
// error body that comes slowly or in parts costs no more wait than it
// takes; a body that stalls is judged by what arrived, and handed on
// whole.
func peekBody(resp *http.Response) {
	if resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	var end jsonEnd
	_, resp.Body = peek(resp.Body, unservablePeek, drainTimeout, end.judge)
}

// BodyPrefix returns the first bytes of resp's body as the [Transport] read
// them before classifying resp, and whether it read them: at most 4 KiB of a
// 400's, 403's or 413's body, up to the end of the JSON object it begins
// with (for a body that is not JSON, what its first read gave), fewer when
// the body is shorter or stalled. It
// reads nothing itself, so a [Classifier] may call it; resp's body still
// reads from its first byte. It returns false for any other response: a
// status whose body is not read, an empty body, a response that did not
// come through a Transport. The bytes are a copy.
func BodyPrefix(resp *http.Response) ([]byte, bool) {
	if p := bodyPrefix(resp); p != nil {
		return bytes.Clone(p), true
	}
	return nil, false
}

// bodyPrefix is the bytes resp's body was judged by (see peek), or nil
// when it was not peeked.
func bodyPrefix(resp *http.Response) []byte {
	if resp == nil {
		return nil
	}
	switch b := resp.Body.(type) {
	case *peekedBody:
		return b.prefix
	case *memoryBody:
		return b.prefix
	}
	return nil
}

// unservable reports whether resp's body, as peeked, says that its upstream
// cannot serve the request while another may.
func unservable(resp *http.Response) bool {
	p := bodyPrefix(resp)
	return p != nil && unservableBody(p)
}

// unservableCodes are values of an error's "code" or "type" (at any depth:
// Azure nests one in "innererror") that say its upstream cannot serve the
// request while another may. They are compared exactly.
var unservableCodes = []string{
	// OpenAI and Azure OpenAI, error.code of a prompt longer than the
	// model's context: {"error":{"message":"This model's maximum context
	// length is 4097 tokens. However, you requested 4120 tokens ...",
	// "type":"invalid_request_error","param":"messages","code":
	// "context_length_exceeded"}} (github.com/mckaywrigley/chatbot-ui
	// issue 102; Azure: github.com/Azure/azure-sdk-for-net issue 41892).
	// Groq sends the same code with the message "Please reduce the length
	// of the messages or completion." (github.com/letta-ai/letta issue
	// 1963).
	"context_length_exceeded",

	// Azure OpenAI, a prompt its content filter refused: error.code
	// "content_filter", "status":400, and innererror.code
	// "ResponsibleAIPolicyViolation" with the content_filter_result
	// (github.com/Mirascope/mirascope, python/tests/e2e/output/snapshots/
	// test_refusal/azure-openai_completions_gpt_4o_mini_snapshots.py; the
	// code's only value in Azure's innerErrorCode schema).
	"content_filter",
	"ResponsibleAIPolicyViolation",

	// OpenAI, a prompt its safety system refused (images):
	// "type":"invalid_request_error", "code":"content_policy_violation",
	// "Your request was rejected as a result of our safety system."
	// (LiteLLM's exception mapping, litellm/litellm_core_utils/
	// exception_mapping_utils.py; github.com/TheoKanning/openai-java
	// issue 446).
	"content_policy_violation",
}

// unservableMessages are the starts of an error's "message" (or of an
// "error" that is a string) that say its upstream cannot serve the request
// while another may. A message must begin with one, case aside: the phrase
// further in (a validation error that quotes the caller's prompt, as
// pydantic's input_value does in vLLM's 400s) says nothing. A pattern that
// ends in a letter or a digit must also end a word of the message: what
// follows is the message's end, one of . , ; : or " (". So a message that
// begins with a caller's own words (OpenRouter's "<model> is not a valid
// model ID", Anthropic's "<field>: Extra inputs are not permitted") says
// nothing either, unless those words are a whole pattern followed by such
// a mark. In a pattern, # is one or more digits, * up to 100 bytes of
// anything but a newline or a quote, as few as fit, and a final $ the
// message's end. Each must also be specific: a caller's own mistake
// ("max_tokens is too large", "string too long. Expected a string with
// maximum length", "Too many tokens in batch") begins with none of them.
var unservableMessages = []string{
	// OpenAI and Azure OpenAI (with the code above): "This model's maximum
	// context length is 4097 tokens. However, you requested 4120 tokens
	// ...", DeepSeek (with "code":"invalid_request_error",
	// github.com/FoundationAgents/OpenManus issue 79), vLLM
	// ({"object":"error", ..., "type":"BadRequestError","code":400},
	// github.com/vllm-project/vllm issue 20409, github.com/HKUSTDial/
	// Alpha-SQL issue 5).
	"this model's maximum context length is # tokens",
	// Newer vLLM, for a prompt that leaves no room for max_tokens: "'max_tokens'
	// or 'max_completion_tokens' is too large: 8000. This model's maximum
	// context length is 4096 tokens and your request has 2778 input tokens".
	"'max_tokens' or 'max_completion_tokens' is too large: #. this model's maximum context length is # tokens and your request has # input tokens",
	// OpenRouter, with "code":400: "This endpoint's maximum context length
	// is 131072 tokens. However, you requested about 141607 tokens"
	// (github.com/Aider-AI/aider issue 3721).
	"this endpoint's maximum context length is # tokens",
	// Mistral, in {"object":"error","message":...,"type":
	// "invalid_request_error","param":null,"code":null}: "Prompt contains
	// 300000 tokens, too large for model with 131072 maximum context length"
	// (the shape: github.com/aurelio-labs/semantic-router issue 297).
	"prompt contains # tokens, too large for model with # maximum context length",
	// SGLang: "The input (9000 tokens) is longer than the model's context
	// length (8192 tokens)." (github.com/BerriAI/litellm issue 10793).
	"the input (# tokens) is longer than the model's context length (# tokens)",

	// Anthropic: {"type":"error","error":{"type":"invalid_request_error",
	// "message":"prompt is too long: 208310 tokens > 200000 maximum"},
	// "request_id":"req_..."} (github.com/anthropics/claude-code issue
	// 12186); Claude on Vertex AI answers a 413 "Prompt is too long"
	// (github.com/anthropics/anthropic-sdk-python issue 1028).
	"prompt is too long: # tokens > # maximum",
	"prompt is too long$",

	// Gemini: {"error":{"code":400,"message":"The input token count
	// (1200293) exceeds the maximum number of tokens allowed (1048576).",
	// "errors":[...],"status":"INVALID_ARGUMENT"}}
	// (github.com/google-gemini/gemini-cli issue 6678); Gemini 2.5 says it
	// without the count (github.com/BerriAI/litellm issue 18282).
	"the input token count* exceeds the maximum number of tokens allowed",

	// Vertex AI: "Unable to submit request because the input token count
	// is 1251952 but model only supports up to 1048576."
	// (github.com/google-gemini/gemini-cli issue 19727).
	"unable to submit request because the input token count is # but model only supports up to #",

	// Groq, a 413 for a request beyond the organization's tokens per
	// minute, which no wait makes fit: "Request too large for model
	// `llama-3.1-70b-versatile` in organization `org_...` on tokens per
	// minute (TPM): Limit 6000, Requested 18993, ...", "type":"tokens",
	// "code":"rate_limit_exceeded" (github.com/bklieger-groq/
	// NotebookLlama-Groq issue 1).
	"request too large for model * in organization * on tokens per minute",

	// Anthropic, a 400 invalid_request_error "Output blocked by content
	// filtering policy" (github.com/anthropics/claude-code issue 43487).
	"output blocked by content filtering policy",

	// Azure OpenAI, with content_filter above: "The response was filtered
	// due to the prompt triggering Azure OpenAI's content management
	// policy."
	"the response was filtered due to the prompt triggering azure openai's content management policy",

	// OpenAI's reasoning models, "code":"invalid_prompt": "Invalid prompt:
	// your prompt was flagged as potentially violating our usage policy."
	// (github.com/alan-turing-institute/t0-1 issue 69).
	"invalid prompt: your prompt was flagged as potentially violating our usage policy",

	// A LiteLLM proxy upstream, which names its own verdict first:
	// "litellm.BadRequestError: litellm.ContextWindowExceededError:
	// AnthropicError - {...}" with "code":"400" (github.com/BerriAI/litellm
	// issue 7259); "litellm.ContentPolicyViolationError: ..." for a
	// refused prompt (LiteLLM's exception mapping, litellm/
	// litellm_core_utils/exception_mapping_utils.py). Its message for a
	// caller's own mistake begins "litellm.BadRequestError: " and names
	// the provider's error next.
	"litellm.contextwindowexceedederror:",
	"litellm.badrequesterror: litellm.contextwindowexceedederror:",
	"litellm.contentpolicyviolationerror:",
	"litellm.badrequesterror: litellm.contentpolicyviolationerror:",
}

// matchStart reports whether s begins with pattern (see
// unservableMessages), ASCII letters compared without case.
func matchStart(s, pattern string) bool {
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '#':
			n := 0
			for n < len(s) && '0' <= s[n] && s[n] <= '9' {
				n++
			}
			if n == 0 {
				return false
			}
			s = s[n:]
		case '*':
			rest := pattern[i+1:]
			for n := 0; n <= 100 && n <= len(s); n++ {
				if matchStart(s[n:], rest) {
					return true
				}
				if n < len(s) && (s[n] == '\n' || s[n] == '\'' || s[n] == '"') {
					return false
				}
			}
			return false
		case '$':
			return s == ""
		default:
			if len(s) == 0 || lower(s[0]) != c {
				return false
			}
			s = s[1:]
		}
	}
	// A pattern that ends a word ends one of s too.
	if c := lower(pattern[len(pattern)-1]); c == '#' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' {
		return s == "" || strings.IndexByte(".,;:", s[0]) >= 0 || strings.HasPrefix(s, " (")
	}
	return true
}

// lower is c in lower case, when it is an ASCII letter.
func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// unservableKey is a key whose presence says so whatever its value:
// OpenRouter's 403 "Your chosen model requires moderation and your input
// was flagged" carries error.metadata.reasons and .flagged_input
// (openrouter.ai/docs/errors, "Moderation Errors").
const unservableKey = "flagged_input"

// unservableBody reports whether body, a JSON error or the first bytes of
// one, says its upstream cannot serve the request while another may: a
// "code" or "type" among unservableCodes, a "message" (or a string "error")
// that begins as one of unservableMessages does, or a flagged_input. Only the JSON read up
// to the first syntax error counts, so a body cut short is judged by the
// values it holds whole; a body that is not JSON says nothing. A marker
// anywhere else (in an echoed prompt under another key, in a "param") does
// not count.
func unservableBody(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	// The containers open at the token read, and for each object whether
	// its next string is a key, and the key of its value being read.
	type level struct {
		object, wantKey bool
		key             string
	}
	var stack []level
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *level
		if n := len(stack); n > 0 {
			top = &stack[n-1]
		}
		if s, ok := tok.(string); ok && top != nil && top.object && top.wantKey {
			top.key, top.wantKey = s, false
			if s == unservableKey {
				return true
			}
			continue
		}
		key := ""
		if top != nil && top.object {
			key = top.key
			top.wantKey = true // after this value, the next key
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if top != nil && top.object {
					top.wantKey = true
				}
				stack = append(stack, level{object: v == '{', wantKey: v == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
		case string:
			if unservableValue(key, v) {
				return true
			}
		}
	}
}

// unservableValue reports whether the string value v of key says so.
func unservableValue(key, v string) bool {
	switch key {
	case "code", "type":
		for _, c := range unservableCodes {
			if v == c {
				return true
			}
		}
	case "message", "error":
		v = strings.TrimLeft(v, " \t\r\n")
		for _, p := range unservableMessages {
			if matchStart(v, p) {
				return true
			}
		}
	}
	return false
}
