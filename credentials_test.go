package failover

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/internal/redact"
)

// stripQuery keeps, byte for byte and in order, only the pairs whose
// name is known to carry no secret.
func TestStripQueryCredentials(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"model=x", "model=x"},
		{"key=s&alt=json", "alt=json"},
		{"$alt=json;enum-encoding=int&key=s", "$alt=json;enum-encoding=int"},
		{"%24alt=json%3Benum-encoding%3Dint&key=s", "%24alt=json%3Benum-encoding%3Dint"}, // one pair, as the Google SDKs send it
		{"limit=%2F1&KEY=s&after=1&after=2", "limit=%2F1&after=1&after=2"},
		{"%6Bey=s&limit=1", "limit=1"}, // an escaped name is still key
		{"%61lt=sse", "%61lt=sse"},     // and alt still alt
		{"API-Version=1&ALT=sse", "API-Version=1&ALT=sse"},
		{"api_key=s&api-key=s&apikey=s&access_token=s", ""},
		{"code=s&sv=2024-05-04&sp=r&se=2026&sig=s&api-version=1", "api-version=1"}, // Azure Functions' key, a SAS token
		{"design=1&x=2&q=3", ""},                                                   // unknown names: they may carry a secret
		{"model=x&token=s&client_secret=s&alt=sse", "model=x&alt=sse"},
		{"pageToken=t&pageSize=2", "pageSize=2"},
		{"key", ""},
		{"stream", "stream"},
		{"limit=1&&before=2", "limit=1&before=2"},
		{"alt=sse;code=s;limit=2", "alt=sse;limit=2"}, // some servers split at ';'
		{"code=s;beta=true&order=asc", "beta=true&order=asc"},
		{"alt%3Dsse%26code=s", ""}, // the name is "alt=sse&code"
	}
	c, err := newCredentials(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		if got := c.stripQuery(tt.in); got != tt.want {
			t.Errorf("stripQuery(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// A caller's key= and code= values and URL password never appear in
// errors, Health or logs, even when Base quotes the URL: code= (Azure
// Functions' key) is a credential because it is not known to be none.
func TestQueryKeyRedacted(t *testing.T) {
	const key, code, pass = "AIzaSyCALLERSECRET0123456789", "fnCALLERCODE0123456789==", "callerpassword99"
	n := newFakeNet()
	n.handle("gen.test", func(r *http.Request) (*http.Response, error) {
		return nil, &url.Error{Op: "Post", URL: "https://u:" + pass + "@gen.test" + r.URL.RequestURI(), Err: io.ErrUnexpectedEOF}
	})
	var logs logBuffer
	tr := newTestTransport(t, Config{Base: n, Logger: newLogger(&logs), Upstreams: []Upstream{{Name: "g", BaseURL: "https://gen.test/v1"}}})
	req := httptestRequest("POST", "https://u:"+pass+"@gen.test/v1/models/x:generateContent?key="+key+"&code="+url.QueryEscape(code), "{}")
	// The addressed upstream keeps the caller's key: the fake quotes it.
	_, err := tr.RoundTrip(req)
	if err == nil {
		t.Fatal("no error")
	}
	for _, s := range []string{err.Error(), tr.Health()[0].LastError, logs.String()} {
		for _, secret := range []string{key, code, url.QueryEscape(code), pass} {
			if strings.Contains(s, secret) {
				t.Errorf("a secret leaked: %s", s)
			}
		}
	}
	if !strings.Contains(err.Error(), "generateContent") {
		t.Errorf("the error lost the cause: %v", err)
	}
}

// A Base that quotes the URL in its errors (a logging or tracing wrapper's
// "POST http://...: EOF") writes the caller's user info as net/url escapes
// it: '@' and ':' escaped, '$', '&', '+', '=', ';' and ',' not, which is
// neither query nor path escaping. Every surface hides it all the same.
func TestUserInfoRedactedAsURLsWriteIt(t *testing.T) {
	const user, pass = "ops$team@corp.example", "pa$$w@rd:0123456789"
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // no answer: the client's read fails
		}
	})
	inner := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(inner.CloseIdleConnections)
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := inner.RoundTrip(r)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", r.Method, r.URL, err)
		}
		return resp, nil
	})
	var logs logBuffer
	tr := newTestTransport(t, Config{Base: base, Logger: newLogger(&logs), Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL + "/v1"}}})
	u, err := url.Parse(srv.URL + "/v1/chat")
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, pass)
	req := httptestRequest("POST", u.String(), chatBody)
	var rec recordTrace
	_, err = tr.RoundTrip(traced(req, &rec))
	if err == nil {
		t.Fatal("no error")
	}
	health, _ := json.Marshal(tr.Health())
	texts := map[string]string{
		"Error": err.Error(), "%+v": fmt.Sprintf("%+v", err), "logs": logs.String(),
		"LastError": tr.Health()[0].LastError, "Health JSON": string(health),
		"Done.Err": fmt.Sprint(rec.done.Err),
	}
	for _, a := range rec.args {
		if d, ok := a.(TraceAttemptDone); ok {
			texts["AttemptDone.Err"] = fmt.Sprint(d.Err)
		}
	}
	if !strings.Contains(texts["Error"], "EOF") {
		t.Fatalf("err = %v, want the cause", err)
	}
	secrets := []string{"ops$team", "corp.example", "pa$$w", "rd:0123456789", "rd%3A0123456789"}
	for where, text := range texts {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s shows %q: %s", where, s, text)
			}
		}
	}
}

// A stream's error event is clipped to maxErrorDetail bytes, and an
// upstream that echoes the key it was sent ("invalid key: Bearer sk-...")
// may have it cut in the middle: the first bytes of the key are no key to
// find, yet they are most of it. Real server, caller's key and upstream's.
func TestRedactClippedStreamError(t *testing.T) {
	const upstreamKey, callerKey = "sk-upstream-CLIPPED-0123456789abcdef", "caller-clipped-0123456789abcdef"
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		key := r.Header.Get("Authorization") + r.Header.Get("X-Api-Key")
		// The detail is "invalid_api_key: " and the message: 17+158+5 bytes
		// before the key, so that the clip keeps 20 of its bytes.
		msg := strings.Repeat("x", 158) + " key " + key
		fmt.Fprintf(w, "data: {\"error\":{\"code\":\"invalid_api_key\",\"message\":%q}}\n\n", msg)
	})
	for _, tt := range []struct{ name, key string }{{"upstream", upstreamKey}, {"caller", callerKey}} {
		t.Run(tt.name, func(t *testing.T) {
			up := Upstream{Name: "a", BaseURL: srv.URL + "/v1"}
			if tt.key == upstreamKey {
				up.Header = http.Header{"Authorization": {"Bearer " + upstreamKey}}
			}
			tr := newTestTransport(t, Config{StreamGuard: &StreamGuard{}, Upstreams: []Upstream{up}})
			req := httptestRequest("POST", srv.URL+"/v1/chat/completions", chatBody)
			if tt.key == callerKey {
				req.Header.Set("X-Api-Key", callerKey)
			}
			var rec recordTrace
			_, err := tr.RoundTrip(traced(req, &rec))
			if !errors.Is(err, ErrStreamError) {
				t.Fatalf("err = %v, want ErrStreamError", err)
			}
			texts := map[string]string{"Error": err.Error(), "LastError": tr.Health()[0].LastError}
			for _, a := range rec.args {
				if d, ok := a.(TraceAttemptDone); ok {
					texts["AttemptDone.Err"] = fmt.Sprint(d.Err)
				}
			}
			prefix := tt.key[:redact.MinLen]
			for where, text := range texts {
				if strings.Contains(text, prefix) {
					t.Errorf("%s shows the key's first bytes: %s", where, text)
				}
				if !strings.Contains(text, "invalid_api_key: xxx") {
					t.Errorf("%s lost the cause: %s", where, text)
				}
			}
		})
	}
}

// A Base whose error message echoes a key (a proxy quoting the header it
// refused) does not carry that key into errors or Health.
func TestErrorsAreRedacted(t *testing.T) {
	const upstreamKey, callerKey = "sk-upstream-0123456789", "sk-caller-9876543210"
	n := newFakeNet()
	n.handle("a.test", func(r *http.Request) (*http.Response, error) {
		return nil, errors.New("proxy refused Authorization: " + r.Header.Get("Authorization") + " / " + callerKey)
	})
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test", Header: http.Header{"Authorization": {"Bearer " + upstreamKey}}},
	}})
	req := httptestRequest("GET", "http://a.test/v1", "")
	req.Header.Set("X-Api-Key", callerKey)
	_, err := tr.RoundTrip(req)
	if err == nil {
		t.Fatal("no error")
	}
	for _, s := range []string{err.Error(), tr.Health()[0].LastError} {
		if strings.Contains(s, upstreamKey) || strings.Contains(s, callerKey) {
			t.Errorf("a key leaked: %s", s)
		}
		if !strings.Contains(s, "proxy refused") {
			t.Errorf("the cause was lost: %s", s)
		}
	}
}

// Which header and query-parameter names the Transport treats as the
// caller's credentials, end to end: the primary answers 503, and the
// backup, which the caller did not address, must get every name that is
// not a credential and none that is.
func TestCredentialRule(t *testing.T) {
	tests := []struct {
		param      bool // a query parameter, else a header
		name       string
		credential bool
	}{
		// The gateways and clouds of the issue, and the usual others.
		{false, "Ocp-Apim-Subscription-Key", true},
		{false, "X-Amz-Security-Token", true},
		{false, "cf-aig-authorization", true},
		{false, "Helicone-Auth", true},
		{false, "X-Portkey-Api-Key", true},
		{false, "X-Portkey-Virtual-Key", true},
		{false, "X-Auth-Token", true},
		{false, "Authorization", true},
		{false, "Proxy-Authorization", true},
		{false, "Api-Key", true},
		{false, "x-api-key", true},
		{false, "X-Goog-Api-Key", true},
		{false, "Cookie", true},
		{false, "Openai-Organization", true},
		{false, "Openai-Project", true},
		{false, "X-Access-Token", true},
		{false, "Private-Token", true},
		{false, "X-Vault-Token", true},
		{false, "X-Client-Secret", true},
		{false, "X-Password", true},
		{false, "X-Hub-Signature-256", true},
		{false, "X-Csrf-Token", true},
		{false, "X-Jwt-Assertion", true},
		{false, "Mcp-Session-Id", true},
		{false, "X-Sig", true},
		{false, "X-Otp", true},
		{false, "Apikey", true},
		{false, "X-Upstream-Credential", true},
		{true, "key", true},
		{true, "KEY", true},
		{true, "api_key", true},
		{true, "apiKey", true},
		{true, "access_token", true},
		{true, "token", true},
		{true, "sig", true},
		{true, "X-Amz-Signature", true},
		{true, "X-Amz-Security-Token", true},
		{true, "X-Amz-Credential", true},
		{true, "X-Goog-Signature", true},
		{true, "X-Goog-Credential", true},
		{true, "password", true},
		{true, "client_secret", true},
		{true, "auth", true},
		{true, "subscription-key", true},
		{true, "sessionId", true},
		{true, "sigV4", true},
		{true, "pwd", true},

		// What SDKs and gateways send that is no secret.
		{false, "Content-Type", false},
		{false, "Accept", false},
		{false, "User-Agent", false},
		{false, "X-Request-Id", false},
		{false, "Openai-Beta", false},
		{false, "Anthropic-Version", false},
		{false, "Anthropic-Beta", false},
		{false, "X-Stainless-Lang", false},
		{false, "X-Stainless-Package-Version", false},
		{false, "X-Stainless-Os", false},
		{false, "X-Stainless-Arch", false},
		{false, "X-Stainless-Runtime", false},
		{false, "X-Stainless-Runtime-Version", false},
		{false, "X-Stainless-Retry-Count", false},
		{false, "X-Stainless-Timeout", false},
		{false, "Idempotency-Key", false},
		{false, "Traceparent", false},
		{false, "X-Title", false},
		{false, "Http-Referer", false},
		{false, "X-Goog-Api-Client", false},
		{false, "X-Goog-Request-Params", false},
		{false, "Amz-Sdk-Invocation-Id", false},
		{false, "X-Amz-Content-Sha256", false},
		{false, "X-Design-Id", false}, // "sig" is a word, not a substring
		{false, "X-Signal", false},
		{true, "model", false},
		{true, "alt", false},
		{true, "$alt", false},
		{true, "enum-encoding", false},
		{true, "api-version", false},
		{true, "Api-Version", false},
		{true, "beta", false},
		{true, "stream", false},
		{true, "include[]", false},
		{true, "limit", false},
		{true, "after", false},
		{true, "after_id", false},
		{true, "pageSize", false},

		// Query parameters no LLM API defines: any of them may carry a
		// secret, whatever its name.
		{true, "code", true}, // Azure Functions' key
		{true, "sv", true},   // a SAS token's, beside its sig=
		{true, "sp", true},
		{true, "se", true},
		{true, "design", true},
		{true, "signal", true},
		{true, "deployment-id", true},
		{true, "pageToken", true},
	}
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{
		Breaker:   BreakerConfig{FailureThreshold: 1000},
		Upstreams: []Upstream{{Name: "primary", BaseURL: primary.URL + "/v1"}, {Name: "backup", BaseURL: backup.URL + "/v1"}},
	})
	// The second pass finds each header's verdict in the Transport's
	// cache of names.
	for i, tt := range slices.Concat(tests, tests) {
		value := fmt.Sprintf("%s-%d-0123456789", callerMark, i)
		req := httptestRequest("GET", primary.URL+"/v1/models", "")
		if tt.param {
			req.URL.RawQuery = url.Values{tt.name: {value}}.Encode()
		} else {
			req.Header[tt.name] = []string{value} // as spelled: some are not canonical
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := backup.requests()
		s := got[len(got)-1]
		arrived := strings.Contains(s.RawQuery, value) || len(headerValues(s.Header, tt.name)) > 0
		kind := "header"
		if tt.param {
			kind = "query parameter"
		}
		switch {
		case tt.credential && arrived:
			t.Errorf("%s %s reached an upstream the caller did not address: it is a credential", kind, tt.name)
		case !tt.credential && !arrived:
			t.Errorf("%s %s did not reach the backup: it is no credential", kind, tt.name)
		}
		if p := primary.requests(); !strings.Contains(fmt.Sprint(p[len(p)-1]), value) {
			t.Errorf("%s %s did not reach the upstream the caller addressed", kind, tt.name)
		}
	}
}

// The cache of header verdicts holds at most maxSeenHeaders names, and a
// name past it is still judged; a name in it, in its array or its map, has
// the verdict it was judged with.
func TestCredentialCacheBounded(t *testing.T) {
	c, err := newCredentials(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for pass := range 2 {
		for i := range 2 * maxSeenHeaders {
			if c.header(fmt.Sprintf("X-Plain-%d", i)) || !c.header(fmt.Sprintf("X-Token-%d", i)) {
				t.Fatalf("pass %d: wrong verdict for name %d", pass, i)
			}
		}
	}
	s := c.seen.Load()
	if n := s.n + len(s.more); n != maxSeenHeaders {
		t.Errorf("the cache holds %d names, want %d", n, maxSeenHeaders)
	}
	for i, k := range []string{"X-Plain-0", "X-Token-0", "X-Plain-100", "X-Token-100"} {
		if v, ok := s.lookup(k); !ok || v != (i%2 == 1) {
			t.Errorf("cache lookup %s = %v, %v; want %v, true", k, v, ok, i%2 == 1)
		}
	}
	if _, ok := s.lookup("X-Plain-300"); ok {
		t.Errorf("X-Plain-300, met past the bound, is in the cache")
	}
}

// Config.CredentialHeaders and CredentialParams add names to the rule,
// ForwardParams takes names off it: the backup, which the caller did not
// address, gets neither the configured header nor model= (a credential by
// CredentialParams), and gets workspace= (carrying none by ForwardParams)
// and limit= (an LLM API's).
func TestConfigCredentialNames(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{
		CredentialHeaders: []string{"x-tenant"},
		CredentialParams:  []string{"Model"},
		ForwardParams:     []string{"WorkSpace"},
		Upstreams:         []Upstream{{Name: "primary", BaseURL: primary.URL + "/v1"}, {Name: "backup", BaseURL: backup.URL + "/v1"}},
	})
	req := httptestRequest("GET", primary.URL+"/v1/models?model="+callerMark+"-q&workspace=w1&tenant="+callerMark+"-t&limit=2", "")
	req.Header.Set("X-Tenant", callerMark+"-h")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := leaks(backup.requests()[0], callerMark); len(got) > 0 {
		t.Errorf("the backup got the caller's configured credentials: %v", got)
	}
	if got := leaks(primary.requests()[0], callerMark); len(got) != 2 {
		t.Errorf("the primary, addressed, got %v of the caller's configured credentials, want the header and the query", got)
	}
	if q := primary.requests()[0].RawQuery; !strings.Contains(q, "model="+callerMark) || !strings.Contains(q, "tenant="+callerMark) {
		t.Errorf("the primary, addressed, got query %q, want the caller's", q)
	}
	if q := backup.requests()[0].RawQuery; q != "workspace=w1&limit=2" {
		t.Errorf("the backup got query %q, want the pairs that carry no credential", q)
	}
}

func TestConfigCredentialNamesValidated(t *testing.T) {
	ok := []Upstream{{BaseURL: "https://api.example.com/v1"}}
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"header with a space", Config{Upstreams: ok, CredentialHeaders: []string{"X-Ok", "Bad Name"}}, "CredentialHeaders[1]"},
		{"empty header", Config{Upstreams: ok, CredentialHeaders: []string{""}}, "CredentialHeaders[0]"},
		{"empty param", Config{Upstreams: ok, CredentialParams: []string{"tenant", ""}}, "CredentialParams[1]"},
		{"empty forward param", Config{Upstreams: ok, ForwardParams: []string{""}}, "ForwardParams[0]"},
		{"forward a known credential", Config{Upstreams: ok, ForwardParams: []string{"page", "Code"}}, "ForwardParams[1]"},
		{"forward a configured credential", Config{Upstreams: ok, CredentialParams: []string{"tenant"}, ForwardParams: []string{"TENANT"}}, "ForwardParams[0]"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg)
		var cerr *ConfigError
		if !errors.As(err, &cerr) || cerr.Field != tt.field {
			t.Errorf("%s: New returned %v, want a ConfigError naming %s", tt.name, err, tt.field)
		}
	}
}

// A query parameter reaches an upstream the caller did not address only
// when its name is known to carry no secret, whatever the way there: a
// failover, a hedge, a last resort. The addressed upstream gets the query
// as the caller wrote it. (Redirect hops: TestRedirectHopsKeepCredentialsWithTheirUpstream.)
func TestQueryCrossesOnlyByName(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		// setup scripts a and b and may send requests first; the
		// caller's request is then addressed to target.
		setup  func(t *testing.T, n *fakeNet, tr *Transport)
		target string
		// other is the host the caller did not address that must get
		// the request.
		other string
	}{
		{
			name: "failover",
			setup: func(t *testing.T, n *fakeNet, tr *Transport) {
				n.status("a.test", 503, "a down")
				n.status("b.test", 200, "b")
			},
			target: "http://a.test/v1/chat/completions", other: "b.test",
		},
		{
			name: "hedge",
			cfg:  Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond}},
			setup: func(t *testing.T, n *fakeNet, tr *Transport) {
				n.handle("a.test", slowly(time.Second, "a", new(atomic.Int32)))
				n.status("b.test", 200, "b")
			},
			target: "http://a.test/v1/chat/completions", other: "b.test",
		},
		{
			// Both circuits open, a first: a request addressed to b
			// goes past a's circuit.
			name: "last resort",
			cfg:  Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}},
			setup: func(t *testing.T, n *fakeNet, tr *Transport) {
				n.status("a.test", 503, "a down")
				n.status("b.test", 503, "b down")
				get(t, tr, "http://a.test/")
				n.status("a.test", 200, "a")
			},
			target: "http://b.test/v1/chat/completions", other: "a.test",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				tr := newTestTransport(t, twoUpstreams(n, tt.cfg))
				tt.setup(t, n, tr)
				addressed := strings.TrimPrefix(tt.target, "http://")[:len("a.test")]
				before, beforeOwn := n.count(tt.other), n.count(addressed)
				resp := mustPost(t, tr, tt.target+"?"+callerQuery, chatBody)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d, want 200", resp.StatusCode)
				}
				readBody(t, resp)
				synctest.Wait()
				got := n.requests(tt.other)
				if len(got) != before+1 {
					t.Fatalf("%s got %d requests, want %d", tt.other, len(got), before+1)
				}
				if q := got[before].RawQuery; q != safeQuery {
					t.Errorf("%s, not addressed, got query %q, want %q", tt.other, q, safeQuery)
				}
				// The last resort sends nothing to b, whose circuit is open.
				if own := n.requests(addressed); len(own) > beforeOwn && own[beforeOwn].RawQuery != callerQuery {
					q := own[beforeOwn].RawQuery
					t.Errorf("%s, addressed, got query %q, want the caller's %q", addressed, q, callerQuery)
				}
			})
		})
	}
}

// Every part of every secret is scrubbed from errors, Health and logs,
// wherever it appears in a message: the token without its scheme, its
// URL-escaped forms, a Basic credential's decoded password, one of
// several comma-separated keys, a cookie's value, a query value. Base is a
// fake here: net/http's own errors never quote a header, but a layer in
// Base may (a proxy or a signing RoundTripper refusing what it got).
func TestRedactsEverySecretPart(t *testing.T) {
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	// The secrets, and how the fake quotes each.
	secrets := map[string]string{
		"sk-up/a+b=0123456789":       "token sk-up/a+b=0123456789",     // upstream a's, without "Bearer "
		"sk-up%2Fa%2Bb%3D0123456789": "url sk-up%2Fa%2Bb%3D0123456789", // the same, URL-escaped
		"sk-up%2Fa+b=0123456789":     "path /v1/x/sk-up%2Fa+b=0123456789",
		"k2-bbbbbbbbbb":              "second key k2-bbbbbbbbbb",
		"up-basic-pass-123":          "basic password up-basic-pass-123",
		"sk-caller-0123456789":       "caller token sk-caller-0123456789",
		"caller-xauth-0123456789":    "x-auth caller-xauth-0123456789",
		"caller-cookie-0123456789":   "cookie caller-cookie-0123456789",
		"caller-basic-pass99":        "proxy password caller-basic-pass99",
		"caller-tenant-0123456789":   "tenant caller-tenant-0123456789",
		"caller/sig+0123456789":      "sig caller/sig+0123456789",
		"caller%2Fsig%2B0123456789":  "raw sig caller%2Fsig%2B0123456789",
		"AIzaCALLER0123456789":       "key AIzaCALLER0123456789",
		"caller-url-pass-99":         "url password caller-url-pass-99",
	}
	var quoted []string
	for _, q := range secrets {
		quoted = append(quoted, q)
	}
	slices.Sort(quoted)
	echo := "proxy refused: " + strings.Join(quoted, "; ") + "; theme=dark"
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errors.New(echo)
	})
	var logs logBuffer
	tr := newTestTransport(t, Config{
		Base:              base,
		Logger:            newLogger(&logs),
		CredentialHeaders: []string{"X-Tenant"},
		Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test/v1", Header: http.Header{
				"Authorization": {"Bearer sk-up/a+b=0123456789"},
				"X-Keys":        {"k1-aaaaaaaaaa, k2-bbbbbbbbbb"},
			}},
			{Name: "b", BaseURL: "http://b.test/v1", Header: http.Header{"Proxy-Authorization": {basic("svc", "up-basic-pass-123")}}},
		},
	})
	req := httptestRequest("POST", "http://u:caller-url-pass-99@a.test/v1/chat?sig=caller%2Fsig%2B0123456789&key=AIzaCALLER0123456789&model=x", chatBody)
	req.Header.Set("Authorization", "Bearer sk-caller-0123456789")
	req.Header.Set("X-Auth-Token", "caller-xauth-0123456789")
	req.Header.Set("Cookie", "theme=dark; session=caller-cookie-0123456789")
	req.Header.Set("Proxy-Authorization", basic("user", "caller-basic-pass99"))
	req.Header.Set("X-Tenant", "caller-tenant-0123456789")
	_, err := tr.RoundTrip(req)
	var ferr *Error
	if !errors.As(err, &ferr) || len(ferr.Attempts) != 2 {
		t.Fatalf("err = %v, want an *Error with both attempts", err)
	}
	texts := map[string]string{"*Error": err.Error(), "logs": logs.String()}
	for i, a := range ferr.Attempts {
		texts[fmt.Sprintf("Attempts[%d]", i)] = a.Error()
	}
	for _, h := range tr.Health() {
		texts["Health "+h.Name+".LastError"] = h.LastError
	}
	for where, text := range texts {
		var shown []string
		for secret := range secrets {
			if strings.Contains(text, secret) {
				shown = append(shown, secret)
			}
		}
		if len(shown) > 0 {
			slices.Sort(shown)
			t.Errorf("%s shows %q", where, shown)
		}
		if where != "logs" && (!strings.Contains(text, "proxy refused") || !strings.Contains(text, "theme=dark")) {
			t.Errorf("%s lost the cause: %s", where, text)
		}
	}
}

// The credential rule holds in a request's trailers as in its headers: the
// upstream the caller addressed gets the caller's credential trailers, any
// other gets the request without them but with every other trailer, set
// before the request or while its body is read, replayed or streamed (the
// primary's circuit open); an upstream's own Header names are its own in
// trailers too; and the caller's trailer credentials are kept out of
// errors and Health.
func TestTrailerCredentialsStayWithTheirUpstream(t *testing.T) {
	const callerKey = "sk-trailer-caller-0123456789"
	type got struct{ host, key, sum, sig string }
	seen := make(chan got, 8)
	handler := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			io.ReadAll(r.Body)
			seen <- got{r.Host, r.Trailer.Get("X-Api-Key"), r.Trailer.Get("X-Checksum"), r.Trailer.Get("X-Signature")}
			w.WriteHeader(code)
		}
	}
	primary, backup := newServer(t, handler(503)), newServer(t, handler(200))
	tr := newTestTransport(t, Config{Breaker: BreakerConfig{FailureThreshold: 2}, Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"X-Signature": {"backup-own"}}},
	}})
	for _, tc := range []struct {
		name     string
		duringIO bool // the trailer values are set while the body is read
	}{{"set before", false}, {"set while the body is read", true}, {"circuit open, streamed body", true}} {
		pr, pw := io.Pipe()
		req, _ := http.NewRequest("POST", primary.URL+"/v1/files", pr)
		req.Trailer = http.Header{"X-Api-Key": nil, "X-Checksum": nil, "X-Signature": nil}
		set := func() {
			req.Trailer.Set("X-Api-Key", callerKey)
			req.Trailer.Set("X-Checksum", "c0ffee")
			req.Trailer.Set("X-Signature", "caller-sig")
		}
		if !tc.duringIO {
			set()
		}
		go func() {
			io.WriteString(pw, "part")
			if tc.duringIO {
				set()
			}
			pw.Close()
		}()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		resp.Body.Close()
		want := []got{
			{primary.Listener.Addr().String(), callerKey, "c0ffee", "caller-sig"},
			{backup.Listener.Addr().String(), "", "c0ffee", ""},
		}
		if tc.name == "circuit open, streamed body" {
			want = want[1:]
		}
		for _, w := range want {
			if g := <-seen; g != w {
				t.Errorf("%s: upstream got trailers %+v, want %+v", tc.name, g, w)
			}
		}
	}

	// In errors and Health: Base's error quotes the trailer it was sent.
	n := newFakeNet()
	n.handle("a.test", func(r *http.Request) (*http.Response, error) {
		io.ReadAll(r.Body)
		return nil, errors.New("refused trailer " + r.Trailer.Get("X-Api-Key"))
	})
	tr = newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
	req := httptestRequest("POST", "http://a.test/v1", "body")
	req.Trailer = http.Header{"X-Api-Key": {callerKey}}
	_, err := tr.RoundTrip(req)
	if err == nil || !strings.Contains(err.Error(), "refused trailer") {
		t.Fatalf("err = %v, want Base's", err)
	}
	for _, s := range []string{err.Error(), tr.Health()[0].LastError} {
		if strings.Contains(s, callerKey) {
			t.Errorf("the caller's trailer key leaked: %s", s)
		}
	}
}

// A trailer the caller adds while its body is read, which net/http sends
// though it was not announced, reaches no upstream but the credentials'
// owner: here the request goes to the backup first (the primary's circuit
// is open, the body read once as it streams), with its announced trailers
// free to go, or none announced.
func TestTrailerAddedWhileBodyReadStaysWithItsUpstream(t *testing.T) {
	const callerKey = "sk-trailer-late-0123456789"
	type got struct{ host, key, sum string }
	seen := make(chan got, 4)
	handler := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			io.ReadAll(r.Body)
			seen <- got{r.Host, r.Trailer.Get("X-Api-Key"), r.Trailer.Get("X-Checksum")}
			w.WriteHeader(code)
		}
	}
	for _, sums := range []bool{true, false} {
		primary, backup := newServer(t, handler(503)), newServer(t, handler(200))
		tr := newTestTransport(t, Config{MaxBodyBuffer: -1, Breaker: BreakerConfig{FailureThreshold: 1}, Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1"},
		}})
		resp, err := tr.RoundTrip(httptestRequest("POST", primary.URL+"/v1/files", "open")) // the primary's circuit opens
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		<-seen
		<-seen

		pr, pw := io.Pipe()
		req, _ := http.NewRequest("POST", primary.URL+"/v1/files", pr)
		req.Trailer = http.Header{}
		if sums {
			req.Trailer["X-Checksum"] = nil // announced
		}
		go func() {
			io.WriteString(pw, "part")
			req.Trailer.Set("X-Api-Key", callerKey)
			if sums {
				req.Trailer.Set("X-Checksum", "c0ffee")
			}
			pw.Close()
		}()
		resp, err = tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := got{backup.Listener.Addr().String(), "", ""}
		if sums {
			want.sum = "c0ffee"
		}
		if g := <-seen; g != want {
			t.Errorf("X-Checksum announced %v: upstream got trailers %+v, want %+v", sums, g, want)
		}
	}
}
