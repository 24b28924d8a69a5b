package failover

import (
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
	"syscall"
	"testing"
	"time"
)

func TestDefaultClassifierStatus(t *testing.T) {
	tests := []struct {
		code int
		want Outcome
	}{
		{200, Success}, {201, Success}, {204, Success}, {301, Success}, {304, Success},
		{400, Rejected}, {404, Rejected}, {409, Rejected}, {413, Rejected}, {422, Rejected},
		{401, AuthFailed}, {403, AuthFailed},
		{429, RateLimited},
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
		base := http.DefaultTransport.(*http.Transport).Clone()
		base.ResponseHeaderTimeout = 50 * time.Millisecond
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
			case code == 429:
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
