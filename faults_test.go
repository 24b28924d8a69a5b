package failover

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

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
				io.WriteString(c, "e\r\ndata: {\"n\":1}\n\r\n")
				c.Close() // no terminating chunk, no [DONE]
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
	primaryURL := closedURL(t)
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
	// headers (AttemptTimeout never cuts a body).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
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
	h := tr.Health()[0]
	if got := countOf(h.Requests, tc.counted); got != 1 || h.Requests.Total() != 1 {
		t.Fatalf("%s: primary counted %+v, want one %v", mode, h.Requests, tc.counted)
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
	return [...]uint64{c.Success, c.Rejected, c.AuthFailed, c.RateLimited, c.Failed, c.Canceled}[o]
}
