package integration_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// openai-go over a failover.Transport: hand the SDK an http.Client whose
// Transport is the failover one (option.WithHTTPClient) and aim it at the
// primary (option.WithBaseURL). The primary fails with a 503, and the
// backup serves the completion within the SDK's first attempt, at its own
// path and with its own key; the caller's key, given to the SDK, reaches
// only the primary.
//
// The host can change only there, below the http.Client: openai-go checks
// that each request still goes to its base URL's origin after its own
// middleware (option.WithMiddleware), so a middleware cannot fail over.
//
// The SDK's own retries stay on: it does not retry what the Transport
// already failed over (see Example_openaiRetries).
func Example_openai() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("primary got", r.Method, r.URL.Path, "with", r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"The server is overloaded.","type":"server_error","code":null,"param":null}}`)
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("backup got", r.Method, r.URL.Path, "with", r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o",`+
			`"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"Hello from the backup."}}]}`)
	}))
	defer backup.Close()

	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"}, // gets the caller's key
		{Name: "backup", BaseURL: backup.URL + "/openai/v1", Header: http.Header{"Authorization": {"Bearer sk-backup"}}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()

	client := openai.NewClient(
		option.WithHTTPClient(&http.Client{Transport: t}),
		option.WithBaseURL(primary.URL+"/v1"),
		option.WithAPIKey("sk-caller"),
	)
	res, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    openai.ChatModel("gpt-4o"),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Choices[0].Message.Content)
	// Output:
	// primary got POST /v1/chat/completions with Bearer sk-caller
	// backup got POST /openai/v1/chat/completions with Bearer sk-backup
	// Hello from the backup.
}

// openai-go retries a failed request twice by default (transport errors,
// 408, 409, 429, 5xx). It does not retry what a failover.Transport already
// failed over: an answer after more than one attempt says
// "X-Should-Retry: false", and an error of the Transport's own (every
// upstream open or cooling down, say) comes as an answer that says the
// same, so one call makes one pass over the upstreams. The SDK still
// retries the answer of a request that had one attempt only.
//
// With Config.SDKRetries each SDK attempt is a pass over every upstream:
// (1+MaxRetries) × 2 attempts, 6 by default, with the SDK's waits between
// them (0.5s, then 1s, or the last answer's retry-after-ms or
// Retry-After), which know nothing of the upstreams. Config.Retries gives
// the Transport more rounds instead, which wait longer while every
// upstream is open or cooling down and never past the request's deadline
// (RateLimit.MaxWait waits for a cooling upstream). The numbers after #
// are the SDK's X-Stainless-Retry-Count.
func Example_openaiRetries() {
	var (
		mu   sync.Mutex
		sent []string // the requests of one call, as upstream#retry
	)
	server := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			sent = append(sent, name+"#"+r.Header.Get("X-Stainless-Retry-Count"))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"message":"The server is overloaded.","type":"server_error","code":null,"param":null}}`)
		}))
	}
	primary, backup := server("primary"), server("backup")
	defer primary.Close()
	defer backup.Close()

	call := func(title string, cfg failover.Config, opts ...option.RequestOption) {
		cfg.Upstreams = []failover.Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer sk-primary"}}},
			{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer sk-backup"}}},
		}
		t, err := failover.New(cfg) // a Transport each, so that no circuit opens from the calls before
		if err != nil {
			log.Fatal(err)
		}
		defer t.Close()
		client := openai.NewClient(append([]option.RequestOption{
			option.WithHTTPClient(&http.Client{Transport: t}),
			option.WithBaseURL(primary.URL + "/v1"),
			option.WithAPIKey("sk-caller"),
		}, opts...)...)
		mu.Lock()
		sent = nil
		mu.Unlock()
		_, err = client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model:    openai.ChatModel("gpt-4o"),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) {
			log.Fatalf("got %v, want the backup's 503", err)
		}
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("%-34s %d attempts: %s, then %d\n", title, len(sent), strings.Join(sent, " "), apiErr.StatusCode)
	}

	call("the SDK's default (2 retries):", failover.Config{})
	call("Config.Retries 1:", failover.Config{Retries: 1, RetryWaitMin: 100 * time.Millisecond})
	call("Config.SDKRetries:", failover.Config{SDKRetries: true})
	// Output:
	// the SDK's default (2 retries):     2 attempts: primary#0 backup#0, then 503
	// Config.Retries 1:                  4 attempts: primary#0 backup#0 primary#0 backup#0, then 503
	// Config.SDKRetries:                 6 attempts: primary#0 backup#0 primary#1 backup#1 primary#2 backup#2, then 503
}
