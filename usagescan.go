package failover

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/failover-go/failover/internal/sse"
	"github.com/tidwall/gjson"
)

// A rawUsage field is one figure of a provider's usage report.
type usageField uint8

const (
	fPromptTokens        usageField = iota // prompt_tokens: OpenAI chat, embeddings, the compatible APIs
	fCompletionTokens                      // completion_tokens
	fPromptCached                          // prompt_tokens_details.cached_tokens
	fPromptCacheWrite                      // prompt_tokens_details.cache_write_tokens: OpenAI, OpenRouter
	fPromptCacheHit                        // prompt_cache_hit_tokens: DeepSeek
	fPromptCacheMiss                       // prompt_cache_miss_tokens: DeepSeek
	fInputTokens                           // input_tokens: the Responses API (cache included), Anthropic (cache apart), and alike (see parse)
	fOutputTokens                          // output_tokens, and alike
	fInputCached                           // input_tokens_details.cached_tokens: the Responses API
	fInputCacheWrite                       // input_tokens_details.cache_write_tokens: the Responses API
	fCacheRead                             // cache_read_input_tokens: Anthropic, and alike
	fCacheCreation                         // cache_creation_input_tokens: Anthropic, and alike
	fPromptTokenCount                      // Gemini's promptTokenCount (cache included)
	fToolUsePrompt                         // Gemini's toolUsePromptTokenCount
	fCandidatesTokens                      // Gemini's candidatesTokenCount
	fThoughtsTokens                        // Gemini's thoughtsTokenCount
	fCachedContentTokens                   // Gemini's cachedContentTokenCount
	fTotalTokens                           // total_tokens
	fReasoning                             // completion_tokens_details.reasoning_tokens, output_tokens_details.reasoning_tokens
	fTally                                 // Gemini's usageMetadata was read: a tally, not a figure
	numUsageFields
)

// rawUsage.seen has a bit for each field.
const _ uint32 = 1 << (numUsageFields - 1)

// geminiFields are the figures of Gemini's usageMetadata.
const geminiFields = 1<<fPromptTokenCount | 1<<fToolUsePrompt | 1<<fCandidatesTokens | 1<<fThoughtsTokens | 1<<fCachedContentTokens

// rawUsage is what an answer's usage reports said, each figure's last
// report kept. Gemini's usageMetadata is the exception: each is the whole
// tally so far, whose JSON leaves out the counts that are 0, and the last
// one is what is billed; so it replaces every Gemini figure, and a figure
// it leaves out is 0, not an earlier report's.
//
// Anthropic's usage.iterations, where present, is what is billed: one entry
// for each sampling step of the request (a compaction, an advisor's
// answer, the message), while the top-level counts leave the compactions
// and the advisor's answers out. The last array with entries counts, as
// the sum of its entries; an advisor's tokens are priced with the rest, at
// the upstream's Cost.
type rawUsage struct {
	v     [numUsageFields]int64
	seen  uint32 // bit f: field f was reported
	iter  bool   // a usage.iterations with entries was read: iters
	iters Tokens // the sum over the last one
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
// maxUsageCapture; tally says it is Gemini's usageMetadata.
func (r *rawUsage) parse(obj []byte, tally bool) {
	if tally {
		r.seen = r.seen&^geminiFields | 1<<fTally
		for f := range usageField(numUsageFields) {
			if geminiFields&(1<<f) != 0 {
				r.v[f] = 0
			}
		}
	}
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
			r.set(fPromptCacheWrite, v.Get("cache_write_tokens"))
		case "prompt_cache_hit_tokens":
			r.set(fPromptCacheHit, v)
		case "prompt_cache_miss_tokens":
			r.set(fPromptCacheMiss, v)
		case "input_tokens":
			r.set(fInputTokens, v)
		case "output_tokens":
			r.set(fOutputTokens, v)
		case "input_tokens_details":
			r.set(fInputCached, v.Get("cached_tokens"))
			r.set(fInputCacheWrite, v.Get("cache_write_tokens"))
		case "total_tokens":
			r.set(fTotalTokens, v)
		case "completion_tokens_details", "output_tokens_details":
			r.set(fReasoning, v.Get("reasoning_tokens"))
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
		// Bedrock's, as Anthropic's, with the cache apart.
		case "inputTokens":
			r.set(fInputTokens, v)
		case "outputTokens":
			r.set(fOutputTokens, v)
		case "cacheReadInputTokens", "cacheReadInputTokenCount":
			r.set(fCacheRead, v)
		case "cacheWriteInputTokens", "cacheWriteInputTokenCount":
			r.set(fCacheCreation, v)
		// Cohere's: what is billed, not all it read.
		case "billed_units":
			r.set(fInputTokens, v.Get("input_tokens"))
			r.set(fOutputTokens, v.Get("output_tokens"))
		}
		return true
	})
}

// tokens brings the report to one shape; false when nothing was
// reported.
func (r *rawUsage) tokens() (Tokens, bool) {
	if r.iter {
		return r.iters, true
	}
	if r.seen == 0 {
		return Tokens{}, false
	}
	v := &r.v
	var t Tokens
	switch {
	case r.has(fPromptTokens):
		t.Input = v[fPromptTokens]
	case r.has(fPromptCacheHit) || r.has(fPromptCacheMiss):
		t.Input = v[fPromptCacheHit] + v[fPromptCacheMiss] // the two parts of DeepSeek's prompt_tokens
	case r.has(fTally) || r.has(fPromptTokenCount) || r.has(fToolUsePrompt):
		t.Input = v[fPromptTokenCount] + v[fToolUsePrompt]
	default:
		// Anthropic's input_tokens (and Bedrock's) leave out what the
		// cache served and stored; the Responses API reports neither.
		t.Input = v[fInputTokens] + v[fCacheRead] + v[fCacheCreation]
	}
	switch {
	case r.has(fCompletionTokens):
		t.Output = v[fCompletionTokens] + r.reasoningApart(v[fPromptTokens], v[fCompletionTokens])
	case r.has(fTally) || r.has(fCandidatesTokens) || r.has(fThoughtsTokens):
		t.Output = v[fCandidatesTokens] + v[fThoughtsTokens]
	default:
		t.Output = v[fOutputTokens] + r.reasoningApart(v[fInputTokens], v[fOutputTokens])
	}
	for _, f := range [...]usageField{fPromptCached, fPromptCacheHit, fCachedContentTokens, fInputCached, fCacheRead} {
		if r.has(f) {
			t.Cached = v[f]
			break
		}
	}
	t.Cached = min(t.Cached, t.Input)
	for _, f := range [...]usageField{fPromptCacheWrite, fInputCacheWrite, fCacheCreation} {
		if r.has(f) {
			t.CacheWrite = v[f]
			break
		}
	}
	t.CacheWrite = min(t.CacheWrite, t.Input-t.Cached)
	return t, true
}

// iterations is a sum over the entries of a usage.iterations array.
type iterations struct {
	sum Tokens
	n   int
}

// add takes in one entry, a JSON object of the bounded size
// maxUsageCapture, as a usage report of its own.
func (it *iterations) add(obj []byte) {
	var r rawUsage
	r.parse(obj, false)
	t, _ := r.tokens()
	it.sum.Input = min(sumTokens(it.sum.Input, t.Input), maxTokens)
	it.sum.Output = min(sumTokens(it.sum.Output, t.Output), maxTokens)
	it.sum.Cached = min(sumTokens(it.sum.Cached, t.Cached), it.sum.Input)
	it.sum.CacheWrite = min(sumTokens(it.sum.CacheWrite, t.CacheWrite), it.sum.Input-it.sum.Cached)
	it.n++
}

// Bedrock's InvokeModel reports the tokens it bills in headers, whatever
// the model's body says (Llama's, Mistral's and Titan's count in names of
// their own); the input count, as Converse's inputTokens, leaves the cache
// out.
const (
	bedrockInputHeader      = "X-Amzn-Bedrock-Input-Token-Count"
	bedrockOutputHeader     = "X-Amzn-Bedrock-Output-Token-Count"
	bedrockCacheReadHeader  = "X-Amzn-Bedrock-Cache-Read-Input-Token-Count"
	bedrockCacheWriteHeader = "X-Amzn-Bedrock-Cache-Write-Input-Token-Count"
)

// headerUsage reads Bedrock's token-count headers; false when none holds
// a count.
func headerUsage(h http.Header) (Tokens, bool) {
	var r rawUsage
	for _, hf := range [...]struct {
		name string
		f    usageField
	}{
		{bedrockInputHeader, fInputTokens},
		{bedrockOutputHeader, fOutputTokens},
		{bedrockCacheReadHeader, fCacheRead},
		{bedrockCacheWriteHeader, fCacheCreation},
	} {
		if v := h[hf.name]; len(v) > 0 {
			if n, err := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64); err == nil && n >= 0 {
				r.v[hf.f], r.seen = min(n, maxTokens), r.seen|1<<hf.f
			}
		}
	}
	return r.tokens()
}

// reasoningApart returns the reasoning tokens when the report counts them
// apart from out, the output it reports, and 0 when out includes them, as
// OpenAI's does. Some APIs that copy OpenAI's shape (xAI's, gateways in
// front of Gemini) leave the reasoning out of completion_tokens though it
// is billed as output; their total_tokens tells them apart, as the sum of
// in, out and the reasoning.
func (r *rawUsage) reasoningApart(in, out int64) int64 {
	if !r.has(fReasoning) || !r.has(fTotalTokens) || r.v[fReasoning] == 0 || r.v[fTotalTokens] != in+out+r.v[fReasoning] {
		return 0
	}
	return r.v[fReasoning]
}

// What a member's value is to the scanner.
const (
	targetNone       = iota
	targetUsage      // "usage", Cohere's "meta": the object to read
	targetTally      // "usageMetadata": the object to read, a whole tally (see rawUsage)
	targetModel      // "model", "modelVersion": the string to read
	targetNest       // "response", "message", "x_groq", "delta": an object whose members are read too
	targetIterations // in the usage object read, "iterations": an array whose entries are read one by one
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
// as top-level objects) and of their "response", "message", "x_groq" and
// "delta" objects (the Responses API's and Anthropic's stream events,
// Groq's and Cohere's stream chunks, Gemini's answers as Google's Code
// Assist API wraps them): their "usage" (or "usageMetadata", or Cohere's
// "meta") object is captured and parsed, as is their "model" (or
// "modelVersion") string. Nothing else is kept: the work per byte is a
// table lookup, or IndexByte within strings, and the memory a usage
// object's bytes, at most maxUsageCapture. The entries of a usage object's
// "iterations" array, which grows with the steps of a request, are summed
// and dropped one by one: only the entry being read counts toward that
// bound.
type usageScanner struct {
	depth   int    // containers open
	objects uint64 // bit d-1: the container at depth d (at most 64) is an object
	root    int    // the depth of the top-level objects: 1, or 2 in a top-level array; 0 between values
	nested  int    // the depth of the targetNest object open in a top-level one; 0 when none
	watched bool   // the container at depth is one whose members are read
	str     bool   // in a string
	esc     bool   // the last piece ended with a backslash in a string
	state   uint8  // with watched: where in a member

	key    [16]byte // the key being read (as its bytes are, escapes and all)
	keyLen int      // its length, which may exceed len(key): then it is none of ours
	target uint8    // what the current member's value is

	capturing uint8 // targetNone, or what is being captured into buf
	tally     bool  // with targetUsage, the captured object is Gemini's usageMetadata
	capDepth  int   // with targetUsage, the depth the captured object opened at
	buf       []byte
	small     [512]byte // buf's first backing

	// The captured usage object's "iterations" array: its entries are
	// summed as each ends, and cut from buf.
	iterDepth int        // the array's depth while it is open; 0 otherwise
	iterAt    int32      // the length of buf after the array's '['
	entryAt   int32      // the length of buf before the open entry's '{'; -1 when none is open
	iters     iterations // of the usage object being captured

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
				switch {
				case c == '{' && (s.target == targetUsage || s.target == targetTally):
					s.capturing, s.capDepth, s.tally, from = targetUsage, s.depth, s.target == targetTally, i
				case c == '{' && s.target == targetNest && s.depth == s.root:
					s.nested = s.depth + 1
				case c == '[' && s.target == targetIterations:
					s.capture(p[from : i+1])
					from = i + 1
					if s.capturing == targetUsage {
						s.iterDepth, s.iterAt, s.entryAt, s.iters = s.depth+1, int32(len(s.buf)), -1, iterations{}
					}
				}
			}
			if c == '{' && s.iterDepth != 0 && s.depth == s.iterDepth { // an entry opens
				s.capture(p[from:i])
				from = i
				s.entryAt = int32(len(s.buf))
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
			switch {
			case s.iterDepth == 0:
			case c == '}' && s.depth == s.iterDepth+1 && s.entryAt >= 0: // an entry ends
				s.capture(p[from : i+1])
				from = i + 1
				if s.iterDepth != 0 {
					s.iters.add(s.buf[s.entryAt:])
					s.buf, s.entryAt = s.buf[:s.iterAt], -1
				}
			case s.depth == s.iterDepth:
				s.iterDepth = 0
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
	s.watched = d > 0 && d <= 64 && s.objects&(1<<(d-1)) != 0 &&
		(d == s.root || d == s.nested || s.capturing == targetUsage && d == s.capDepth+1)
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
		switch {
		case s.keyLen > len(s.key):
		case s.capturing == targetUsage: // a member of the usage object read
			if string(s.key[:s.keyLen]) == "iterations" {
				s.target = targetIterations
			}
		default:
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
	case "usageMetadata":
		return targetTally
	case "model", "modelVersion":
		return targetModel
	}
	if top {
		switch string(key) {
		case "meta":
			return targetUsage
		case "response", "message", "x_groq", "delta":
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
		s.iterDepth, s.iters = 0, iterations{}
		s.watch() // the usage object's members are read no more
		return
	}
	s.buf = append(s.buf, b...)
}

// captured parses the value captured whole.
func (s *usageScanner) captured() {
	switch s.capturing {
	case targetUsage:
		s.raw.parse(s.buf, s.tally)
		if s.iters.n > 0 {
			s.raw.iter, s.raw.iters = true, s.iters.sum
		}
		s.iterDepth, s.iters = 0, iterations{}
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
	s.iterDepth, s.iters = 0, iterations{}
}

// sseUsage hands the data of a text/event-stream's events to a
// usageScanner, each event's data ended with it.
//
// Most events can say nothing of usage: an OpenAI chat stream's chunks
// but its last. So an event's data is held, up to maxEventHold bytes, and
// scanned at the event's end only when mayReport says it might report
// usage or the model; a larger event is scanned as it comes, in the
// reader's Parts. Either way every byte is scanned at most once, and the
// outcome is the scanner's over every event.
type sseUsage struct {
	st *sseState // from sseStates, once the stream began
}

// sseState is a stream's reader and the buffer it holds events in.
type sseState struct {
	r         sse.Reader
	streaming bool // the event outgrew held: its data is scanned as it comes
	held      [maxEventHold]byte
}

// maxEventHold bounds the bytes of an event's data that sseUsage holds.
const maxEventHold = 4 << 10

// sseStates are given back when the body is done.
var sseStates = sync.Pool{New: func() any { return new(sseState) }}

// feed reads the next piece of the stream.
func (f *sseUsage) feed(p []byte, s *usageScanner) {
	if f.st == nil {
		f.st = sseStates.Get().(*sseState)
		f.st.r.Buffer(f.st.held[:0], maxEventHold)
	}
	f.st.r.Feed(p)
	f.st.next(s)
}

// release ends the stream, and its last event if the stream did not, and
// gives the state back.
func (f *sseUsage) release(s *usageScanner) {
	st := f.st
	if st == nil {
		return
	}
	f.st = nil
	st.r.End()
	st.next(s)
	st.r, st.streaming = sse.Reader{}, false
	sseStates.Put(st)
}

// next scans what the pieces fed so far complete.
func (st *sseState) next(s *usageScanner) {
	for {
		switch st.r.Next() {
		case sse.None:
			return
		case sse.Part:
			st.streaming = true
			s.scan(st.r.Data())
		case sse.Event:
			if d := st.r.Data(); st.streaming || len(d) > 0 && s.mayReport(d) {
				s.scan(d)
			}
			st.streaming = false
			s.endValue()
		}
	}
}
