package failover

import (
	"net/http"
	"strings"
	"testing"
)

// A caller's credentials reach only the upstream the caller addressed, in
// every form a credential takes and every way a request can address an
// upstream. Every upstream answers 503, so every request visits all three.
func TestCredentialsStayWithTheirUpstream(t *testing.T) {
	upstreams := []Upstream{
		{Name: "a", BaseURL: "http://api.a.test/v1", Header: http.Header{"Authorization": {"Bearer key-a-upstream"}}},
		{Name: "b", BaseURL: "http://b.test:8080/openai/v1/", Header: http.Header{"X-Api-Key": {"key-b-upstream"}, "X-Custom-Token": {"key-b-custom"}}},
		{Name: "c", BaseURL: "http://[::1]:9/v1"},
	}
	hosts := map[string]string{"a": "api.a.test", "b": "b.test:8080", "c": "[::1]:9"}
	tests := []struct {
		name, url, addressed, wantPath string
	}{
		{"exact base", "http://api.a.test/v1/chat/completions", "a", "/v1/chat/completions"},
		{"base with trailing slash", "http://api.a.test/v1/", "a", "/v1/"},
		{"base alone", "http://api.a.test/v1", "a", "/v1"},
		{"host in upper case", "http://API.A.Test/v1/chat/completions", "a", "/v1/chat/completions"},
		{"default port written out", "http://api.a.test:80/v1/chat/completions", "a", "/v1/chat/completions"},
		{"user info", "http://user:caller-secret-pass@api.a.test/v1/chat/completions", "a", "/v1/chat/completions"},
		{"base path with trailing slash", "http://b.test:8080/openai/v1/chat/completions", "b", "/openai/v1/chat/completions"},
		{"IPv6 host", "http://[::1]:9/v1/chat/completions", "c", "/v1/chat/completions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newFakeNet()
			for _, h := range hosts {
				n.status(h, 503, "down")
			}
			tr := newTestTransport(t, Config{Base: n, Upstreams: upstreams, Breaker: BreakerConfig{FailureThreshold: 100}})
			req := httptestRequest("POST", tt.url+"?key=caller-secret-query&api_key=caller-secret-q2&model=x", chatBody)
			req.Header.Set("Authorization", "Bearer caller-secret-auth")
			req.Header.Set("Proxy-Authorization", "Basic caller-secret-proxy")
			req.Header.Set("Api-Key", "caller-secret-azure")
			req.Header.Set("X-Goog-Api-Key", "caller-secret-goog")
			req.Header.Set("Cookie", "session=caller-secret-cookie")
			req.Header.Set("X-Custom-Token", "caller-secret-custom")
			req.Header["x-api-key"] = []string{"caller-secret-anthropic"} // not canonical
			req.Header.Set("X-Request-Id", "r-1")                         // not a credential
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()

			for name, host := range hosts {
				got := n.requests(host)
				if len(got) != 1 {
					t.Fatalf("%s got %d requests, want 1", name, len(got))
				}
				s := got[0]
				if s.Header.Get("X-Request-Id") != "r-1" || s.Body != chatBody || !strings.Contains(s.RawQuery, "model=x") {
					t.Errorf("%s: the request's own data did not arrive: %+v", name, s)
				}
				if name != tt.addressed {
					if leaked := findSecret(s, "caller-secret"); leaked != "" {
						t.Errorf("%s, not addressed, got the caller's credential in %s", name, leaked)
					}
				} else if s.Path != tt.wantPath {
					t.Errorf("%s: path %q, want %q", name, s.Path, tt.wantPath)
				}
				for other, key := range map[string]string{"a": "key-a-upstream", "b": "key-b-upstream"} {
					if other != name {
						if leaked := findSecret(s, key); leaked != "" {
							t.Errorf("%s got upstream %s's key in %s", name, other, leaked)
						}
					}
				}
			}

			// The addressed upstream gets the caller's credentials, except
			// for the names its own Header sets, which replace them.
			a := n.requests(hosts[tt.addressed])[0]
			own := upstreams[indexOf(tt.addressed)].Header
			for _, name := range []string{"Authorization", "Proxy-Authorization", "Api-Key", "X-Goog-Api-Key", "Cookie", "X-Custom-Token", "X-Api-Key"} {
				vals := headerValues(a.Header, name)
				if want, ok := own[name]; ok {
					if strings.Join(vals, ",") != strings.Join(want, ",") {
						t.Errorf("addressed %s: %s = %q, want only its own %q", tt.addressed, name, vals, want)
					}
				} else if len(vals) == 0 || !strings.Contains(vals[0], "caller-secret") {
					t.Errorf("addressed %s: %s = %q, want the caller's", tt.addressed, name, vals)
				}
			}
			if !strings.Contains(a.RawQuery, "key=caller-secret-query") {
				t.Errorf("addressed %s lost the caller's key= parameter: %q", tt.addressed, a.RawQuery)
			}
		})
	}
}

func indexOf(name string) int { return int(name[0] - 'a') }

// headerValues returns the values of name in h under any spelling of it.
func headerValues(h http.Header, name string) []string {
	var out []string
	for k, vs := range h {
		if strings.EqualFold(k, name) {
			out = append(out, vs...)
		}
	}
	return out
}

// findSecret reports where in s a value containing secret appears.
func findSecret(s seen, secret string) string {
	for k, vs := range s.Header {
		for _, v := range vs {
			if strings.Contains(v, secret) {
				return "header " + k
			}
		}
	}
	switch {
	case strings.Contains(s.RawQuery, secret):
		return "query"
	case strings.Contains(s.User, secret):
		return "user info"
	}
	return ""
}

func TestStripQueryCredentials(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"model=x", "model=x"},
		{"key=s&alt=json", "alt=json"},
		{"$alt=json;enum-encoding=int&key=s", "$alt=json;enum-encoding=int"},
		{"z=%2F1&KEY=s&a=1&a=2", "z=%2F1&a=1&a=2"},
		{"%6Bey=s&x=1", "x=1"}, // an escaped name is still key
		{"api_key=s&api-key=s&apikey=s&access_token=s", ""},
		{"keyboard=1&monkey=2", "keyboard=1&monkey=2"},
		{"key", ""},
		{"a=1&&b=2", "a=1&&b=2"},
		{"a=1;key=s;b=2", "a=1;b=2"}, // some servers split at ';'
		{"key=s;b=2&c=3", "b=2&c=3"},
	}
	for _, tt := range tests {
		if got := stripQueryCredentials(tt.in); got != tt.want {
			t.Errorf("stripQueryCredentials(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
