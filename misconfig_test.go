package failover

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

const noCredsNote = "Upstreams[1] has no credentials of its own (Upstream.Header) and the caller's were held back"

// The backup has no credentials of its own and the caller's were held
// back: its 401 is not the caller's answer, the primary's 503 is, and the
// note is said once to the Logger and kept in Health.
func TestNoCredentialsAnswer(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 401, `{"error":"missing key"}`)
	var logs logBuffer
	tr := newTestTransport(t, Config{Logger: newLogger(&logs), Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Anthropic-Version": {"2023-06-01"}}},
	}})
	for range 3 {
		req := httptestRequest("GET", primary.URL+"/v1/models", "")
		req.Header.Set("Authorization", "Bearer caller-key-123")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("status %d, want the primary's 503", resp.StatusCode)
		}
		s, _ := ServedBy(resp)
		if s.Upstream != "primary" || !slices.Contains(s.Problems, noCredsNote) {
			t.Errorf("ServedBy: %+v, want primary's answer with the note %q", s, noCredsNote)
		}
	}
	if backup.count() != 3 {
		t.Errorf("backup got %d requests, want 3", backup.count())
	}
	if n := strings.Count(logs.String(), "has no credentials of its own"); n != 1 {
		t.Errorf("the Logger said it %d times, want once:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "caller-key-123") {
		t.Error("the log shows the caller's key")
	}
	h := tr.Health()[1]
	if !slices.Contains(h.Problems, noCredsNote) {
		t.Errorf("Health Problems %q, want %q", h.Problems, noCredsNote)
	}
	if h.Demoted == ReasonAuthFailing || h.Requests.AuthFailed != 0 {
		t.Errorf("the backup's 401s counted against its key: Demoted %q, AuthFailed %d", h.Demoted, h.Requests.AuthFailed)
	}
	js, _ := json.Marshal(h)
	if !strings.Contains(string(js), `"problems":["Upstreams[1] has no credentials`) {
		t.Errorf("Health JSON lacks the problem: %s", js)
	}

	// Addressed to the backup, the caller's credentials are its own: its
	// 401 is the caller's.
	req := httptestRequest("GET", backup.URL+"/v1/models", "")
	req.Header.Set("Authorization", "Bearer caller-key-123")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("addressed to the backup: status %d, want its 401", resp.StatusCode)
	}
}

// With no answer to fall back on, the Error names the upstream and why.
func TestNoCredentialsError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	backup := newUpstreamServer(t, 401, `{"error":"missing key"}`)
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: closed + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	req := httptestRequest("GET", closed+"/v1/models", "")
	req.Header.Set("Api-Key", "caller-key-123")
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got an answer %d, want an *Error", resp.StatusCode)
	}
	var ae *AttemptError
	if !errors.As(err, &ae) {
		t.Fatalf("error %v, want an *AttemptError", err)
	}
	var found bool
	for _, a := range err.(*Error).Attempts {
		if a.Upstream == "backup" && errors.Is(a, ErrNoCredentials) && strings.Contains(a.Error(), noCredsNote) {
			found = true
		}
	}
	if !found || strings.Contains(err.Error(), "caller-key-123") {
		t.Errorf("error %q, want the backup's AttemptError with ErrNoCredentials and the note, no key", err)
	}
}

func TestSameBaseURLAtNew(t *testing.T) {
	var logs logBuffer
	tr, err := New(Config{Logger: newLogger(&logs), Upstreams: []Upstream{
		{Name: "a", BaseURL: "https://api.example.com/v1"},
		{Name: "b", BaseURL: "https://API.example.com/v1"},
		{Name: "c", BaseURL: "https://api.example.com/v1", Header: http.Header{"Authorization": {"Bearer c-key-456"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	const want = "Upstreams[1] has the BaseURL of Upstreams[0]"
	if !strings.Contains(logs.String(), want) || !strings.Contains(logs.String(), "give it a Header") {
		t.Errorf("the Logger said %q, want %q", logs.String(), want)
	}
	h := tr.Health()
	if len(h[1].Problems) != 1 || !strings.Contains(h[1].Problems[0], want) {
		t.Errorf("Health Problems of b: %q, want %q", h[1].Problems, want)
	}
	if len(h[0].Problems) != 0 || len(h[2].Problems) != 0 {
		t.Errorf("Health Problems of a, c: %q, %q, want none (c has a Header)", h[0].Problems, h[2].Problems)
	}
}

// No backup's Models maps the model: the Error and the answer say so, and
// the Logger once.
func TestModelServedByNoBackup(t *testing.T) {
	primary := newUpstreamServer(t, 500, "down")
	backup := newUpstreamServer(t, 200, "ok")
	var logs logBuffer
	tr := newTestTransport(t, Config{Logger: newLogger(&logs), Retry: RetryConfig{Off: true}, Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Models: map[string]string{"gpt-4o": "gpt-4o"}},
	}})
	const want = `no upstream but Upstreams[0] serves model "gpt-4o-mini": Upstreams[1].Models do not map it`
	for range 3 {
		resp := mustPost(t, tr, primary.URL+"/v1/chat/completions", chatBody)
		resp.Body.Close()
		if s, _ := ServedBy(resp); resp.StatusCode != 500 || !slices.Contains(s.Problems, want) {
			t.Errorf("answer %d, ServedBy %+v, want the primary's 500 with %q", resp.StatusCode, s, want)
		}
	}
	if n := strings.Count(logs.String(), "Upstreams[1].Models"); n != 1 {
		t.Errorf("the Logger said it %d times, want once:\n%s", n, logs.String())
	}
	if p := tr.Health()[1].Problems; !slices.Contains(p, want+" (skipped 3 requests)") {
		t.Errorf("Health Problems %q, want %q with its count", p, want)
	}

	// With no answer at all, the Error says it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	tr = newTestTransport(t, Config{Retry: RetryConfig{Off: true}, Upstreams: []Upstream{
		{Name: "primary", BaseURL: closed + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Models: map[string]string{"gpt-4o": "gpt-4o"}},
	}})
	resp, err := tr.RoundTrip(httptestRequest("POST", closed+"/v1/chat/completions", chatBody))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got an answer %d, want an *Error", resp.StatusCode)
	}
	var e *Error
	if !errors.As(err, &e) || !slices.Contains(e.Problems, want) || !strings.Contains(err.Error(), want) {
		t.Errorf("error %q, want an *Error with %q", err, want)
	}
	if !errors.Is(err, ErrModelNotServed) {
		t.Errorf("error %v, want ErrModelNotServed", err)
	}
}

// authBase is a Base that authenticates the requests to host itself, as
// an oauth2 or SigV4 RoundTripper for Vertex or Bedrock does: on a clone,
// never on the request it is given.
type authBase struct {
	host, token string
	next        http.RoundTripper
}

func (b authBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host == b.host {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.next.RoundTrip(req)
}

// TestBaseAuthenticatedBackup: a backup whose credentials come
// from Base (oauth2 for Vertex, SigV4 for Bedrock) sets no Upstream.Header,
// so its real 401 (the Base's token expired) is dropped as "no
// credentials of its own", Health blames the config, and the expired
// token never counts against the backup (AuthFailed stays 0, it is never
// demoted for it).
func TestBaseAuthenticatedBackup(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	var got []string
	backup := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		w.WriteHeader(401)
		io.WriteString(w, `{"error":{"code":401,"message":"Request had invalid authentication credentials: token expired","status":"UNAUTHENTICATED"}}`)
	})
	bu, _ := url.Parse(backup.URL)
	tr := newTestTransport(t, Config{
		Base: authBase{host: bu.Host, token: "base-oauth-token", next: http.DefaultTransport.(*http.Transport).Clone()},
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "vertex", BaseURL: backup.URL + "/v1"},
		}})
	req := httptestRequest("GET", primary.URL+"/v1/models", "")
	req.Header.Set("Authorization", "Bearer caller-key-123")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) == 0 || got[0] != "Bearer base-oauth-token" {
		t.Fatalf("the backup saw Authorization %q, want the Base's", got)
	}
	h := tr.Health()[1]
	if slices.Contains(h.Problems, noCredsNote) {
		t.Errorf("Health blames the config though the backup was sent credentials (by Base): %q", h.Problems)
	}
	if h.Requests.AuthFailed == 0 {
		t.Errorf("the backup's 401 for its own expired token did not count: AuthFailed 0")
	}
}

// TestModelNotesNotCrowdedOut: during an outage of the primary,
// each distinct model that the backups do not map is kept in Health,
// up to 64, whatever the callers sent: a caller's typos or junk models
// ("gpt-4oo") are blamed on the backups' Models, and once 64 are in, the
// model the config really forgot is never in Health.
func TestModelNotesNotCrowdedOut(t *testing.T) {
	primary := newUpstreamServer(t, 500, "down")
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{Retry: RetryConfig{Off: true}, Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Models: map[string]string{"gpt-4o": "gpt-4o"}},
	}})
	for i := range 64 {
		resp := mustPost(t, tr, primary.URL+"/v1/chat/completions", fmt.Sprintf(`{"model":"junk-from-a-caller-%d"}`, i))
		resp.Body.Close()
	}
	resp := mustPost(t, tr, primary.URL+"/v1/chat/completions", chatBody)
	resp.Body.Close()
	const want = `no upstream but Upstreams[0] serves model "gpt-4o-mini": Upstreams[1].Models do not map it`
	p := tr.Health()[1].Problems
	if !slices.ContainsFunc(p, func(n string) bool { return strings.HasPrefix(n, want+" (") }) {
		t.Errorf("Health lacks the real misconfiguration %q; it holds %d caller-made notes such as %q", want, len(p), p[0])
	}
}

// TestSameBaseURLDeployed: sameBaseURL compares the base paths
// before {deployment} only, so two different BaseURLs on one host (a
// {deployment} one and the literal prefix, or two suffixes) are called
// "the BaseURL of" each other, and New warns of a misconfiguration that
// is not there. (New refuses the first pair as ambiguous, see
// TestDeploymentUnderBaseURL, so sameBaseURL is asked directly.)
func TestSameBaseURLDeployed(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		same bool
	}{
		{"https://gw.test/openai", "https://gw.test/openai/{deployment}", false},
		{"https://gw.test/x/{deployment}/chat", "https://gw.test/x/{deployment}/embed", false},
		{"https://gw.test/x/{deployment}", "https://gw.test/x/{deployment}/chat", false},
		{"https://gw.test/x/{deployment}/chat", "https://GW.test/x/%7Bdeployment%7D/chat/", true},
	} {
		u, err := newUpstream(0, Upstream{BaseURL: tt.a})
		if err != nil {
			t.Fatal(err)
		}
		v, err := newUpstream(1, Upstream{BaseURL: tt.b})
		if err != nil {
			t.Fatal(err)
		}
		if got := sameBaseURL(u, v); got != tt.same {
			t.Errorf("sameBaseURL(%s, %s) = %v, want %v", tt.a, tt.b, got, tt.same)
		}
	}
	tr := newTestTransport(t, Config{Base: newFakeNet(), Upstreams: []Upstream{
		{Name: "first", BaseURL: "https://gw.test/x/{deployment}/chat", Header: http.Header{"Authorization": {"Bearer first-key-0123456789"}}},
		{Name: "second", BaseURL: "https://gw.test/x/{deployment}/embed"},
	}})
	if p := tr.Health()[1].Problems; len(p) > 0 {
		t.Errorf("two suffixes after {deployment}: Health Problems %q", p)
	}
}

// TestHeldBackQueryKey: heldBack reads only the caller's headers,
// so when the caller's credentials were a query key (Gemini's ?key=, held
// back as well), the uncredentialed backup's 401 counts against a key it
// does not have (AuthFailed, on the way to ReasonAuthFailing), and
// the misconfiguration goes unreported.
func TestHeldBackQueryKey(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 401, `{"error":"missing key"}`)
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1beta"},
		{Name: "backup", BaseURL: backup.URL + "/v1beta"},
	}})
	resp, err := tr.RoundTrip(httptestRequest("GET", primary.URL+"/v1beta/models?key=caller-gemini-key-123", ""))
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("status %d, want the primary's 503 (as with a header key): a 401 says the caller's key is bad", resp.StatusCode)
		}
	}
	if backup.count() != 1 {
		t.Fatalf("backup got %d requests, want 1", backup.count())
	}
	if h := tr.Health()[1]; !slices.Contains(h.Problems, noCredsNote) || h.Requests.AuthFailed != 0 {
		t.Errorf("Health Problems %q, AuthFailed %d; want the note and no auth failure", h.Problems, h.Requests.AuthFailed)
	}
}

// The Health of a model no backup serves shows the most skipped models
// first, at most maxShownModels, with their counts; the Logger says the
// first maxProblemModels models once each, then only a model that is
// skipped again and ranks among the shown, not every one-off model.
func TestModelNotesRanked(t *testing.T) {
	primary := newUpstreamServer(t, 500, "down")
	backup := newUpstreamServer(t, 200, "ok")
	var logs logBuffer
	tr := newTestTransport(t, Config{Logger: newLogger(&logs), Retry: RetryConfig{Off: true}, Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Models: map[string]string{"gpt-4o": "gpt-4o"}},
	}})
	post := func(model string) {
		resp := mustPost(t, tr, primary.URL+"/v1/chat/completions", fmt.Sprintf(`{"model":%q}`, model))
		resp.Body.Close()
	}
	for i := range 1200 {
		post(fmt.Sprintf("junk-%d", i))
		if i%2 == 0 {
			post("forgotten")
		}
	}
	p := tr.Health()[1].Problems
	const want = `no upstream but Upstreams[0] serves model "forgotten": Upstreams[1].Models do not map it (skipped 600 requests)`
	if len(p) != maxShownModels || p[0] != want {
		t.Errorf("Health Problems (%d) %q, want %d led by %q", len(p), p, maxShownModels, want)
	}
	if n := strings.Count(logs.String(), "Upstreams[1].Models"); n > maxProblemModels+maxShownModels {
		t.Errorf("the Logger said %d model notes for 1,201 models, want at most %d", n, maxProblemModels+maxShownModels)
	}
	if n := strings.Count(logs.String(), `\"forgotten\"`); n != 1 {
		t.Errorf("the Logger said the forgotten model %d times, want once:\n%s", n, logs.String())
	}
	if got := thousands(1234567); got != "1,234,567" {
		t.Errorf("thousands(1234567) = %q", got)
	}
}

// Under a plain *http.Transport as Base, as under none, an upstream
// without an Upstream.Header credential has none; the caller's held back
// as user info count as held back.
func TestNoCredentialsPlainBase(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 401, `{"error":"missing key"}`)
	tr := newTestTransport(t, Config{Base: http.DefaultTransport.(*http.Transport).Clone(), Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	u, _ := url.Parse(primary.URL + "/v1/models")
	u.User = url.UserPassword("caller", "caller-secret-123")
	resp, err := tr.RoundTrip(httptestRequest("GET", u.String(), ""))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("status %d, want the primary's 503", resp.StatusCode)
	}
	if h := tr.Health()[1]; !slices.Contains(h.Problems, noCredsNote) || h.Requests.AuthFailed != 0 {
		t.Errorf("Health Problems %q, AuthFailed %d; want the note and no auth failure", h.Problems, h.Requests.AuthFailed)
	}
}
