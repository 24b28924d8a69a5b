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
	"net/url"
	"runtime"
	"slices"
	"strconv"
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
	panics atomic.Bool // every call panics
	kinds  map[SharedKind]int
}

func newMemShared() *memShared {
	return &memShared{open: map[string]time.Time{}, closed: map[string]time.Time{}, cool: map[string]time.Time{}, why: map[string]CooldownReason{},
		lease: map[string]string{}, leased: map[string]time.Time{}, subs: map[chan SharedEvent]bool{}, kinds: map[SharedKind]int{}}
}

var errStoreDown = errors.New("store down")

func (m *memShared) Publish(ctx context.Context, e SharedEvent) error {
	if m.panics.Load() {
		panic("memShared: the store panics")
	}
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
	if m.panics.Load() {
		panic("memShared: the store panics")
	}
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
	if m.panics.Load() {
		panic("memShared: the store panics")
	}
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
	if m.panics.Load() {
		panic("memShared: the store panics")
	}
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

// The upstreams and request URLs that FuzzRoute (address_test.go) and
// FuzzRewrite (rewrite_test.go) share, and the routing they expect. Each
// fuzz target has a seed corpus in testdata/fuzz/<FuzzName>/, which plain
// `go test` runs; .ci/fuzz.sh runs each target for $FUZZTIME.

// Values no fuzzed input may contain, so that finding them in what an
// upstream received proves a leak.
const (
	callerMarker   = "zqCALLERSECRETqz"
	upstreamMarker = "zqUPSTREAMKEYqz"
)

func upstreamSecret(i int) string { return fmt.Sprintf("upkey%d-%s", i, upstreamMarker) }

// fuzzUpstreamHeader is the Header of the i-th fuzzed upstream: its keys,
// and X-Fuzz-Upstream, which tells what each upstream received apart
// whatever order the Transport tries them in.
func fuzzUpstreamHeader(i int) http.Header {
	h := http.Header{"X-Fuzz-Upstream": {strconv.Itoa(i)}}
	switch i {
	case 0:
		h["Authorization"] = []string{"Bearer " + upstreamSecret(0)}
	case 1:
		h["X-Api-Key"] = []string{upstreamSecret(1)}
		h["X-Custom-Token"] = []string{upstreamSecret(1) + "-b"}
	}
	return h
}

// fuzzBase is a base URL that New accepted, as the fuzz tests read it.
type fuzzBase struct {
	url           *url.URL
	path, rawPath string // decoded and escaped, without one trailing slash
}

// fuzzTransport builds a Transport, through New, over those of the base
// URLs that New accepts on their own (each is checked to be one that can be
// an upstream), and returns them; nil when it accepts none.
func fuzzTransport(t *testing.T, rt http.RoundTripper, raws ...string) (*Transport, []fuzzBase, []string) {
	return fuzzTransportWith(t, rt, UnroutedPass, raws...)
}

// fuzzTransportWith is fuzzTransport with Config.Unrouted set to policy.
func fuzzTransportWith(t *testing.T, rt http.RoundTripper, policy UnroutedPolicy, raws ...string) (*Transport, []fuzzBase, []string) {
	var ups []Upstream
	var accepted []string
	for _, r := range raws {
		if r == "" {
			continue
		}
		if _, err := New(Config{Upstreams: []Upstream{{BaseURL: r}}, Base: rt}); err != nil {
			continue
		}
		i := len(ups)
		ups = append(ups, Upstream{Name: "u" + strconv.Itoa(i), BaseURL: r, Header: fuzzUpstreamHeader(i)})
		accepted = append(accepted, r)
	}
	if len(ups) == 0 {
		return nil, nil, nil
	}
	tr, err := New(Config{Upstreams: ups, Base: rt, Unrouted: policy, Retry: RetryConfig{Off: true}})
	if err != nil {
		t.Fatalf("New refused base URLs %q that it accepts one by one: %v", accepted, err)
	}
	bases := make([]fuzzBase, len(ups))
	for i, up := range ups {
		u, err := url.Parse(up.BaseURL)
		switch {
		case err != nil:
			t.Fatalf("New accepted BaseURL %q, which is not a URL: %v", up.BaseURL, err)
		case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.Hostname() == "", u.Opaque != "":
			t.Fatalf("New accepted BaseURL %q, not an absolute http or https URL", up.BaseURL)
		case u.User != nil, u.RawQuery != "", u.ForceQuery, u.Fragment != "":
			t.Fatalf("New accepted BaseURL %q, with user info, a query or a fragment", up.BaseURL)
		case dotSegments(u.Path):
			t.Fatalf("New accepted BaseURL %q, whose path %q has dot segments", up.BaseURL, u.Path)
		}
		// A trailing slash is trimmed only when it is a literal one: a
		// base ending in %2F keeps it.
		b := fuzzBase{url: u, path: u.Path, rawPath: u.EscapedPath()}
		if strings.HasSuffix(b.rawPath, "/") {
			b.rawPath, b.path = strings.TrimSuffix(b.rawPath, "/"), strings.TrimSuffix(b.path, "/")
		}
		bases[i] = b
	}
	return tr, bases, accepted
}

// fuzzRequestURL makes the request URL: target alone (mode%4 == 0), or
// target after one of the (accepted) bases, as written, with its host in upper case,
// or with its default port written out; bit 8 of mode writes the scheme in
// upper case.
func fuzzRequestURL(bases []string, target string, mode uint16) string {
	if mode%4 == 0 || len(bases) == 0 {
		return target
	}
	b, err := url.Parse(bases[int(mode/4)%len(bases)])
	if err != nil {
		return target
	}
	scheme, host := b.Scheme, b.Host
	switch mode % 4 {
	case 2:
		host = strings.ToUpper(host)
	case 3:
		if b.Port() == "" {
			if strings.EqualFold(scheme, "https") {
				host += ":443"
			} else {
				host += ":80"
			}
		}
	}
	if mode&0x100 != 0 {
		scheme = strings.ToUpper(scheme)
	}
	return scheme + "://" + host + b.EscapedPath() + target
}

// wantRoute is the upstream a URL is addressed to, as Upstream.BaseURL
// documents it: same scheme, same authority (any case, default port or
// not), decoded and escaped path under the base path, the longest base path
// first; never a path with dot segments. -1 means none.
func wantRoute(u *url.URL, bases []fuzzBase) int {
	if u.Opaque != "" || u.Host == "" {
		return -1
	}
	raw := u.EscapedPath()
	best := -1
	for i, b := range bases {
		if !strings.EqualFold(u.Scheme, b.url.Scheme) ||
			asciiLower(authority(b.url.Scheme, u.Host)) != asciiLower(authority(b.url.Scheme, b.url.Host)) ||
			!pathUnder(u.Path, b.path) || !pathUnder(raw, b.rawPath) {
			continue
		}
		if best < 0 || len(b.path) > len(bases[best].path) {
			best = i
		}
	}
	if best >= 0 && dotSegments(u.Path) {
		return -1
	}
	return best
}

// wantFirst is the upstream (0 or -1) that UnroutedFirst addresses u to,
// u being addressed to none: the first, when u's path lies under its base
// path.
func wantFirst(u *url.URL, first fuzzBase) int {
	if u.Opaque != "" || u.Host == "" || dotSegments(u.Path) || !pathUnder(u.Path, first.path) || !pathUnder(u.EscapedPath(), first.rawPath) {
		return -1
	}
	return 0
}

// authority is host without the scheme's default port or an empty port.
// asciiLower is s with its ASCII capitals in lower case, and every other
// byte as it is: a host's letters compare without case (RFC 3986, 3.2.2),
// anything else byte for byte (strings.EqualFold would take an invalid
// byte for U+FFFD, and match a host that differs from it).
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

func authority(scheme, host string) string {
	def := ":80"
	if strings.EqualFold(scheme, "https") {
		def = ":443"
	}
	if h, ok := strings.CutSuffix(host, def); ok {
		return h
	}
	return strings.TrimSuffix(host, ":")
}

// pathUnder reports whether p is base or lies under it.
func pathUnder(p, base string) bool {
	rest, ok := strings.CutPrefix(p, base)
	return ok && (rest == "" || rest[0] == '/')
}

// dotSegments reports whether p has a "." or ".." segment, with '/' or
// '\' between segments (some servers read a backslash as a slash).
func dotSegments(p string) bool {
	for _, seg := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }) {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

func addRouteSeeds(f *testing.F, withHeader bool) {
	bases := []string{
		"https://api.openai.com/v1",
		"http://b.test:8080/openai/v1/",
		"http://[::1]:9/v1",
		"https://gen.test",
		"http://h.test/proxy%2Fopenai/v1",
		"HTTP://Upper.Test:80/V1",
	}
	targets := []string{
		"/chat/completions?model=x&key=abc&alt=json",
		"/../../admin",
		"/%2e%2e/%2E%2E/admin",
		"/..%2fadmin",
		"%2F..%2F..%2Fadmin",
		"/./x",
		"",
		"/",
		"x/../../y",
		"?key=1&&a=2&%6Bey=3&KEY=4&$alt=json;enum-encoding=int",
		"https://evil.test/v1/chat",
		"//evil.test/x",
		"@evil.test/x",
		"/models/gemini:generateContent?key=k&alt=sse",
	}
	for i, target := range targets {
		for mode := range uint16(4) {
			b0, b1, b2 := bases[i%len(bases)], bases[(i+1)%len(bases)], bases[(i+2)%len(bases)]
			mode := mode + 4*uint16(i%3)
			if withHeader {
				f.Add(b0, b1, b2, target, mode, []string{"", "x-goog-api-key", "X-Request-Id", "x-custom-token"}[mode%4])
			} else {
				f.Add(b0, b1, b2, target, mode)
			}
		}
	}
}

// droppingNext is a next RoundTripper that breaks the contract: it sends
// the request to its real server, closes the answer and returns neither a
// response nor an error (a middleware that dropped it).
func droppingNext(t *testing.T) http.RoundTripper {
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := base.RoundTrip(r)
		if err == nil {
			resp.Body.Close()
		}
		return nil, nil
	})
}

// trailerServers are a primary that answers 503 and a backup that answers
// 200, each telling got the body it received, its X-Checksum trailer and
// its ContentLength.
func trailerServers(t *testing.T) (got chan string, primary, backup *server) {
	got = make(chan string, 2)
	handler := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			got <- fmt.Sprintf("%s %q length %d", body, r.Trailer.Get("X-Checksum"), r.ContentLength)
			w.WriteHeader(code)
		}
	}
	return got, newServer(t, handler(503)), newServer(t, handler(200))
}

// perRequestAllocs sends n requests one by one with send and returns the
// allocations and the bytes of each that took nothing new from the
// package's pools, each sorted. A pool's refill comes after a
// collection, and under -race at random (sync.Pool drops a quarter of
// what it is given): counted, it would make the figures vary from run to
// run. It fails t when fewer than a quarter of the requests are left.
func perRequestAllocs(t *testing.T, n int, send func()) (allocs, bytes []uint64) {
	t.Helper()
	refills := 0
	hedge, watch, canceler := hedgeFires.New, watchFires.New, cancelers.New
	hedgeFires.New = func() any { refills++; return hedge() }
	watchFires.New = func() any { refills++; return watch() }
	cancelers.New = func() any { refills++; return canceler() }
	defer func() { hedgeFires.New, watchFires.New, cancelers.New = hedge, watch, canceler }()
	for range n {
		var before, after runtime.MemStats
		r := refills
		runtime.ReadMemStats(&before)
		send()
		runtime.ReadMemStats(&after)
		if refills == r {
			allocs = append(allocs, after.Mallocs-before.Mallocs)
			bytes = append(bytes, after.TotalAlloc-before.TotalAlloc)
		}
	}
	if len(allocs) < n/4 {
		t.Fatalf("%d of %d requests took nothing new from a pool: too few to tell", len(allocs), n)
	}
	slices.Sort(allocs)
	slices.Sort(bytes)
	return allocs, bytes
}
