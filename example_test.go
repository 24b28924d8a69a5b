package failover_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover"
)

// Two upstreams behind one http.Client: the primary is overloaded, so the
// request is served by the backup, with the backup's own key and path.
func Example() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(529)
		io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error"}}`)
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("backup got %s %s with %s\n", r.Method, r.URL.Path, r.Header.Get("Authorization"))
		io.WriteString(w, `{"choices":[{"message":{"content":"hello"}}]}`)
	}))
	defer backup.Close()

	t, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer PRIMARY_KEY"}}},
			{Name: "backup", BaseURL: backup.URL + "/openai/v1", Header: http.Header{"Authorization": {"Bearer BACKUP_KEY"}}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: t} // any SDK takes this client

	resp, err := client.Post(primary.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// backup got POST /openai/v1/chat/completions with Bearer BACKUP_KEY
	// 200 {"choices":[{"message":{"content":"hello"}}]}
}

// Health shows each upstream's circuit, cooldown and latency; it encodes
// to JSON for a /health endpoint.
func ExampleTransport_Health() {
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer down.Close()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	t, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{{Name: "down", BaseURL: down.URL}, {Name: "up", BaseURL: up.URL}},
		Breaker:   failover.BreakerConfig{FailureThreshold: 3, Cooldown: time.Minute},
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: t}
	for range 4 {
		resp, err := client.Get(down.URL + "/models")
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	for _, h := range t.Health() {
		fmt.Printf("%s: %s, trips %d, failed %d, succeeded %d\n", h.Name, h.State, h.Trips, h.Requests.Failed, h.Requests.Success)
	}
	js, _ := json.Marshal(t.Health()[0])
	var fields map[string]any
	json.Unmarshal(js, &fields)
	fmt.Println("JSON state:", fields["state"], "last error:", fields["last_error"])
	// Output:
	// down: open, trips 1, failed 3, succeeded 0
	// up: closed, trips 0, failed 0, succeeded 4
	// JSON state: open last error: HTTP 503 Service Unavailable
}

// When every upstream is open or cooling down, the error says when to come
// back.
func ExampleError() {
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer busy.Close()
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{Name: "busy", BaseURL: busy.URL}}})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: t}
	resp, err := client.Get(busy.URL) // the provider's own 429 comes back
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode)

	_, err = client.Get(busy.URL) // now cooling: nothing is sent
	var ferr *failover.Error
	if errors.Is(err, failover.ErrRateLimited) && errors.As(err, &ferr) {
		fmt.Println("rate limited; retry after about", ferr.RetryAfter().Round(10*time.Second))
	}
	// Output:
	// 429
	// rate limited; retry after about 30s
}

// A Breaker guards any RoundTripper with one circuit, without failover.
func ExampleNewBreaker() {
	b, err := failover.NewBreaker(http.DefaultTransport, failover.BreakerConfig{FailureThreshold: 5, Cooldown: 30 * time.Second}, nil)
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: b}
	_ = client
	fmt.Println(b.State())
	// Output: closed
}

// The metrics are in Prometheus text format, each family with its help
// text and type.
func ExampleTransport_WritePrometheus() {
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{Name: "openai", BaseURL: "https://api.openai.com/v1"}}})
	if err != nil {
		log.Fatal(err)
	}
	// In a server: mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) { t.WritePrometheus(w) })
	var b strings.Builder
	t.WritePrometheus(&b)
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.Contains(line, "failover_breaker_state") {
			fmt.Println(line)
		}
	}
	// Output:
	// # HELP failover_breaker_state State of the upstream's circuit: 0 closed, 1 open, 2 half-open.
	// # TYPE failover_breaker_state gauge
	// failover_breaker_state{upstream="openai"} 0
}

// RetryAfter reads every form providers use.
func ExampleRetryAfter() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, h := range []http.Header{
		{"Retry-After-Ms": {"1500"}},
		{"Retry-After": {"20"}},
		{"Retry-After": {"Sun, 29 Nov 2026 12:01:00 GMT"}},
	} {
		d, _ := failover.RetryAfter(h, now)
		fmt.Println(d)
	}
	// Output:
	// 1.5s
	// 20s
	// 1m0s
}

// loggingTransport is any RoundTripper of the caller's: tracing, auth, a
// recorder for tests.
type loggingTransport struct{ next http.RoundTripper }

func (l loggingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(r)
	if err == nil {
		fmt.Printf("sent to %s: %d\n", r.URL.Path, resp.StatusCode)
	}
	return resp, err
}

// The Transport composes with other RoundTrippers: below it (Base sees every
// attempt, rewritten for its upstream) and above it (an SDK's middleware, or
// a tracing wrapper, sees one request and one answer).
func Example_compose() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer backup.Close()

	t, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/compat/v1"},
		},
		Base: loggingTransport{http.DefaultTransport}, // below: every attempt
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: loggingTransport{t}} // above: the caller's view
	resp, err := client.Get(primary.URL + "/v1/models")
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	// Output:
	// sent to /v1/models: 502
	// sent to /compat/v1/models: 200
	// sent to /v1/models: 200
}

// A primary that is slow today: after 50ms without an answer, the request
// also goes to the backup, whose answer wins; the primary's attempt is
// canceled.
func ExampleHedgeConfig() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
			io.WriteString(w, "primary")
		case <-r.Context().Done(): // canceled when the hedge wins
		}
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "backup")
	}))
	defer backup.Close()

	t, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{{Name: "primary", BaseURL: primary.URL}, {Name: "backup", BaseURL: backup.URL}},
		Hedge:     &failover.HedgeConfig{Delay: 50 * time.Millisecond, Percent: 5},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.CloseIdleConnections()
	resp, err := (&http.Client{Transport: t}).Get(primary.URL + "/v1/models")
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body))

	var m strings.Builder
	t.WritePrometheus(&m)
	for line := range strings.Lines(m.String()) {
		if strings.HasPrefix(line, "failover_hedge") {
			fmt.Print(line)
		}
	}
	// Output:
	// backup
	// failover_hedge_wins_total 1
	// failover_hedges_denied_total 0
	// failover_hedges_total 1
}

// One provider, three keys (Upstream.Keys): they take turns, and each has
// its own 429 cooldown and revoked-key state. A 429 cools its key down for
// the Retry-After it names (30s here) and the request goes at once to the
// next key, as does a 401 or 403 (a revoked key); a key that keeps
// answering them is tried after the others, and Config.Logger logs
// "upstream rejected its credentials" with the key's name. A 5xx or a
// reset would keep the key: the provider is at fault, and its circuit
// counts it. Health names each key, never its value.
func Example_keyPool() {
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		status := http.StatusOK
		switch key {
		case "sk-a": // out of requests for this minute
			status = http.StatusTooManyRequests
			w.Header().Set("Retry-After", "30")
		case "sk-b": // revoked
			status = http.StatusUnauthorized
		}
		fmt.Printf("  %s: %d\n", key, status)
		w.WriteHeader(status)
		if status == http.StatusOK {
			io.WriteString(w, `{"choices":[{"message":{"content":"hello"}}]}`)
		}
	}))
	defer provider.Close()

	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "openai", BaseURL: provider.URL + "/v1", Keys: []failover.Key{
			{Name: "a", Header: http.Header{"Authorization": {"Bearer sk-a"}}},
			{Name: "b", Header: http.Header{"Authorization": {"Bearer sk-b"}}},
			{Name: "c", Header: http.Header{"Authorization": {"Bearer sk-c"}}},
		}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	client := &http.Client{Transport: t}

	for i := 1; i <= 4; i++ {
		fmt.Printf("request %d\n", i)
		resp, err := client.Post(provider.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println("  answer:", resp.StatusCode)
	}
	for _, k := range t.Health()[0].Keys {
		fmt.Printf("key %s: cooling %v, revoked %v\n", k.Name, k.Cooldown > 0, k.AuthFailing)
	}
	// Output:
	// request 1
	//   sk-a: 429
	//   sk-b: 401
	//   sk-c: 200
	//   answer: 200
	// request 2
	//   sk-b: 401
	//   sk-c: 200
	//   answer: 200
	// request 3
	//   sk-b: 401
	//   sk-c: 200
	//   answer: 200
	// request 4
	//   sk-c: 200
	//   answer: 200
	// key a: cooling true, revoked false
	// key b: cooling false, revoked true
	// key c: cooling false, revoked false
}

// Weighted spreads the requests over the upstreams in proportion to their
// Weight, here three to one, by smooth weighted round robin: the order
// repeats every four requests and never sends two in a row to the lighter
// upstream. Without a Router, all eight would go to the first upstream.
// Failover still applies to each request: an upstream that fails passes
// its request on to the next.
func ExampleWeighted() {
	answer := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, name)
		}))
	}
	big, small := answer("big"), answer("small")
	defer big.Close()
	defer small.Close()

	t, err := failover.New(failover.Config{
		Router: &failover.Weighted{},
		Upstreams: []failover.Upstream{
			{Name: "big", BaseURL: big.URL, Weight: 3},
			{Name: "small", BaseURL: small.URL, Weight: 1},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	client := &http.Client{Transport: t}
	var served []string
	for range 8 {
		resp, err := client.Get(big.URL + "/models")
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		served = append(served, string(body))
	}
	fmt.Println(strings.Join(served, " "))
	// Output: big big small big big big small big
}

// Models renames the request's model for each upstream, so that a request
// for gpt-4o can fall back to another provider's model. Only the top-level
// "model" changes; the rest of the body goes byte for byte. An upstream
// whose map serves neither the model nor "*" is skipped: the Claude-only
// upstream below never sees the request (its server would print it). The
// 503 is tried once more at OpenAI before Gemini's other model
// ([RetryConfig]).
func ExampleUpstream_models() {
	server := func(name string, status int) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			fmt.Printf("%s got %s\n", name, body)
			w.WriteHeader(status)
		}))
	}
	openai := server("openai", http.StatusServiceUnavailable)
	defer openai.Close()
	claude := server("claude", http.StatusOK)
	defer claude.Close()
	gemini := server("gemini", http.StatusOK)
	defer gemini.Close()

	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "openai", BaseURL: openai.URL + "/v1"}, // no Models: every model as it is
		{Name: "claude", BaseURL: claude.URL + "/v1", Models: map[string]string{"claude-sonnet-4-5": "claude-sonnet-4-5"}},
		{Name: "gemini", BaseURL: gemini.URL + "/v1beta/openai", Models: map[string]string{"gpt-4o": "gemini-2.5-flash", "*": "*"}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	resp, err := (&http.Client{Transport: t}).Post(openai.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi", "model": "not this one"}]}`))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "from", resp.Request.URL.Path)
	// Output:
	// openai got {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi", "model": "not this one"}]}
	// openai got {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi", "model": "not this one"}]}
	// gemini got {"model": "gemini-2.5-flash", "messages": [{"role": "user", "content": "hi", "model": "not this one"}]}
	// 200 from /v1beta/openai/chat/completions
}

// Each upstream may have its own breaker and attempt timeout. Here, as in
// the field's reference setup, the primary trips after 3 failures and is
// probed again after 15s, while the backup keeps the defaults (5 failures,
// 30s). The backup is slow to its first byte by nature: it waits 10s for
// its headers where Config says 200ms for everyone else, and its slow
// answer arrives. Health shows each upstream's policy in effect.
func ExampleUpstream_policy() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer primary.Close()
	var slow atomic.Bool
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slow.Load() {
			time.Sleep(300 * time.Millisecond) // past Config's 200ms
		}
		io.WriteString(w, "backup")
	}))
	defer backup.Close()

	t, err := failover.New(failover.Config{
		AttemptTimeout: 200 * time.Millisecond,
		Upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1", Breaker: &failover.BreakerConfig{FailureThreshold: 3, Cooldown: 15 * time.Second}},
			{Name: "backup", BaseURL: backup.URL + "/v1", AttemptTimeout: 10 * time.Second},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	client := &http.Client{Transport: t}
	get := func() string {
		resp, err := client.Get(primary.URL + "/v1/models")
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return fmt.Sprint(resp.StatusCode, " ", string(body))
	}
	for range 3 {
		get()
	}
	slow.Store(true)
	fmt.Println("slow answer:", get())
	for _, h := range t.Health() {
		fmt.Printf("%s: %s after %d failures; trips after %d, opens for %v at first, attempt timeout %v\n",
			h.Name, h.State, h.Requests.Failed, h.Breaker.FailureThreshold, h.Breaker.Cooldown, h.AttemptTimeout)
	}
	// Output:
	// slow answer: 200 backup
	// primary: open after 3 failures; trips after 3, opens for 15s at first, attempt timeout 200ms
	// backup: closed after 0 failures; trips after 5, opens for 1s at first, attempt timeout 10s
}

// Active probes find a provider that went down before a request does, and
// one that came back before its circuit's Cooldown ends. Here the primary
// is down from the start: its probes (GET {BaseURL}/models every 100ms)
// open its circuit, so the first request goes straight to the backup
// without waiting on the primary. Then the primary recovers: the next
// probe that succeeds half-opens its circuit, an hour before the Cooldown
// would have, and the next request probes it for real and closes it.
func ExampleProbeConfig() {
	var down atomic.Bool
	down.Store(true)
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if r.URL.Path != "/v1/models" {
			fmt.Println("primary got", r.Method, r.URL.Path)
		}
		io.WriteString(w, "primary")
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "backup")
	}))
	defer backup.Close()

	t, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{{Name: "primary", BaseURL: primary.URL + "/v1"}, {Name: "backup", BaseURL: backup.URL + "/v1"}},
		Probe:     failover.ProbeConfig{Interval: 100 * time.Millisecond},
		Breaker:   failover.BreakerConfig{FailureThreshold: 2, Cooldown: time.Hour},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close() // stops the probes
	client := &http.Client{Transport: t}
	ask := func() {
		resp, err := client.Post(primary.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println("answered by", string(body))
	}
	// waitFor polls Health until the primary's circuit is in state.
	waitFor := func(state string) {
		for deadline := time.Now().Add(time.Minute); t.Health()[0].State != state; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				log.Fatalf("the primary's circuit is %s, not %s", t.Health()[0].State, state)
			}
		}
		fmt.Println("primary:", state)
	}

	waitFor("open")
	ask()
	down.Store(false)
	waitFor("half-open")
	ask()
	fmt.Println("primary:", t.Health()[0].State)
	// Output:
	// primary: open
	// answered by backup
	// primary: half-open
	// primary got POST /v1/chat/completions
	// answered by primary
	// primary: closed
}

// Content-aware fallback: a prompt too long for one model is not the
// caller's fault everywhere. The first upstream's model answers OpenAI's
// 400 context_length_exceeded; the Transport reads the start of that body,
// judges it Unservable and sends the request at once to the next upstream,
// whose Models map the request to a model with a larger context. Nobody is
// blamed: the first upstream's circuit, cooldown and figures are untouched.
// Had every upstream answered so, the caller would have got the last
// answer as it came.
func Example_contextWindowFallback() {
	server := func(name string, answer func(w http.ResponseWriter)) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req struct{ Model string }
			json.NewDecoder(r.Body).Decode(&req)
			fmt.Println(name, "got", req.Model)
			w.Header().Set("Content-Type", "application/json")
			answer(w)
		}))
	}
	small := server("small", func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 204308 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`)
	})
	defer small.Close()
	large := server("large", func(w http.ResponseWriter) { io.WriteString(w, `{"choices":[]}`) })
	defer large.Close()

	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "small", BaseURL: small.URL + "/v1"},
		{Name: "large", BaseURL: large.URL + "/v1", Models: map[string]string{"gpt-4o": "gpt-4.1", "*": "*"}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	resp, err := (&http.Client{Transport: t}).Post(small.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model": "gpt-4o", "messages": [{"role": "user", "content": "a very long prompt"}]}`))
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	for _, h := range t.Health() {
		fmt.Printf("%s: %d unservable, %d success, circuit %s, breaker failures %d\n",
			h.Name, h.Requests.Unservable, h.Requests.Success, h.State, h.BreakerFailures)
	}
	// Output:
	// small got gpt-4o
	// large got gpt-4.1
	// 200 {"choices":[]}
	// small: 1 unservable, 0 success, circuit closed, breaker failures 0
	// large: 0 unservable, 1 success, circuit closed, breaker failures 0
}

// A custom Classifier can judge Unservable what DefaultClassifier does not
// know: here a self-hosted gateway's 400 for a request with images, which
// its other upstreams take. BodyPrefix gives it the first bytes of the
// body the Transport read (of a 400, 403 or 413); the caller still reads
// the body whole.
func ExampleBodyPrefix() {
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"detail":"this deployment takes no images"}`)
	}))
	defer gateway.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "from backup")
	}))
	defer backup.Close()

	t, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{
			{Name: "gateway", BaseURL: gateway.URL},
			{Name: "backup", BaseURL: backup.URL},
		},
		Classify: func(resp *http.Response, err error) failover.Outcome {
			if p, ok := failover.BodyPrefix(resp); ok && strings.Contains(string(p), "takes no images") {
				return failover.Unservable
			}
			return failover.DefaultClassifier(resp, err)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	resp, err := (&http.Client{Transport: t}).Post(gateway.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`))
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body), "; gateway:", t.Health()[0].Requests.Unservable, "unservable")
	// Output:
	// 200 from backup ; gateway: 1 unservable
}

// A stream whose content began and then went silent: the read that waits
// past Timeouts.Idle (20s by default; 50ms here) ends it with a
// *StallError naming the upstream, and the silence counts against it.
// Until content, the same silence would have failed over.
func ExampleStallError() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // then nothing
	}))
	defer primary.Close()
	t, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{{Name: "primary", BaseURL: primary.URL + "/v1"}},
		Timeouts:  failover.Timeouts{Idle: 50 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	client := &http.Client{Transport: t}
	resp, err := client.Post(primary.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	var stall *failover.StallError
	if errors.As(err, &stall) {
		fmt.Println(stall.Upstream, "went silent for", stall.Silence)
	}
	fmt.Println("its failures:", t.Health()[0].BreakerFailures)
	// Output:
	// primary went silent for 50ms
	// its failures: 1
}

// A stream cut after its content began is continued by the backup, whose
// chat completions take a trailing assistant message: the caller reads one
// stream, as if one upstream had written it.
func ExampleContinueConfig() {
	chunk := func(id, text, finish string) string {
		f := "null"
		if finish != "" {
			f = `"` + finish + `"`
		}
		return `data: {"id":"` + id + `","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + text + `"},"finish_reason":` + f + "}]}\n\n"
	}
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, chunk("chatcmpl-1", "Once upon ", "")+chunk("chatcmpl-1", "a time,", ""))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection drops mid-answer
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Role, Content string }
		}
		json.NewDecoder(r.Body).Decode(&req)
		last := req.Messages[len(req.Messages)-1]
		fmt.Printf("backup continues the %s's %q\n", last.Role, last.Content)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, chunk("gen-7", " there was a fox.", "stop")+"data: [DONE]\n\n")
	}))
	defer backup.Close()

	t, err := failover.New(failover.Config{
		Continue: failover.ContinueConfig{On: true},
		Upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1", Prefill: failover.Prefill{Chat: failover.ChatTrailingAssistant}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()

	resp, err := (&http.Client{Transport: t}).Post(primary.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"Tell a story."}]}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	var text strings.Builder
	ids := map[string]bool{}
	for _, ev := range strings.Split(string(body), "\n\n") {
		var c struct {
			ID      string
			Choices []struct{ Delta struct{ Content string } }
		}
		if json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &c) == nil && len(c.Choices) > 0 {
			ids[c.ID] = true
			text.WriteString(c.Choices[0].Delta.Content)
		}
	}
	fmt.Println(text.String())
	fmt.Println("ids:", len(ids), "ends with [DONE]:", strings.HasSuffix(string(body), "data: [DONE]\n\n"))
	// Output:
	// backup continues the assistant's "Once upon a time,"
	// Once upon a time, there was a fox.
	// ids: 1 ends with [DONE]: true
}
