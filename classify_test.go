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
	"syscall"
	"testing"
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
