package failover

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run when any test leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// respond builds a response with a body and header pairs.
func respond(code int, body string, kv ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return &http.Response{
		StatusCode:    code,
		Status:        fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
	}
}

// seen is a request as an upstream received it.
type seen struct {
	Method, Host, Path, RawPath, RawQuery string
	Header                                http.Header
	Body                                  string
	User                                  string
}

// fakeNet is a scripted Base RoundTripper: each host has a handler, and every
// request that reaches a host is recorded. It runs in memory, so that tests
// in a synctest bubble see no real I/O.
type fakeNet struct {
	mu       sync.Mutex
	handlers map[string]func(*http.Request) (*http.Response, error)
	reqs     map[string][]seen
}

func newFakeNet() *fakeNet {
	return &fakeNet{handlers: map[string]func(*http.Request) (*http.Response, error){}, reqs: map[string][]seen{}}
}

// handle sets the handler of host (as the request URL names it).
func (n *fakeNet) handle(host string, h func(*http.Request) (*http.Response, error)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.handlers[host] = h
}

// status makes host answer code with body.
func (n *fakeNet) status(host string, code int, body string, kv ...string) {
	n.handle(host, func(*http.Request) (*http.Response, error) { return respond(code, body, kv...), nil })
}

func (n *fakeNet) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	s := seen{Method: r.Method, Host: r.URL.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: string(body)}
	if r.URL.User != nil {
		s.User = r.URL.User.String()
	}
	n.mu.Lock()
	n.reqs[r.URL.Host] = append(n.reqs[r.URL.Host], s)
	h := n.handlers[r.URL.Host]
	n.mu.Unlock()
	if h == nil {
		return nil, fmt.Errorf("dial tcp %s: connect: connection refused", r.URL.Host)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return h(r)
}

func (n *fakeNet) count(host string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.reqs[host])
}

func (n *fakeNet) requests(host string) []seen {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]seen(nil), n.reqs[host]...)
}

// server is an httptest upstream that records what it receives.
type server struct {
	*httptest.Server
	mu    sync.Mutex
	reqs  []seen
	conns int
}

func newServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, seen{Method: r.Method, Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: string(body)})
		s.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		h(w, r)
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.mu.Lock()
			s.conns++
			s.mu.Unlock()
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// newUpstreamServer answers every request with code and body.
func newUpstreamServer(t *testing.T, code int, body string) *server {
	t.Helper()
	return newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(code)
		io.WriteString(w, body)
	})
}

func (s *server) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

func (s *server) requests() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.reqs...)
}

func (s *server) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// newTestTransport builds a Transport with its own connection pool (unless
// cfg.Base is set) and closes its idle connections when the test ends.
func newTestTransport(t *testing.T, cfg Config) *Transport {
	t.Helper()
	if cfg.Base == nil {
		cfg.Base = http.DefaultTransport.(*http.Transport).Clone()
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func do(t *testing.T, tr http.RoundTripper, req *http.Request) (*http.Response, error) {
	t.Helper()
	return (&http.Client{Transport: tr}).Do(req)
}

func mustGet(t *testing.T, tr http.RoundTripper, url string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := do(t, tr, req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp
}

func mustPost(t *testing.T, tr http.RoundTripper, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := do(t, tr, req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return string(b)
}

// logBuffer is a slog handler's output, safe to read while logging.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLogger(b *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
