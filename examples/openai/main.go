// Command openai puts a failover.Transport under the real openai-go client.
//
// By default nothing leaves the machine: it starts two local
// OpenAI-compatible servers, a primary that answers every request with an
// overload error (503, or 529 with -overload 529) and a backup that answers
// properly, then makes one chat completion and one streaming completion
// against the primary and prints which upstream served each, and the
// Transport's Health.
//
//	go run ./examples/openai
//	go run ./examples/openai -overload 529
//
// With -primary and -backup it talks to real providers instead, with the
// primary's key from OPENAI_API_KEY and the backup's from BACKUP_API_KEY.
// Failover changes the URL and the credentials of a request, never its body,
// so -model must name a model that both providers serve:
//
//	OPENAI_API_KEY=sk-... BACKUP_API_KEY=sk-... go run ./examples/openai \
//		-primary https://api.openai.com/v1 -backup https://my-proxy.example/v1 \
//		-model gpt-4o-mini
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("openai example: ")
	var (
		primary  = flag.String("primary", os.Getenv("FAILOVER_PRIMARY_URL"), "base URL of the primary provider, such as https://api.openai.com/v1 (default $FAILOVER_PRIMARY_URL); empty runs the offline demo")
		backup   = flag.String("backup", os.Getenv("FAILOVER_BACKUP_URL"), "base URL of the backup provider (default $FAILOVER_BACKUP_URL)")
		model    = flag.String("model", "gpt-4o-mini", "model to ask; both providers must serve it")
		overload = flag.Int("overload", http.StatusServiceUnavailable, "status the offline primary answers: 503 or 529")
		retries  = flag.Int("sdk-retries", 2, "openai-go's own retries against real providers (the offline demo always uses 0)")
	)
	flag.Parse()
	if flag.NArg() > 0 {
		log.Fatalf("unexpected arguments %q", flag.Args())
	}

	ctx, stop := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stop()

	var cfg config
	if *primary == "" && *backup == "" {
		if *overload != http.StatusServiceUnavailable && *overload != 529 {
			log.Fatalf("-overload must be 503 or 529, not %d", *overload)
		}
		var shutdown func()
		cfg, shutdown = offline(*overload)
		defer shutdown()
	} else {
		var err error
		if cfg, err = live(*primary, *backup, *retries); err != nil {
			log.Fatal(err)
		}
	}
	cfg.model = *model
	if err := run(ctx, os.Stdout, cfg); err != nil {
		log.Fatal(err)
	}
}

// config is what run needs: the upstreams, and how the SDK is set up.
type config struct {
	upstreams []failover.Upstream
	callerKey string // the key the SDK itself is given
	model     string
	// sdkRetries is passed to option.WithMaxRetries.
	sdkRetries int
	// threshold is the breaker's FailureThreshold (0 means the default, 5).
	threshold uint
}

// live aims at two real providers. Each upstream's Header carries its own
// key: the Transport puts it on every request it sends there, replacing
// whatever the SDK set, so one SDK client can use two accounts.
func live(primary, backup string, sdkRetries int) (config, error) {
	if primary == "" || backup == "" {
		return config{}, errors.New("-primary and -backup go together")
	}
	pk, bk := os.Getenv("OPENAI_API_KEY"), os.Getenv("BACKUP_API_KEY")
	if pk == "" || bk == "" {
		return config{}, errors.New("set OPENAI_API_KEY (primary) and BACKUP_API_KEY (backup)")
	}
	return config{
		upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: primary, Header: bearer(pk)},
			{Name: "backup", BaseURL: backup, Header: bearer(bk)},
		},
		callerKey: pk,
		// Against real providers the SDK's own retries (default 2) stay
		// on: each SDK retry is one more round over both upstreams.
		sdkRetries: sdkRetries,
	}, nil
}

// offline starts the two local servers and returns a config aimed at them,
// and a function that stops them.
func offline(overload int) (config, func()) {
	const primaryKey, backupKey = "sk-demo-primary", "sk-demo-backup"
	p := httptest.NewServer(overloaded(primaryKey, overload))
	b := httptest.NewServer(provider(backupKey))
	return config{
		upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: p.URL + "/v1", Header: bearer(primaryKey)},
			{Name: "backup", BaseURL: b.URL + "/v1", Header: bearer(backupKey)},
		},
		// The SDK's key is replaced by each upstream's own; no real key
		// from the environment reaches the local servers either.
		callerKey: "sk-demo-caller",
		// openai-go retries 5xx on its own (twice by default, after
		// 0.5 s and 1 s). With its retries off, a call that succeeds
		// can only have succeeded because the Transport moved on to the
		// backup within that one SDK attempt.
		sdkRetries: 0,
		// Two failures open the primary's circuit (the default is 5), so
		// Health shows it open after the two calls of the demo.
		threshold: 2,
	}, func() { p.Close(); b.Close() }
}

func bearer(key string) http.Header { return http.Header{"Authorization": {"Bearer " + key}} }

func run(ctx context.Context, out io.Writer, cfg config) error {
	t, err := failover.New(failover.Config{
		Upstreams: cfg.upstreams,
		Breaker:   failover.BreakerConfig{FailureThreshold: cfg.threshold},
	})
	if err != nil {
		return err
	}
	defer t.CloseIdleConnections()

	client := openai.NewClient(
		// The Transport must sit in the http.Client: openai-go checks that
		// every request still goes to its base URL's origin after its
		// middleware, so the host can only change below it, inside the
		// RoundTripper.
		option.WithHTTPClient(&http.Client{Transport: t}),
		// Requests are addressed to the primary; the Transport sends
		// them to the first healthy upstream.
		option.WithBaseURL(cfg.upstreams[0].BaseURL),
		option.WithAPIKey(cfg.callerKey),
		option.WithMaxRetries(cfg.sdkRetries),
	)
	params := openai.ChatCompletionNewParams{
		Model:    cfg.model,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello in five words.")},
	}

	fmt.Fprintf(out, "chat completion (sdk retries %d)\n", cfg.sdkRetries)
	var raw *http.Response
	completion, err := client.Chat.Completions.New(ctx, params, option.WithResponseInto(&raw))
	if err != nil {
		return fmt.Errorf("chat completion: %w", err)
	}
	text := ""
	if len(completion.Choices) > 0 {
		text = completion.Choices[0].Message.Content
	}
	fmt.Fprintf(out, "  served by %s: %q\n", servedBy(raw), text)

	fmt.Fprintf(out, "streaming completion\n  ")
	var streamRaw *http.Response
	stream := client.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&streamRaw))
	defer stream.Close()
	for stream.Next() {
		for _, c := range stream.Current().Choices {
			fmt.Fprint(out, c.Delta.Content) // printed as each chunk arrives
		}
	}
	if err := stream.Err(); err != nil {
		return fmt.Errorf("streaming completion: %w", err)
	}
	fmt.Fprintf(out, "\n  served by %s\n\n", servedBy(streamRaw))

	return printHealth(out, t.Health())
}

// servedBy names the upstream that answered resp, and how many attempts
// the call took (failover.ServedBy).
func servedBy(resp *http.Response) string {
	s, ok := failover.ServedBy(resp)
	if !ok {
		return "an unknown upstream"
	}
	return fmt.Sprintf("%s after %d attempts", s.Upstream, s.Attempts)
}

func printHealth(out io.Writer, health []failover.UpstreamHealth) error {
	fmt.Fprintln(out, "t.Health():")
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  UPSTREAM\tSTATE\tAVAILABLE\tOPEN FOR\tSUCCESS\tFAILED\tRATE LIMITED\tLAST ERROR")
	for _, h := range health {
		fmt.Fprintf(w, "  %s\t%s\t%t\t%s\t%d\t%d\t%d\t%s\n",
			h.Name, h.State, h.Available, h.OpenFor.Round(time.Second),
			h.Requests.Success, h.Requests.Failed, h.Requests.RateLimited, cmp.Or(h.LastError, "-"))
	}
	return w.Flush()
}

// overloaded answers every request as an overloaded provider does, after
// checking that it got its own key.
func overloaded(key string, status int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+key {
			writeError(w, http.StatusUnauthorized, "invalid_api_key", "Incorrect API key provided.")
			return
		}
		if status == 529 {
			writeError(w, status, "overloaded_error", "Overloaded")
			return
		}
		writeError(w, status, "server_error", "The server is overloaded. Please try again later.")
	})
}

// provider answers POST /v1/chat/completions as an OpenAI-compatible
// provider does, with a JSON completion or, for "stream": true, an SSE
// stream flushed chunk by chunk.
func provider(key string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+key {
			writeError(w, http.StatusUnauthorized, "invalid_api_key", "Incorrect API key provided.")
			return
		}
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "We could not parse the JSON body of your request.")
			return
		}
		words := []string{"Hello", " from", " the", " backup", " upstream!"}
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{
				"id": "chatcmpl-demo", "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
				"choices": []any{map[string]any{
					"index": 0, "finish_reason": "stop",
					"message": map[string]any{"role": "assistant", "content": strings.Join(words, "")},
				}},
				"usage": map[string]any{"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
			})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		flusher, _ := w.(http.Flusher)
		for i, word := range words {
			delta := map[string]any{"content": word}
			if i == 0 {
				delta["role"] = "assistant"
			}
			var finish any
			if i == len(words)-1 {
				finish = "stop"
			}
			chunk, _ := json.Marshal(map[string]any{
				"id": "chatcmpl-demo", "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": req.Model,
				"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}},
			})
			fmt.Fprintf(w, "data: %s\n\n", chunk)
			if flusher != nil {
				flusher.Flush()
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "Unknown request URL: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": typ, "param": nil}})
}
