package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/failover-go/failover"
)

// The affinity part plays agent loops against two equal upstreams that
// keep a prompt cache each, through failover.Weighted, once with the
// Transport's prompt-cache affinity (its default) and once without, and
// compares the share of input tokens read from the cache.
//
// Its sizes and times are at provider scale (before -timescale). Each
// conversation has a system prompt of its own (it names the agent's
// workspace, as an agent's does), so no two share a cached prefix; each
// turn adds a user message (the task, then a tool's result) and an answer.
const (
	affinityConversations = 200
	affinityTurns         = 8
	affinityParallel      = 25 // conversations at once, in each run

	systemTokens = 1000 // a conversation's system prompt
	userTokens   = 100  // each user message
	answerTokens = 300  // each answer

	cacheTTL        = 5 * time.Minute        // how long an upstream keeps a cached prefix after its last use
	answerBase      = 200 * time.Millisecond // each answer's time, with the prompt cached
	prefillPerToken = 200 * time.Microsecond // and this much per uncached prompt token
	maxToolTime     = 100 * time.Millisecond // an agent's time between an answer and its next request, at most
)

// affinityOptions configure the affinity part.
type affinityOptions struct {
	Conversations int // agent loops, each a conversation
	Turns         int // requests of each conversation
	Parallel      int // conversations at once
	Timescale     float64
	Model         string
}

// defaultAffinity returns the affinity part's options at the drill's
// timescale and model.
func defaultAffinity(o options) affinityOptions {
	return affinityOptions{
		Conversations: affinityConversations,
		Turns:         affinityTurns,
		Parallel:      affinityParallel,
		Timescale:     o.Timescale,
		Model:         o.Model,
	}
}

func (o affinityOptions) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * o.Timescale)
}

// chatMessage is one message of a chat-completions request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// tokens is the simulated tokenizer: a token per four bytes.
func tokens(s string) int64 { return int64(len(s)+3) / 4 }

// cacheUpstream is a local OpenAI chat-completions server with a prompt
// cache: it keeps each prefix of the conversations it answered, up to
// every message boundary and through its own answer (as vLLM's and
// SGLang's prefix caches keep the generated tokens), for cacheTTL after
// its last use, and reports the longest cached prefix of each prompt as
// usage.prompt_tokens_details.cached_tokens. An answer takes answerBase
// plus prefillPerToken for each uncached prompt token.
type cacheUpstream struct {
	srv       *httptest.Server
	timescale float64
	requests  atomic.Int64 // answered with a 200

	mu    sync.Mutex
	cache map[uint64]time.Time // prefix hash → when it expires
}

func newCacheUpstream(timescale float64) *cacheUpstream {
	u := &cacheUpstream{timescale: timescale, cache: map[uint64]time.Time{}}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	return u
}

func (u *cacheUpstream) baseURL() string { return u.srv.URL + "/v1" }

func (u *cacheUpstream) close() { u.srv.Close() }

func (u *cacheUpstream) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * u.timescale)
}

func (u *cacheUpstream) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string        `json:"model"`
		Messages []chatMessage `json:"messages"`
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
		return
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	// The hash of each prefix, through message i, and its tokens.
	h := fnv.New64a()
	prefixes := make([]uint64, len(req.Messages))
	sums := make([]int64, len(req.Messages))
	var prompt int64
	for i, m := range req.Messages {
		writeMessage(h, m)
		prompt += tokens(m.Content)
		prefixes[i], sums[i] = h.Sum64(), prompt
	}
	answer := chatMessage{Role: "assistant", Content: answerText(prefixes[len(prefixes)-1])}
	writeMessage(h, answer)

	now := time.Now()
	expires := now.Add(u.scaled(cacheTTL))
	var cached int64
	u.mu.Lock()
	for i := len(prefixes) - 1; i >= 0; i-- {
		if exp, ok := u.cache[prefixes[i]]; ok && now.Before(exp) {
			cached = sums[i]
			break
		}
	}
	for _, p := range prefixes {
		u.cache[p] = expires
	}
	u.cache[h.Sum64()] = expires
	u.mu.Unlock()

	t := time.NewTimer(u.scaled(answerBase + time.Duration(prompt-cached)*prefillPerToken))
	defer t.Stop()
	select {
	case <-r.Context().Done():
		return
	case <-t.C:
	}
	completion := tokens(answer.Content)
	resp := map[string]any{
		"id":      fmt.Sprintf("chatcmpl-%x", prefixes[len(prefixes)-1]),
		"object":  "chat.completion",
		"created": now.Unix(),
		"model":   req.Model,
		"choices": []map[string]any{{"index": 0, "message": answer, "finish_reason": "stop"}},
		"usage": map[string]any{
			"prompt_tokens":         prompt,
			"completion_tokens":     completion,
			"total_tokens":          prompt + completion,
			"prompt_tokens_details": map[string]int64{"cached_tokens": cached},
		},
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
	u.requests.Add(1)
}

// writeMessage adds m to the prefix hash h.
func writeMessage(h io.Writer, m chatMessage) {
	io.WriteString(h, m.Role)
	h.Write([]byte{0})
	io.WriteString(h, m.Content)
	h.Write([]byte{0})
}

// filler returns text of n bytes that starts with head.
func filler(head string, n int) string {
	const words = " the agent reads the file, runs the tests and edits the code until they pass;"
	var b strings.Builder
	b.WriteString(head)
	for b.Len() < n {
		b.WriteString(words)
	}
	return b.String()[:n]
}

// The messages of conversation c, each of its size in tokens.
func systemPrompt(c int) string {
	return filler(fmt.Sprintf("You are a coding agent working in /src/project-%03d.", c), 4*systemTokens)
}

func userMessage(c, turn int) string {
	if turn == 0 {
		return filler(fmt.Sprintf("Task %03d: make the failing test pass.", c), 4*userTokens)
	}
	return filler(fmt.Sprintf("Tool result %03d.%d:", c, turn), 4*userTokens)
}

func answerText(prompt uint64) string {
	return filler(fmt.Sprintf("Step %016x:", prompt), 4*answerTokens)
}

// affinityRun is what the caller of one Transport saw.
type affinityRun struct {
	Name        string
	Input       int64         // input tokens, as the answers reported them
	Cached      int64         // of them read from the prompt cache
	PerUpstream []int64       // requests each upstream answered
	Requests    int           // requests sent
	Failed      int           // of them not answered with a 200
	P50, P99    time.Duration // the caller's latency, end to end

	// Kept and Moved count the turns answered by the upstream of the
	// conversation's turn before, and by the other, as the Transport's
	// metrics say (failover_affinity_sessions_total); 0 without affinity.
	Kept, Moved int64

	// Prefill50 and Prefill99 are the percentiles of the time the
	// answers took to read their uncached tokens, at provider scale:
	// the latency that the cache saves, free of the machine's load.
	Prefill50, Prefill99 time.Duration
}

// CachedShare is the share of input tokens read from the prompt cache.
func (r affinityRun) CachedShare() float64 {
	if r.Input == 0 {
		return 0
	}
	return float64(r.Cached) / float64(r.Input)
}

// affinityDrill plays the affinity part as o says, with affinity and
// without, both at once with servers of their own, so that the machine's
// load weighs on both alike, and writes its table to out.
func affinityDrill(ctx context.Context, o affinityOptions, out io.Writer) error {
	runs, err := affinityRuns(ctx, o)
	if err != nil {
		return err
	}
	return writeAffinity(out, o, runs)
}

// affinityRuns plays the affinity part and returns its two runs: affinity
// on, then off.
func affinityRuns(ctx context.Context, o affinityOptions) ([]affinityRun, error) {
	if o.Conversations <= 0 || o.Turns <= 0 || o.Parallel <= 0 || o.Timescale <= 0 {
		return nil, errors.New("affinity: conversations, turns, parallel and timescale must be positive")
	}
	if o.Model == "" {
		o.Model = "gpt-4o-mini"
	}
	runs := make([]affinityRun, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() { runs[i], errs[i] = playAffinity(ctx, o, i == 1) })
	}
	wg.Wait()
	return runs, errors.Join(errs...)
}

// playAffinity runs o's conversations through a failover.Transport with
// failover.Weighted over two fresh cacheUpstreams, affinity off or on.
func playAffinity(ctx context.Context, o affinityOptions, off bool) (affinityRun, error) {
	ups := []*cacheUpstream{newCacheUpstream(o.Timescale), newCacheUpstream(o.Timescale)}
	defer func() {
		for _, u := range ups {
			u.close()
		}
	}()
	run := affinityRun{Name: "affinity on (default)"}
	if off {
		run.Name = "affinity off"
	}
	var (
		mu        sync.Mutex
		input     int64
		cached    int64
		prefill   []time.Duration
		latencies []time.Duration
		failed    int
	)
	base := newBase()
	defer base.CloseIdleConnections()
	set := metrics.NewSet()
	cfg := failover.Config{
		Upstreams: []failover.Upstream{{Name: "a", BaseURL: ups[0].baseURL()}, {Name: "b", BaseURL: ups[1].baseURL()}},
		Base:      base,
		Router:    &failover.Weighted{},
		Affinity:  failover.AffinityConfig{Off: off},
		Metrics:   set,
		// The part plays time faster than providers do (-timescale), so
		// a stall of a loaded machine looks like seconds of silence from
		// both upstreams, and hang detection would move conversations
		// for it. Its upstreams never hang.
		Hang: failover.HangConfig{Off: true},
		OnUsage: func(u failover.Usage) {
			mu.Lock()
			input, cached = input+u.Input, cached+u.Cached
			prefill = append(prefill, time.Duration(u.Input-u.Cached)*prefillPerToken)
			mu.Unlock()
		},
	}
	ft, err := failover.New(cfg)
	if err != nil {
		return run, err
	}
	defer ft.Close()
	client := &http.Client{Transport: ft, Timeout: callerTimeout} // unscaled: a starved machine must not time the loops out
	url := ups[0].baseURL() + "/chat/completions"

	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range min(o.Parallel, o.Conversations) {
		wg.Go(func() {
			for {
				c := int(next.Add(1)) - 1
				if c >= o.Conversations || ctx.Err() != nil {
					return
				}
				lat, ok := converse(ctx, client, url, o, c)
				mu.Lock()
				latencies = append(latencies, lat...)
				failed += b2i(!ok)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return run, err
	}
	slices.Sort(latencies)
	slices.Sort(prefill)
	run.Input, run.Cached = input, cached
	run.Prefill50, run.Prefill99 = percentile(prefill, 0.5), percentile(prefill, 0.99)
	for _, u := range ups {
		run.PerUpstream = append(run.PerUpstream, u.requests.Load())
	}
	run.Requests, run.Failed = len(latencies), failed
	if !off {
		run.Kept, run.Moved = counterValue(set, `failover_affinity_sessions_total{result="kept"}`), counterValue(set, `failover_affinity_sessions_total{result="moved"}`)
	}
	run.P50, run.P99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
	return run, nil
}

// counterValue returns the value of the series name in set, 0 when set
// has none.
func counterValue(set *metrics.Set, name string) int64 {
	var b strings.Builder
	set.WritePrometheus(&b)
	for line := range strings.Lines(b.String()) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// converse plays conversation c: each turn sends the whole history and
// appends the answer, after a tool's time from the second turn on. It
// returns each request's latency, and false when a request failed, which
// ends the conversation.
func converse(ctx context.Context, client *http.Client, url string, o affinityOptions, c int) ([]time.Duration, bool) {
	rng := rand.New(rand.NewPCG(uint64(c), 37))
	msgs := []chatMessage{{Role: "system", Content: systemPrompt(c)}}
	var lat []time.Duration
	for turn := range o.Turns {
		if turn > 0 {
			t := time.NewTimer(o.scaled(time.Duration(rng.Int64N(int64(maxToolTime)))))
			select {
			case <-ctx.Done():
				t.Stop()
				return lat, false
			case <-t.C:
			}
		}
		msgs = append(msgs, chatMessage{Role: "user", Content: userMessage(c, turn)})
		start := time.Now()
		answer, err := complete(ctx, client, url, o.Model, msgs)
		lat = append(lat, time.Since(start))
		if err != nil {
			return lat, false
		}
		msgs = append(msgs, answer)
	}
	return lat, true
}

// complete sends one chat-completions request and returns the answer's
// message.
func complete(ctx context.Context, client *http.Client, url, model string, msgs []chatMessage) (chatMessage, error) {
	body, err := json.Marshal(map[string]any{"model": model, "messages": msgs})
	if err != nil {
		return chatMessage{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return chatMessage{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return chatMessage{}, err
	}
	defer resp.Body.Close()
	var ans struct {
		Choices []struct {
			Message chatMessage `json:"message"`
		} `json:"choices"`
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ans)
	switch {
	case resp.StatusCode != http.StatusOK:
		return chatMessage{}, fmt.Errorf("status %s", resp.Status)
	case err != nil:
		return chatMessage{}, err
	case len(ans.Choices) == 0:
		return chatMessage{}, errors.New("no choices")
	}
	io.Copy(io.Discard, resp.Body) // to its end, so that the usage is metered
	return ans.Choices[0].Message, nil
}

// writeAffinity writes the affinity part's table and its summary.
func writeAffinity(out io.Writer, o affinityOptions, runs []affinityRun) error {
	var b strings.Builder
	head := fmt.Sprintf("Prompt-cache affinity: %d agent loops of %d turns, %d at once, through failover.Weighted "+
		"over two equal upstreams a and b; the runs with affinity and without play at once. "+
		"Each turn sends the whole history: the loop's own system prompt (%d tokens), then %d tokens per user message and %d per answer. "+
		"Each upstream caches the prefixes of what it answered, answers included, for %g min; "+
		"an answer takes %s plus %s per uncached prompt token (prefill) at provider scale. "+
		"Config is the default but for the Router and Hang.Off (time runs faster here: a stall of the machine would pass for a hang).",
		o.Conversations, o.Turns, o.Parallel, systemTokens, userTokens, answerTokens, cacheTTL.Minutes(), fmtDur(answerBase), fmtDur(prefillPerToken))
	wrap(&b, head, lineWidth)
	b.WriteString("\n")
	g := grid{{""}, {"cached input tokens"}, {"input tokens not cached"}, {"requests per upstream"}}
	for i := range runs[0].PerUpstream {
		g = append(g, []string{"  " + string(rune('a'+i))})
	}
	g = append(g, []string{"turns kept on / moved off their upstream"}, []string{"failed requests"}, []string{"latency p50 / p99"}, []string{"prefill p50 / p99 (provider scale)"})
	for _, r := range runs {
		cells := []string{r.Name, fmt.Sprintf("%s (%d of %d)", pct1(r.CachedShare()), r.Cached, r.Input), fmt.Sprint(r.Input - r.Cached), ""}
		for _, n := range r.PerUpstream {
			cells = append(cells, fmt.Sprintf("%d (%s)", n, pct1(ratio(int(n), r.Requests))))
		}
		kept := "-"
		if r.Kept+r.Moved > 0 {
			kept = fmt.Sprintf("%d / %d", r.Kept, r.Moved)
		}
		cells = append(cells, kept, fmt.Sprint(r.Failed), fmtDur(r.P50)+" / "+fmtDur(r.P99), fmtDur(r.Prefill50)+" / "+fmtDur(r.Prefill99))
		for i, c := range cells {
			g[i] = append(g[i], c)
		}
	}
	g.write(&b, lineWidth)
	wrap(&b, "\nLatency is end to end, on this machine at this timescale; prefill is what the answers spent on their uncached tokens.\n\n"+
		affinitySummary(runs), lineWidth)
	_, err := io.WriteString(out, b.String())
	return err
}

// affinitySummary says in plain words what the affinity part showed.
func affinitySummary(runs []affinityRun) string {
	on, off := runs[0], runs[1]
	more := "as many"
	if n := on.Input - on.Cached; n > 0 {
		more = fmt.Sprintf("%.1f times as many", float64(off.Input-off.Cached)/float64(n))
	}
	return fmt.Sprintf("In short: with affinity (the default), %s of the input tokens came from the prompt cache, without it %s: "+
		"%s input tokens at the full price, for the same balance over the upstreams, and a prefill p99 of %s instead of %s.",
		pct1(on.CachedShare()), pct1(off.CachedShare()), more, fmtDur(off.Prefill99), fmtDur(on.Prefill99))
}
