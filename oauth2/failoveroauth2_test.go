package failoveroauth2_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/failover-go/failover"
	failoveroauth2 "github.com/failover-go/failover/oauth2"
)

// tokenServer is a loopback OAuth 2.0 token endpoint for the client
// credentials grant, issuing token-1, token-2, ..., each valid for
// expiresIn seconds, and an API that takes only the latest of them.
type tokenServer struct {
	token, api *httptest.Server

	mu     sync.Mutex
	issued int
	seen   []string // the API's Authorization headers, in order
}

func newTokenServer(t *testing.T, expiresIn int) *tokenServer {
	s := &tokenServer{}
	s.token = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, secret, _ := r.BasicAuth()
		if r.FormValue("grant_type") != "client_credentials" || id != "client" || secret != "client-secret-0123456789" ||
			r.FormValue("scope") != failoveroauth2.AzureOpenAIScope {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"invalid_client"}`)
			return
		}
		s.mu.Lock()
		s.issued++
		n := s.issued
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":"token-%d","token_type":"bearer","expires_in":%d}`, n, expiresIn)
	}))
	t.Cleanup(s.token.Close)
	s.api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("Authorization")
		s.mu.Lock()
		s.seen = append(s.seen, got)
		current := fmt.Sprintf("Bearer token-%d", s.issued)
		s.mu.Unlock()
		if got != current {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "ok")
	}))
	t.Cleanup(s.api.Close)
	return s
}

// tokenSource is a client credentials source for s's endpoint with
// secret, whose requests go through a client of the bubble's: without
// keep-alives, nothing in the bubble waits on the network between
// requests, so that its clock can move on.
func tokenSource(ctx context.Context, s *tokenServer, secret string) oauth2.TokenSource {
	cc := clientcredentials.Config{ClientID: "client", ClientSecret: secret, TokenURL: s.token.URL + "/token",
		Scopes: []string{failoveroauth2.AzureOpenAIScope}}
	return cc.TokenSource(context.WithValue(ctx, oauth2.HTTPClient, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}))
}

// The token is fetched once, reused while it is valid, and fetched anew
// once it expires (10s early, as oauth2 does): the API, which takes only
// the latest token, accepts every request.
func TestRefreshesExpiredToken(t *testing.T) {
	s := newTokenServer(t, 60)
	synctest.Test(t, func(t *testing.T) {
		tr, err := failover.New(failover.Config{Base: &http.Transport{DisableKeepAlives: true}, Upstreams: []failover.Upstream{
			{Name: "azure", BaseURL: s.api.URL + "/openai/v1", Authorizer: failoveroauth2.New(tokenSource(t.Context(), s, "client-secret-0123456789"))},
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		client := &http.Client{Transport: tr}
		for i, wait := range []time.Duration{0, 30 * time.Second, 30 * time.Second} {
			time.Sleep(wait)
			resp, err := client.Post(s.api.URL+"/openai/v1/chat/completions", "application/json", strings.NewReader(`{"model":"gpt-4o"}`))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "ok" {
				t.Fatalf("request %d: %d %q, want 200 ok", i, resp.StatusCode, body)
			}
		}
	})
	want := []string{"Bearer token-1", "Bearer token-1", "Bearer token-2"}
	if !slices.Equal(s.seen, want) || s.issued != 2 {
		t.Errorf("the API saw %q after %d tokens were issued, want %q after 2", s.seen, s.issued, want)
	}
}

// A token source that fails fails its upstream's attempt: the request
// goes on to the next upstream, and the *Error, were there none, matches
// ErrAuthorize. The client secret is nowhere in what the caller sees.
func TestTokenErrorFailsOver(t *testing.T) {
	s := newTokenServer(t, 3600)
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			w.WriteHeader(http.StatusBadRequest) // another upstream's credentials
			return
		}
		io.WriteString(w, "backup")
	}))
	defer backup.Close()
	const wrong = "wrong-secret-0123456789"
	az := failoveroauth2.New(tokenSource(context.Background(), s, wrong))
	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "azure", BaseURL: s.api.URL + "/openai/v1", Authorizer: az},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	resp, err := (&http.Client{Transport: tr}).Get(s.api.URL + "/openai/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "backup" || len(s.seen) != 0 {
		t.Fatalf("answer %q, API saw %d requests; want the backup's, and none", body, len(s.seen))
	}
	h := tr.Health()[0]
	if !strings.Contains(h.LastError, "invalid_client") || strings.Contains(h.LastError, wrong) || h.State != "closed" {
		t.Errorf("azure: last error %q, state %s; want the token endpoint's refusal, closed", h.LastError, h.State)
	}

	alone, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{Name: "azure", BaseURL: s.api.URL + "/openai/v1", Authorizer: az}}})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	_, err = alone.RoundTrip(httptest.NewRequest("GET", s.api.URL+"/openai/v1/models", nil).WithContext(context.Background()))
	var re *oauth2.RetrieveError
	if !errors.Is(err, failover.ErrAuthorize) || !errors.As(err, &re) {
		t.Errorf("err %v, want one matching ErrAuthorize and the *oauth2.RetrieveError", err)
	}
}

// A token endpoint that hangs holds no request past its attempt's bound:
// oauth2's Token takes no context, but the attempt gives up waiting for
// it, and the request goes on to the next upstream. Attempts meanwhile
// wait for the one fetch in flight rather than start their own.
func TestHangingTokenSourceTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		fetches := 0
		ts := tokenFunc(func() (*oauth2.Token, error) {
			mu.Lock()
			fetches++
			mu.Unlock()
			<-release
			return &oauth2.Token{AccessToken: "late-token-0123456789"}, nil
		})
		backup := roundTripper(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("backup")), Request: r}, nil
		})
		tr, err := failover.New(failover.Config{Base: backup, Timeouts: failover.Timeouts{Attempt: 5 * time.Second},
			Upstreams: []failover.Upstream{
				{Name: "azure", BaseURL: "http://azure.test/openai/v1", Authorizer: failoveroauth2.New(ts)},
				{Name: "backup", BaseURL: "http://backup.test/v1"},
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i := range 3 {
			start := time.Now()
			resp, err := tr.RoundTrip(httptest.NewRequest("GET", "http://azure.test/openai/v1/models", nil).WithContext(ctx))
			if err != nil {
				t.Fatalf("request %d: %v after %v", i, err, time.Since(start))
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "backup" || time.Since(start) != 5*time.Second {
				t.Fatalf("request %d: %q after %v, want the backup's after the attempt's 5s", i, body, time.Since(start))
			}
		}
		mu.Lock()
		if fetches != 1 {
			t.Errorf("%d token fetches in flight at once, want 1", fetches)
		}
		mu.Unlock()
		close(release)
		synctest.Wait()
	})
}

type tokenFunc func() (*oauth2.Token, error)

func (f tokenFunc) Token() (*oauth2.Token, error) { return f() }

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A token source that panics fails the attempt, as an Authorizer that
// panics does; the process goes on.
func TestPanickingTokenSource(t *testing.T) {
	az := failoveroauth2.New(tokenFunc(func() (*oauth2.Token, error) { panic("token source broke") }))
	req := httptest.NewRequest("GET", "http://azure.test/openai/v1/models", nil)
	if err := az.Authorize(req); err == nil || !strings.Contains(err.Error(), "token source broke") {
		t.Fatalf("Authorize: %v, want the panic as an error", err)
	}
	if err := az.Authorize(req); err == nil {
		t.Fatal("Authorize after a panic: nil error")
	}
}
