package failover

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// Content-aware fallback: an answer that says this upstream cannot serve
// this request while another may is [Unservable]: the prompt is too long
// for its model (contextTooLong). An answer that says the provider's
// content policy refused the request (contentRefused) is the caller's
// answer, [Rejected], unless Config.FailoverContentPolicy says otherwise.
// The Transport peeks at the bodies of the statuses that carry such
// answers (peekBody), and DefaultClassifier reads them through
// [BodyPrefix].

// unservablePeek is how much of a 400's, 403's or 413's body is read before
// the attempt is classified: such error bodies are at most about 700 bytes.
const unservablePeek = 4 << 10

// peekable reports whether a response with status code can say that its
// upstream cannot serve the request: a 400 (every provider), a 403
// (OpenRouter's moderation) or a 413 (Groq, Anthropic on Vertex AI).
func peekable(code int) bool {
	return code == http.StatusBadRequest || code == http.StatusForbidden || code == http.StatusRequestEntityTooLarge
}

// peekBody reads at most unservablePeek bytes of resp's body, for at most
// drainTimeout, up to the end of the JSON object it begins with, and gives
// resp a body that reads the same bytes from the first (see peek).
func peekBody(resp *http.Response) {
	if resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	var end jsonEnd
	_, resp.Body = peek(resp.Body, unservablePeek, drainTimeout, end.judge)
}

// BodyPrefix returns the first bytes of resp's body as the [Transport] read
// them before classifying resp, and whether it read them: at most 4 KiB of
// a 400's, 403's or 413's body, up to the end of the JSON object it begins
// with. It reads nothing itself, so a [Classifier] may call it, and resp's
// body still reads from its first byte. It returns false for a response
// whose body was not read or did not come through a Transport. The bytes
// are a copy.
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

// contextTooLong reports whether resp's body, as peeked, says that the
// request is too large for its upstream's model while another may take
// it: a prompt past the context length, or past what the account may
// send at all.
func contextTooLong(resp *http.Response) bool {
	p := bodyPrefix(resp)
	return p != nil && contextLength.in(p)
}

// contentRefused reports whether resp's body, as peeked, says that the
// provider's content policy refused the request.
func contentRefused(resp *http.Response) bool {
	p := bodyPrefix(resp)
	return p != nil && contentPolicy.in(p)
}

// markers are what an error body says one thing with. docs/design.md
// cites each one's source.
type markers struct {
	// codes are values of an error's "code" or "type", at any depth,
	// compared exactly.
	codes []string

	// messages are the starts of an error's "message" (or of an "error"
	// that is a string), ASCII case aside. A pattern that ends in a letter
	// or digit must also end a word of the message (followed by its end,
	// one of . , ; : or " ("), so that a message beginning with the
	// caller's own words says nothing. In a pattern, # is one or more
	// digits, * up to 100 bytes of anything but a newline or a quote, as
	// few as fit, and a final $ the message's end.
	messages []string

	// key, when set, is a key whose presence says so whatever its value.
	key string
}

// contextLength says that the prompt is too long for the upstream's model.
var contextLength = markers{
	codes: []string{
		"context_length_exceeded", // OpenAI, Azure OpenAI, Groq: a prompt longer than the context
	},
	messages: []string{
		// OpenAI, Azure OpenAI, DeepSeek, vLLM.
		"this model's maximum context length is # tokens",
		// Newer vLLM, for a prompt that leaves no room for max_tokens.
		"'max_tokens' or 'max_completion_tokens' is too large: #. this model's maximum context length is # tokens and your request has # input tokens",
		// OpenRouter.
		"this endpoint's maximum context length is # tokens",
		// Mistral.
		"prompt contains # tokens, too large for model with # maximum context length",
		// SGLang.
		"the input (# tokens) is longer than the model's context length (# tokens)",

		// Anthropic; Claude on Vertex AI answers a 413 "Prompt is too long".
		"prompt is too long: # tokens > # maximum",
		"prompt is too long$",

		// Gemini, with or without the count.
		"the input token count* exceeds the maximum number of tokens allowed",

		// Vertex AI.
		"unable to submit request because the input token count is # but model only supports up to #",

		// Groq, a 413 for a request beyond the organization's tokens per
		// minute, which no wait makes fit.
		"request too large for model * in organization * on tokens per minute",

		// A LiteLLM proxy upstream, which names its own verdict first; its
		// message for a caller's own mistake names the provider's error
		// next.
		"litellm.contextwindowexceedederror:",
		"litellm.badrequesterror: litellm.contextwindowexceedederror:",
	},
}

// contentPolicy says that the provider's content policy refused the
// request.
var contentPolicy = markers{
	codes: []string{
		"content_filter",               // Azure OpenAI: its content filter refused the prompt
		"ResponsibleAIPolicyViolation", // Azure OpenAI, innererror.code with content_filter
		"content_policy_violation",     // OpenAI: its safety system refused the prompt
	},
	messages: []string{
		// Anthropic's content filter.
		"output blocked by content filtering policy",

		// Azure OpenAI, with content_filter above.
		"the response was filtered due to the prompt triggering azure openai's content management policy",

		// OpenAI's reasoning models, "code":"invalid_prompt".
		"invalid prompt: your prompt was flagged as potentially violating our usage policy",

		// A LiteLLM proxy upstream.
		"litellm.contentpolicyviolationerror:",
		"litellm.badrequesterror: litellm.contentpolicyviolationerror:",
	},
	// OpenRouter's moderation 403 carries error.metadata.flagged_input.
	key: "flagged_input",
}

// matchStart reports whether s begins with pattern (see
// markers.messages), ASCII letters compared without case.
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

// in reports whether body, a JSON error or its first bytes, says what m
// says: a "code" or "type" among m.codes, a "message" or string "error"
// that begins as one of m.messages does, or m.key. Only the JSON up to the
// first syntax error counts; a marker under another key does not.
func (m *markers) in(body []byte) bool {
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
			if m.key != "" && s == m.key {
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
			if m.value(key, v) {
				return true
			}
		}
	}
}

// value reports whether the string value v of key says what m says.
func (m *markers) value(key, v string) bool {
	switch key {
	case "code", "type":
		for _, c := range m.codes {
			if v == c {
				return true
			}
		}
	case "message", "error":
		v = strings.TrimLeft(v, " \t\r\n")
		for _, p := range m.messages {
			if matchStart(v, p) {
				return true
			}
		}
	}
	return false
}
