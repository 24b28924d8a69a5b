package failover

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/failover-go/failover/failovertest"
	"go.uber.org/goleak"
)

func TestDefaultClassifierStatus(t *testing.T) {
	tests := []struct {
		code int
		want Outcome
	}{
		{200, Success}, {201, Success}, {204, Success}, {301, Success}, {304, Success},
		{400, Rejected}, {404, Rejected}, {409, Rejected}, {413, Rejected}, {422, Rejected},
		{401, AuthFailed}, {403, AuthFailed},
		{429, RateLimited}, {402, RateLimited},
		{408, Failed}, {500, Failed}, {501, Failed}, {502, Failed}, {503, Failed}, {504, Failed}, {529, Failed},
	}
	for _, tt := range tests {
		resp := &http.Response{StatusCode: tt.code, Body: http.NoBody}
		if got := DefaultClassifier(resp, nil); got != tt.want {
			t.Errorf("DefaultClassifier(%d) = %v, want %v", tt.code, got, tt.want)
		}
	}
}

func TestDefaultClassifierErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Outcome
	}{
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, Failed},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, Failed},
		{"eof", io.ErrUnexpectedEOF, Failed},
		{"attempt timeout", ErrAttemptTimeout, Failed},
		// The Transport decides Canceled from the caller's context first; a
		// context error the classifier sees is the upstream's.
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("i/o timeout: %w", context.DeadlineExceeded)}, Failed},
		{"header timeout", fmt.Errorf("net/http: timeout awaiting response headers: %w", context.DeadlineExceeded), Failed},
		{"untrusted certificate", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, Failed},
		{"invalid header", errors.New(`net/http: invalid header field value for "X-Foo"`), Rejected},
		{"unsupported scheme", errors.New(`unsupported protocol scheme "ftp"`), Rejected},
	}
	for _, tt := range tests {
		if got := DefaultClassifier(nil, tt.err); got != tt.want {
			t.Errorf("DefaultClassifier(%s) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A real TLS server with a certificate the client does not trust is a
// failure of that upstream: the request moves on to the next.
func TestUntrustedCertificateFailsOver(t *testing.T) {
	bad := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("request reached the server with the untrusted certificate")
	}))
	bad.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake failure is the point
	defer bad.Close()
	good := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "bad", BaseURL: bad.URL},
		{Name: "good", BaseURL: good.URL},
	}})
	resp := mustGet(t, tr, bad.URL+"/v1/x")
	if got := readBody(t, resp); got != "ok" {
		t.Fatalf("body = %q, want ok", got)
	}
	h := tr.Health()
	if h[0].Requests.Failed != 1 {
		t.Fatalf("bad upstream failures = %d, want 1", h[0].Requests.Failed)
	}
}

func TestOutcomeString(t *testing.T) {
	for o, want := range outcomeNames {
		if got := Outcome(o).String(); got != want {
			t.Errorf("Outcome(%d) = %q, want %q", o, got, want)
		}
	}
	if got := Outcome(99).String(); got != "unknown" {
		t.Errorf("Outcome(99) = %q, want unknown", got)
	}
}

// Timeouts of Base are the upstream's failures, not the caller's
// cancellation: a dial timeout and ResponseHeaderTimeout fail over and count
// toward the breaker.
func TestBaseTimeoutsFailOver(t *testing.T) {
	backup := newUpstreamServer(t, 200, "from backup")
	t.Run("dial timeout", func(t *testing.T) {
		base := http.DefaultTransport.(*http.Transport).Clone()
		base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if strings.HasPrefix(addr, "blackhole.test") {
				// What a blackholed host gives after Dialer.Timeout.
				d := net.Dialer{Deadline: time.Now().Add(-time.Second)}
				return d.DialContext(ctx, network, "127.0.0.1:9")
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}
		tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{
			{Name: "primary", BaseURL: "http://blackhole.test/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1"},
		}})
		resp := mustGet(t, tr, "http://blackhole.test/v1/models")
		if got := readBody(t, resp); got != "from backup" {
			t.Fatalf("body %q, want the backup's", got)
		}
		if h := tr.Health()[0]; h.Requests.Failed != 1 || h.BreakerFailures != 1 {
			t.Fatalf("primary %+v: a dial timeout is a failure", h.Requests)
		}
	})
	t.Run("response header timeout", func(t *testing.T) {
		slow := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		// The timeout on the primary's requests only: the backup, sent
		// through it too, had to answer within 50ms of wall clock, which
		// a loaded machine could overrun.
		timed := http.DefaultTransport.(*http.Transport).Clone()
		timed.ResponseHeaderTimeout = 50 * time.Millisecond
		plain := http.DefaultTransport.(*http.Transport).Clone()
		t.Cleanup(timed.CloseIdleConnections)
		t.Cleanup(plain.CloseIdleConnections)
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Host == slow.Listener.Addr().String() {
				return timed.RoundTrip(r)
			}
			return plain.RoundTrip(r)
		})
		tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{
			{Name: "primary", BaseURL: slow.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1"},
		}})
		resp := mustGet(t, tr, slow.URL+"/v1/models")
		if got := readBody(t, resp); got != "from backup" {
			t.Fatalf("body %q, want the backup's", got)
		}
		if h := tr.Health()[0]; h.Requests.Failed != 1 {
			t.Fatalf("primary %+v: a header timeout is a failure", h.Requests)
		}
	})
}

// faultServer is a loopback HTTP/1.1 server that answers each request by
// running a fault on the raw connection: it can misbehave in ways no
// http.Handler can (reset mid-headers, lie about Content-Length).
type faultServer struct {
	l     net.Listener
	fault func(c net.Conn, r *http.Request)
	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
	done  chan struct{} // closed when the server shuts down
}

func newFaultServer(t *testing.T, fault func(c net.Conn, r *http.Request)) *faultServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &faultServer{l: l, fault: fault, conns: map[net.Conn]bool{}, done: make(chan struct{})}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(s.close)
	return s
}

func (s *faultServer) URL() string { return "http://" + s.l.Addr().String() }

func (s *faultServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			br := bufio.NewReader(c)
			for {
				r, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, r.Body)
				s.fault(c, r)
				if r.Close {
					return
				}
			}
		}()
	}
}

// open returns the number of connections the server holds.
func (s *faultServer) open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *faultServer) close() {
	select {
	case <-s.done:
		return
	default:
	}
	close(s.done)
	s.l.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// hang blocks until the server shuts down or the client goes away.
func (s *faultServer) hang(c net.Conn) {
	go func() { // a read returns when the client closes
		io.Copy(io.Discard, c)
	}()
	<-s.done
}

// reset closes c with an RST instead of a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func answer(status, headers, body string) func(net.Conn, *http.Request) {
	return func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 %s\r\n%sContent-Length: %d\r\n\r\n%s", status, headers, len(body), body)
	}
}

// What the caller sees of a fault, and what the primary's breaker records.
type faultCase struct {
	name  string
	fault func(s *faultServer) func(net.Conn, *http.Request)

	// With a healthy backup behind the primary.
	failover bool // the backup serves the request

	// With the primary alone.
	status  int   // the caller gets this response, or
	errIs   error // an error matching this
	bodyErr bool  // reading the body (of a 2xx) fails: the fault came after the headers

	counted  Outcome       // what the primary's attempt counts as
	cooldown time.Duration // after a 429: how long the primary cools down
}

// The fault table of the README's "Failure semantics": each row runs with
// a backup (does the request fail over?) and alone (what does the caller
// see?), checks what the primary counted, and that no connection or
// goroutine is left behind.
func TestFaults(t *testing.T) {
	in10s := func(layout string) func() string { // a date 10s after the 429 is sent
		return func() string { return "Retry-After: " + time.Now().Add(10*time.Second).UTC().Format(layout) + "\r\n" }
	}
	fixed := func(h string) func() string { return func() string { return h } }
	retryAfterForms := []struct {
		form     string
		header   func() string
		cooldown time.Duration // what the primary cools down for, give or take a second
	}{
		{"seconds", fixed("Retry-After: 7\r\n"), 7 * time.Second},
		{"RFC 1123 date", in10s(http.TimeFormat), 10 * time.Second},
		{"RFC 850 date", in10s("Monday, 02-Jan-06 15:04:05 GMT"), 10 * time.Second},
		{"asctime date", in10s(time.ANSIC), 10 * time.Second},
		{"retry-after-ms", fixed("Retry-After-Ms: 1500\r\n"), 1500 * time.Millisecond},
		{"garbage", fixed("Retry-After: soon\r\n"), time.Second},
		{"negative", fixed("Retry-After: -3\r\n"), time.Second},
		{"huge", fixed("Retry-After: 99999999999\r\n"), 60 * time.Second},
		{"absent", fixed(""), time.Second},
	}
	cases := []faultCase{
		{name: "refused", fault: nil, failover: true, errIs: syscall.ECONNREFUSED, counted: Failed},
		{name: "accepts, never answers", fault: func(s *faultServer) func(net.Conn, *http.Request) {
			return func(c net.Conn, _ *http.Request) { s.hang(c) }
		}, failover: true, errIs: ErrAttemptTimeout, counted: Failed},
		{name: "headers, then hangs", fault: func(s *faultServer) func(net.Conn, *http.Request) {
			return func(c net.Conn, _ *http.Request) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")
				s.hang(c)
			}
		}, status: 200, bodyErr: true, counted: Success},
		{name: "reset mid-headers", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return func(c net.Conn, _ *http.Request) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Ty")
				reset(c)
			}
		}, failover: true, errIs: &ioOrReset{}, counted: Failed},
		{name: "reset mid-body", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return func(c net.Conn, _ *http.Request) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"id\":")
				time.Sleep(10 * time.Millisecond)
				reset(c)
			}
		}, status: 200, bodyErr: true, counted: Success},
		{name: "truncated body", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return func(c net.Conn, _ *http.Request) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"id\":")
				c.Close()
			}
		}, status: 200, bodyErr: true, counted: Success},
		{name: "truncated SSE stream", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return func(c net.Conn, _ *http.Request) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
				ev := "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
				fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev) // content: the stream is the caller's
				c.Close()                                   // no terminating chunk, no [DONE]
			}
		}, status: 200, bodyErr: true, counted: Success},
		{name: "slow headers, byte by byte", fault: func(s *faultServer) func(net.Conn, *http.Request) {
			return func(c net.Conn, _ *http.Request) {
				for _, b := range []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") {
					select {
					case <-s.done:
						return
					case <-time.After(20 * time.Millisecond):
					}
					if _, err := c.Write([]byte{b}); err != nil {
						return
					}
				}
			}
		}, failover: true, errIs: ErrAttemptTimeout, counted: Failed},
		{name: "200 with malformed JSON", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return answer("200 OK", "Content-Type: application/json\r\n", `{"choices":[{"message":`)
		}, status: 200, counted: Success},
		{name: "huge headers", fault: func(*faultServer) func(net.Conn, *http.Request) {
			big := "X-Big: " + strings.Repeat("a", 200<<10) + "\r\n"
			return answer("200 OK", big, "ok")
		}, failover: true, errIs: &ioOrReset{}, counted: Failed},
		{name: "401", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return answer("401 Unauthorized", "", `{"error":{"code":"invalid_api_key"}}`)
		}, failover: true, status: 401, counted: AuthFailed},
		{name: "403", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return answer("403 Forbidden", "", `{"error":{"status":"PERMISSION_DENIED"}}`)
		}, failover: true, status: 403, counted: AuthFailed},
		{name: "400", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return answer("400 Bad Request", "", `{"error":{"type":"invalid_request_error"}}`)
		}, status: 400, counted: Rejected},
		{name: "400, prompt too long", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return answer("400 Bad Request", "Content-Type: application/json\r\n", `{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`)
		}, failover: true, status: 400, counted: Unservable},
		{name: "400, content refused", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return answer("400 Bad Request", "Content-Type: application/json\r\n", `{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400}}`)
		}, status: 400, counted: Rejected},
		{name: "403, moderation", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return answer("403 Forbidden", "Content-Type: application/json\r\n", `{"error":{"code":403,"message":"Your chosen model requires moderation and your input was flagged","metadata":{"reasons":["harassment"],"flagged_input":"..."}}}`)
		}, status: 403, counted: Rejected},
		{name: "413, over the tokens per minute", fault: func(*faultServer) func(net.Conn, *http.Request) {
			return answer("413 Request Entity Too Large", "Content-Type: application/json\r\n", `{"error":{"message":"Request too large for model llama-3.1-8b-instant in organization org_x service tier on_demand on tokens per minute (TPM): Limit 6000, Requested 12328, please reduce your message size and try again.","type":"tokens","code":"rate_limit_exceeded"}}`)
		}, failover: true, status: 413, counted: Unservable},
	}
	for _, code := range []string{"500 Internal Server Error", "502 Bad Gateway", "503 Service Unavailable", "504 Gateway Timeout", "529 Overloaded", "408 Request Timeout"} {
		cases = append(cases, faultCase{name: code, fault: func(*faultServer) func(net.Conn, *http.Request) {
			return answer(code, "", `{"error":"`+code+`"}`)
		}, failover: true, status: atoi(code), counted: Failed})
	}
	for _, ra := range retryAfterForms {
		cases = append(cases, faultCase{name: "429, " + ra.form, fault: func(*faultServer) func(net.Conn, *http.Request) {
			return func(c net.Conn, r *http.Request) {
				answer("429 Too Many Requests", ra.header(), `{"error":{"type":"rate_limit_exceeded"}}`)(c, r)
			}
		}, failover: true, status: 429, counted: RateLimited, cooldown: ra.cooldown})
	}
	cases = append(cases, faultCase{name: "402, credits spent", fault: func(*faultServer) func(net.Conn, *http.Request) {
		return answer("402 Payment Required", "", `{"error":{"code":402,"message":"Insufficient credits"}}`)
	}, failover: true, status: 402, counted: RateLimited, cooldown: time.Minute})

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leaks := goleak.IgnoreCurrent()
			for _, withBackup := range []bool{true, false} {
				runFault(t, tc, withBackup)
			}
			goleak.VerifyNone(t, leaks)
		})
	}
}

// ioOrReset matches the errors a connection broken by the server gives:
// EOF, a reset, or a header that does not parse.
type ioOrReset struct{}

func (*ioOrReset) Error() string { return "a broken connection" }

func atoi(status string) int {
	var n int
	fmt.Sscanf(status, "%d", &n)
	return n
}

func runFault(t *testing.T, tc faultCase, withBackup bool) {
	t.Helper()
	mode := "alone"
	if withBackup {
		mode = "with backup"
	}
	var primary *faultServer
	primaryURL := failovertest.ClosedURL(t)
	if tc.fault != nil {
		primary = newFaultServer(t, nil)
		primary.fault = tc.fault(primary)
		primaryURL = primary.URL()
	}
	upstreams := []Upstream{{Name: "primary", BaseURL: primaryURL}}
	var backup *server
	if withBackup {
		backup = newUpstreamServer(t, 200, "from backup")
		upstreams = append(upstreams, Upstream{Name: "backup", BaseURL: backup.URL})
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxResponseHeaderBytes = 64 << 10
	tr := newTestTransport(t, Config{Base: base, Upstreams: upstreams, AttemptTimeout: 300 * time.Millisecond})

	// The caller's deadline is what ends a body that hangs after its
	// headers (AttemptTimeout never cuts a body). The other cases have
	// none: on a starved machine a deadline would end them early, and
	// the caller's own error is not what they test.
	ctx := context.Background()
	if tc.bodyErr {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
	}
	req := httptestRequest("POST", primaryURL+"/v1/chat/completions", chatBody).WithContext(ctx)
	resp, err := tr.RoundTrip(req)

	switch {
	case withBackup && tc.failover:
		if err != nil {
			t.Fatalf("%s: %v, want the backup's answer", mode, err)
		}
		if got := readBody(t, resp); got != "from backup" {
			t.Fatalf("%s: got %d %q, want the backup's answer", mode, resp.StatusCode, got)
		}
	case tc.status != 0:
		if err != nil {
			t.Fatalf("%s: %v, want a %d", mode, err, tc.status)
		}
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: status %d, want %d", mode, resp.StatusCode, tc.status)
		}
		_, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if tc.bodyErr != (rerr != nil) {
			t.Fatalf("%s: reading the body: %v; want an error: %v", mode, rerr, tc.bodyErr)
		}
		if backup != nil && backup.count() != 0 {
			t.Fatalf("%s: the backup was tried after a %d", mode, tc.status)
		}
	default:
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("%s: got a %d, want an error", mode, resp.StatusCode)
		}
		var ferr *Error
		if !errors.As(err, &ferr) {
			t.Fatalf("%s: err %T %v, want an *Error", mode, err, err)
		}
		if _, broken := tc.errIs.(*ioOrReset); !broken && !errors.Is(err, tc.errIs) {
			t.Fatalf("%s: err %v, want it to match %v", mode, err, tc.errIs)
		}
	}
	// Alone, a transient failure or a short wait is retried once
	// (RetryConfig); with a backup as good, never.
	retries := uint64(metricValue(t, tr, `failover_retries_total{upstream="primary"}`))
	if withBackup && retries != 0 || retries > 1 {
		t.Fatalf("%s: the primary was retried %d times", mode, retries)
	}
	h := tr.Health()[0]
	if got := countOf(h.Requests, tc.counted); got != 1+retries || h.Requests.Total() != 1+retries {
		t.Fatalf("%s: primary counted %+v, want %d %v", mode, h.Requests, 1+retries, tc.counted)
	}
	if tc.cooldown > 0 && (h.Cooldown > tc.cooldown || h.Cooldown < tc.cooldown-1500*time.Millisecond) {
		t.Fatalf("%s: primary cools down %v, want about %v", mode, h.Cooldown, tc.cooldown)
	}
	if withBackup && tc.failover && backup.count() != 1 {
		t.Fatalf("%s: backup got %d requests", mode, backup.count())
	}

	tr.CloseIdleConnections()
	if backup != nil {
		backup.Close()
	}
	if primary != nil {
		primary.close()
		if n := primary.open(); n != 0 {
			t.Fatalf("%s: %d connections left open on the primary", mode, n)
		}
	}
}

func countOf(c Counts, o Outcome) uint64 {
	return [...]uint64{c.Success, c.Rejected, c.AuthFailed, c.RateLimited, c.Failed, c.Canceled, c.Unservable}[o]
}

// DefaultClassifier on any status from 0 to 999 and any kind of error never
// panics, returns a valid Outcome and never Canceled; Success iff there is no
// error and the status is below 400; the documented outcome for each status,
// and for errors that the documentation names.
func FuzzClassifier(f *testing.F) {
	for _, code := range []int{0, 99, 200, 204, 301, 399, 400, 401, 403, 404, 408, 429, 499, 500, 501, 503, 529, 599, 600, 999} {
		f.Add(code, 0, "", 0)
	}
	for kind := range numErrKinds {
		f.Add(200, kind, "net/http: invalid header field value", kind%4)
		f.Add(503, kind, "stopped after 10 redirects", kind%3)
	}
	f.Fuzz(func(t *testing.T, status, kind int, msg string, wrap int) {
		code := int(uint(status) % 1000)
		err := fuzzError(kind, msg, wrap)
		var resp *http.Response
		if err == nil || wrap&4 != 0 {
			// A RoundTripper that breaks its contract may give both.
			resp = &http.Response{StatusCode: code, Status: strconv.Itoa(code), Header: http.Header{}, Body: http.NoBody}
		}
		in := fmt.Sprintf("status %d, error %#v (%v)", code, err, err)
		o := DefaultClassifier(resp, err)
		if o < Success || o > Failed || o.String() == "unknown" {
			t.Fatalf("%s: DefaultClassifier = %d (%v), not a valid outcome other than Canceled", in, int(o), o)
		}
		if (o == Success) != (err == nil && code < 400) {
			t.Fatalf("%s: DefaultClassifier = %v", in, o)
		}
		if again := DefaultClassifier(resp, err); again != o {
			t.Fatalf("%s: DefaultClassifier = %v, then %v", in, o, again)
		}
		if err == nil {
			want := Rejected
			switch {
			case code < 400:
				want = Success
			case code == 401 || code == 403:
				want = AuthFailed
			case code == 429 || code == 402:
				want = RateLimited
			case code == 408 || code >= 500:
				want = Failed
			}
			if o != want {
				t.Fatalf("%s: DefaultClassifier = %v, want %v", in, o, want)
			}
			return
		}
		if o != Failed && o != Rejected {
			t.Fatalf("%s: DefaultClassifier = %v for an error, want failed or rejected", in, o)
		}
		if errors.Is(err, ErrAttemptTimeout) && o != Failed {
			t.Fatalf("%s: DefaultClassifier = %v for an attempt timeout, want failed", in, o)
		}
		var cert *tls.CertificateVerificationError
		if errors.As(err, &cert) && o != Failed {
			t.Fatalf("%s: DefaultClassifier = %v for an untrusted certificate, want failed", in, o)
		}
		if kind%numErrKinds >= 1 && kind%numErrKinds <= 7 && wrap&3 != 3 && o != Failed {
			// A timeout, a context error the caller's context did not
			// cause, EOF, refused, reset: the upstream failed.
			t.Fatalf("%s: DefaultClassifier = %v, want failed", in, o)
		}
	})
}

const numErrKinds = 16

// fuzzError makes an error of the given kind (none for kind 0), wrapped
// wrap%4 times: in fmt.Errorf, a *net.OpError, then a *url.Error that
// quotes msg.
func fuzzError(kind int, msg string, wrap int) error {
	var err error
	switch uint(kind) % numErrKinds {
	case 0:
		return nil
	case 1:
		err = ErrAttemptTimeout
	case 2:
		err = fmt.Errorf("net/http: timeout awaiting response headers: %w", context.DeadlineExceeded)
	case 3:
		err = context.Canceled
	case 4:
		err = io.EOF
	case 5:
		err = io.ErrUnexpectedEOF
	case 6:
		err = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	case 7:
		err = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	case 8:
		err = errors.New(msg)
	case 9:
		err = &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}
	case 10:
		err = x509.HostnameError{Certificate: &x509.Certificate{}, Host: msg}
	case 11:
		err = x509.CertificateInvalidError{Cert: &x509.Certificate{}, Reason: x509.Expired, Detail: msg}
	case 12:
		err = x509.UnknownAuthorityError{}
	case 13:
		err = fmt.Errorf("net/http: invalid header field value for %q", msg)
	case 14:
		err = fmt.Errorf("unsupported protocol scheme %q", msg)
	case 15:
		err = errors.Join(errors.New(msg), ErrAttemptTimeout)
	}
	for i := range uint(wrap) % 4 {
		switch i {
		case 0:
			err = fmt.Errorf("attempt: %w", err)
		case 1:
			err = &net.OpError{Op: "read", Net: "tcp", Err: err}
		case 2:
			err = &url.Error{Op: "Post", URL: msg, Err: err}
		}
	}
	return err
}

// An upstream whose answer net/http refuses fails over, whatever the
// refusal's message says: an HTTP/2 header that the protocol forbids (a
// name in upper case, a control character in a value, as broken proxies
// send) and a malformed HTTP/1 header line are the upstream's failure, not
// the caller's invalid header, though net/http's message quotes "invalid
// header" (go-retryablehttp's pattern for a request no upstream can send).
func TestMalformedAnswerFailsOver(t *testing.T) {
	backup := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "from backup")
	}))
	backup.Config.Protocols = new(http.Protocols)
	backup.Config.Protocols.SetHTTP1(true)
	backup.Config.Protocols.SetUnencryptedHTTP2(true) // for h2cTransport
	backup.Start()
	defer backup.Close()
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
		base func() *http.Transport
	}{
		{"HTTP/2 header name in upper case", func(t *testing.T) string {
			return rawH2Server(t, hpackLiteral("X-Upper", "v"))
		}, h2cTransport},
		{"HTTP/2 header value with a control character", func(t *testing.T) string {
			return rawH2Server(t, hpackLiteral("x-bad", "a\x01b"))
		}, h2cTransport},
		{"HTTP/1 header line without a colon", func(t *testing.T) string {
			s := newFaultServer(t, func(c net.Conn, _ *http.Request) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\ninvalid header\r\nContent-Length: 2\r\n\r\nok")
			})
			return s.URL()
		}, func() *http.Transport { return http.DefaultTransport.(*http.Transport).Clone() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := tc.url(t)
			tr := newTestTransport(t, Config{Base: tc.base(), Upstreams: []Upstream{
				{Name: "primary", BaseURL: primary + "/v1"},
				{Name: "backup", BaseURL: backup.URL + "/v1"},
			}})
			resp, err := tr.RoundTrip(httptestRequest("POST", primary+"/v1/chat/completions", chatBody))
			if err != nil {
				t.Fatalf("RoundTrip: %v, want the backup's answer", err)
			}
			if got := readBody(t, resp); got != "from backup" {
				t.Fatalf("body %q, want the backup's", got)
			}
			if h := tr.Health()[0]; h.Requests.Failed != 1 || h.BreakerFailures != 1 {
				t.Fatalf("primary counted %+v, breaker failures %d; want one failure", h.Requests, h.BreakerFailures)
			}
		})
	}
}

// h2cTransport is a Base that speaks HTTP/2 without TLS (prior knowledge).
func h2cTransport() *http.Transport {
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.Protocols = new(http.Protocols)
	base.Protocols.SetUnencryptedHTTP2(true)
	return base
}

// hpackLiteral encodes :status 200 and one header field as a literal
// without indexing, as HPACK writes a name it has no entry for. Lengths
// are below 127: no Huffman coding, one length byte.
func hpackLiteral(name, value string) []byte {
	b := []byte{0x88, 0x00, byte(len(name))} // 0x88: :status 200, from the static table
	b = append(b, name...)
	b = append(b, byte(len(value)))
	return append(b, value...)
}

// rawH2Server is a loopback HTTP/2 server without TLS that answers every
// stream with the header block headers, as written: it sends what Go's
// own server refuses to. It returns its URL.
func rawH2Server(t *testing.T, headers []byte) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	frame := func(w io.Writer, typ, flags byte, stream uint32, payload []byte) {
		hdr := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags,
			byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}
		w.Write(append(hdr, payload...))
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := io.ReadFull(br, make([]byte, len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))); err != nil {
					return
				}
				frame(c, 0x4, 0, 0, nil) // SETTINGS
				for {
					var hdr [9]byte
					if _, err := io.ReadFull(br, hdr[:]); err != nil {
						return
					}
					n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
					if _, err := io.CopyN(io.Discard, br, int64(n)); err != nil {
						return
					}
					switch typ, flags := hdr[3], hdr[4]; {
					case typ == 0x4 && flags&0x1 == 0: // SETTINGS: acknowledged
						frame(c, 0x4, 0x1, 0, nil)
					case typ == 0x1: // HEADERS: answered, END_HEADERS and END_STREAM
						stream := uint32(hdr[5]&0x7f)<<24 | uint32(hdr[6])<<16 | uint32(hdr[7])<<8 | uint32(hdr[8])
						frame(c, 0x1, 0x4|0x1, stream, headers)
					}
				}
			}()
		}
	}()
	return "http://" + l.Addr().String()
}

// A Classifier of the caller's that returns an Outcome none of the
// defined ones is taken as DefaultClassifier's verdict: it indexed past
// the metrics' and the window's arrays, and panicked the request.
func TestUndefinedOutcomeCountsAsDefault(t *testing.T) {
	for _, bad := range []Outcome{Unservable + 1, 9, -1} {
		primary := newUpstreamServer(t, http.StatusServiceUnavailable, "down")
		backup := newUpstreamServer(t, http.StatusOK, "ok")
		classify := func(*http.Response, error) Outcome { return bad }
		tr := newTestTransport(t, Config{Classify: classify, Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL},
			{Name: "backup", BaseURL: backup.URL},
		}})
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Fatalf("Outcome(%d): RoundTrip panicked: %v", bad, v)
				}
			}()
			if body := readBody(t, mustGet(t, tr, primary.URL+"/v1/models")); body != "ok" {
				t.Errorf("Outcome(%d): got %q, want the backup's answer (the primary's 503 failed)", bad, body)
			}
		}()
		if h := tr.Health(); h[0].Requests.Failed != 1 || h[1].Requests.Success != 1 {
			t.Errorf("Outcome(%d): health %+v, want the primary failed once and the backup served", bad, h)
		}
		scrapeMetrics(tr)
		br, err := NewBreaker(nil, BreakerConfig{FailureThreshold: 1}, classify)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := br.RoundTrip(httptestRequest("GET", primary.URL+"/v1/models", ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if br.State() != Open {
			t.Errorf("Outcome(%d): the Breaker is %v after a 503, want open", bad, br.State())
		}
	}
}
