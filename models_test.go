package failover

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestModelMapLookup(t *testing.T) {
	primary := modelMap{"gpt-5.5": "gemini-2.5-flash", "gpt-5.5-mini": "*"}
	fallback := modelMap{"gpt-5.5": "gemini-2.5-pro", "*": "gemini-2.5-flash"}
	keep := modelMap{"*": "*", "gpt-5.5": "gemini-2.5-flash"}
	for _, tt := range []struct {
		name   string
		m      modelMap
		model  string
		target string
		ok     bool
	}{
		{"nil map keeps the model", nil, "gpt-5.5", "gpt-5.5", true},
		{"empty map keeps the model", modelMap{}, "gpt-5.5", "gpt-5.5", true},
		{"nil map, no model", nil, "", "", true},
		{"listed", primary, "gpt-5.5", "gemini-2.5-flash", true},
		{"listed as *", primary, "gpt-5.5-mini", "gpt-5.5-mini", true},
		{"not listed, no *: skipped", primary, "o3", "", false},
		{"case matters", primary, "GPT-5.5", "", false},
		{"listed beats *", fallback, "gpt-5.5", "gemini-2.5-pro", true},
		{"* maps the rest", fallback, "o3", "gemini-2.5-flash", true},
		{"* keeps the rest", keep, "o3", "o3", true},
		{"* keeps, listed maps", keep, "gpt-5.5", "gemini-2.5-flash", true},
		{"no model, no *", primary, "", "", false},
	} {
		target, ok := tt.m.lookup(tt.model)
		if target != tt.target || ok != tt.ok {
			t.Errorf("%s: lookup(%q) = %q, %v; want %q, %v", tt.name, tt.model, target, ok, tt.target, tt.ok)
		}
	}
}

func TestModelMapValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		m    modelMap
		ok   bool
	}{
		{"nil", nil, true},
		{"mapped", modelMap{"gpt-5.5": "gemini-2.5-flash", "*": "*"}, true},
		{"empty key", modelMap{"": "gpt-5.5"}, false},
		{"empty value", modelMap{"gpt-5.5": ""}, false},
		{"bad UTF-8", modelMap{"gpt-5.5": "gemini\xff"}, false},
	} {
		err := tt.m.validate("Upstreams[1].Models")
		var ce *ConfigError
		switch {
		case tt.ok && err != nil:
			t.Errorf("%s: validate = %v, want nil", tt.name, err)
		case !tt.ok && (!errors.As(err, &ce) || ce.Field != "Upstreams[1].Models"):
			t.Errorf("%s: validate = %v, want a ConfigError for Upstreams[1].Models", tt.name, err)
		}
	}
}

func TestRequestModel(t *testing.T) {
	for _, tt := range []struct {
		name, body, want string
		ok               bool
	}{
		{"chat completion", `{"model":"gpt-5.5","messages":[{"role":"user","content":"hi"}]}`, "gpt-5.5", true},
		{"pretty", "\n {\n  \"messages\": [],\n  \"model\" : \"gpt-5.5\"\n}\n", "gpt-5.5", true},
		{"escaped value", `{"model":"gpt\u002d5.5"}`, "gpt-5.5", true},
		{"escaped key", `{"mod\u0065l":"gpt-5.5"}`, "gpt-5.5", true},
		{"unicode", `{"model":"模型-1"}`, "模型-1", true},
		{"empty", `{"model":""}`, "", true},
		{"last of two", `{"model":"a","stream":true,"model":"b"}`, "b", true},
		{"nested only", `{"messages":[{"model":"x"}],"metadata":{"model":"y"}}`, "", false},
		{"nested first", `{"metadata":{"model":"y"},"model":"x"}`, "x", true},
		{"in a string", `{"prompt":"{\"model\":\"x\"}"}`, "", false},
		{"case matters", `{"Model":"x"}`, "", false},
		{"number", `{"model":5}`, "", false},
		{"null", `{"model":null}`, "", false},
		{"object", `{"model":{"id":"x"}}`, "", false},
		{"array", `[{"model":"x"}]`, "", false},
		{"string", `"model"`, "", false},
		{"truncated", `{"model":"x"`, "", false},
		{"trailing data", `{"model":"x"} {}`, "", false},
		{"not JSON", `model=x`, "", false},
		{"no body", ``, "", false},
		{"deep", `{"a":` + strings.Repeat("[", maxJSONDepth-1) + strings.Repeat("]", maxJSONDepth-1) + `,"model":"x"}`, "x", true},
		{"too deep", `{"a":` + strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth) + `,"model":"x"}`, "", false},
	} {
		got, ok := requestModel([]byte(tt.body))
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: requestModel(%.60q) = %q, %v; want %q, %v", tt.name, tt.body, got, ok, tt.want, tt.ok)
		}
	}
}

// The model requestModel returns does not share memory with the body.
func TestRequestModelCopies(t *testing.T) {
	body := []byte(`{"model":"gpt-5.5"}`)
	got, _ := requestModel(body)
	copy(body[10:], "XXXXXXX")
	if got != "gpt-5.5" {
		t.Fatalf("after the body changed, the model is %q", got)
	}
}

func TestRewriteModel(t *testing.T) {
	for _, tt := range []struct {
		name, body, model, want string
		err                     error
	}{
		{"chat completion",
			`{"model":"gpt-5.5","messages":[{"role":"user","content":"hi"}],"stream":true}`, "gemini-2.5-flash",
			`{"model":"gemini-2.5-flash","messages":[{"role":"user","content":"hi"}],"stream":true}`, nil},
		{"pretty, model last",
			"{\n  \"messages\": [ {\"role\": \"user\"} ],\n  \"model\" :\t\"gpt-5.5\"  \n}\n", "o3",
			"{\n  \"messages\": [ {\"role\": \"user\"} ],\n  \"model\" :\t\"o3\"  \n}\n", nil},
		{"leading white space", " \r\n\t{\"model\":\"a\"}", "b", " \r\n\t{\"model\":\"b\"}", nil},
		{"nested models untouched",
			`{"messages":[{"role":"assistant","model":"keep-1"}],"tools":[{"type":"function","function":{"name":"pick","parameters":{"type":"object","properties":{"model":{"type":"string"}}}}}],"metadata":{"model":"keep-2"},"model":"gpt-5.5"}`, "claude",
			`{"messages":[{"role":"assistant","model":"keep-1"}],"tools":[{"type":"function","function":{"name":"pick","parameters":{"type":"object","properties":{"model":{"type":"string"}}}}}],"metadata":{"model":"keep-2"},"model":"claude"}`, nil},
		{"model in a string untouched",
			`{"prompt":"say {\"model\":\"x\"}","model":"a"}`, "b",
			`{"prompt":"say {\"model\":\"x\"}","model":"b"}`, nil},
		{"escaped key kept as sent",
			`{"mod\u0065l":"gpt-5.5","n":1}`, "o3",
			`{"mod\u0065l":"o3","n":1}`, nil},
		{"escapes in the value replaced",
			`{"model":"gpt\u002d5.5"}`, "gpt-5.5",
			`{"model":"gpt-5.5"}`, nil},
		{"every duplicate",
			`{"model":"a","x":[1,2],"model":"b"}`, "c",
			`{"model":"c","x":[1,2],"model":"c"}`, nil},
		{"not a string",
			`{"model":{"id":"x"},"n":1}`, "y",
			`{"model":"y","n":1}`, nil},
		{"escaped new model",
			`{"model":"a"}`, "q\"b\\s\n\x01\u2028<&>/模",
			`{"model":"q\"b\\s\n\u0001\u2028<&>/模"}`, nil},
		{"longer and shorter",
			`{"model":"a","b":"model"}`, strings.Repeat("m", 300),
			`{"model":"` + strings.Repeat("m", 300) + `","b":"model"}`, nil},
		{"empty model", `{"model":"a"}`, "", `{"model":""}`, nil},
		{"no model", `{"messages":[{"model":"x"}]}`, "b", "", errNoModel},
		{"case matters", `{"Model":"a"}`, "b", "", errNoModel},
		{"empty object", `{}`, "b", "", errNoModel},
		{"array", `[{"model":"a"}]`, "b", "", errNotJSONObject},
		{"string", `"model"`, "b", "", errNotJSONObject},
		{"truncated", `{"model":"a"`, "b", "", errNotJSONObject},
		{"trailing data", `{"model":"a"}x`, "b", "", errNotJSONObject},
		{"two objects", `{"model":"a"}{"model":"a"}`, "b", "", errNotJSONObject},
		{"empty body", ``, "b", "", errNotJSONObject},
		{"white space", "  \n", "b", "", errNotJSONObject},
		{"too deep", `{"model":"a","x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`, "b", "", errNotJSONObject},
		{"model not UTF-8", `{"model":"a"}`, "b\xff", "", errBadModel},
	} {
		checkRewrite(t, tt.name, tt.body, tt.model, tt.want, tt.err)
	}
}

func checkRewrite(t *testing.T, name, body, model, want string, wantErr error) {
	t.Helper()
	in := []byte(body)
	got, err := rewriteModel(in, model)
	if string(in) != body {
		t.Errorf("%s: rewriteModel changed its input to %q", name, in)
	}
	if !errors.Is(err, wantErr) || string(got) != want {
		t.Errorf("%s: rewriteModel(%.60q, %q) = %q, %v; want %q, %v", name, body, model, got, err, want, wantErr)
		return
	}
	if err != nil {
		return
	}
	if m, ok := requestModel(got); !ok || m != model {
		t.Errorf("%s: requestModel after rewriteModel = %q, %v; want %q, true", name, m, ok, model)
	}
	if len(got) > 0 {
		got[0] = 'X'
		if string(in) != body {
			t.Errorf("%s: the result shares memory with the body", name)
		}
	}
}

func BenchmarkRewriteModel(b *testing.B) {
	// A request with a large inline image, where a full decode and encode
	// would hurt.
	image := strings.Repeat("iVBORw0KGgoAAAANSUhEUgAA", 1<<15) // 768 KiB
	body := []byte(`{"model":"gpt-5.5","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + image + `"}}]}],"max_tokens":16}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		m, ok := requestModel(body)
		if !ok || m != "gpt-5.5" {
			b.Fatal(m, ok)
		}
		out, err := rewriteModel(body, "gemini-2.5-flash")
		if err != nil || !bytes.HasPrefix(out, []byte(`{"model":"gemini-2.5-flash"`)) {
			b.Fatal(err)
		}
	}
}

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

// A request for one provider's model falls back to another provider's
// model: the backup gets its own model id in an otherwise identical body.
func TestModelMapping(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 200, "b")
	cfg := twoUpstreams(n, Config{})
	cfg.Upstreams[1].Models = map[string]string{"gpt-4o": "gemini-2.5-flash", "gpt-4o-mini": "*"}
	tr := newTestTransport(t, cfg)

	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"hi","model":"nested"}],"stream":false}`
	resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", body))
	if err != nil || readBody(t, resp) != "b" {
		t.Fatalf("got %v", err)
	}
	want := `{"model":"gemini-2.5-flash","messages":[{"role":"user","content":"hi","model":"nested"}],"stream":false}`
	if got := n.requests("b.test")[0].Body; got != want {
		t.Fatalf("backup got %s\nwant       %s", got, want)
	}
	if got := n.requests("a.test")[0].Body; got != body {
		t.Fatalf("the primary, without Models, got %s", got)
	}

	// "*" keeps the caller's model.
	resp, err = tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", `{"model":"gpt-4o-mini"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := n.requests("b.test")[1].Body; got != `{"model":"gpt-4o-mini"}` {
		t.Fatalf("backup got %s", got)
	}

	// A model the backup does not serve skips it: the caller gets the
	// primary's answer.
	resp, err = tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", `{"model":"o3"}`))
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("got %v, %v; want the primary's 503", resp, err)
	}
	resp.Body.Close()
	if len(n.requests("b.test")) != 2 {
		t.Fatal("the backup got a model it does not serve")
	}
}

// Content-Length and GetBody match the renamed body on the wire.
func TestModelMappingOnTheWire(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	var gotLen, gotBody string
	backup := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		gotLen = strconv.FormatInt(r.ContentLength, 10)
		w.WriteHeader(200)
	})
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{BaseURL: primary.URL},
		{BaseURL: backup.URL, Models: map[string]string{"*": "claude-sonnet-4"}},
	}})
	resp := mustPost(t, tr, primary.URL+"/v1/messages", `{"model":"gpt-4o","max_tokens":1}`)
	resp.Body.Close()
	gotBody = backup.requests()[0].Body
	if want := `{"model":"claude-sonnet-4","max_tokens":1}`; gotBody != want || gotLen != strconv.Itoa(len(want)) {
		t.Fatalf("backup got %s with Content-Length %s", gotBody, gotLen)
	}
}

func TestModelMappingSkipError(t *testing.T) {
	n := newFakeNet()
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{BaseURL: "http://a.test", Models: map[string]string{"x": "y"}}}})
	_, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1", `{"model":"z"}`))
	if !errors.Is(err, ErrModelNotServed) {
		t.Fatalf("err = %v, want ErrModelNotServed", err)
	}
	if _, err := New(Config{Upstreams: []Upstream{{BaseURL: "http://a.test", Models: map[string]string{"": "y"}}}}); err == nil {
		t.Fatal("New accepted an empty model")
	}
}

// A request with trailers goes chunked, its trailers after the renamed
// body, to an upstream whose Models rename its model, as it does to one
// that sends it as it is.
func TestModelMappingTrailers(t *testing.T) {
	got, primary, backup := trailerServers(t)
	tr := newTestTransport(t, Config{Retry: RetryConfig{Off: true}, Upstreams: []Upstream{
		{BaseURL: primary.URL},
		{BaseURL: backup.URL, Models: map[string]string{"gpt-4o": "claude-sonnet-4"}},
	}})
	req, _ := http.NewRequest("POST", primary.URL+"/v1/messages", io.NopCloser(strings.NewReader(`{"model":"gpt-4o"}`)))
	req.Trailer = http.Header{"X-Checksum": {"c0ffee"}}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for i, w := range []string{`{"model":"gpt-4o"} "c0ffee" length -1`, `{"model":"claude-sonnet-4"} "c0ffee" length -1`} {
		if g := <-got; g != w {
			t.Errorf("attempt %d: upstream got %s, want %s", i+1, g, w)
		}
	}
}

// A request with GetBody, as SDKs make them, is read for its model with
// MaxBodyBuffer negative (never buffer, which is for bodies without
// GetBody): it was not, and the backup got the caller's model unrenamed,
// and a model its Models do not serve.
func TestModelMappingNoBuffer(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{MaxBodyBuffer: -1, Upstreams: []Upstream{
		{BaseURL: primary.URL},
		{BaseURL: backup.URL, Models: map[string]string{"gpt-4o": "claude-sonnet-4"}},
	}})
	readBody(t, mustPost(t, tr, primary.URL+"/v1/messages", `{"model":"gpt-4o","max_tokens":1}`))
	resp := mustPost(t, tr, primary.URL+"/v1/messages", `{"model":"o3"}`)
	readBody(t, resp)
	if resp.StatusCode != 503 {
		t.Errorf("a model the backup does not serve: got %d, want the primary's 503", resp.StatusCode)
	}
	var got []string
	for _, r := range backup.requests() {
		got = append(got, r.Body)
	}
	if want := []string{`{"model":"claude-sonnet-4","max_tokens":1}`}; !slices.Equal(got, want) {
		t.Errorf("backup got %q, want %q", got, want)
	}
}
