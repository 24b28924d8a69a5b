package failover

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"
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
		// The first attempt sends Body; the request about to fail over
		// reads GetBody once for the state it references (pin.go), and
		// the later attempts send those bytes.
		if gets != 1 {
			t.Errorf("GetBody called %d times, want 1", gets)
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
	req = httptestRequest("POST", "http://a.test/v1", chatBody) // the first's body was read
	req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
	_, err = tr.RoundTrip(req)
	if !errors.Is(err, ErrBodyNotReplayable) || !errors.Is(err, boom) {
		t.Fatalf("err = %v, want ErrBodyNotReplayable wrapping GetBody's error", err)
	}
}

// failingBody reads n bytes, then fails with err.
type failingBody struct {
	n   int
	err error
}

func (b *failingBody) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, b.err
	}
	k := min(len(p), b.n)
	for i := range k {
		p[i] = 'x'
	}
	b.n -= k
	return k, nil
}

func (b *failingBody) Close() error { return nil }

// A request whose own body is at fault (its reads fail, or it is shorter
// or longer than its ContentLength) gets net/http's error as it is, tried
// at one upstream only, and counts against none: before, each such request
// counted as a failure at every upstream, and after FailureThreshold of
// them every circuit was open and well-formed requests failed with
// ErrCircuitOpen without being sent.
func TestCallerBodyFaultBlamesNoUpstream(t *testing.T) {
	broken := errors.New("the caller's file went away")
	cases := []struct {
		name string
		req  func(url string) *http.Request
		is   error // what the error must match, when not nil
		// net/http writes ContentLength bytes of a longer body and fails
		// the request only when it sees the rest before the response:
		// the upstream may answer the truncated request.
		mayAnswer bool
	}{
		{"read error", func(url string) *http.Request {
			req := httptestRequest("POST", url, "")
			req.ContentLength = 1000
			req.Body = &failingBody{n: 10, err: broken}
			req.GetBody = func() (io.ReadCloser, error) { return &failingBody{n: 10, err: broken}, nil }
			return req
		}, broken, false},
		{"read error, unknown length", func(url string) *http.Request {
			req := httptestRequest("POST", url, "")
			req.ContentLength = -1
			req.Body = &failingBody{n: 3, err: broken}
			req.GetBody = func() (io.ReadCloser, error) { return &failingBody{n: 3, err: broken}, nil }
			return req
		}, broken, false},
		{"shorter than ContentLength", func(url string) *http.Request {
			req := httptestRequest("POST", url, `{"model":"m"}`)
			req.ContentLength = 100
			return req
		}, nil, false},
		{"longer than ContentLength", func(url string) *http.Request {
			req := httptestRequest("POST", url, `{"model":"m","messages":[]}`)
			req.ContentLength = 5
			return req
		}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			primary := newUpstreamServer(t, 200, "primary")
			backup := newUpstreamServer(t, 200, "backup")
			tr := newTestTransport(t, Config{Breaker: BreakerConfig{FailureThreshold: 2}, Upstreams: []Upstream{
				{Name: "primary", BaseURL: primary.URL},
				{Name: "backup", BaseURL: backup.URL},
			}})
			for i := range 5 {
				resp, err := tr.RoundTrip(tc.req(primary.URL + "/v1/chat"))
				if err == nil {
					resp.Body.Close()
					if tc.mayAnswer && resp.StatusCode == 200 {
						continue
					}
					t.Fatalf("request %d: %d, want the body's error", i, resp.StatusCode)
				}
				var ferr *Error
				if errors.As(err, &ferr) || errors.Is(err, ErrCircuitOpen) {
					t.Fatalf("request %d: %v, want net/http's error as it is", i, err)
				}
				if tc.is != nil && !errors.Is(err, tc.is) {
					t.Fatalf("request %d: %v does not match the body's error", i, err)
				}
			}
			if got := backup.count(); got != 0 {
				t.Errorf("the backup got %d requests: the caller's fault was failed over", got)
			}
			for _, h := range tr.Health() {
				if h.State != "closed" || h.Requests.Failed != 0 || h.BreakerFailures != 0 {
					t.Errorf("%s: %s with %d failures counted; want closed and none", h.Name, h.State, h.Requests.Failed)
				}
			}
			resp := mustPost(t, tr, primary.URL+"/v1/chat", `{"model":"m"}`)
			if got := readBody(t, resp); got != "primary" {
				t.Fatalf("a well-formed request got %q, want the primary's answer", got)
			}
		})
	}
}

// jsonEnd ends a peek at the end of the object or array a body begins
// with (braces in strings and escaped quotes aside), at once for a body
// that begins with anything else, and never inside a value.
func TestJSONEnd(t *testing.T) {
	cases := []struct {
		body string
		end  int // the bytes the end is found after; -1: not yet
	}{
		{`{"a":1}`, 7},
		{`  {"a":{"b":[1,2]}}trailing`, 19},
		{`{"a":"}"}`, 9},
		{`{"a":"\"}"}x`, 11},
		{`{"a":"\\"}x`, 10},
		{`[{"a":"]"}]`, 11},
		{`{"a":1`, -1},
		{`{"a":"}`, -1},
		{``, -1},
		{"  \n", -1},
		{`<html>`, 0},
		{`"a string"`, 0},
		{`Too Many Requests`, 0},
	}
	for _, tc := range cases {
		// Byte by byte, as a body that trickles, and at once.
		var s jsonEnd
		got := -1
		for i := range len(tc.body) + 1 {
			if s.done([]byte(tc.body[:i])) {
				got = s.off
				break
			}
		}
		var whole jsonEnd
		if whole.done([]byte(tc.body)) != (tc.end >= 0) || got != tc.end && !(tc.end == 0 && got == firstNonSpace(tc.body)) {
			t.Errorf("%q: end after %d bytes, want %d", tc.body, got, tc.end)
		}
	}
}

func firstNonSpace(s string) int { return len(s) - len(strings.TrimLeft(s, " \t\r\n")) }

// A peeked body that stalls is handed on with the pending read behind it:
// the caller reads every byte, in order, when they come; closing it ends
// the read-ahead, so no goroutine outlives the body.
func TestPeekStalledBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pr, pw := io.Pipe()
		go func() {
			io.WriteString(pw, `{"error":`)
			time.Sleep(time.Hour) // far past the peek's wait
			io.WriteString(pw, `"late"}`)
			pw.Close()
		}()
		prefix, body := peek(pr, 4<<10, drainTimeout, new(jsonEnd).judge)
		if string(prefix) != `{"error":` {
			t.Fatalf("prefix %q, want the bytes that came in time", prefix)
		}
		got, err := io.ReadAll(body)
		if string(got) != `{"error":"late"}` || err != nil {
			t.Errorf("read %q, %v; want the body whole", got, err)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		pr, pw := io.Pipe()
		go io.WriteString(pw, `{"error":`)
		_, body := peek(pr, 4<<10, drainTimeout, new(jsonEnd).judge)
		body.Close()
		synctest.Wait() // the read-ahead has ended: the bubble would say so otherwise
		if _, err := io.ReadAll(body); err == nil {
			t.Error("a closed body read without an error")
		}
		pw.Close()
	})
}

// wrote tells w, as net/http does through the request's ClientTrace,
// that Base wrote the request, and reports whether w's request has that
// trace.
func wrote(w *watchedBody) bool {
	req := w.traced(httptestRequest("GET", "http://a.test/", ""))
	trace := httptrace.ContextClientTrace(req.Context())
	if trace == nil || trace.WroteRequest == nil {
		return false
	}
	trace.WroteRequest(httptrace.WroteRequestInfo{})
	return true
}

// A body net/http knows to be in memory goes to Base as it is (net/http
// then writes headers and body at once, and fails one that disagrees with
// its ContentLength before writing a byte), with a watcher that already
// holds the verdict when the two disagree; any other body is watched as it
// is read.
func TestWatchBody(t *testing.T) {
	const s = "0123456789"
	const (
		unwatched = iota
		misfit    // sent as it is, the caller's fault known ahead
		watched
	)
	for _, tc := range []struct {
		name string
		body io.Reader
		n    int64
		want int
	}{
		{"strings.Reader", strings.NewReader(s), 10, unwatched},
		{"bytes.Reader", bytes.NewReader([]byte(s)), 10, unwatched},
		{"bytes.Buffer", bytes.NewBufferString(s), 10, unwatched},
		{"NopCloser(strings.Reader)", io.NopCloser(strings.NewReader(s)), 10, unwatched},
		{"NopCloser(bytes.Reader), a WriterTo", io.NopCloser(bytes.NewReader([]byte(s))), 10, unwatched},
		{"NopCloser(NopCloser(...))", io.NopCloser(io.NopCloser(strings.NewReader(s))), 10, unwatched},
		{"a ContentLength too short", strings.NewReader(s), 9, misfit},
		{"a ContentLength too long", io.NopCloser(strings.NewReader(s)), 11, misfit},
		{"a bytes.Buffer too short", bytes.NewBufferString(s), 100, misfit},
		{"ContentLength unknown", strings.NewReader(s), -1, watched},
		{"ContentLength 0", strings.NewReader(s), 0, watched},
		{"a reader of another type", iotest.HalfReader(strings.NewReader(s)), 10, watched},
		{"NopCloser of another type", io.NopCloser(iotest.ErrReader(io.ErrUnexpectedEOF)), 10, watched},
	} {
		rc := io.NopCloser(tc.body) // as http.NewRequest makes it
		sent, w := watchBody(nil, rc, tc.n)
		got := watched
		switch {
		case w == nil && sent == rc:
			got = unwatched
		case w != nil && sent == rc && !w.faulted(errors.New("a dial's")) && wrote(w) && w.faulted(errors.New("net/http's own")):
			got = misfit // the caller's fault once Base has written the request
		case w != nil && sent == io.ReadCloser(w) && !w.faulted(errors.New("net/http's own")):
			got = watched
		default:
			t.Errorf("%s: sent %T, watcher %v: none of the three", tc.name, sent, w != nil)
			continue
		}
		if got != tc.want {
			t.Errorf("%s: %d, want %d (0 unwatched, 1 misfit, 2 watched)", tc.name, got, tc.want)
		}
	}
	for _, body := range []io.ReadCloser{nil, http.NoBody} {
		if sent, w := watchBody(nil, body, 10); sent != body || w != nil {
			t.Errorf("%v: sent %v, watcher %v; want it as it is, unwatched", body, sent, w)
		}
	}
}

// nopCloserReader finds the reader io.NopCloser wrapped, in both of its
// types, as reflect does (on this Go, without reflect: nopCloserLayout).
func TestNopCloserReader(t *testing.T) {
	t.Logf("io.NopCloser's layout read directly: %v", nopCloserLayout)
	for _, r := range []io.Reader{strings.NewReader("x"), bytes.NewReader([]byte("x")), iotest.HalfReader(strings.NewReader("x"))} {
		body := io.NopCloser(r)
		if got := nopCloserReader(body); got != r {
			t.Errorf("NopCloser(%T): got %T %p, want %p", r, got, got, r)
		}
		if want := reflect.ValueOf(body).Field(0).Interface(); nopCloserReader(body) != want {
			t.Errorf("NopCloser(%T): not reflect's reader", r)
		}
	}
}

// The bytes judged end with the JSON object the body begins with, however
// the body comes (found by FuzzInspect429): what follows it in the same
// read is handed on, not judged.
func TestPeekJudgesTheObject(t *testing.T) {
	const body = `{"a":1}"retryDelay":"5s"`
	for name, r := range map[string]io.Reader{
		"at once":     strings.NewReader(body),
		"byte a time": iotest.OneByteReader(strings.NewReader(body)),
	} {
		for _, n := range []int{4 << 10, 9} { // 9: the read that reaches the bound holds the object's end
			r := r
			if n == 9 {
				r = strings.NewReader(body)
			}
			var end jsonEnd
			prefix, rc := peek(io.NopCloser(r), n, time.Minute, end.judge)
			got, err := io.ReadAll(rc)
			if string(prefix) != `{"a":1}` || string(got) != body || err != nil {
				t.Errorf("%s, at most %d: judged %q, read %q, %v; want the object, then the whole body", name, n, prefix, got, err)
			}
		}
	}
}

// A body the Transport buffers for replay is read within the request's
// context: a body that stalls does not hold RoundTrip past the caller's
// cancellation, which it ends with the context's error, as net/http
// does, having sent nothing.
func TestBufferingHeedsCancellation(t *testing.T) {
	up := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "up", BaseURL: up.URL + "/v1"}}})
	pr, pw := io.Pipe()
	defer pw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", up.URL+"/v1/files", pr)
	done := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		done <- err
	}()
	io.WriteString(pw, "the first part, then nothing") // the Transport is reading
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RoundTrip still reads a stalled body 5s after the caller canceled")
	}
	if n := up.count(); n != 0 {
		t.Errorf("the upstream got %d requests, want none", n)
	}
}

// A body the Transport read ahead (a 400's, peeked whole or in part; a
// guarded stream's held events) reads nothing after Close, as net/http's
// own body does: it returned the bytes it held. Each case is checked
// against a bare http.Transport's answer to the same request first.
func TestPeekedBodiesReadNothingAfterClose(t *testing.T) {
	long := `{"error":{"message":"bad request"}}` + strings.Repeat(" ", 64<<10)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/whole":
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"bad request"}}`)
		case "/v1/part":
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, long)
		case "/v1/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, sseChatRole+sseChatRole)
		}
	})
	bare := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(bare.CloseIdleConnections)
	tr := newTestTransport(t, Config{
		StreamGuard: &StreamGuard{HoldEvents: 1},
		Upstreams:   []Upstream{{Name: "a", BaseURL: srv.URL + "/v1"}},
	})
	for _, path := range []string{"/v1/whole", "/v1/part", "/v1/stream"} {
		var want string // bare's error
		for _, rt := range []struct {
			name string
			rt   http.RoundTripper
		}{{"bare", bare}, {"failover", tr}} {
			resp, err := rt.rt.RoundTrip(httptestRequest("GET", srv.URL+path, ""))
			if err != nil {
				t.Fatalf("%s %s: %v", rt.name, path, err)
			}
			if _, err := resp.Body.Read(make([]byte, 4)); err != nil {
				t.Fatalf("%s %s: first read: %v", rt.name, path, err)
			}
			resp.Body.Close()
			n, err := resp.Body.Read(make([]byte, 64))
			if want == "" && err != nil {
				want = err.Error()
			}
			if n != 0 || err == nil || err.Error() != want {
				t.Errorf("%s %s: a read after Close got %d bytes, %v; want none, and %q", rt.name, path, n, err, want)
			}
		}
	}
}

// A stream thrown away (a hedge's loser, an answer held and then replaced)
// is closed unread: draining it only keeps its upstream generating, and
// billing, for up to maxDrain bytes or drainTimeout. A JSON answer is
// still drained, so that its connection serves again.
func TestDiscardClosesAStreamUnread(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			for {
				if _, err := io.WriteString(w, sseChatRole); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(time.Millisecond):
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"error":"overloaded"}`)
	})
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	for _, tt := range []struct {
		path  string
		reads bool
	}{{"/stream", false}, {"/json", true}} {
		resp, err := base.RoundTrip(httptestRequest("GET", srv.URL+tt.path, ""))
		if err != nil {
			t.Fatal(err)
		}
		body := &bodyProbe{Reader: resp.Body}
		orig := resp.Body
		resp.Body = body
		discard(resp)
		orig.Close()
		if got := body.reads.Load() > 0; got != tt.reads || !body.closed.Load() {
			t.Errorf("%s: read %d times, closed %v; want read %v, closed", tt.path, body.reads.Load(), body.closed.Load(), tt.reads)
		}
	}
}

// A body in memory that disagrees with its ContentLength is the caller's
// fault only once Base has written the request, which reads it: an
// upstream that refuses the connection failed before, and is to blame as
// for any request. Here the next upstream renames the model, and its body,
// the renamed one, has the right length: the request is served. The
// verdict held ahead blamed the caller for the refused dial, and the
// request ended there, with the dial's error.
func TestMisfitBodyDialErrorIsTheUpstreams(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String()
	l.Close()
	backup := newUpstreamServer(t, http.StatusOK, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{BaseURL: refused},
		{BaseURL: backup.URL, Models: map[string]string{"gpt-x": "b-model"}},
	}})
	body := `{"model":"gpt-x"}`
	req := httptestRequest("POST", refused+"/v1/chat", body)
	req.ContentLength = int64(len(body)) + 5
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("got %v, want the backup's answer", err)
	}
	readBody(t, resp)
	if got := backup.requests(); len(got) != 1 || !strings.Contains(got[0].Body, "b-model") {
		t.Errorf("the backup got %+v, want the renamed body", got)
	}
	if h := tr.Health()[0]; h.Requests.Failed == 0 {
		t.Errorf("the refusing upstream's health %+v, want its failure counted", h.Requests)
	}
}
