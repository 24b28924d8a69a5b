package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover"
)

// profile is the latency and background error rate of one upstream, at
// provider scale (before -timescale), and its price.
type profile struct {
	name     string
	kind     string // what the field measured it as
	p50, p99 time.Duration
	success  float64
	cost     failover.Cost // dollars per million input and output tokens
}

// profiles are the field's published numbers: p50/p99 and success rate,
// and the list prices of such models (gpt-4o, gemini-2.5-flash,
// deepseek-chat). The first is the primary, the one that the fault script
// plays on.
var profiles = []profile{
	{"primary", "GPT-class", 340 * time.Millisecond, 920 * time.Millisecond, 0.9971, failover.Cost{Input: 2.5, Output: 10}},
	{"backup1", "Gemini Flash", 180 * time.Millisecond, 480 * time.Millisecond, 0.9962, failover.Cost{Input: 0.3, Output: 2.5}},
	{"backup2", "DeepSeek", 210 * time.Millisecond, 620 * time.Millisecond, 0.9945, failover.Cost{Input: 0.27, Output: 1.1}},
}

// The usage every answer reports: the drill's request and a short answer.
const (
	promptTokens     = 9
	completionTokens = 4
)

// z99 is the standard normal quantile of 0.99: a log-normal latency with
// median p50 has its 99th percentile at p50·exp(z99·σ).
const z99 = 2.3263478740408408

// fault is what the primary does during a phase of the script.
type fault int

const (
	healthy     fault = iota
	burst503          // answers 503 at once
	hang              // accepts, reads the request, never answers
	storm429          // answers 429 with retry-after-ms and Retry-After
	overload529       // answers 529 overloaded_error
)

// phase is one part of the fault script, as offsets from the drill's start.
type phase struct {
	name       string
	fault      fault
	start, end time.Duration
}

// script returns the phases of a run of length d, in thirtieths of it
// (seconds of the default 30 s run): 5 healthy, 4 of 503s, 2 healthy, 4 of
// hang, 4 of 429s, 3 of 529s, then 8 of recovery. The healthy gap after
// the 503s is there so that the primary's circuit has closed again when
// the hang begins (by the primary's breaker cooldown of 15 s at provider
// scale and one probe; 2 s is 40 s at the default timescale), and the hang meets
// hang detection rather than an open circuit.
func script(d time.Duration) []phase {
	steps := []struct {
		name       string
		fault      fault
		thirtieths int
	}{
		{"warm-up", healthy, 5},
		{"503 burst", burst503, 4},
		{"healthy gap", healthy, 2},
		{"hang", hang, 4},
		{"429 storm", storm429, 4},
		{"529 overload", overload529, 3},
		{"recovery", healthy, 8},
	}
	var out []phase
	at, sum := time.Duration(0), 0
	for _, s := range steps {
		sum += s.thirtieths
		end := d * time.Duration(sum) / 30
		out = append(out, phase{name: s.name, fault: s.fault, start: at, end: end})
		at = end
	}
	return out
}

// faultWindow returns when the first fault starts and the last one ends.
func faultWindow(phases []phase) (start, end time.Duration) {
	start = -1
	for _, p := range phases {
		if p.fault == healthy {
			continue
		}
		if start < 0 {
			start = p.start
		}
		end = p.end
	}
	return start, end
}

// phaseOf returns the index of the first phase with fault f, or -1.
func phaseOf(phases []phase, f fault) int {
	for i, p := range phases {
		if p.fault == f {
			return i
		}
	}
	return -1
}

// phaseAt returns the index of the phase that offset at falls in.
func phaseAt(phases []phase, at time.Duration) int {
	for i, p := range phases {
		if at < p.end {
			return i
		}
	}
	return len(phases) - 1
}

// fakeUpstream is a local OpenAI-compatible server: POST
// /v1/chat/completions, streaming when the body asks for it, with the
// latency and errors of its profile, and the fault script when it is a
// primary. Its answers report their usage as OpenAI's do: in the
// completion, and in a stream's last chunk when the request asks for it
// with stream_options.include_usage.
type fakeUpstream struct {
	prof   profile
	scale  float64
	sigma  float64
	phases []phase      // nil: no faults
	start  atomic.Int64 // unix nanoseconds of the script's start; see begin
	srv    *httptest.Server
}

func newFakeUpstream(p profile, scale float64, phases []phase) *fakeUpstream {
	f := &fakeUpstream{
		prof:   p,
		scale:  scale,
		sigma:  math.Log(float64(p.p99)/float64(p.p50)) / z99,
		phases: phases,
	}
	f.start.Store(time.Now().UnixNano())
	f.srv = httptest.NewServer(f)
	return f
}

// begin starts the fault script at t.
func (f *fakeUpstream) begin(t time.Time) { f.start.Store(t.UnixNano()) }

// baseURL is the upstream's API base, as an SDK would be given it.
func (f *fakeUpstream) baseURL() string { return f.srv.URL + "/v1" }

// close shuts the server down. Every request to it must have ended.
func (f *fakeUpstream) close() { f.srv.Close() }

// latency draws one request's latency from the profile's log-normal
// distribution, scaled.
func (f *fakeUpstream) latency() time.Duration {
	d := float64(f.prof.p50) * math.Exp(f.sigma*rand.NormFloat64())
	return time.Duration(d * f.scale)
}

func (f *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "no route "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "POST only")
		return
	}
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "the body is not JSON")
		return
	}
	ctx := r.Context()
	lat := f.latency()

	current := healthy
	if f.phases != nil {
		since := time.Duration(time.Now().UnixNano() - f.start.Load())
		current = f.phases[phaseAt(f.phases, since)].fault
	}
	switch current {
	case hang:
		<-ctx.Done()
		return
	case burst503:
		if wait(ctx, lat/10) {
			writeError(w, http.StatusServiceUnavailable, "server_error", "service_unavailable", "The server is overloaded or not ready yet.")
		}
		return
	case storm429:
		if wait(ctx, lat/10) {
			// OpenAI's headers: retry-after-ms first, whole seconds for
			// clients that read only Retry-After.
			ra := time.Duration(float64(5*time.Second) * f.scale)
			w.Header().Set("Retry-After-Ms", strconv.FormatInt(ra.Milliseconds(), 10))
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(ra.Seconds()))))
			writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "Rate limit reached for requests per min. Please try again later.")
		}
		return
	case overload529:
		if wait(ctx, lat/10) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(529)
			io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
		}
		return
	}

	// Background errors at the profile's rate: what a breaker must ride
	// through without tripping.
	if rand.Float64() >= f.prof.success {
		if wait(ctx, lat/2) {
			if rand.IntN(2) == 0 {
				writeError(w, http.StatusInternalServerError, "server_error", "internal_error", "The server had an error while processing your request.")
			} else {
				writeError(w, http.StatusServiceUnavailable, "server_error", "service_unavailable", "The server is overloaded or not ready yet.")
			}
		}
		return
	}
	if req.Stream {
		f.stream(w, r, req.Model, req.StreamOptions.IncludeUsage, lat)
		return
	}
	if !wait(ctx, lat) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"chatcmpl-drill","object":"chat.completion","created":%d,"model":%q,`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello from %s."},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		time.Now().Unix(), req.Model, f.prof.name, promptTokens, completionTokens, promptTokens+completionTokens)
}

// stream answers as OpenAI's server-sent events do: headers and the first
// chunk after 40 % of the latency, the rest spread over the remainder; with
// includeUsage every chunk has "usage": null and one more, without
// choices, the usage.
func (f *fakeUpstream) stream(w http.ResponseWriter, r *http.Request, model string, includeUsage bool, lat time.Duration) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	if !wait(ctx, lat*4/10) {
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	created := time.Now().Unix()
	usage := ""
	if includeUsage {
		usage = `,"usage":null`
	}
	chunk := func(delta, finish string) string {
		return fmt.Sprintf(`data: {"id":"chatcmpl-drill","object":"chat.completion.chunk","created":%d,"model":%q,"choices":[{"index":0,"delta":%s,"finish_reason":%s}]%s}`+"\n\n",
			created, model, delta, finish, usage)
	}
	events := []string{
		chunk(`{"role":"assistant","content":""}`, "null"),
		chunk(`{"content":"Hello"}`, "null"),
		chunk(`{"content":" from"}`, "null"),
		chunk(fmt.Sprintf(`{"content":" %s."}`, f.prof.name), "null"),
		chunk(`{}`, `"stop"`),
	}
	if includeUsage {
		events = append(events, fmt.Sprintf(`data: {"id":"chatcmpl-drill","object":"chat.completion.chunk","created":%d,"model":%q,"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n",
			created, model, promptTokens, completionTokens, promptTokens+completionTokens))
	}
	events = append(events, "data: [DONE]\n\n")
	gap := lat * 6 / 10 / time.Duration(len(events)-1)
	for i, e := range events {
		if i > 0 && !wait(ctx, gap) {
			return
		}
		if _, err := io.WriteString(w, e); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// writeError writes an OpenAI-style error.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":%q,"type":%q,"param":null,"code":%q}}`, msg, typ, code)
}

// wait sleeps for d, and reports false when ctx ended first.
func wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
