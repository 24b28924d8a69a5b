package failover

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// With Config.Shared, when another process of the fleet holds the
// half-open probe's lease, Health says what requests find: the upstream is
// not available, because the probe is elsewhere, and no request goes there.
func TestHealthAgreesWithAdmissionUnderRemoteLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		s := newMemShared()
		// Another member holds a's probe for the next hour.
		if ok, err := s.AcquireProbe(context.Background(), "a", "another member", time.Hour); !ok || err != nil {
			t.Fatal(ok, err)
		}
		tr := newTestTransport(t, twoUpstreams(n, Config{Shared: s, SharedSync: 100 * time.Millisecond, Breaker: BreakerConfig{FailureThreshold: 2, Cooldown: time.Second}}))
		t.Cleanup(func() { tr.Close() })
		synctest.Wait()
		get(t, tr, "http://a.test/")
		get(t, tr, "http://a.test/")
		time.Sleep(time.Second) // the cooldown ends: the next request would probe
		synctest.Wait()
		h := tr.Health()[0]
		if h.State != "half-open" || h.Available || h.Unavailable != ReasonProbeElsewhere {
			t.Fatalf("Health: state %s, available %v, unavailable %q; want half-open, not available, %q", h.State, h.Available, h.Unavailable, ReasonProbeElsewhere)
		}
		before := n.count("a.test")
		for range 5 {
			if code, err := get(t, tr, "http://a.test/"); code != 200 || err != nil {
				t.Fatalf("%d %v, want b's 200", code, err)
			}
			synctest.Wait()
		}
		if got := n.count("a.test") - before; got != 0 {
			t.Fatalf("%d of 5 requests went to a, whose probe another member holds", got)
		}
		if h := tr.Health()[0]; h.Available {
			t.Fatalf("Health says available after 5 requests skipped it: %+v", h)
		}
		var m strings.Builder
		tr.WritePrometheus(&m)
		if !strings.Contains(m.String(), `failover_skipped_total{upstream="a",reason="probe_elsewhere"} 5`) {
			t.Errorf("the skipped metric does not name the reason:\n%s", grepLines(m.String(), "failover_skipped_total"))
		}
	})
}

// Health and the skipped metrics give the reason the request was refused
// for: a cooldown, an open circuit, a probe in flight.
func TestUnavailableReasons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		release := make(chan struct{})
		var probing sync.WaitGroup
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if r.URL.Path == "/probe" {
				probing.Done()
				<-release
				return respond(200, "a"), nil
			}
			return respond(503, "down"), nil
		})
		n.status("b.test", 429, "busy", "Retry-After", "7")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second}}))
		get(t, tr, "http://a.test/") // a opens, b cools down for 7s
		hs := tr.Health()
		if a := hs[0]; a.Available || a.Unavailable != ReasonCircuitOpen || a.OpenFor != time.Second {
			t.Errorf("a: %+v, want unavailable for circuit_open, 1s", a)
		}
		if b := hs[1]; b.Available || b.Unavailable != ReasonRateLimited || b.Cooldown != 7*time.Second {
			t.Errorf("b: %+v, want unavailable for rate_limited, 7s", b)
		}
		time.Sleep(time.Second)
		if a := tr.Health()[0]; !a.Available || a.Unavailable != "" {
			t.Errorf("a after its cooldown: available %v, %q; want available to probe", a.Available, a.Unavailable)
		}
		probing.Add(1)
		go get(t, tr, "http://a.test/probe")
		probing.Wait()
		if a := tr.Health()[0]; a.Available || a.Unavailable != ReasonProbing {
			t.Errorf("a during its probe: available %v, %q; want %q", a.Available, a.Unavailable, ReasonProbing)
		}
		_, err := get(t, tr, "http://a.test/")
		if err == nil {
			t.Fatal("a request got through while a probes and b cools down")
		}
		close(release)
		synctest.Wait()
		var m strings.Builder
		tr.WritePrometheus(&m)
		for _, want := range []string{
			`failover_skipped_total{upstream="a",reason="probe_in_flight"} 1`,
			`failover_skipped_total{upstream="b",reason="rate_limited"} 1`,
		} {
			if !strings.Contains(m.String(), want) {
				t.Errorf("metrics lack %s:\n%s", want, grepLines(m.String(), "failover_skipped_total"))
			}
		}
	})
}

// recordRouter keeps the candidates of the last request, and orders them
// as Priority does.
type recordRouter struct {
	mu    sync.Mutex
	cands []Candidate
}

func (r *recordRouter) Order(dst []int, cands []Candidate) []int {
	r.mu.Lock()
	r.cands = append(r.cands[:0], cands...)
	r.mu.Unlock()
	return Priority{}.Order(dst, cands)
}

func (r *recordRouter) last() []Candidate {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Candidate(nil), r.cands...)
}

// A Router learns why an upstream is demoted: hung, out of headroom, or
// degraded are three different things to a Router's author, and Health
// names the same reason.
func TestCandidateDemotionReason(t *testing.T) {
	t.Run("suspect", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			n.handle("a.test", func(r *http.Request) (*http.Response, error) {
				<-r.Context().Done()
				return nil, r.Context().Err()
			})
			n.status("b.test", 200, "b")
			rr := &recordRouter{}
			tr := newTestTransport(t, twoUpstreams(n, Config{Router: rr, AttemptTimeout: 10 * time.Second}))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for range 3 {
				go tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
			}
			synctest.Wait()
			time.Sleep(150 * time.Millisecond) // past the 100ms floor
			get(t, tr, "http://a.test/")
			c := rr.last()[0]
			if c.Demoted != ReasonSuspect || c.State != Closed || c.Unavailable != "" {
				t.Fatalf("candidate %+v, want demoted as suspect with its circuit closed", c)
			}
			if h := tr.Health()[0]; h.Demoted != ReasonSuspect || !h.Suspect || h.Degraded {
				t.Fatalf("Health: demoted %q, suspect %v, degraded %v", h.Demoted, h.Suspect, h.Degraded)
			}
			cancel()
			synctest.Wait()
		})
	})
	t.Run("out of headroom", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			n.status("a.test", 200, "a", "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "20s")
			n.status("b.test", 200, "b")
			rr := &recordRouter{}
			tr := newTestTransport(t, twoUpstreams(n, Config{Router: rr}))
			get(t, tr, "http://a.test/")
			get(t, tr, "http://a.test/")
			if c := rr.last()[0]; c.Demoted != ReasonOutOfHeadroom {
				t.Fatalf("candidate demoted %q, want %q", c.Demoted, ReasonOutOfHeadroom)
			}
			if h := tr.Health()[0]; h.Demoted != ReasonOutOfHeadroom || h.Degraded || !h.OutOfHeadroom {
				t.Fatalf("Health: %+v", h)
			}
		})
	})
	t.Run("degraded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			n.handle("a.test", func(r *http.Request) (*http.Response, error) {
				time.Sleep(300 * time.Millisecond)
				return respond(200, "a"), nil
			})
			n.status("b.test", 200, "b")
			rr := &recordRouter{}
			tr := newTestTransport(t, twoUpstreams(n, Config{Router: rr, Degraded: DegradedConfig{Latency: 100 * time.Millisecond, MinSamples: 3}}))
			for range 3 {
				get(t, tr, "http://a.test/")
			}
			time.Sleep(refreshEvery)
			get(t, tr, "http://a.test/")
			if c := rr.last()[0]; c.Demoted != ReasonDegraded {
				t.Fatalf("candidate demoted %q, want %q", c.Demoted, ReasonDegraded)
			}
			if h := tr.Health()[0]; h.Demoted != ReasonDegraded || !h.Degraded || h.Suspect {
				t.Fatalf("Health: %+v", h)
			}
		})
	})
}

// A model no upstream behind the open ones serves does not make a request
// wait for nothing: the wait is for the first upstream that serves it.
func TestEarliestSkipsUnservedModels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		cfg := twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second}, RateLimit: RateLimitConfig{MaxWait: 2 * time.Second}})
		cfg.Upstreams[1].Models = map[string]string{"other": "*"}
		tr := newTestTransport(t, cfg)
		body := `{"model":"gpt"}`
		mustPost(t, tr, "http://a.test/", body).Body.Close() // a opens; b does not serve gpt
		n.status("a.test", 200, "a")
		start := time.Now()
		resp := mustPost(t, tr, "http://a.test/", body)
		defer resp.Body.Close()
		if got := readBody(t, resp); got != "a" || time.Since(start) != time.Second {
			t.Fatalf("got %q after %v; want a's answer once its circuit lets a probe through, 1s", got, time.Since(start))
		}
	})
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// sets finds the keys an upstream's Header sets in any spelling and of any
// length, its first look by length (upstream.lens) included: keys of 63
// bytes and more share one bit.
func TestUpstreamSets(t *testing.T) {
	long := "X-" + strings.Repeat("Long", 20) // 82 bytes
	u, err := newUpstream(0, Upstream{Name: "a", BaseURL: "https://a.test/v1", Header: http.Header{
		"Authorization": {"k"},
		long:            {"v"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		want bool
	}{
		{"Authorization", true},
		{"authorization", true},
		{"AUTHORIZATION", true},
		{"Authorizatio", false},
		{"Authorizatiom", false},
		{"Content-Type", false},
		{strings.ToLower(long), true},
		{long + "s", false},              // 83 bytes: the same bit, another key
		{strings.Repeat("x", 63), false}, // the same bit
		{"", false},
	} {
		if got := u.sets(c.key); got != c.want {
			t.Errorf("sets(%q) = %v, want %v", c.key, got, c.want)
		}
	}
}

// An Upstream.Header value with a control character that net/http refuses
// to send (any but HT, not only CR, LF and NUL) is refused by New, naming
// the field and not the value: before, New took it, and every request
// addressed to that upstream then failed with net/http's "invalid header
// field value", as the caller's own fault, without failing over to the
// upstream that could answer it.
func TestUpstreamHeaderControlCharacter(t *testing.T) {
	primary := newUpstreamServer(t, 200, "primary")
	backup := newUpstreamServer(t, 200, "backup")
	for _, v := range []string{"sk-\x01secret", "sk-\x7fsecret", "sk-\x1bsecret"} {
		tr, err := New(Config{Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL, Header: http.Header{"Authorization": {"Bearer " + v}}},
			{Name: "backup", BaseURL: backup.URL},
		}})
		if err == nil {
			resp, rerr := tr.RoundTrip(httptestRequest("GET", primary.URL+"/v1/models", ""))
			if rerr == nil {
				resp.Body.Close()
			}
			tr.Close()
			t.Errorf("New took a header value with %q; a request then got %v", v, rerr)
			continue
		}
		var cerr *ConfigError
		if !errors.As(err, &cerr) || cerr.Field != "Upstreams[0].Header" || strings.Contains(err.Error(), "secret") {
			t.Errorf("New: %v; want a ConfigError naming Upstreams[0].Header without the value", err)
		}
	}
	tr, err := New(Config{Upstreams: []Upstream{{BaseURL: primary.URL, Header: http.Header{"X-Note": {"a\tb \xff"}}}}})
	if err != nil {
		t.Fatalf("a header value with HT and obs-text: %v", err)
	}
	defer tr.Close()
	readBody(t, mustGet(t, tr, primary.URL+"/v1/models"))
	if got := primary.requests(); len(got) != 1 || got[0].Header.Get("X-Note") != "a\tb \xff" {
		t.Fatalf("the primary got %+v", got)
	}
}

// A BaseURL whose port no connection can have (0, or past 65535) is
// refused by New, naming the field: before, New took it, and every
// request to the upstream failed to dial ("invalid port"), counting
// against its circuit as if the provider were down.
func TestUpstreamBaseURLPortOutOfRange(t *testing.T) {
	for _, b := range []string{"http://a.test:0/v1", "http://a.test:65536/v1", "https://a.test:99999", "http://[::1]:123456/v1", "http://a.test:00000/v1"} {
		_, err := New(Config{Upstreams: []Upstream{{BaseURL: b}}})
		var cerr *ConfigError
		if !errors.As(err, &cerr) || cerr.Field != "Upstreams[0].BaseURL" {
			t.Errorf("New with BaseURL %q: %v, want a ConfigError naming Upstreams[0].BaseURL", b, err)
		}
	}
	srv := newUpstreamServer(t, 200, "ok")
	for _, b := range []string{srv.URL + "/v1", "http://a.test:/v1", "http://a.test:65535/v1", "http://a.test:00080/v1", "http://[::1]:1/v1"} {
		tr, err := New(Config{Upstreams: []Upstream{{BaseURL: b}}})
		if err != nil {
			t.Errorf("New with BaseURL %q: %v", b, err)
			continue
		}
		tr.Close()
	}
}

// New refuses a Query or a {deployment} that could never work, naming the
// field, and takes the forms Azure OpenAI's classic path is written in.
func TestUpstreamQueryAndDeploymentConfig(t *testing.T) {
	const azure = "https://res.test/openai/deployments/{deployment}"
	for _, tt := range []struct {
		name  string
		cfg   Config
		field string // "": New takes it
		says  string // in the reason
	}{
		{"query in BaseURL", Config{Upstreams: []Upstream{{BaseURL: "https://res.test/openai?api-version=1"}}}, "Upstreams[0].BaseURL", "put parameters in Query"},
		{"credential in Query", Config{Upstreams: []Upstream{{BaseURL: "https://a.test/v1"}, {BaseURL: azure, Query: url.Values{"api-key": {"k"}}}}}, "Upstreams[1].Query", "put credentials in Header"},
		{"credential in Query in other case", Config{Upstreams: []Upstream{{BaseURL: azure, Query: url.Values{"Key": {"k"}}}}}, "Upstreams[0].Query", "credential"},
		{"CredentialParams in Query", Config{CredentialParams: []string{"tenant"}, Upstreams: []Upstream{{BaseURL: azure, Query: url.Values{"tenant": {"t"}}}}}, "Upstreams[0].Query", "credential"},
		{"credential-like Query name", Config{Upstreams: []Upstream{{BaseURL: azure, Query: url.Values{"Subscription-Key": {"k"}}}}}, "Upstreams[0].Query", "put credentials in Header"},
		{"Query name in two cases", Config{Upstreams: []Upstream{{BaseURL: azure, Query: url.Values{"api-version": {"1"}, "API-Version": {"2"}}}}}, "Upstreams[0].Query", "two cases"},
		{"empty Query name", Config{Upstreams: []Upstream{{BaseURL: azure, Query: url.Values{"": {"x"}}}}}, "Upstreams[0].Query", "empty"},
		{"two deployments", Config{Upstreams: []Upstream{{BaseURL: "https://res.test/{deployment}/{deployment}"}}}, "Upstreams[0].BaseURL", "{deployment}"},
		{"deployment in a segment", Config{Upstreams: []Upstream{{BaseURL: "https://res.test/openai/x{deployment}"}}}, "Upstreams[0].BaseURL", "{deployment}"},
		{"other placeholder", Config{Upstreams: []Upstream{{BaseURL: "https://res.test/openai/{model}"}}}, "Upstreams[0].BaseURL", "{deployment}"},
		{"brace beside deployment", Config{Upstreams: []Upstream{{BaseURL: "https://res.test/{v}/{deployment}"}}}, "Upstreams[0].BaseURL", "{deployment}"},
		{"deployment in host", Config{Upstreams: []Upstream{{BaseURL: "https://{deployment}.res.test/v1"}}}, "Upstreams[0].BaseURL", "not a URL"},
		{"Models maps to no segment", Config{Upstreams: []Upstream{{BaseURL: azure, Models: map[string]string{"gpt-4o": "a/b"}}}}, "Upstreams[0].Models", "path segment"},
		{"Models maps to a dot segment", Config{Upstreams: []Upstream{{BaseURL: azure, Models: map[string]string{"gpt-4o": ".."}}}}, "Upstreams[0].Models", "path segment"},
		{"classic path", Config{Upstreams: []Upstream{{BaseURL: azure, Query: url.Values{"api-version": {"2024-10-21"}}, Models: map[string]string{"gpt-4o": "my-gpt4o", "*": "*"}}}}, "", ""},
		{"escaped braces, trailing slash", Config{Upstreams: []Upstream{{BaseURL: "https://res.test/openai/deployments/%7Bdeployment%7D/"}}}, "", ""},
		{"suffix after deployment", Config{Upstreams: []Upstream{{BaseURL: "https://res.test/{deployment}/openai"}}}, "", ""},
		{"slashes elsewhere in Models", Config{Upstreams: []Upstream{{BaseURL: "https://a.test/v1", Models: map[string]string{"x": "a/b"}}}}, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := New(tt.cfg)
			if tt.field == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				tr.Close()
				return
			}
			var cerr *ConfigError
			if !errors.As(err, &cerr) || cerr.Field != tt.field || !strings.Contains(cerr.Reason, tt.says) {
				t.Fatalf("New: %v, want a ConfigError naming %s that says %q", err, tt.field, tt.says)
			}
		})
	}
}

// A {deployment} upstream serves a model its Models map to a path
// segment, never a request that names none (noModel), and any model for
// Health (""). Health shows the BaseURL as written.
func TestDeployedServes(t *testing.T) {
	tr := newTestTransport(t, Config{Base: newFakeNet(), Upstreams: []Upstream{
		{Name: "plain", BaseURL: "https://a.test/v1", Models: map[string]string{"gpt-4o": "*"}},
		{Name: "mapped", BaseURL: "https://res.test/openai/deployments/%7Bdeployment%7D", Models: map[string]string{"gpt-4o": "my-gpt4o", "*": "*"}},
		{Name: "any", BaseURL: "https://res2.test/openai/deployments/{deployment}"},
	}})
	plain, mapped, anyModel := tr.upstreams[0], tr.upstreams[1], tr.upstreams[2]
	for _, tt := range []struct {
		u     *upstream
		model string
		want  bool
	}{
		{plain, "", true}, {plain, noModel, true}, {plain, "o3", false},
		{mapped, "", true}, {mapped, noModel, false}, {mapped, "gpt-4o", true}, {mapped, "o3", true}, {mapped, "a/b", false}, {mapped, "..", false},
		{anyModel, "", true}, {anyModel, noModel, false}, {anyModel, "gpt 4o", true}, {anyModel, `a\b`, false}, {anyModel, "a\nb", false},
	} {
		if got := tt.u.serves(tt.model); got != tt.want {
			t.Errorf("%s serves %q: %v, want %v", tt.u.name, tt.model, got, tt.want)
		}
	}
	h := tr.Health()
	if !h[1].Available || h[1].Unavailable != "" {
		t.Errorf("Health of a {deployment} upstream: available %v (%q), want available", h[1].Available, h[1].Unavailable)
	}
	if want := "https://res.test/openai/deployments/{deployment}"; h[1].BaseURL != want {
		t.Errorf("Health BaseURL %q, want %q", h[1].BaseURL, want)
	}
}

// withQuery sets an upstream's Query in place of the caller's pairs of the
// same names, keeping every other pair as it was.
func TestWithQuery(t *testing.T) {
	u, err := newUpstream(0, Upstream{BaseURL: "https://res.test/openai", Query: url.Values{"api-version": {"2024-10-21"}, "drop": nil}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ raw, want string }{
		{"", "api-version=2024-10-21"},
		{"api-version=2023-05-15", "api-version=2024-10-21"},
		{"a=1;api%2Dversion=old&b=%20", "a=1&b=%20&api-version=2024-10-21"},
		{"drop=1&Api-Version=x", "api-version=2024-10-21"},
		{"API-VERSION=x&b=1", "b=1&api-version=2024-10-21"},
	} {
		if got := u.withQuery(tt.raw); got != tt.want {
			t.Errorf("withQuery(%q) = %q, want %q", tt.raw, got, tt.want)
		}
	}
}

// urlErrorBase fails every request with a *url.Error that quotes its
// URL, as a Base built on an http.Client or a retrying client does.
type urlErrorBase struct{}

func (urlErrorBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	return nil, &url.Error{Op: req.Method, URL: req.URL.String(), Err: errors.New("connection refused")}
}

// TestQuerySecretNameRefused: New takes an Upstream.Query whose name
// says it is a credential (APIM's subscription-key, a token=) though the
// rule for headers (looksSecret) would call it one, and its value then
// reaches the caller in Base's error, when it quotes the URL: nothing
// scrubs Query values. New should refuse such a name (the header
// patterns), or the values should join upstreamSecrets.
func TestQuerySecretNameRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	const secret = "apim-subscription-secret-0123456789"
	for _, name := range []string{"subscription-key", "token", "x-api-key"} {
		tr, err := New(Config{Base: urlErrorBase{}, Retry: RetryConfig{Off: true}, Upstreams: []Upstream{
			{Name: "apim", BaseURL: closed + "/openai/deployments/{deployment}", Query: url.Values{name: {secret}}},
		}})
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("%s: New: %v, want a *ConfigError", name, err)
			}
			continue // refused: fine
		}
		resp, err := tr.RoundTrip(httptestRequest("POST", closed+"/openai/deployments/d/chat/completions", chatBody))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: got %d, want an error", name, resp.StatusCode)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Query %q accepted and its value is in the error: %v", name, err)
		}
		for _, h := range tr.Health() {
			if strings.Contains(strings.Join(h.Problems, " ")+h.BaseURL, secret) {
				t.Errorf("%s: Health shows the value: %+v", name, h)
			}
		}
	}
}

// TestQueryNameAnyCase: Upstream.Query replaces the caller's
// parameters of its names compared byte for byte, while the credential
// rule folds case: a caller's API-Version stays beside the upstream's
// api-version, and an Azure front end that folds case sees two.
func TestQueryNameAnyCase(t *testing.T) {
	n := newFakeNet()
	n.status("res.azure.test", 200, `{"choices":[]}`)
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{
		{Name: "azure", BaseURL: "https://res.azure.test/openai/deployments/{deployment}", Query: url.Values{"api-version": {"2024-10-21"}}},
	}})
	resp, err := tr.RoundTrip(httptestRequest("POST", "https://res.azure.test/openai/deployments/d/chat/completions?API-Version=2023-05-15", `{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if q := n.requests("res.azure.test")[0].RawQuery; strings.Contains(q, "2023-05-15") {
		t.Errorf("Azure got query %q: the caller's API-Version beside the upstream's api-version", q)
	}
}

// An Upstream.Query value of 8 bytes or more is scrubbed from errors as
// a Header value is, whatever its name: one mistaken for a parameter
// stays with its upstream too.
func TestQueryValueScrubbed(t *testing.T) {
	const value = "tenant-0123456789abcdef"
	tr := newTestTransport(t, Config{Base: urlErrorBase{}, Retry: RetryConfig{Off: true}, Upstreams: []Upstream{
		{Name: "apim", BaseURL: "https://gw.test/openai/deployments/{deployment}", Query: url.Values{"tenant": {value}}},
	}})
	resp, err := tr.RoundTrip(httptestRequest("POST", "https://gw.test/openai/deployments/d/chat/completions", chatBody))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %d, want an error", resp.StatusCode)
	}
	if strings.Contains(err.Error(), value) || !strings.Contains(err.Error(), "tenant=") {
		t.Errorf("error %q: want the tenant parameter with its value scrubbed", err)
	}
}
