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
