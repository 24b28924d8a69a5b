package failover

// Usage and cost metering: the token usage that an answer reports in its
// body is read as the caller reads the body, by a small state machine over
// the bytes that keeps the usage object (a few hundred bytes) and, in a
// stream, a copy of the current event's data, each at most 4 KiB, never
// the body: the caller's bytes pass at once, and the work per byte is
// bounded.

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"math/bits"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/VictoriaMetrics/metrics"
	"github.com/tidwall/gjson"
)

// Usage is the token usage of one answer, as its upstream reported it in
// the answer's body, and what it cost: what [Config.OnUsage] and
// [Trace.Usage] receive. It holds no credential.
//
// The usage is read from the body of a 2xx JSON or text/event-stream
// answer as the caller reads it, holding none of it back: OpenAI's "usage"
// (chat completions, the Responses API, embeddings, and the final chunk of
// a stream asked for with stream_options.include_usage), Anthropic's
// "usage" (its stream's message_start and message_delta), Gemini's
// "usageMetadata" (every chunk of its streams, as SSE or as a JSON array),
// and the many OpenAI-compatible APIs that answer alike. When a stream
// reports usage more than once, each figure's last report counts:
// providers report running totals.
//
// It is known when the body has been read to its end, or closed: a body
// closed early reports what the upstream had said by then (an Anthropic
// stream's input tokens, from message_start), and an answer that reported
// nothing calls nothing. Only the answer the caller gets is read: the
// bodies of failed attempts and of hedges that lost are discarded unread,
// though a provider may bill them.
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
	// included (Gemini reports it apart, as thoughtsTokenCount).
	Output int64

	// Cached counts the input tokens read from the prompt cache: a part
	// of Input, where reported (OpenAI's cached_tokens, Anthropic's
	// cache_read_input_tokens, Gemini's cachedContentTokenCount).
	Cached int64

	// CacheWrite counts the input tokens written to the prompt cache: a
	// part of Input, where reported (Anthropic's
	// cache_creation_input_tokens).
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

	// A stream's time to first byte, as firstByteBody observes it.
	start time.Time
	hist  *lazyHistogram
	seen  bool

	// mu guards what follows: Close may come from another goroutine
	// than Read's.
	mu    sync.Mutex
	done  bool
	lines sseLines
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

// A rawUsage field is one figure of a provider's usage report.
type usageField uint8

const (
	fPromptTokens        usageField = iota // prompt_tokens: OpenAI chat, embeddings, the compatible APIs
	fCompletionTokens                      // completion_tokens
	fPromptCached                          // prompt_tokens_details.cached_tokens
	fPromptCacheHit                        // prompt_cache_hit_tokens: DeepSeek
	fInputTokens                           // input_tokens: the Responses API (cache included), Anthropic (cache apart)
	fOutputTokens                          // output_tokens
	fInputCached                           // input_tokens_details.cached_tokens: the Responses API
	fCacheRead                             // cache_read_input_tokens: Anthropic
	fCacheCreation                         // cache_creation_input_tokens: Anthropic
	fPromptTokenCount                      // Gemini's promptTokenCount (cache included)
	fToolUsePrompt                         // Gemini's toolUsePromptTokenCount
	fCandidatesTokens                      // Gemini's candidatesTokenCount
	fThoughtsTokens                        // Gemini's thoughtsTokenCount
	fCachedContentTokens                   // Gemini's cachedContentTokenCount
	numUsageFields
)

// rawUsage is what an answer's usage reports said, each figure's last
// report kept.
type rawUsage struct {
	v    [numUsageFields]int64
	seen uint32 // bit f: field f was reported
}

func (r *rawUsage) has(f usageField) bool { return r.seen&(1<<f) != 0 }

// set takes v, when it is a count, as field f.
func (r *rawUsage) set(f usageField, v gjson.Result) {
	if v.Type != gjson.Number || !(v.Num >= 0) {
		return
	}
	n := int64(maxTokens)
	if v.Num < maxTokens {
		n = v.Int()
	}
	r.v[f] = n
	r.seen |= 1 << f
}

// parse takes in one usage object, a JSON object of the bounded size
// maxUsageCapture.
func (r *rawUsage) parse(obj []byte) {
	// Parsed in place: nothing of the Results outlives the call but the
	// numbers read from them.
	gjson.Parse(unsafe.String(unsafe.SliceData(obj), len(obj))).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "prompt_tokens":
			r.set(fPromptTokens, v)
		case "completion_tokens":
			r.set(fCompletionTokens, v)
		case "prompt_tokens_details":
			r.set(fPromptCached, v.Get("cached_tokens"))
		case "prompt_cache_hit_tokens":
			r.set(fPromptCacheHit, v)
		case "input_tokens":
			r.set(fInputTokens, v)
		case "output_tokens":
			r.set(fOutputTokens, v)
		case "input_tokens_details":
			r.set(fInputCached, v.Get("cached_tokens"))
		case "cache_read_input_tokens":
			r.set(fCacheRead, v)
		case "cache_creation_input_tokens":
			r.set(fCacheCreation, v)
		case "promptTokenCount":
			r.set(fPromptTokenCount, v)
		case "toolUsePromptTokenCount":
			r.set(fToolUsePrompt, v)
		case "candidatesTokenCount":
			r.set(fCandidatesTokens, v)
		case "thoughtsTokenCount":
			r.set(fThoughtsTokens, v)
		case "cachedContentTokenCount":
			r.set(fCachedContentTokens, v)
		}
		return true
	})
}

// tokens brings the report to one shape; false when nothing was
// reported.
func (r *rawUsage) tokens() (Tokens, bool) {
	if r.seen == 0 {
		return Tokens{}, false
	}
	v := &r.v
	var t Tokens
	switch {
	case r.has(fPromptTokens):
		t.Input = v[fPromptTokens]
	case r.has(fPromptTokenCount) || r.has(fToolUsePrompt):
		t.Input = v[fPromptTokenCount] + v[fToolUsePrompt]
	default:
		// Anthropic's input_tokens leave out what the cache served and
		// stored; the Responses API reports neither of those.
		t.Input = v[fInputTokens] + v[fCacheRead] + v[fCacheCreation]
	}
	switch {
	case r.has(fCompletionTokens):
		t.Output = v[fCompletionTokens]
	case r.has(fCandidatesTokens) || r.has(fThoughtsTokens):
		t.Output = v[fCandidatesTokens] + v[fThoughtsTokens]
	default:
		t.Output = v[fOutputTokens]
	}
	for _, f := range [...]usageField{fPromptCached, fPromptCacheHit, fCachedContentTokens, fInputCached, fCacheRead} {
		if r.has(f) {
			t.Cached = v[f]
			break
		}
	}
	t.Cached = min(t.Cached, t.Input)
	t.CacheWrite = min(v[fCacheCreation], t.Input-t.Cached)
	return t, true
}

// What a member's value is to the scanner.
const (
	targetNone  = iota
	targetUsage // "usage", "usageMetadata": the object to read
	targetModel // "model", "modelVersion": the string to read
	targetNest  // "response", "message": an object whose members are read too
)

// Where the scanner is in a member of an object whose members it reads.
const (
	atKey   = iota // before a key, or the object's end
	inKey          // in the key's string
	atColon        // after the key
	atValue        // after the colon
	inValue        // in or after the value: until a comma or the object's end
)

// jsonStructural marks the bytes that open or close strings and
// containers: all that matters where no member is read.
var jsonStructural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// usageScanner reads the usage and the model from a JSON text, or a
// sequence of them, as its bytes come, in any pieces. It follows strings
// and the nesting of containers, and reads the members of the top-level
// objects (the elements of a top-level array, as Gemini streams them, count
// as top-level objects) and of their "response" and "message" objects (the
// Responses API's and Anthropic's stream events): their "usage" (or
// "usageMetadata") object is captured and parsed, as is their "model" (or
// "modelVersion") string. Nothing else is kept: the work per byte is a
// table lookup, or IndexByte within strings, and the memory a usage
// object's bytes, at most maxUsageCapture.
type usageScanner struct {
	depth   int    // containers open
	objects uint64 // bit d-1: the container at depth d (at most 64) is an object
	root    int    // the depth of the top-level objects: 1, or 2 in a top-level array; 0 between values
	nested  int    // the depth of the "response" or "message" object open in a top-level one; 0 when none
	watched bool   // the container at depth is one whose members are read
	str     bool   // in a string
	esc     bool   // the last piece ended with a backslash in a string
	state   uint8  // with watched: where in a member

	key    [16]byte // the key being read (as its bytes are, escapes and all)
	keyLen int      // its length, which may exceed len(key): then it is none of ours
	target uint8    // what the current member's value is

	capturing uint8 // targetNone, or what is being captured into buf
	capDepth  int   // with targetUsage, the depth the captured object opened at
	buf       []byte
	small     [512]byte // buf's first backing

	raw   rawUsage
	model string // the first model named
}

// scan reads p, the next piece of the text.
func (s *usageScanner) scan(p []byte) {
	from := -1 // where the value being captured begins in p
	if s.capturing != targetNone {
		from = 0
	}
	for i := 0; i < len(p); {
		if s.str {
			start := i
			i = s.skipString(p, i)
			if s.watched && s.state == inKey {
				end := i
				if !s.str {
					end-- // the closing quote
				}
				if s.keyLen < len(s.key) {
					copy(s.key[s.keyLen:], p[start:end])
				}
				s.keyLen += end - start
			}
			if !s.str {
				from = s.closeString(p, i-1, from)
			}
			continue
		}
		if !s.watched {
			if i = indexStructural(p, i); i == len(p) {
				break
			}
		}
		switch c := p[i]; c {
		case '"':
			s.str = true
			if s.watched {
				switch s.state {
				case atKey:
					s.state, s.keyLen = inKey, 0
				case atValue:
					s.state = inValue
					if s.target == targetModel && s.model == "" {
						s.capturing, from = targetModel, i
					}
				}
			}
		case '{', '[':
			if s.watched && s.state == atValue {
				s.state = inValue
				if c == '{' {
					switch s.target {
					case targetUsage:
						s.capturing, s.capDepth, from = targetUsage, s.depth, i
					case targetNest:
						if s.depth == s.root {
							s.nested = s.depth + 1
						}
					}
				}
			}
			s.depth++
			if s.depth <= 64 {
				bit := uint64(1) << (s.depth - 1)
				if c == '{' {
					s.objects |= bit
				} else {
					s.objects &^= bit
				}
			}
			if s.depth == 1 {
				s.root = 1
				if c == '[' {
					s.root = 2
				}
			}
			s.watch()
			if s.watched {
				s.state = atKey
			}
		case '}', ']':
			if s.depth == 0 {
				break // not JSON: ignored
			}
			if s.capturing == targetUsage && s.depth == s.capDepth+1 {
				s.capture(p[from : i+1])
				from = -1
				s.captured()
			}
			if s.depth == s.nested {
				s.nested = 0
			}
			s.depth--
			if s.depth == 0 {
				s.root = 0
			}
			s.watch()
			if s.watched {
				s.state = inValue
			}
		case ':':
			if s.state == atColon {
				s.state = atValue
			}
		case ',':
			if s.state == inValue {
				s.state = atKey
			}
		case ' ', '\t', '\n', '\r':
		default:
			if s.state == atValue {
				s.state = inValue // a number, true, false or null
			}
		}
		i++
	}
	if from >= 0 && s.capturing != targetNone {
		s.capture(p[from:])
	}
}

// watch sets watched for the container open at depth.
func (s *usageScanner) watch() {
	d := s.depth
	s.watched = d > 0 && d <= 64 && s.objects&(1<<(d-1)) != 0 && (d == s.root || d == s.nested)
}

// skipString reads a string's content from p[i] on. It returns the index
// after the string's closing quote, with str false, or len(p).
func (s *usageScanner) skipString(p []byte, i int) int {
	if s.esc {
		s.esc = false
		i++ // the byte escaped by the backslash that ended the last piece
	}
	// A key or a short value ends within a word or two: eight bytes at a
	// time, no call. A longer string goes to bytes.IndexByte, whose
	// vector loop costs more to start and far less per byte: the next
	// quote, then a backslash before it.
	for w := 0; w < 2 && i+8 <= len(p); w++ {
		x := binary.LittleEndian.Uint64(p[i:])
		m := swarHas(x, '"') | swarHas(x, '\\')
		if m == 0 {
			i += 8
			continue
		}
		i += bits.TrailingZeros64(m) >> 3
		if p[i] == '"' {
			s.str = false
			return i + 1
		}
		i += 2 // the backslash and the byte it escapes
		if i > len(p) {
			s.esc = true
			return len(p)
		}
	}
	q := -1 // the next quote at or after i, or len(p)
	for i < len(p) {
		if q < i {
			q = len(p)
			if k := bytes.IndexByte(p[i:], '"'); k >= 0 {
				q = i + k
			}
		}
		b := bytes.IndexByte(p[i:q], '\\')
		if b < 0 {
			if q == len(p) {
				break
			}
			s.str = false
			return q + 1
		}
		i += b + 2 // the backslash and the byte it escapes
		if i > len(p) {
			s.esc = true
		}
	}
	return len(p)
}

// Eight bytes at a time: swarHas(x, b) has the high bit of its lowest
// byte set where x's lowest byte b is (higher bytes may be set wrongly,
// never lower ones).
const (
	swarLow  = 0x0101010101010101
	swarHigh = 0x8080808080808080
)

func swarHas(x, b uint64) uint64 {
	v := x ^ (b * swarLow)
	return (v - swarLow) &^ v & swarHigh
}

// swarRun is how far indexStructural looks eight bytes at a time before
// it takes a run for long and hands it to bytes.IndexByte, whose vector
// loop costs more to start and far less per byte.
const swarRun = 32

// indexStructural returns the index of the first byte of p at or after i
// that opens or closes a string or a container, or len(p). ('[' and ']'
// are '{' and '}' but for the bit 0x20.)
func indexStructural(p []byte, i int) int {
	for end := min(i+swarRun, len(p)); i+8 <= end; i += 8 {
		x := binary.LittleEndian.Uint64(p[i:])
		y := x | 0x20*swarLow
		if m := swarHas(x, '"') | swarHas(y, '{') | swarHas(y, '}'); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	if len(p)-i < 8 {
		for ; i < len(p) && !jsonStructural[p[i]]; i++ {
		}
		return i
	}
	// A window at a time, so that a needle that is far or missing costs
	// no more than the window (the work stays linear in p).
	for ; i < len(p); i += structuralWindow {
		end := min(i+structuralWindow, len(p))
		for _, c := range [...]byte{']', '"', '[', '}', '{'} {
			if k := bytes.IndexByte(p[i:end], c); k >= 0 {
				end = i + k
			}
		}
		if end < min(i+structuralWindow, len(p)) {
			return end
		}
	}
	return len(p)
}

// structuralWindow is how many bytes indexStructural hands
// bytes.IndexByte at a time.
const structuralWindow = 2 << 10

// closeString acts on the end of a string, its quote at p[q], and returns
// the new start of the capture in p.
func (s *usageScanner) closeString(p []byte, q, from int) int {
	if !s.watched {
		return from
	}
	switch s.state {
	case inKey:
		s.target = targetNone
		if s.keyLen <= len(s.key) {
			s.target = keyTarget(s.key[:s.keyLen], s.depth == s.root)
		}
		s.state = atColon
	case inValue:
		if s.capturing == targetModel {
			s.capture(p[from : q+1])
			s.captured()
			return -1
		}
	}
	return from
}

// keyTarget is what the value of a member named key is to the scanner, in
// a top-level object (top) or a nested one.
func keyTarget(key []byte, top bool) uint8 {
	switch string(key) {
	case "usage":
		return targetUsage
	case "model":
		return targetModel
	}
	if top {
		switch string(key) {
		case "usageMetadata":
			return targetUsage
		case "modelVersion":
			return targetModel
		case "response", "message":
			return targetNest
		}
	}
	return targetNone
}

// capture adds b to the value being captured, or gives the capture up
// when the value grows past maxUsageCapture.
func (s *usageScanner) capture(b []byte) {
	if s.buf == nil {
		s.buf = s.small[:0]
	}
	if len(s.buf)+len(b) > maxUsageCapture {
		s.capturing, s.buf = targetNone, s.buf[:0]
		return
	}
	s.buf = append(s.buf, b...)
}

// captured parses the value captured whole.
func (s *usageScanner) captured() {
	switch s.capturing {
	case targetUsage:
		s.raw.parse(s.buf)
	case targetModel:
		// (gjson unescapes it; clip makes it one line of valid UTF-8.)
		if m := gjson.Parse(unsafe.String(unsafe.SliceData(s.buf), len(s.buf))).Str; m != "" {
			s.model = strings.Clone(clip(m))
		}
	}
	s.capturing, s.buf = targetNone, s.buf[:0]
}

// mayReport reports whether ev, an event's data, may hold what the
// scanner reads: a "usage" member whose value is an object, a
// "usageMetadata" member, or while no model is known a "model" or
// "modelVersion" member. It is true of every event the scanner would read
// something from (a key is a quoted string, and a quote within a string
// is escaped), and false of OpenAI's chunks with "usage": null.
func (s *usageScanner) mayReport(ev []byte) bool {
	if s.model == "" && bytes.Contains(ev, []byte(`model`)) {
		return true
	}
	// (Searched for from the u: quotes are everywhere in JSON.)
	for at := 0; ; {
		i := bytes.Index(ev[at:], []byte(`usage`))
		if i < 0 {
			return false
		}
		i += at
		at = i + len(`usage`)
		if i == 0 || ev[i-1] != '"' {
			continue
		}
		rest := ev[at:]
		if bytes.HasPrefix(rest, []byte(`Metadata"`)) {
			return true
		}
		if len(rest) > 0 && rest[0] == '"' {
			if rest = skipSpace(rest[1:]); len(rest) > 0 && rest[0] == ':' {
				if rest = skipSpace(rest[1:]); len(rest) > 0 && rest[0] == '{' {
					return true
				}
			}
		}
	}
}

// skipSpace returns b without its leading JSON whitespace.
func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// endValue ends the JSON text being read, whole or not: an SSE event's
// data ends with the event.
func (s *usageScanner) endValue() {
	if s.depth == 0 && !s.str && s.capturing == targetNone {
		return
	}
	s.depth, s.objects, s.root, s.nested, s.watched = 0, 0, 0, 0, false
	s.str, s.esc, s.state, s.keyLen, s.target = false, false, atKey, 0, targetNone
	s.capturing, s.buf = targetNone, s.buf[:0]
}

// What a line of a stream is, as sseLines reads it.
const (
	lineStart = iota // at the start of a line
	lineName         // in a field name that may be "data"
	lineSpace        // after "data:", where one space may come
	lineData         // in a data field's value
	lineSkip         // in any other line
)

// sseLines splits a text/event-stream into lines as the WHATWG HTML
// standard's "Server-sent events" section does (CRLF, LF or CR; a blank
// line ends an event) and hands the values of its data fields to a
// usageScanner, an event's data lines joined, each event's data ended
// with it.
//
// Most events can say nothing of usage: an OpenAI chat stream's chunks
// but its last. So an event's data is held, up to maxEventHold bytes, and
// scanned at the event's end only when mayReport says it might report
// usage or the model; a larger event is scanned as it comes, from its
// held start on. Either way every byte is scanned at most once, and the
// outcome is the scanner's over every event.
type sseLines struct {
	state   uint8
	name    int  // bytes of "data" matched
	cr      bool // the last line ended in CR: an LF next is part of it
	started bool // the byte order mark has been looked for

	held      *[maxEventHold]byte // from eventBufs, once an event had data
	n         int                 // bytes of the event's data held
	streaming bool                // the event outgrew held: its data is scanned as it comes
}

// maxEventHold bounds the bytes of an event's data that sseLines holds.
const maxEventHold = 4 << 10

// eventBufs are the buffers sseLines hold events in, given back when the
// body is done.
var eventBufs = sync.Pool{New: func() any { return new([maxEventHold]byte) }}

// data takes in a piece of the current event's data.
func (f *sseLines) data(b []byte, s *usageScanner) {
	switch {
	case f.streaming:
		s.scan(b)
	case f.n+len(b) > maxEventHold:
		f.streaming = true
		if f.n > 0 {
			s.scan(f.held[:f.n])
			f.n = 0
		}
		s.scan(b)
	case len(b) > 0:
		if f.held == nil {
			f.held = eventBufs.Get().(*[maxEventHold]byte)
		}
		f.n += copy(f.held[f.n:], b)
	}
}

// end ends the current event: its held data is scanned when it may say
// something.
func (f *sseLines) end(s *usageScanner) {
	if f.n > 0 && s.mayReport(f.held[:f.n]) {
		s.scan(f.held[:f.n])
	}
	f.n, f.streaming = 0, false
	s.endValue()
}

// release ends the last event, if the stream did not, and gives the
// buffer back.
func (f *sseLines) release(s *usageScanner) {
	f.end(s)
	if f.held != nil {
		eventBufs.Put(f.held)
		f.held = nil
	}
}

func (f *sseLines) feed(buf []byte, s *usageScanner) {
	if !f.started {
		f.started = true
		buf = bytes.TrimPrefix(buf, utf8BOM)
	}
	// The next LF and CR at or after at, once looked for: each search
	// passes over bytes no other search passes again, so that the work
	// is linear in buf however its lines end.
	lf, cr := -1, indexFrom(buf, 0, '\r')
	for at := 0; at < len(buf); {
		if f.cr {
			f.cr = false
			if buf[at] == '\n' {
				at++
				continue
			}
		}
		switch f.state {
		case lineData, lineSkip:
			if lf < at {
				lf = indexFrom(buf, at, '\n')
			}
			if cr < at {
				cr = indexFrom(buf, at, '\r')
			}
			end := min(lf, cr)
			if f.state == lineData {
				f.data(buf[at:end], s)
			}
			if end == len(buf) {
				return
			}
			f.cr = buf[end] == '\r'
			at = end + 1
			f.state = lineStart
		case lineSpace:
			if buf[at] == ' ' {
				at++
			}
			f.state = lineData
		default: // lineStart, lineName
			if f.state == lineStart && bytes.HasPrefix(buf[at:], []byte("data:")) {
				f.state, at = lineSpace, at+len("data:") // the usual line, at once
				continue
			}
			c := buf[at]
			at++
			if c == '\n' || c == '\r' {
				if f.state == lineStart {
					f.end(s) // a blank line ends the event
				}
				f.state, f.cr = lineStart, c == '\r'
				continue
			}
			if f.state == lineStart {
				f.state, f.name = lineName, 0
			}
			switch {
			case f.name < 4 && c == "data"[f.name]:
				f.name++
			case f.name == 4 && c == ':':
				f.state = lineSpace
			default:
				f.state = lineSkip
			}
		}
	}
}

// indexFrom returns the index of the first c of b at or after at, or
// len(b).
func indexFrom(b []byte, at int, c byte) int {
	if i := bytes.IndexByte(b[at:], c); i >= 0 {
		return at + i
	}
	return len(b)
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
