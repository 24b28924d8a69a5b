package failover

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// servedTransport is a Transport over a primary and a backup server.
func servedTransport(t *testing.T, cfg Config, primary, backup *server) *Transport {
	t.Helper()
	cfg.Upstreams = []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer backup-key"}}},
	}
	return newTestTransport(t, cfg)
}

func wantServed(t *testing.T, resp *http.Response, want Served) {
	t.Helper()
	got, ok := ServedBy(resp)
	if !ok {
		t.Fatalf("ServedBy: not ok, want %+v", want)
	}
	if got.Upstream != want.Upstream || got.Attempt != want.Attempt || got.Attempts != want.Attempts || got.Hedged != want.Hedged {
		t.Errorf("ServedBy: got %+v, want %+v", got, want)
	}
}

func TestServedByFailover(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "ok")
	tr := servedTransport(t, Config{}, primary, backup)
	resp := mustGet(t, tr, primary.URL+"/v1/models")
	defer resp.Body.Close()
	wantServed(t, resp, Served{Upstream: "backup", Attempt: 2, Attempts: 2})
	if resp.Request.Header.Get("Authorization") != "" {
		t.Error("the answer's Request shows the backup's credentials")
	}
}

func TestServedByDirect(t *testing.T) {
	primary := newUpstreamServer(t, 200, "ok")
	backup := newUpstreamServer(t, 200, "ok")
	tr := servedTransport(t, Config{}, primary, backup)
	req := httptestRequest("GET", primary.URL+"/v1/models", "")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	wantServed(t, resp, Served{Upstream: "primary", Attempt: 1, Attempts: 1})
	if resp.Request.URL.String() != req.URL.String() || resp.Request.Context().Err() != nil {
		t.Errorf("the answer's Request is %v, want the caller's URL and context", resp.Request.URL)
	}
}

func TestServedByStream(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, sseChatRole+sseChatContent+sseChatStop+"data: [DONE]\n\n")
	})
	tr := servedTransport(t, Config{}, primary, backup)
	resp := mustPost(t, tr, primary.URL+"/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true}`)
	wantServed(t, resp, Served{Upstream: "backup", Attempt: 2, Attempts: 2})
	if body := readBody(t, resp); !strings.Contains(body, "[DONE]") {
		t.Errorf("stream body %q, want it whole", body)
	}
}

func TestServedByHedged(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	backup := newUpstreamServer(t, 200, "ok")
	tr := servedTransport(t, Config{Hedge: &HedgeConfig{Delay: 20 * time.Millisecond}}, primary, backup)
	resp := mustGet(t, tr, primary.URL+"/v1/models")
	defer resp.Body.Close()
	wantServed(t, resp, Served{Upstream: "backup", Attempt: 2, Attempts: 2, Hedged: true})
}

func TestServedByForeign(t *testing.T) {
	srv := newUpstreamServer(t, 200, "ok")
	base := http.DefaultTransport.(*http.Transport).Clone()
	defer base.CloseIdleConnections()
	resp, err := base.RoundTrip(httptestRequest("GET", srv.URL+"/v1/models", ""))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s, ok := ServedBy(resp); ok {
		t.Errorf("ServedBy of a response no Transport made: %+v, true", s)
	}
	if _, ok := ServedBy(nil); ok {
		t.Error("ServedBy(nil): ok")
	}

	// A request built on an answer's Request is not that answer's.
	tr := servedTransport(t, Config{}, srv, srv)
	answer := mustGet(t, tr, srv.URL+"/v1/models")
	answer.Body.Close()
	next := &http.Response{Request: answer.Request.Clone(answer.Request.Context())}
	if _, ok := ServedBy(next); ok {
		t.Error("ServedBy of a response whose Request is a clone of an answer's: ok")
	}
}

func TestServedHeader(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "ok")
	for _, c := range []struct {
		header, want string
	}{
		{"", ""},
		{"failover-upstream", "backup"},
	} {
		tr := servedTransport(t, Config{ServedHeader: c.header}, primary, backup)
		resp := mustGet(t, tr, primary.URL+"/v1/models")
		resp.Body.Close()
		if got := resp.Header.Get("Failover-Upstream"); got != c.want {
			t.Errorf("ServedHeader %q: the answer's Failover-Upstream is %q, want %q", c.header, got, c.want)
		}
	}
}

func TestServedHeaderRefused(t *testing.T) {
	for _, h := range []string{"Authorization", "X-Api-Key", "Upstream Name", "Bad:Name", "Anthropic-Version"} {
		_, err := New(Config{ServedHeader: h, Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test/v1", Header: http.Header{"Anthropic-Version": {"2023-06-01"}}},
		}})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "ServedHeader" {
			t.Errorf("ServedHeader %q: New returned %v, want a *ConfigError for ServedHeader", h, err)
		}
	}
}

// An answer the Transport made for an SDK is served by no upstream; the
// error it stands for names each upstream that failed.
func TestServedByMadeAnswer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	backup := newUpstreamServer(t, 500, "down")
	tr := newTestTransport(t, Config{Retry: RetryConfig{Off: true}, ServedHeader: "Failover-Upstream", Upstreams: []Upstream{
		{Name: "primary", BaseURL: closed + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	backup.Close() // refuses too, after a first answer it never gets
	req := httptestRequest("GET", closed+"/v1/models", "")
	req.Header.Set("X-Stainless-Lang", "go")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s, ok := ServedBy(resp)
	if !ok || s.Upstream != "" || s.Attempts != 2 {
		t.Errorf("ServedBy of the made answer: %+v, %v; want no upstream, 2 attempts", s, ok)
	}
	if h := resp.Header.Get("Failover-Upstream"); h != "" {
		t.Errorf("the made answer carries Failover-Upstream %q", h)
	}
	var names []string
	var ae *AttemptError
	if e, ok := AnswerError(resp).(*Error); ok && errors.As(e, &ae) {
		for _, a := range e.Attempts {
			names = append(names, a.Upstream)
		}
	}
	if strings.Join(names, ",") != "primary,backup" {
		t.Errorf("the answer's error names %q, want primary,backup", names)
	}
}

// An answer held for want of a better one is marked as the one it is,
// and answers the caller holds at once keep their own marks and
// Requests.
func TestServedByHeldAnswer(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 502, "bad gateway")
	tr := servedTransport(t, Config{}, primary, backup)
	first := mustGet(t, tr, primary.URL+"/v1/models/1")
	defer first.Body.Close()
	second := mustGet(t, tr, primary.URL+"/v1/models/2")
	defer second.Body.Close()
	for i, resp := range []*http.Response{first, second} {
		if resp.StatusCode != 502 {
			t.Fatalf("answer %d: status %d, want the backup's 502", i+1, resp.StatusCode)
		}
		wantServed(t, resp, Served{Upstream: "backup", Attempt: 2, Attempts: 2})
		if p, want := resp.Request.URL.Path, fmt.Sprintf("/v1/models/%d", i+1); p != want {
			t.Errorf("answer %d: its Request's path is %q, want %q", i+1, p, want)
		}
		if resp.Request.Header.Get("Authorization") != "" {
			t.Errorf("answer %d: its Request shows the backup's credentials", i+1)
		}
	}
	if first.Request == second.Request {
		t.Error("two answers share one Request")
	}
}
