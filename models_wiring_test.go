package failover

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
)

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
