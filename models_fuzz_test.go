package failover

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzRewriteModel: on any body and model, rewriteModel and requestModel
// never panic and never change the body; rewriteModel succeeds exactly on a
// JSON object with a top-level "model" (as encoding/json reads the body)
// and a model in UTF-8, and then changes nothing but the value of every
// top-level "model", to model as encoding/json writes it; requestModel
// reads model back, and rewriting back to the caller's model gives what
// rewriting the body to it gives.
func FuzzRewriteModel(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		if len(body) > 64<<10 || len(model) > 1<<10 {
			return
		}
		in := bytes.Clone(body)
		orig, origOK := requestModel(body)
		got, err := rewriteModel(body, model)
		if !bytes.Equal(body, in) {
			t.Fatalf("body changed from %q to %q", in, body)
		}

		spans, isObject := topLevelModels(body)
		switch {
		case !utf8.ValidString(model):
			if !errors.Is(err, errBadModel) {
				t.Fatalf("rewriteModel(%q, %q) = %q, %v; want errBadModel", body, model, got, err)
			}
			return
		case !isObject:
			if !errors.Is(err, errNotJSONObject) || origOK {
				t.Fatalf("not a JSON object %q: rewriteModel = %q, %v; requestModel = %q, %v", body, got, err, orig, origOK)
			}
			return
		case len(spans) == 0:
			if !errors.Is(err, errNoModel) || origOK {
				t.Fatalf("no model in %q: rewriteModel = %q, %v; requestModel = %q, %v", body, got, err, orig, origOK)
			}
			return
		case err != nil:
			t.Fatalf("rewriteModel(%q, %q): %v", body, model, err)
		}

		// Byte for byte the body, but for the values of the top-level
		// "model" members.
		if want := spliceModels(body, spans, encodeJSONString(t, model)); !bytes.Equal(got, want) {
			t.Fatalf("rewriteModel(%q, %q) =\n%q, want\n%q", body, model, got, want)
		}
		if m, ok := requestModel(got); !ok || m != model {
			t.Fatalf("requestModel(rewriteModel(%q, %q)) = %q, %v", body, model, m, ok)
		}

		// requestModel reads what encoding/json reads: the last "model",
		// when a string. gjson and encoding/json differ only on broken
		// surrogate escapes and invalid UTF-8, which no model has.
		last := body[spans[len(spans)-1][0]:spans[len(spans)-1][1]]
		var want string
		wantOK := json.Unmarshal(last, &want) == nil
		if utf8.Valid(last) && !brokenSurrogate.Match(last) && (orig != want || origOK != wantOK) {
			t.Fatalf("requestModel(%q) = %q, %v; encoding/json reads %q, %v", body, orig, origOK, want, wantOK)
		}

		// Back to the caller's model: everything outside the value is
		// as it was.
		if origOK && utf8.ValidString(orig) {
			back, err := rewriteModel(got, orig)
			direct, err2 := rewriteModel(body, orig)
			if err != nil || err2 != nil || !bytes.Equal(back, direct) {
				t.Fatalf("rewriteModel there and back = %q, %v; straight to %q: %q, %v", back, err, orig, direct, err2)
			}
			if string(last) == string(encodeJSONString(t, orig)) && len(spans) == 1 && !bytes.Equal(back, body) {
				t.Fatalf("rewriteModel there and back = %q, want the body %q", back, body)
			}
		}
	})
}

// brokenSurrogate matches a \u escape of a surrogate, which gjson and
// encoding/json may decode apart when it is not half of a pair.
var brokenSurrogate = regexp.MustCompile(`(?i)\\u[d][89a-f]`)

// topLevelModels returns where the value of every top-level member named
// "model" lies in body, as encoding/json reads it, and whether body is a
// JSON object at all.
func topLevelModels(body []byte) (spans [][2]int, ok bool) {
	if !json.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		if tok == "model" {
			end := int(dec.InputOffset())
			spans = append(spans, [2]int{end - len(raw), end})
		}
	}
	return spans, true
}

func spliceModels(body []byte, spans [][2]int, value []byte) []byte {
	var out []byte
	prev := 0
	for _, s := range spans {
		out = append(append(out, body[prev:s[0]]...), value...)
		prev = s[1]
	}
	return append(out, body[prev:]...)
}

// encodeJSONString is s as encoding/json writes it, without HTML escapes.
func encodeJSONString(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// appendJSONString writes what encoding/json writes.
func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{
		"", "gpt-5.5", `q"b\s`, "\x00\x01\b\f\n\r\t\x1f\x7f", "<&>", "\u2028\u2029", "模型", "a\u2028b\u2029c",
		strings.Repeat("é", 40),
	} {
		if got, want := appendJSONString(nil, s), encodeJSONString(t, s); !bytes.Equal(got, want) {
			t.Errorf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
	}
}
