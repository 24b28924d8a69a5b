package failover_test

import (
	"context"
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

// provider is a loopback upstream that says when it is called, and
// answers with status.
func provider(name string, status int) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("%s got %s %s\n", name, r.Method, r.URL.Path)
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"from":%q}`, name)
	}))
}

// This request may use only deepseek and then openai, in that order:
// deepseek is down, so openai answers, and gemini, first in the
// configuration, is never asked. A name the Transport does not have is an
// error, and nothing is sent.
func ExampleWithUpstreams() {
	gemini, openai, deepseek := provider("gemini", 200), provider("openai", 200), provider("deepseek", 503)
	defer gemini.Close()
	defer openai.Close()
	defer deepseek.Close()
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "gemini", BaseURL: gemini.URL + "/v1"},
		{Name: "openai", BaseURL: openai.URL + "/v1"},
		{Name: "deepseek", BaseURL: deepseek.URL + "/v1"},
	}})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: t}

	ctx := failover.WithUpstreams(context.Background(), "deepseek", "openai")
	req, _ := http.NewRequestWithContext(ctx, "POST", gemini.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))

	ctx = failover.WithUpstreams(context.Background(), "openai", "anthropic")
	req, _ = http.NewRequestWithContext(ctx, "POST", gemini.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	_, err = t.RoundTrip(req)
	var unknown *failover.UnknownUpstreamError
	if errors.As(err, &unknown) {
		fmt.Println("unknown:", unknown.Names)
		fmt.Println(err)
	}
	// Output:
	// deepseek got POST /v1/chat/completions
	// openai got POST /v1/chat/completions
	// 200 {"from":"openai"}
	// unknown: [anthropic]
	// failover: unknown upstream "anthropic" in WithUpstreams; the upstreams are "gemini", "openai", "deepseek"
}

// A paid tool call must not run twice: with WithoutFailover, the primary's
// 503 comes back as it is, and the backup is never sent the request.
func ExampleWithoutFailover() {
	primary, backup := provider("primary", 503), provider("backup", 200)
	defer primary.Close()
	defer backup.Close()
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: t}

	ctx := failover.WithoutFailover(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", primary.URL+"/v1/tools/charge", strings.NewReader(`{"amount":5}`))
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("the caller got", resp.StatusCode)
	// Output:
	// primary got POST /v1/tools/charge
	// the caller got 503
}

// The Transport waits up to a minute for an attempt's headers; this
// request, whose caller is in a hurry, waits a second on the primary, which
// hangs, then fails over. Its own timeout, shorter than the Transport's,
// does not count against the primary's circuit.
func ExampleWithAttemptTimeout() {
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // until the attempt gives up
	}))
	defer hung.Close()
	backup := provider("backup", 200)
	defer backup.Close()
	t, err := failover.New(failover.Config{
		AttemptTimeout: time.Minute,
		Breaker:        failover.BreakerConfig{FailureThreshold: 1},
		Upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: hung.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1"},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: t}

	ctx := failover.WithAttemptTimeout(context.Background(), time.Second)
	req, _ := http.NewRequestWithContext(ctx, "GET", hung.URL+"/v1/models", nil)
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body))
	fmt.Println("the primary's circuit is", t.Health()[0].State)
	// Output:
	// backup got GET /v1/models
	// {"from":"backup"}
	// the primary's circuit is closed
}

// A conversation begun at the backup, while the primary was down, goes on
// at the backup alone: the Transport learned where response resp_1 lives
// from the answer that created it (PinConfig, on by default). When the
// backup is down too, the request that references it fails at once with a
// PinnedError that names the upstream and the reference, rather than
// reaching a provider that never heard of resp_1.
func ExampleWithPinned() {
	var backupDown atomic.Bool
	primary := provider("primary", 503)
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if backupDown.Load() {
			w.WriteHeader(503)
			return
		}
		body, _ := io.ReadAll(r.Body)
		fmt.Printf("backup got %s\n", body)
		fmt.Fprint(w, `{"id":"resp_1","object":"response"}`)
	}))
	defer backup.Close()
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}, Breaker: failover.BreakerConfig{FailureThreshold: 1}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	post := func(ctx context.Context, body string) {
		req, _ := http.NewRequestWithContext(ctx, "POST", primary.URL+"/v1/responses", strings.NewReader(body))
		resp, err := t.RoundTrip(req)
		var pinned *failover.PinnedError
		switch {
		case errors.As(err, &pinned):
			fmt.Printf("refused: %s holds %s (%v)\n", pinned.Upstream, pinned.Ref, errors.Is(err, failover.ErrCircuitOpen))
		case err != nil:
			fmt.Println(err)
		default:
			io.Copy(io.Discard, resp.Body) // the Transport learns resp_1 as the body is read
			resp.Body.Close()
			fmt.Println("answer:", resp.StatusCode)
		}
	}
	ctx := context.Background()
	post(ctx, `{"model":"gpt-5","input":"hi"}`) // the primary fails; its circuit opens
	post(ctx, `{"model":"gpt-5","previous_response_id":"resp_1","input":"more"}`)
	// WithPinned pins a request yourself.
	post(failover.WithPinned(ctx, "backup"), `{"model":"gpt-5","input":"mine"}`)
	backupDown.Store(true)
	post(ctx, `{"model":"gpt-5","previous_response_id":"resp_1","input":"more"}`) // its circuit opens
	post(ctx, `{"model":"gpt-5","previous_response_id":"resp_1","input":"more"}`)
	// Output:
	// primary got POST /v1/responses
	// backup got {"model":"gpt-5","input":"hi"}
	// answer: 200
	// backup got {"model":"gpt-5","previous_response_id":"resp_1","input":"more"}
	// answer: 200
	// backup got {"model":"gpt-5","input":"mine"}
	// answer: 200
	// answer: 503
	// refused: backup holds resp_1 (true)
}

// A batch job's request yields when capacity runs short: it passes over
// an upstream whose rate-limit window is nearly spent (under 10 % left by
// default, Config.Shed) and, when none is left, fails at once with ErrShed
// and a RetryAfter, leaving the capacity to interactive requests.
func ExampleWithSheddable() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Limit-Requests", "100")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "5") // 5 % left
		w.Header().Set("X-Ratelimit-Reset-Requests", "20s")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer api.Close()
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{Name: "openai", BaseURL: api.URL + "/v1"}}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	send := func(ctx context.Context, what string) {
		req, _ := http.NewRequestWithContext(ctx, "POST", api.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		resp, err := t.RoundTrip(req)
		var ra failover.RetryAfterError
		switch {
		case errors.Is(err, failover.ErrShed) && errors.As(err, &ra):
			fmt.Printf("%s: shed, retry within %v\n", what, ra.RetryAfter().Round(10*time.Second))
		case err != nil:
			fmt.Println(what, err)
		default:
			resp.Body.Close()
			fmt.Printf("%s: %d\n", what, resp.StatusCode)
		}
	}
	send(context.Background(), "interactive") // learns that 5 % is left
	send(failover.WithSheddable(context.Background()), "batch")
	send(context.Background(), "interactive")
	// Output:
	// interactive: 200
	// batch: shed, retry within 20s
	// interactive: 200
}
