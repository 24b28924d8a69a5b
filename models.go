package failover

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// modelMap maps the model a caller asks for to the model id of one
// upstream: the key is the caller's model, the value this upstream's. The
// key "*" matches every model not listed, and a value "*" keeps the
// caller's model as it is. Models are compared exactly (case matters).
type modelMap map[string]string

// lookup returns the model to send this upstream for a request that asked
// for model. A nil or empty map maps nothing: every model goes unchanged. A
// map that lists neither model nor "*" returns false: this upstream does not
// serve model, and is skipped for the request.
func (m modelMap) lookup(model string) (target string, ok bool) {
	if len(m) == 0 {
		return model, true
	}
	target, ok = m[model]
	if !ok {
		target, ok = m["*"]
	}
	switch {
	case !ok:
		return "", false
	case target == "*":
		return model, true
	}
	return target, true
}

// validate rejects a map that could never be used: an empty model on either
// side, or a model that is not valid UTF-8 (it could not be written into a
// JSON body as it is). field names the map in the error
// ("Upstreams[1].Models").
func (m modelMap) validate(field string) error {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch v := m[k]; {
		case k == "":
			return configError(field, "has an empty model as a key")
		case v == "":
			return configError(field, "maps "+strconv.Quote(k)+" to an empty model")
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return configError(field, "maps "+strconv.Quote(k)+" to "+strconv.Quote(v)+": not valid UTF-8")
		}
	}
	return nil
}

// Errors of rewriteModel.
var (
	errNotJSONObject = errors.New("failover: request body is not a JSON object")
	errNoModel       = errors.New(`failover: request body has no top-level "model"`)
	errBadModel      = errors.New("failover: model is not valid UTF-8")
)

// requestModel returns the top-level "model" of a JSON request body, and
// false when the body is not a JSON object or its "model" is absent or not a
// string. A key spelled with escapes ("mod\u0065l") is "model" too; of a
// key given twice the last counts, as encoding/json and most servers read
// it.
func requestModel(body []byte) (string, bool) {
	var model string
	found := false
	ok := eachModel(body, func(_ int, v gjson.Result) {
		model, found = "", false
		if v.Type == gjson.String {
			model, found = v.Str, true
		}
	})
	if !ok || !found {
		return "", false
	}
	return strings.Clone(model), true
}

// rewriteModel returns a copy of body, a JSON object, with every top-level
// "model" set to model and every other byte as it was; a "model" nested in
// messages or tools is left alone. It fails when body is not a JSON
// object, has no top-level "model", or model is not valid UTF-8.
func rewriteModel(body []byte, model string) ([]byte, error) {
	if !utf8.ValidString(model) {
		return nil, errBadModel
	}
	type span struct{ start, end int }
	var spans []span
	if !eachModel(body, func(start int, v gjson.Result) {
		spans = append(spans, span{start, start + len(v.Raw)})
	}) {
		return nil, errNotJSONObject
	}
	if len(spans) == 0 {
		return nil, errNoModel
	}
	value := appendJSONString(nil, model)
	n := len(body)
	for _, s := range spans {
		n += len(value) - (s.end - s.start)
	}
	out := make([]byte, 0, n)
	prev := 0
	for _, s := range spans {
		out = append(out, body[prev:s.start]...)
		out = append(out, value...)
		prev = s.end
	}
	return append(out, body[prev:]...), nil
}

// maxJSONDepth bounds the nesting of JSON that is validated (a caller's
// body, an upstream's stream event): gjson.Valid recurses once per level,
// and a stack overflow is fatal, past any recover. encoding/json refuses
// deeper nesting too.
const maxJSONDepth = 10000

// eachModel calls fn, in order, with the offset in body and the value of
// every top-level member of body named "model". It returns false, without
// calling fn, when body is not a valid JSON object.
func eachModel(body []byte, fn func(start int, value gjson.Result)) bool {
	lead := 0
	for lead < len(body) && isJSONSpace(body[lead]) {
		lead++
	}
	if lead == len(body) || body[lead] != '{' || !nestsShallow(body) || !gjson.ValidBytes(body) {
		return false
	}
	// No string aliasing body outlives the call (requestModel clones the
	// model), as in gjson.GetBytes.
	json := unsafe.String(&body[lead], len(body)-lead)
	gjson.Parse(json).ForEach(func(key, value gjson.Result) bool {
		if key.Str == "model" {
			fn(lead+value.Index, value)
		}
		return true
	})
	return true
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// nestsShallow reports whether body nests objects and arrays at most
// maxJSONDepth deep, without recursion. Call it before gjson.Valid on
// anything a caller or an upstream sent.
func nestsShallow(body []byte) bool {
	depth := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '"': // skip to the closing quote: one not escaped by an odd run of backslashes
			for {
				j := bytes.IndexByte(body[i+1:], '"')
				if j < 0 {
					return true // unterminated: not JSON, and no deeper
				}
				i += 1 + j
				k := i
				for k > 0 && body[k-1] == '\\' {
					k--
				}
				if (i-k)%2 == 0 {
					break
				}
			}
		case '{', '[':
			if depth++; depth > maxJSONDepth {
				return false
			}
		case '}', ']':
			depth--
		}
	}
	return true
}

// appendJSONString appends s, valid UTF-8, as a JSON string, escaped as
// encoding/json escapes it with SetEscapeHTML(false): quote, backslash,
// control characters, U+2028 and U+2029.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			start = i + size
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
