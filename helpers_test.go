package failover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

const chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`

func httptestRequest(method, url, body string) *http.Request {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		panic(err)
	}
	return req
}

// get sends one GET through tr and returns the status, or 0 and the error.
func get(t *testing.T, tr http.RoundTripper, url string) (int, error) {
	t.Helper()
	resp, err := tr.RoundTrip(httptestRequest("GET", url, ""))
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func twoUpstreams(n *fakeNet, cfg Config) Config {
	cfg.Base = n
	cfg.Upstreams = []Upstream{{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test"}}
	return cfg
}

type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error { c.closed++; return nil }

// memShared is a Shared in memory. The Redis one (package redisshared) is
// tested against a real redis-server; these tests cannot use it: this
// package's tests cannot import redisshared (it imports this package), and
// synctest bubbles, which make the fleet's timing exact, allow no real
// network I/O.
type memShared struct {
	mu     sync.Mutex
	open   map[string]time.Time
	closed map[string]time.Time
	cool   map[string]time.Time
	why    map[string]CooldownReason
	rates  map[string]map[string]SharedEvent // upstream, member: with For as a deadline in at
	lease  map[string]string
	leased map[string]time.Time
	subs   map[chan SharedEvent]bool
	down   atomic.Bool // every call fails
	stall  atomic.Bool // Publish waits for its context to end
	kinds  map[SharedKind]int
}

func newMemShared() *memShared {
	return &memShared{open: map[string]time.Time{}, closed: map[string]time.Time{}, cool: map[string]time.Time{}, why: map[string]CooldownReason{},
		lease: map[string]string{}, leased: map[string]time.Time{}, subs: map[chan SharedEvent]bool{}, kinds: map[SharedKind]int{}}
}

var errStoreDown = errors.New("store down")

func (m *memShared) Publish(ctx context.Context, e SharedEvent) error {
	if m.down.Load() {
		return errStoreDown
	}
	if m.stall.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kinds[e.Kind]++
	until := time.Now().Add(e.For)
	switch e.Kind {
	case SharedOpen:
		delete(m.closed, e.Upstream)
		if until.After(m.open[e.Upstream]) {
			m.open[e.Upstream] = until
		}
	case SharedCooling:
		if until.After(m.cool[e.Upstream]) {
			m.cool[e.Upstream], m.why[e.Upstream] = until, e.Reason
		}
	case SharedRate:
		if m.rates == nil {
			m.rates = map[string]map[string]SharedEvent{}
		}
		if m.rates[e.Upstream] == nil {
			m.rates[e.Upstream] = map[string]SharedEvent{}
		}
		e.at = until
		m.rates[e.Upstream][e.Member] = e
		return nil // stored, not told
	case SharedClosed, SharedReset:
		delete(m.open, e.Upstream)
		delete(m.lease, e.Upstream)
		m.closed[e.Upstream] = until
		if e.Kind == SharedReset {
			delete(m.cool, e.Upstream)
		}
	}
	for c := range m.subs {
		select {
		case c <- e:
		default: // a slow subscriber misses it, as on Redis
		}
	}
	return nil
}

func (m *memShared) Load(ctx context.Context, names []string) ([]SharedEvent, error) {
	if m.down.Load() {
		return nil, errStoreDown
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var out []SharedEvent
	for _, n := range names {
		if left := m.open[n].Sub(now); left > 0 {
			out = append(out, SharedEvent{Upstream: n, Kind: SharedOpen, For: left})
		}
		if left := m.closed[n].Sub(now); left > 0 {
			out = append(out, SharedEvent{Upstream: n, Kind: SharedClosed, For: left})
		}
		for member, r := range m.rates[n] {
			if left := r.at.Sub(now); left > 0 {
				out = append(out, SharedEvent{Upstream: n, Kind: SharedRate, Rate: r.Rate, For: left, Member: member})
			}
		}
		if left := m.cool[n].Sub(now); left > 0 {
			out = append(out, SharedEvent{Upstream: n, Kind: SharedCooling, For: left, Reason: m.why[n]})
		}
	}
	return out, nil
}

func (m *memShared) Subscribe(ctx context.Context, deliver func(SharedEvent)) error {
	if m.down.Load() {
		return errStoreDown
	}
	c := make(chan SharedEvent, 64)
	m.mu.Lock()
	m.subs[c] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.subs, c)
		m.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-c:
			deliver(e)
		}
	}
}

func (m *memShared) AcquireProbe(ctx context.Context, upstream, member string, ttl time.Duration) (bool, error) {
	if m.down.Load() {
		return false, errStoreDown
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if h, ok := m.lease[upstream]; ok && now.Before(m.leased[upstream]) && h != member {
		return false, nil
	}
	m.lease[upstream], m.leased[upstream] = member, now.Add(ttl)
	return true, nil
}

func (m *memShared) published(k SharedKind) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.kinds[k]
}
