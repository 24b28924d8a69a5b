package failoversigv4_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/failover-go/failover"
	failoversigv4 "github.com/failover-go/failover/sigv4"
)

var testCreds = aws.Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "secret-access-key-0123456789", SessionToken: "session-token-0123456789"}

func provider() aws.CredentialsProvider {
	return aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) { return testCreds, nil })
}

// verify checks r's SigV4 signature as AWS would: it rebuilds the request
// from what arrived (its signed headers, and body, whose hash it computes
// itself), signs it with the secret at the time r says, and compares.
func verify(r *http.Request, body []byte) error {
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	if !ok {
		return fmt.Errorf("Authorization %q is not SigV4", auth)
	}
	fields := map[string]string{}
	for f := range strings.SplitSeq(rest, ", ") {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	scope := strings.Split(fields["Credential"], "/")
	if len(scope) != 5 || scope[0] != testCreds.AccessKeyID || scope[2] != "us-west-2" || scope[3] != "bedrock" {
		return fmt.Errorf("credential scope %q", fields["Credential"])
	}
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return err
	}
	re := &http.Request{Method: r.Method, Host: r.Host, Header: http.Header{}, ContentLength: int64(len(body)),
		URL: &url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}}
	for h := range strings.SplitSeq(fields["SignedHeaders"], ";") {
		if h != "host" && h != "content-length" {
			re.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(context.Background(), testCreds, re, hex.EncodeToString(sum[:]), "bedrock", "us-west-2", at); err != nil {
		return err
	}
	if want := re.Header.Get("Authorization"); want != auth {
		return fmt.Errorf("signature mismatch:\n got %s\nwant %s", auth, want)
	}
	return nil
}

// bedrock is a loopback stand-in for Bedrock's OpenAI-compatible endpoint
// that answers 403 to any request whose signature does not verify.
type bedrock struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
	header []http.Header
	errs   []error
}

func newBedrock(t *testing.T) *bedrock {
	b := &bedrock{}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		err := verify(r, body)
		b.mu.Lock()
		b.bodies, b.header, b.errs = append(b.bodies, string(body)), append(b.header, r.Header.Clone()), append(b.errs, err)
		b.mu.Unlock()
		if err != nil {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintf(w, `{"message":%q}`, "The request signature we calculated does not match the signature you provided.")
			return
		}
		io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(b.Close)
	return b
}

func post(t *testing.T, tr http.RoundTripper, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := (&http.Client{Transport: tr}).Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp, string(got)
}

// A request that fails over to Bedrock, its model mapped by
// Upstream.Models, is signed over the body as sent, and verifies; so does
// one without a body addressed to Bedrock. The primary's key never
// reaches Bedrock.
func TestSignatureCoversMappedBody(t *testing.T) {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer primary.Close()
	br := newBedrock(t)
	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "openai", BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer sk-openai-0123456789"}}},
		{Name: "bedrock", BaseURL: br.URL + "/openai/v1", Models: map[string]string{"gpt-4o": "openai.gpt-oss-120b-1:0"},
			Authorizer: failoversigv4.New(provider(), "us-west-2", "bedrock")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	resp, got := post(t, tr, primary.URL+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d %s; Bedrock's verdicts %v", resp.StatusCode, got, br.errs)
	}
	if len(br.bodies) != 1 || !strings.Contains(br.bodies[0], `"model":"openai.gpt-oss-120b-1:0"`) {
		t.Fatalf("Bedrock got %q, want the mapped model", br.bodies)
	}
	h := br.header[0]
	if strings.Contains(h.Get("Authorization"), "sk-openai") || h.Get("X-Amz-Security-Token") != testCreds.SessionToken {
		t.Errorf("Bedrock got Authorization %q, X-Amz-Security-Token %q", h.Get("Authorization"), h.Get("X-Amz-Security-Token"))
	}

	resp, err = (&http.Client{Transport: tr}).Get(br.URL + "/openai/v1/models?limit=5")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET: status %d; Bedrock's verdicts %v", resp.StatusCode, br.errs)
	}
}

// The server's check is real: a body changed after signing (here by a
// Base, as a proxy could) is refused.
func TestTamperedBodyRefused(t *testing.T) {
	br := newBedrock(t)
	tamper := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		r.Body = io.NopCloser(strings.NewReader(strings.Replace(string(body), "hi", "yo", 1)))
		return http.DefaultTransport.RoundTrip(r)
	})
	for _, tc := range []struct {
		name string
		base http.RoundTripper
		want int
	}{
		{"as signed", http.DefaultTransport, 200},
		{"tampered", tamper, 403},
	} {
		tr, err := failover.New(failover.Config{Base: tc.base, Upstreams: []failover.Upstream{
			{Name: "bedrock", BaseURL: br.URL + "/openai/v1", Authorizer: failoversigv4.New(provider(), "us-west-2", "bedrock")},
		}})
		if err != nil {
			t.Fatal(err)
		}
		resp, _ := post(t, tr, br.URL+"/openai/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		tr.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}
}

// A body that cannot be replayed has no GetBody to hash: it is not sent
// unsigned, and the error says why.
func TestUnreplayableBodyNotSigned(t *testing.T) {
	br := newBedrock(t)
	tr, err := failover.New(failover.Config{MaxBodyBuffer: -1, Upstreams: []failover.Upstream{
		{Name: "bedrock", BaseURL: br.URL + "/openai/v1", Authorizer: failoversigv4.New(provider(), "us-west-2", "bedrock")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	req, _ := http.NewRequest("POST", br.URL+"/openai/v1/chat/completions", io.MultiReader(strings.NewReader(`{"model":"m"}`)))
	_, err = tr.RoundTrip(req)
	if !errors.Is(err, failover.ErrAuthorize) || !strings.Contains(err.Error(), "cannot be replayed") {
		t.Errorf("err %v, want ErrAuthorize for a body without GetBody", err)
	}
	if len(br.bodies) != 0 {
		t.Errorf("Bedrock got %d requests, want none", len(br.bodies))
	}
}

// New with a missing argument fails every attempt rather than panic.
func TestNewMissingArguments(t *testing.T) {
	for _, az := range []failover.Authorizer{
		failoversigv4.New(nil, "us-west-2", "bedrock"),
		failoversigv4.New(provider(), "", "bedrock"),
		failoversigv4.New(provider(), "us-west-2", ""),
	} {
		req, _ := http.NewRequest("GET", "https://bedrock-runtime.us-west-2.amazonaws.com/openai/v1/models", nil)
		if err := az.Authorize(req); err == nil {
			t.Error("Authorize succeeded, want an error")
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
