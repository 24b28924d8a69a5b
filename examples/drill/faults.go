package main

// The fault catalogue (-faults): one request (or a sparse trickle) per
// provider fault, each against a primary and a backup of its own, through
// a failover.Transport with the default Config under openai-go with its
// default options (its own retries included), as a new user runs it. Every
// time is real: the default Timeouts are fixed, not scaled.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/failover-go/failover"
)

// faultCase is one fault of the catalogue.
type faultCase struct {
	name    string
	primary func(n int, w http.ResponseWriter, r *http.Request, stream bool) // n: the primary's request count, from 1
	stream  bool                                                             // the caller streams
	backup  string                                                           // the backup's model (Upstream.Models maps to it); "": the caller's
	timeout time.Duration                                                    // the caller's deadline; 0: none (openai-go has none)
	sparse  *sparseLoad                                                      // a trickle of requests instead of one
	want    string                                                           // what the right conduct is
}

// sparseLoad is a request every every, for total, while the primary is
// down for its first down.
type sparseLoad struct {
	every, total, down time.Duration
}

// faultResult is what the caller of one fault saw.
type faultResult struct {
	name             string
	got              string // the answer's text, or the error's gist
	took             time.Duration
	primary, backup  int64
	primaryFailures  uint
	recovered        time.Duration // sparse: from the primary's recovery to its first answer again; -1: never
	failed, requests int           // sparse: requests that ended in an error, of all
	want             string
}

// faultCatalogue is the faults of issue 35, each with its right conduct.
func faultCatalogue() []faultCase {
	never := func(_ int, _ http.ResponseWriter, r *http.Request, _ bool) { <-r.Context().Done() }
	return []faultCase{
		{name: "silent primary, stream, no history", primary: never, stream: true,
			want: "the backup's answer within 30s (Timeouts.Headers); the timeout counts"},
		{name: "silent primary, no stream, 60s deadline", primary: never, timeout: time.Minute,
			want: "the deadline's error at 60s; with no history it does not count (an answer not streamed may take 10m)"},
		{name: "stall after content (30s)", stream: true, primary: func(_ int, w http.ResponseWriter, r *http.Request, _ bool) {
			writeChunks(w, "Hel")
			select {
			case <-time.After(30 * time.Second):
				writeChunks(w, "lo")
				io.WriteString(w, "data: [DONE]\n\n")
			case <-r.Context().Done():
			}
		}, want: "a clean error naming the primary after 20s (Timeouts.Idle); it counts"},
		{name: "cut after content", stream: true, primary: func(_ int, w http.ResponseWriter, _ *http.Request, _ bool) {
			writeChunks(w, "Hel")
			panic(http.ErrAbortHandler) // the connection drops mid-stream
		}, want: "a clean error, never a truncated success"},
		{name: "one 500, backup on another model", backup: "other-model", primary: func(n int, w http.ResponseWriter, _ *http.Request, stream bool) {
			if n == 1 {
				http.Error(w, `{"error":{"message":"internal error","type":"server_error"}}`, 500)
				return
			}
			answer(w, stream, "primary")
		}, want: "the primary's answer on a retry; the backup untouched"},
		{name: "429 Retry-After 2s once, backup on another model", backup: "other-model", primary: func(n int, w http.ResponseWriter, _ *http.Request, stream bool) {
			if n == 1 {
				w.Header().Set("Retry-After", "2")
				http.Error(w, `{"error":{"message":"rate limited","type":"rate_limit_exceeded"}}`, 429)
				return
			}
			answer(w, stream, "primary")
		}, want: "the primary's answer after 2s; the backup untouched"},
		{name: "one 500, backup the same", primary: func(n int, w http.ResponseWriter, _ *http.Request, stream bool) {
			if n == 1 {
				http.Error(w, `{"error":{"message":"internal error","type":"server_error"}}`, 500)
				return
			}
			answer(w, stream, "primary")
		}, want: "the backup's answer at once"},
		{name: "content-policy 400", primary: func(_ int, w http.ResponseWriter, _ *http.Request, _ bool) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			io.WriteString(w, `{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","code":"content_policy_violation"}}`)
		}, want: "the provider's 400 as it came; nothing else tried, nobody blamed"},
		{name: "both upstreams 503", primary: func(_ int, w http.ResponseWriter, _ *http.Request, _ bool) {
			http.Error(w, `{"error":{"message":"unavailable"}}`, 503)
		}, backup: "503", want: "the 503 after 2 attempts, not the SDK's 6"},
		{name: "5s blip, 10 requests a second", sparse: &sparseLoad{every: 100 * time.Millisecond, total: 15 * time.Second, down: 5 * time.Second},
			want: "no request fails; the primary back within a few seconds of its recovery"},
		{name: "60s outage, a request every 4s", sparse: &sparseLoad{every: 4 * time.Second, total: 80 * time.Second, down: time.Minute},
			want: "no request fails; the primary back within 10s of its recovery"},
	}
}

// writeChunks writes one content chunk of text and flushes it.
func writeChunks(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", text)
	w.(http.Flusher).Flush()
}

// answer writes a whole, healthy answer whose text is who.
func answer(w http.ResponseWriter, stream bool, who string) {
	if stream {
		writeChunks(w, who)
		io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, who)
}

// runFaults plays the catalogue, all faults at once, and writes the
// table to out.
func runFaults(ctx context.Context, out io.Writer) error {
	cases := faultCatalogue()
	results := make([]faultResult, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Go(func() { results[i] = runFault(ctx, c) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	return writeFaults(out, results)
}

// writeFaults writes what each fault did, a paragraph each in lines of at
// most lineWidth columns: what the caller got and when, the attempts at
// each upstream, and the right conduct.
func writeFaults(out io.Writer, results []faultResult) error {
	var b strings.Builder
	b.WriteString("Provider faults, default Config, under openai-go's defaults\n")
	for _, r := range results {
		got := fmt.Sprintf("got %s after %s", r.got, r.took.Round(100*time.Millisecond))
		if r.requests > 0 {
			rec := "never"
			if r.recovered >= 0 {
				rec = r.recovered.Round(100*time.Millisecond).String() + " after its recovery"
			}
			got = fmt.Sprintf("%d of %d failed; primary back %s", r.failed, r.requests, rec)
		}
		fmt.Fprintf(&b, "\n%s\n", r.name)
		wrap(&b, fmt.Sprintf("  caller: %s; attempts: primary %d, backup %d (counted %d)", got, r.primary, r.backup, r.primaryFailures), lineWidth)
		wrap(&b, "  right conduct: "+r.want, lineWidth)
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// runFault plays one fault.
func runFault(ctx context.Context, c faultCase) faultResult {
	res := faultResult{name: c.name, want: c.want, recovered: -1}
	var primaryN, backupN atomic.Int64
	var upSince atomic.Int64 // sparse: UnixNano when the primary recovered
	start := time.Now()
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(primaryN.Add(1))
		stream := strings.Contains(readAll(r), `"stream":true`)
		if c.sparse != nil {
			if time.Since(start) < c.sparse.down {
				http.Error(w, `{"error":{"message":"unavailable"}}`, 503)
				return
			}
			upSince.CompareAndSwap(0, time.Now().UnixNano())
			answer(w, stream, "primary")
			return
		}
		c.primary(n, w, r, stream)
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		backupN.Add(1)
		stream := strings.Contains(readAll(r), `"stream":true`)
		if c.backup == "503" {
			http.Error(w, `{"error":{"message":"unavailable"}}`, 503)
			return
		}
		answer(w, stream, "backup")
	}))
	defer backup.Close()
	b := failover.Upstream{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer sk-backup"}}}
	if c.backup != "" && c.backup != "503" {
		b.Models = map[string]string{"*": c.backup}
	}
	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		b,
	}})
	if err != nil {
		res.got = err.Error()
		return res
	}
	defer tr.Close()
	client := openai.NewClient(
		option.WithHTTPClient(&http.Client{Transport: tr}),
		option.WithBaseURL(primary.URL+"/v1"),
		option.WithAPIKey("sk-primary"),
	)
	ask := func() (string, error) {
		rctx := ctx
		if c.timeout > 0 {
			var cancel context.CancelFunc
			rctx, cancel = context.WithTimeout(ctx, c.timeout)
			defer cancel()
		}
		params := openai.ChatCompletionNewParams{Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
		if c.stream {
			s := client.Chat.Completions.NewStreaming(rctx, params)
			defer s.Close()
			var text strings.Builder
			for s.Next() {
				for _, ch := range s.Current().Choices {
					text.WriteString(ch.Delta.Content)
				}
			}
			return text.String(), s.Err()
		}
		r, err := client.Chat.Completions.New(rctx, params)
		if err != nil {
			return "", err
		}
		return r.Choices[0].Message.Content, nil
	}
	if s := c.sparse; s != nil {
		for time.Since(start) < s.total && ctx.Err() == nil {
			text, err := ask()
			res.requests++
			if err != nil {
				res.failed++
			}
			if text == "primary" && res.recovered < 0 {
				if up := upSince.Load(); up != 0 {
					res.recovered = time.Since(start) - s.down
				}
			}
			time.Sleep(s.every)
		}
	} else {
		text, err := ask()
		res.took = time.Since(start)
		res.got = gist(text, err)
	}
	res.primary, res.backup = primaryN.Load(), backupN.Load()
	res.primaryFailures = tr.Health()[0].BreakerFailures
	return res
}

// gist says in a few words what a caller got.
func gist(text string, err error) string {
	var apiErr *openai.Error
	switch {
	case errors.As(err, &apiErr):
		return fmt.Sprintf("error %d", apiErr.StatusCode)
	case err != nil:
		msg := err.Error()
		if len(msg) > 70 {
			msg = msg[:70] + "..."
		}
		return "error: " + msg
	}
	if text == "" {
		return "an empty answer"
	}
	return fmt.Sprintf("%q", text)
}

func readAll(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// faultDrill runs the catalogue beside hogs CPU hogs.
func faultDrill(ctx context.Context, hogs int, out io.Writer) error {
	if hogs < 0 || hogs > maxHogs {
		return fmt.Errorf("-hogs %d: want 0 to %d", hogs, maxHogs)
	}
	if hogs > 0 {
		h, err := startHogs(hogs)
		if err != nil {
			return err
		}
		defer h.stop()
	}
	return runFaults(ctx, out)
}
