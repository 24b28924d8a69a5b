package failover

// Usage and cost metering: the usage an answer reports is read as the
// caller reads the body, by a small state machine that keeps at most 4 KiB
// of it; the caller's bytes pass at once.

import (
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// Usage is the token usage of one answer, as its upstream reported it in
// the answer's body, and what it cost: what [Config.OnUsage] and
// [Trace.Usage] receive. It holds no credential.
//
// It is read from a 2xx JSON or text/event-stream answer as the caller reads
// the body, holding none of it back, in each provider's shape: OpenAI's
// "usage" (a stream's with stream_options.include_usage), Anthropic's
// (summed over its "iterations" when it has them, as they are billed),
// Gemini's "usageMetadata", Cohere's "billed_units" (in "usage", "meta" or
// a stream's "delta"), Bedrock's camel-case "usage" (or its token-count
// headers, when the body reports nothing), and the OpenAI-compatible APIs'
// (Groq's in a stream's "x_groq"). When a stream reports more than once,
// each figure's last report counts, but Gemini's last usageMetadata counts
// whole. It is known once the body has been read to its end or closed; a
// body closed early reports what the upstream had said by then. Only the
// answer the caller gets is metered, though a provider may bill failed
// attempts and lost hedges too.
type Usage struct {
	// Upstream is the upstream's Name.
	Upstream string

	// Model is the model the answer names (its "model", or Gemini's
	// "modelVersion"), else the model the request asked the upstream for
	// when the Transport knows it (with Upstream.Models); "" when
	// neither is known.
	Model string

	Tokens

	// Cost is Tokens priced at the upstream's Cost, per million: Cached
	// at Cost.CachedInput, CacheWrite at Cost.CacheWrite (either, when
	// zero, at Cost.Input), the rest of Input at Cost.Input and Output at
	// Cost.Output; 0 without a Cost.
	Cost float64
}

// Tokens are counts of tokens, each provider's report brought to one
// shape.
type Tokens struct {
	// Input counts every input token: the prompt, including what was
	// read from and written to the provider's prompt cache (which
	// Anthropic reports apart from its input_tokens) and Gemini's
	// tool-use prompt.
	Input int64

	// Output counts the tokens generated, reasoning ("thinking")
	// included (Gemini reports it apart, as thoughtsTokenCount, and so do
	// some OpenAI-compatible APIs, in completion_tokens_details).
	Output int64

	// Cached counts the input tokens read from the prompt cache: a part
	// of Input, where reported (OpenAI's cached_tokens, Anthropic's
	// cache_read_input_tokens, Gemini's cachedContentTokenCount,
	// Bedrock's cacheReadInputTokens).
	Cached int64

	// CacheWrite counts the input tokens written to the prompt cache: a
	// part of Input, where reported (Anthropic's
	// cache_creation_input_tokens, the cache_write_tokens of OpenAI's and
	// OpenRouter's prompt_tokens_details and of the Responses API's
	// input_tokens_details, Bedrock's cacheWriteInputTokens).
	CacheWrite int64
}

// UsageTotals are an upstream's usage since the Transport was made, as
// [UpstreamHealth] reports it.
type UsageTotals struct {
	// Answers counts the answers whose usage was read.
	Answers uint64

	Tokens

	// Cost is the sum of the answers' Usage.Cost.
	Cost float64

	// Unreported counts the streamed answers (text/event-stream) read to
	// their end without reporting their usage, such as OpenAI streams
	// asked for without stream_options.include_usage.
	Unreported uint64
}

// Bounds of usage metering.
const (
	// maxUsageCapture bounds the bytes of a usage object or a model
	// string read in: a larger one is skipped.
	maxUsageCapture = 4 << 10
	// maxUsageModels bounds the models per upstream that the metrics
	// name; the answers of any other model count as "other". Models come
	// from answers and requests, which the callers control.
	maxUsageModels = 64
	// maxTokens is the most a reported count is taken for.
	maxTokens = 1 << 40
	// usageWeight is an answer's weight in the moving averages Score
	// reads.
	usageWeight = 0.1
)

// otherModel names the models past maxUsageModels in the metrics.
const otherModel = "other"

// usageConfig is what the Transport does with usage.
type usageConfig struct {
	on      bool        // every answer is metered; else only those whose Trace has a Usage hook
	onUsage func(Usage) // Config.OnUsage
}

// newUsageConfig reads cfg's usage settings: metering is on with
// MeterUsage, with OnUsage, or when any upstream has a Cost.
func newUsageConfig(cfg Config) usageConfig {
	on := cfg.MeterUsage || cfg.OnUsage != nil
	for _, u := range cfg.Upstreams {
		on = on || u.Cost != (Cost{})
	}
	return usageConfig{on: on, onUsage: cfg.OnUsage}
}

// of is t priced at c.
func (c Cost) of(t Tokens) float64 {
	in := max(c.Input, 0)
	cached, write := in, in
	if c.CachedInput > 0 {
		cached = c.CachedInput
	}
	if c.CacheWrite > 0 {
		write = c.CacheWrite
	}
	plain := t.Input - t.Cached - t.CacheWrite // never negative: Cached and CacheWrite are parts of Input (tokens)
	return (float64(plain)*in + float64(t.Cached)*cached + float64(t.CacheWrite)*write + float64(t.Output)*max(c.Output, 0)) / 1e6
}

// meters reports whether the call's answer is metered.
func (c *call) meters() bool {
	return c.t.usage.on || c.trace != nil && c.trace.Usage != nil
}

// meter wraps the body of resp, u's answer to the call, in a usageBody
// when it is a 2xx JSON or text/event-stream answer with a body in the
// clear; a stream's is timed to its first byte too, as firstByteBody
// does. It reports whether it wrapped it.
func (c *call) meter(resp *http.Response, u *upstream) bool {
	if resp.StatusCode < 200 || resp.StatusCode > 299 || resp.Body == nil || resp.Body == http.NoBody {
		return false
	}
	if ce := resp.Header["Content-Encoding"]; len(ce) > 0 && ce[0] != "" && !strings.EqualFold(ce[0], "identity") {
		return false // the caller asked for it compressed: the bytes say nothing
	}
	var ct string
	if v := resp.Header["Content-Type"]; len(v) > 0 {
		ct = v[0]
	}
	sse := isEventStream(ct)
	if !sse && !isJSON(ct) {
		return false
	}
	b := &usageBody{rc: resp.Body, t: c.t, u: u, sse: sse}
	if _, ok := resp.Header[bedrockInputHeader]; ok {
		b.hdr, b.hdrOK = headerUsage(resp.Header)
	}
	if sse {
		b.start, b.hist = c.start, &u.m.firstByte
	}
	if c.trace != nil {
		b.hook = c.trace.Usage
	}
	if c.model != "" {
		m, _ := u.models.lookup(c.model)
		b.model = clip(m) // the caller's: bounded and valid UTF-8 for a metric label, as an answer's own model is
	}
	resp.Body = b
	return true
}

// isJSON reports whether a Content-Type is JSON: application/json or a
// +json type.
func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.TrimSpace(mt)
	return strings.EqualFold(mt, "application/json") || len(mt) > 5 && strings.EqualFold(mt[len(mt)-5:], "+json")
}

// usageBody is a metered answer's body: it passes every byte on as it
// reads it, reads the usage from them, and reports it once, at the end of
// the body or when it is closed.
type usageBody struct {
	rc    io.ReadCloser
	t     *Transport
	u     *upstream
	hook  func(Usage) // the request's Trace.Usage; nil without one
	model string      // the model the request asked u for; "" when unknown
	sse   bool
	hdrOK bool   // the answer's headers report usage (Bedrock's): hdr
	hdr   Tokens // what they report: the usage when the body reports none

	// A stream's time to first byte, as firstByteBody observes it.
	start time.Time
	hist  *lazyHistogram
	seen  bool

	// mu guards what follows: Close may come from another goroutine
	// than Read's.
	mu    sync.Mutex
	done  bool
	lines sseUsage
	scan  usageScanner
}

func (b *usageBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 && b.hist != nil && !b.seen {
		b.seen = true
		b.hist.update(time.Since(b.start).Seconds())
	}
	if n == 0 && err == nil {
		return n, err
	}
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return n, err
	}
	if n > 0 {
		if b.sse {
			b.lines.feed(p[:n], &b.scan)
		} else {
			b.scan.scan(p[:n])
		}
	}
	if err == nil {
		b.mu.Unlock()
		return n, err
	}
	b.done = true // the body is over, at its end or broken
	b.mu.Unlock()
	b.report(err == io.EOF)
	return n, err
}

// Close closes the body and reports the usage read so far, unless the
// end of the body did.
func (b *usageBody) Close() error {
	err := b.rc.Close()
	b.mu.Lock()
	done := b.done
	b.done = true
	b.mu.Unlock()
	if !done {
		b.report(false)
	}
	return err
}

// report records the usage the body reported, once it is done; eof says
// that it was read to its end.
func (b *usageBody) report(eof bool) {
	if b.sse {
		b.lines.release(&b.scan) // the end of the stream ends its last event
	}
	tk, ok := b.scan.raw.tokens()
	if !ok {
		tk, ok = b.hdr, b.hdrOK
	}
	if !ok {
		if eof && b.sse {
			b.u.usage.unreported(b.t, b.u)
		}
		return
	}
	model := b.scan.model
	if model == "" {
		model = b.model
	}
	r := Usage{Upstream: b.u.name, Model: model, Tokens: tk, Cost: b.u.cfg.Cost.of(tk)}
	b.u.usage.add(b.t, b.u, r)
	if f := b.t.usage.onUsage; f != nil {
		f(r)
	}
	if b.hook != nil {
		b.hook(r)
	}
}

// usageState is an upstream's usage: its totals, for Health; its metric
// series by model; and the moving averages Score reads.
type usageState struct {
	// Moving averages per answer of the cost and the input and output
	// tokens, as math.Float64bits; zero until an answer reported usage.
	// Written under mu, read without it.
	avgCost, avgInput, avgOutput atomic.Uint64

	mu         sync.Mutex
	totals     UsageTotals
	models     map[string]*modelSeries // by model, at most maxUsageModels and otherModel
	unrep      *metrics.Counter        // failover_usage_unreported_total, made on first use
	unrepCount uint64
}

// modelSeries are the metric series of one upstream and model.
type modelSeries struct {
	tokens [4]*metrics.Counter // input, output, cached, cache_write
	cost   *metrics.FloatCounter
}

// tokenKinds name failover_tokens_total's kind label, in the order of
// modelSeries.tokens.
var tokenKinds = [4]string{"input", "output", "cached", "cache_write"}

// add counts r, an answer of u, in the metrics, the totals and the
// averages.
func (s *usageState) add(t *Transport, u *upstream, r Usage) {
	s.mu.Lock()
	ms := s.series(t, u, r.Model)
	s.totals.Answers++
	s.totals.Input = sumTokens(s.totals.Input, r.Input)
	s.totals.Output = sumTokens(s.totals.Output, r.Output)
	s.totals.Cached = sumTokens(s.totals.Cached, r.Cached)
	s.totals.CacheWrite = sumTokens(s.totals.CacheWrite, r.CacheWrite)
	s.totals.Cost += r.Cost
	first := s.totals.Answers == 1
	for _, a := range [...]struct {
		avg *atomic.Uint64
		v   float64
	}{{&s.avgCost, r.Cost}, {&s.avgInput, float64(r.Input)}, {&s.avgOutput, float64(r.Output)}} {
		v := a.v
		if !first {
			old := math.Float64frombits(a.avg.Load())
			v = old + usageWeight*(v-old)
		}
		a.avg.Store(math.Float64bits(v))
	}
	s.mu.Unlock()
	for i, n := range [...]int64{r.Input, r.Output, r.Cached, r.CacheWrite} {
		if n > 0 {
			ms.tokens[i].Add(int(n))
		}
	}
	ms.cost.Add(r.Cost)
}

// sumTokens returns total+n, n >= 0, saturating: the counts an upstream
// reports are bounded one by one (maxTokens), not their sum, which would
// wrap to a negative total after some millions of the largest.
func sumTokens(total, n int64) int64 {
	if n > math.MaxInt64-total {
		return math.MaxInt64
	}
	return total + n
}

// series returns the metric series of u's model, made on first use: past
// maxUsageModels models, those of otherModel. It requires that s.mu is
// held.
func (s *usageState) series(t *Transport, u *upstream, model string) *modelSeries {
	if ms := s.models[model]; ms != nil {
		return ms
	}
	if s.models == nil {
		s.models = map[string]*modelSeries{}
	}
	if len(s.models) >= maxUsageModels {
		model = otherModel
		if ms := s.models[model]; ms != nil {
			return ms
		}
	}
	ms := &modelSeries{cost: t.metrics.GetOrCreateFloatCounter(famCost.series(u.name, model))}
	for i, kind := range tokenKinds {
		ms.tokens[i] = t.metrics.GetOrCreateCounter(famTokens.series(u.name, model, kind))
	}
	s.models[model] = ms
	return ms
}

// unreported counts a stream of u read to its end without usage.
func (s *usageState) unreported(t *Transport, u *upstream) {
	s.mu.Lock()
	if s.unrep == nil {
		s.unrep = t.metrics.GetOrCreateCounter(famUsageUnreported.series(u.name))
	}
	s.unrepCount++
	c := s.unrep
	s.mu.Unlock()
	c.Inc()
}

// snapshot returns the totals, for Health.
func (s *usageState) snapshot() UsageTotals {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.totals
	t.Unreported = s.unrepCount
	return t
}

// averages returns the moving averages per answer of the cost and the
// tokens, for a Router's Candidate.
func (s *usageState) averages() (cost, input, output float64) {
	return math.Float64frombits(s.avgCost.Load()), math.Float64frombits(s.avgInput.Load()), math.Float64frombits(s.avgOutput.Load())
}

// usageJSON is UsageTotals as UpstreamHealth's JSON has it.
type usageJSON struct {
	Answers          uint64  `json:"answers"`
	InputTokens      int64   `json:"input_tokens"`
	OutputTokens     int64   `json:"output_tokens"`
	CachedTokens     int64   `json:"cached_tokens"`
	CacheWriteTokens int64   `json:"cache_write_tokens"`
	Cost             float64 `json:"cost"`
	Unreported       uint64  `json:"unreported"`
}

func (t UsageTotals) json() usageJSON {
	return usageJSON{t.Answers, t.Input, t.Output, t.Cached, t.CacheWrite, t.Cost, t.Unreported}
}
