package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// The README's first snippet, under openai-go, against two local servers
// that stand in for OpenAI and OpenRouter: OpenAI is overloaded, and
// OpenRouter answers the same call, asked for its own name of the model
// and with its own key. OpenAI is tried twice: a 503 is retried once at the
// same upstream when the next would serve another model ([failover.RetryConfig]).
func Example() {
	os.Setenv("OPENAI_API_KEY", "sk-openai") // the keys come from the environment
	os.Setenv("OPENROUTER_API_KEY", "sk-openrouter")
	defer os.Unsetenv("OPENAI_API_KEY")
	defer os.Unsetenv("OPENROUTER_API_KEY")
	openaiURL, openrouterURL, stop := readmeServers()
	defer stop()

	// first snippet
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "openai", BaseURL: openaiURL,
			Header: http.Header{"Authorization": {"Bearer " + os.Getenv("OPENAI_API_KEY")}}},
		{Name: "openrouter", BaseURL: openrouterURL,
			Header: http.Header{"Authorization": {"Bearer " + os.Getenv("OPENROUTER_API_KEY")}},
			Models: map[string]string{"gpt-4o": "openai/gpt-4o", "gpt-4o-mini": "openai/gpt-4o-mini"}},
	}})
	if err != nil {
		log.Fatal(err) // a *failover.ConfigError naming the field
	}
	defer t.Close()

	client := openai.NewClient(
		option.WithBaseURL(openaiURL), // the first upstream's BaseURL
		option.WithHTTPClient(&http.Client{Transport: t}),
	)
	// end of first snippet

	res, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Choices[0].Message.Content)
	// Output:
	// openai got POST /v1/chat/completions with Bearer sk-openai
	// openai got POST /v1/chat/completions with Bearer sk-openai
	// openrouter got POST /api/v1/chat/completions with Bearer sk-openrouter for openai/gpt-4o
	// Hello from OpenRouter.
}

// readmeServers starts the stand-ins for OpenAI, which is overloaded, and
// OpenRouter, and returns their BaseURLs as the README spells the real ones
// (/v1 and /api/v1).
func readmeServers() (openaiURL, openrouterURL string, stop func()) {
	oa := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("openai got", r.Method, r.URL.Path, "with", r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"The server is overloaded.","type":"server_error","code":null,"param":null}}`)
	}))
	or := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Model string }
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Println("openrouter got", r.Method, r.URL.Path, "with", r.Header.Get("Authorization"), "for", req.Model)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"gen-1","object":"chat.completion","created":1700000000,"model":"openai/gpt-4o",`+
			`"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"Hello from OpenRouter."}}]}`)
	}))
	return oa.URL + "/v1", or.URL + "/api/v1", func() { oa.Close(); or.Close() }
}
