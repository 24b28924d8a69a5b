package failover

import (
	"bytes"
	"errors"
	"strings"
	"testing"
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
