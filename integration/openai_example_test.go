package integration_test

import (
	"context"
	"encoding/json"
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
	"github.com/failover-go/failover/failovertest"
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

// cleanups stands in for the *testing.T that failovertest.NewServer takes
// in a test: run shuts the servers down at the end of an Example.
type cleanups []func()

func (c *cleanups) Cleanup(f func()) { *c = append(*c, f) }

func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// Config.Continue under openai-go: the primary cuts its stream after
// "Once upon a time,", and the backup, whose Upstream.Prefill says it
// continues a trailing assistant message, gets the request again with
// that message appended. The SDK reads one stream, which
// openai.ChatCompletionAccumulator makes into one completion: the
// primary's id, one finish reason, and the usage both upstreams reported
// (the backup's alone here: the primary was cut before its usage chunk,
// which comes last). Had the backup refused, the SDK's stream would have
// failed with the cut's unexpected EOF, as without Continue.
func Example_openaiContinue() {
	var t cleanups // in a test: t *testing.T
	defer t.run()

	primary := failovertest.NewServer(&t, failovertest.Step{
		Chunks: []string{
			`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"Once upon "},"finish_reason":null}]}` + "\n\n",
			`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"a time,"},"finish_reason":null}]}` + "\n\n",
		},
		End: failovertest.EndCut,
	})
	backup := failovertest.NewServer(&t, failovertest.Step{Chunks: []string{
		`data: {"id":"gen-2","object":"chat.completion.chunk","created":1700000001,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":" there was"},"finish_reason":null}]}` + "\n\n",
		`data: {"id":"gen-2","object":"chat.completion.chunk","created":1700000001,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":" a fox."},"finish_reason":"stop"}]}` + "\n\n",
		`data: {"id":"gen-2","object":"chat.completion.chunk","created":1700000001,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":5,"total_tokens":25}}` + "\n\n",
		"data: [DONE]\n\n",
	}})

	tr, err := failover.New(failover.Config{
		Continue: failover.ContinueConfig{On: true},
		Upstreams: []failover.Upstream{
			{Name: "openai", BaseURL: primary.URL + "/v1"},
			{Name: "openrouter", BaseURL: backup.URL + "/api/v1", Header: http.Header{"Authorization": {"Bearer sk-backup"}},
				Prefill: failover.Prefill{Chat: failover.ChatTrailingAssistant}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	client := openai.NewClient(
		option.WithHTTPClient(&http.Client{Transport: tr}),
		option.WithBaseURL(primary.URL+"/v1"),
		option.WithAPIKey("sk-caller"),
	)
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         openai.ChatModel("gpt-4o"),
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell a story.")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(acc.Choices[0].Message.Content)
	fmt.Println(acc.ID, acc.Choices[0].FinishReason, acc.Usage.TotalTokens, "tokens")

	r := backup.Requests()[0]
	var sent struct {
		Messages []struct{ Role, Content string }
	}
	json.Unmarshal(r.Body, &sent)
	last := sent.Messages[len(sent.Messages)-1]
	fmt.Printf("backup got %s with %s, ending in %s %q\n", r.Path, r.Header.Get("Authorization"), last.Role, last.Content)
	// Output:
	// Once upon a time, there was a fox.
	// chatcmpl-1 stop 25 tokens
	// backup got /api/v1/chat/completions with Bearer sk-backup, ending in assistant "Once upon a time,"
}
