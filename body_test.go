package failover

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

func TestBodyReplay(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 503, "down")
	n.status("c.test", 200, "ok")
	upstreams := []Upstream{{BaseURL: "http://a.test"}, {BaseURL: "http://b.test"}, {BaseURL: "http://c.test"}}

	t.Run("GetBody", func(t *testing.T) {
		tr := newTestTransport(t, Config{Base: n, Upstreams: upstreams})
		req := httptestRequest("POST", "http://a.test/v1", chatBody)
		gets := 0
		getBody := req.GetBody
		req.GetBody = func() (io.ReadCloser, error) { gets++; return getBody() }
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatal(resp, err)
		}
		if gets != 2 {
			t.Errorf("GetBody called %d times, want 2 (the first attempt sends Body)", gets)
		}
	})
	t.Run("buffered", func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 503, "down")
		n.status("c.test", 200, "ok")
		tr := newTestTransport(t, Config{Base: n, Upstreams: upstreams})
		body := &closeCounter{Reader: strings.NewReader(chatBody)}
		req := httptestRequest("POST", "http://a.test/v1", "")
		req.Body, req.GetBody, req.ContentLength = body, nil, -1
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatal(resp, err)
		}
		for _, h := range []string{"a.test", "b.test", "c.test"} {
			if got := n.requests(h)[0].Body; got != chatBody {
				t.Errorf("%s got body %q", h, got)
			}
		}
		if body.closed != 1 {
			t.Errorf("caller's body closed %d times, want 1", body.closed)
		}
	})
	t.Run("too large", func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) { return nil, errors.New("connection reset by peer") })
		n.status("b.test", 200, "ok")
		tr := newTestTransport(t, Config{Base: n, MaxBodyBuffer: 16, Upstreams: upstreams[:2]})
		body := &readCounter{r: strings.NewReader(chatBody)}
		req := httptestRequest("POST", "http://a.test/v1", "")
		req.Body, req.GetBody, req.ContentLength = body, nil, -1
		resp, err := tr.RoundTrip(req)
		if resp != nil || !errors.Is(err, ErrBodyNotReplayable) {
			t.Fatalf("got %v, %v; want ErrBodyNotReplayable", resp, err)
		}
		if n.count("b.test") != 0 {
			t.Error("a body that cannot be replayed went to a second upstream")
		}
		if got := n.requests("a.test")[0].Body; got != chatBody {
			t.Errorf("the one attempt sent %q, want the whole body", got)
		}
		if body.n != int64(len(chatBody)) {
			t.Errorf("caller's body read %d bytes, want %d: never twice", body.n, len(chatBody))
		}
	})
	t.Run("too large, answered", func(t *testing.T) {
		tr := newTestTransport(t, Config{Base: n, MaxBodyBuffer: -1, Upstreams: upstreams})
		req := httptestRequest("POST", "http://a.test/v1", "")
		req.Body, req.GetBody, req.ContentLength = io.NopCloser(strings.NewReader(chatBody)), nil, -1
		before := n.count("b.test")
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("got %v, %v; want the one attempt's 503", resp, err)
		}
		resp.Body.Close()
		if n.count("b.test") != before {
			t.Error("a body that cannot be replayed went to a second upstream")
		}
	})
}

// Responses of discarded attempts are drained and closed, so their
// connections are reused; a huge one is read only up to a bound.
func TestDiscardedResponses(t *testing.T) {
	primary := newUpstreamServer(t, 503, `{"error":"overloaded"}`)
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{
		Breaker:   BreakerConfig{FailureThreshold: 1000},
		Upstreams: []Upstream{{BaseURL: primary.URL}, {BaseURL: backup.URL}},
	})
	for range 20 {
		resp := mustGet(t, tr, primary.URL+"/x")
		readBody(t, resp)
	}
	if c := primary.connections(); c > 2 {
		t.Errorf("primary saw %d connections for 20 sequential requests: discarded responses are not reused", c)
	}

	var written int64
	var mu sync.Mutex
	huge := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(503)
		chunk := bytes.Repeat([]byte("x"), 32<<10)
		for range 1 << 10 { // 32 MiB, far more than is drained
			n, err := w.Write(chunk)
			mu.Lock()
			written += int64(n)
			mu.Unlock()
			if err != nil {
				return
			}
		}
	})
	tr = newTestTransport(t, Config{Upstreams: []Upstream{{BaseURL: huge.URL}, {BaseURL: backup.URL}}})
	if resp := mustGet(t, tr, huge.URL+"/x"); readBody(t, resp) != "ok" {
		t.Fatal("not served by the backup")
	}
	huge.Close() // waits for the handler to end
	mu.Lock()
	defer mu.Unlock()
	if written >= 32<<20 {
		t.Fatalf("the whole huge body was written (%d bytes): it was read, not closed", written)
	}
}

// GetBody failing ends the request with an error that says why, and the
// next upstream gets nothing.
func TestGetBodyFails(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 200, "ok")
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{BaseURL: "http://a.test"}, {BaseURL: "http://b.test"}}})
	req := httptestRequest("POST", "http://a.test/v1", chatBody)
	boom := errors.New("file gone")
	req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("got %v, %v; want the first attempt's 503", resp, err)
	}
	resp.Body.Close()
	if n.count("b.test") != 0 {
		t.Fatal("b got a request without its body")
	}

	n.handle("a.test", func(*http.Request) (*http.Response, error) { return nil, errors.New("connection reset") })
	_, err = tr.RoundTrip(req)
	if !errors.Is(err, ErrBodyNotReplayable) || !errors.Is(err, boom) {
		t.Fatalf("err = %v, want ErrBodyNotReplayable wrapping GetBody's error", err)
	}
}
