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
