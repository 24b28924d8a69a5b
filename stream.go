package failover

// Stream guards: a streamed answer (text/event-stream) is held back until
// its first content event, so that a stream that begins with an error event,
// or never begins, can still fail over: until content arrives, nothing has
// reached the caller.

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/failover-go/failover/internal/sse"
	"github.com/tidwall/gjson"
)

// Errors the stream guard reports for a streamed answer that is abandoned
// before any of it reached the caller.
var (
	// ErrFirstByteTimeout means a streamed answer sent no event within
	// [StreamGuard.FirstByteTimeout] of its headers.
	ErrFirstByteTimeout = errors.New("failover: no stream event within FirstByteTimeout")

	// ErrFirstContentTimeout means a streamed answer sent no content
	// within [Timeouts.FirstContent] of its headers.
	ErrFirstContentTimeout = errors.New("failover: no stream content within Timeouts.FirstContent")

	// ErrStreamError means a streamed answer sent an error event before any
	// content (Anthropic's overloaded_error, the Responses API's
	// insufficient_quota after response.created). The error that wraps it
	// names the event's error type or code.
	ErrStreamError = errors.New("failover: stream began with an error event")
)

// Defaults of [StreamGuard].
const (
	defaultHoldEvents = 64
	defaultHoldBytes  = 256 << 10
)

const (
	// maxErrorDetail bounds how many bytes of an error event an error
	// carries.
	maxErrorDetail = 200
	// holdBufSize is the first size of the buffer of held bytes.
	holdBufSize = 4 << 10
	// maxEmptyReads is how many reads in a row may return nothing before
	// the body counts as broken (io.ErrNoProgress).
	maxEmptyReads = 100
)

// StreamGuard configures how the Transport holds back a streamed answer
// (2xx, Content-Type text/event-stream) until it proves itself. Until its first
// content event the stream has reached no one, so an error event or silence
// can still fail over to the next upstream; from the first content event on
// the stream belongs to the caller and is never switched. The caller reads
// the stream exactly as the upstream sent it, held bytes included.
//
// An event is content when it carries output: an OpenAI chat chunk with
// delta content, tool calls, a refusal or reasoning; a Responses API
// "*.delta" event or an output item other than reasoning; an Anthropic
// content_block_delta, or a content_block_start with text or a tool call;
// Gemini candidates with parts; data that is not a JSON object, or nests
// objects and arrays more than 10,000 deep (encoding/json refuses that
// too). An event is an error when its event field is "error", its JSON
// type is "error" or "response.failed", or its JSON object has a top-level
// "error" member (not null). Everything else (role-only chunks, message_start, ping,
// response.created, response.in_progress) is held back. "data: [DONE]" ends
// the holding, as does the end of the stream.
//
// The zero value holds back up to 64 events or 256 KiB before the first
// content event, for at most [Timeouts.FirstContent].
type StreamGuard struct {
	// FirstByteTimeout, when set, replaces Timeouts.FirstContent with a
	// bound, from the response headers, on the stream's first event. A
	// comment line (OpenRouter's ": OPENROUTER PROCESSING" keep-alive)
	// counts. A stream with no event in time is abandoned with
	// [ErrFirstByteTimeout]; one that has sent an event but no content by
	// then is returned as it is, still streaming.
	//
	// Deprecated: set Timeouts.FirstContent, which bounds the time to
	// content, the time a reasoning model thinks.
	FirstByteTimeout time.Duration

	// HoldEvents is how many events may be held back before the first
	// content event; when that many have passed without content or error,
	// the stream is returned as it is. Comments do not count. Zero means
	// 64. Negative disables holding: the guard then only waits for the
	// first event or comment (when FirstByteTimeout is set) and fails over
	// only when that first event is an error.
	HoldEvents int

	// HoldBytes bounds the bytes held back before the first content
	// event, at most 64 MiB; when reached, the stream is returned as it
	// is. Zero means 256 KiB. Negative disables holding, as a negative HoldEvents does.
	HoldBytes int
}

// maxHoldBytes bounds StreamGuard.HoldBytes: the guard holds that much of a
// stream in memory before the first content event.
const maxHoldBytes = 64 << 20

func (g *StreamGuard) validate() error {
	switch {
	case g.FirstByteTimeout < 0:
		return configError("StreamGuard.FirstByteTimeout", "must not be negative")
	case g.HoldBytes > maxHoldBytes:
		return configError("StreamGuard.HoldBytes", "must be at most 64 MiB")
	}
	return nil
}

// streamError is an error event that began a stream. It matches
// ErrStreamError.
type streamError struct {
	code   string // the event's error code or type: "overloaded_error", "insufficient_quota"
	detail string // code and message, at most maxErrorDetail bytes of the event
}

func (e *streamError) Error() string {
	if e.detail == "" {
		return ErrStreamError.Error()
	}
	return ErrStreamError.Error() + ": " + e.detail
}

func (e *streamError) Unwrap() error { return ErrStreamError }

// guard holds back the beginning of a streamed answer until its first
// content event, an error event, the end of the stream or g's limits, and
// returns resp with a Body that yields the held bytes and then the rest of
// the stream. It returns resp untouched unless resp is a 2xx
// text/event-stream answer with a body.
//
// When the stream begins with an error event, has no event within
// FirstByteTimeout, or fails to read before any content, guard closes the
// body and returns an error: one that matches ErrStreamError, or
// ErrFirstByteTimeout, or the body's read error. The caller may then try
// another upstream: nothing of the stream has reached anyone.
//
// With FirstByteTimeout set, the body is read by a goroutine of guard's,
// which ends when its last read returns (a body that is closed returns at
// once); otherwise guard reads in the caller's goroutine.
func (g StreamGuard) guard(resp *http.Response) (*http.Response, error) {
	resp, _, err := g.hold(resp, 0)
	return resp, err
}

// hold is guard with firstContent, the bound on the time to the first
// content event when FirstByteTimeout is not set (0: none). It reports
// whether content arrived before it returned the stream.
func (g StreamGuard) hold(resp *http.Response, firstContent time.Duration) (*http.Response, bool, error) {
	if resp == nil || resp.StatusCode < 200 || resp.StatusCode > 299 ||
		resp.Body == nil || resp.Body == http.NoBody || !isEventStream(resp.Header.Get("Content-Type")) {
		return resp, false, nil
	}
	h := holder{
		rc:        resp.Body,
		hold:      g.HoldEvents >= 0 && g.HoldBytes >= 0,
		maxEvents: g.HoldEvents,
		maxBytes:  g.HoldBytes,
	}
	timeout := g.FirstByteTimeout
	if timeout <= 0 && h.hold {
		timeout, h.strict = firstContent, true
	}
	if !h.hold && timeout <= 0 {
		return resp, false, nil
	}
	if h.maxEvents <= 0 {
		h.maxEvents = defaultHoldEvents
	}
	if h.maxBytes <= 0 {
		h.maxBytes = defaultHoldBytes
	}
	h.p.Buffer(nil, h.maxBytes) // no event's data outgrows what the guard holds: no Parts
	body, err := h.run(timeout)
	if err != nil {
		return nil, false, err
	}
	resp.Body = body
	return resp, h.content, nil
}

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// holder reads the beginning of one stream.
type holder struct {
	rc        io.ReadCloser
	hold      bool // false: stop at the first event or comment
	maxEvents int
	maxBytes  int

	buf     []byte // every byte read so far; never more than maxBytes
	p       sse.Reader
	events  int  // events held that were neither content nor error
	alive   bool // an event or a comment has arrived
	content bool // a content event has arrived
	strict  bool // the timeout bounds the time to content (Timeouts.FirstContent)

	// With a FirstByteTimeout, reads go through a goroutine so that the
	// deadline can interrupt them: one buffer at a time on reqs, its
	// result on res.
	reqs chan []byte
	res  chan readResult
}

type readResult struct {
	n   int
	err error
}

// run reads until it knows what the stream is, and returns the body to give
// the caller or the error to fail over with.
func (h *holder) run(timeout time.Duration) (io.ReadCloser, error) {
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
		h.reqs = make(chan []byte)
		h.res = make(chan readResult, 1) // a read left in flight never blocks its goroutine
		go readLoop(h.rc, h.reqs, h.res)
		defer close(h.reqs)
	}
	empty := 0
	for {
		if len(h.buf) == cap(h.buf) {
			h.grow()
		}
		p := h.buf[len(h.buf):cap(h.buf)]
		var n int
		var err error
		if deadline == nil {
			n, err = h.rc.Read(p)
		} else {
			h.reqs <- p
			select {
			case r := <-h.res:
				n, err = r.n, r.err
			case <-deadline:
				if h.strict {
					h.rc.Close() // ends the read in flight
					return nil, ErrFirstContentTimeout
				}
				if !h.alive {
					h.rc.Close()
					return nil, ErrFirstByteTimeout
				}
				// Alive but no content yet: hand over the stream with
				// the read still in flight.
				return &heldBody{buf: h.buf, pending: h.res, tail: p, rc: h.rc}, nil
			}
		}
		h.buf = h.buf[:len(h.buf)+n]
		// At the limit the guard stops looking, end of stream or not, so
		// that what it decides does not depend on how reads split the
		// stream.
		full := len(h.buf) >= h.maxBytes
		pass, fail := h.scan(p[:n], err == io.EOF && !full)
		switch {
		case fail != nil:
			h.rc.Close()
			return nil, fail
		case pass || full || err == io.EOF:
			return &heldBody{buf: h.buf, err: err, rc: h.rc}, nil
		case err != nil:
			h.rc.Close()
			return nil, err
		case n == 0:
			if empty++; empty >= maxEmptyReads {
				h.rc.Close()
				return nil, io.ErrNoProgress
			}
		default:
			empty = 0
		}
	}
}

// grow makes room in buf for the next read, up to maxBytes.
func (h *holder) grow() {
	size := min(max(2*cap(h.buf), holdBufSize), h.maxBytes)
	buf := make([]byte, len(h.buf), size)
	copy(buf, h.buf)
	h.buf = buf
}

// scan reads p, the bytes just read, with those before. It reports pass
// when the stream is to be returned (content, the end, a limit) and fail
// when it is to be abandoned. At eof, the last line and event need no
// terminator.
func (h *holder) scan(p []byte, eof bool) (pass bool, fail error) {
	h.p.Feed(p)
	if eof {
		h.p.End()
	}
	for {
		switch h.p.Next() {
		case sse.None:
			return eof, nil
		case sse.Comment:
			h.alive = true
			if !h.hold {
				return true, nil
			}
		case sse.Event:
			h.alive = true
			typ, data := h.p.Type(), h.p.Data()
			switch classify(typ, data) {
			case eventError:
				return false, newStreamError(typ, data)
			case eventContent:
				h.content = !thinking(data)
				return true, nil
			case eventDone:
				return true, nil
			}
			if h.events++; !h.hold || h.events >= h.maxEvents {
				return true, nil
			}
		case sse.Part:
			return true, nil // an event larger than the hold (see guard: never)
		}
	}
}

// readLoop reads r into each buffer it is sent, until reqs is closed.
func readLoop(r io.Reader, reqs <-chan []byte, res chan<- readResult) {
	for p := range reqs {
		n, err := r.Read(p)
		res <- readResult{n, err}
	}
}

// heldBody is a guarded stream's Body: the bytes the guard read, then the
// read the guard left in flight, if any, then the rest of the original
// body.
type heldBody struct {
	buf     []byte          // held bytes not yet returned
	pending chan readResult // the result of the read in flight, or nil
	tail    []byte          // the buffer of the read in flight
	err     error           // the original body's error, once seen (io.EOF at its end)
	rc      io.ReadCloser

	closeOnce sync.Once
	closeErr  error
	closed    atomic.Bool // Close was called: Read returns nothing more, held bytes neither
}

func (b *heldBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errReadOnClosedBody
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(b.buf) == 0 && b.pending != nil {
		r := <-b.pending
		b.buf, b.err = b.tail[:r.n], r.err
		b.pending, b.tail = nil, nil
	}
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		if len(b.buf) == 0 {
			b.buf = nil // let the held bytes go
		}
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.rc.Read(p)
}

// Close closes the original body, once.
func (b *heldBody) Close() error {
	b.closed.Store(true)
	b.closeOnce.Do(func() { b.closeErr = b.rc.Close() })
	return b.closeErr
}

// What an event says about a stream.
const (
	eventHeld    = iota // neither content nor error: role chunks, pings, preambles
	eventContent        // output for the caller
	eventError          // an error instead of output
	eventDone           // "[DONE]": the end
)

// classify tells what an event with event field typ and data is.
func classify(typ, data []byte) int {
	if string(typ) == "error" {
		return eventError
	}
	d := bytes.TrimSpace(data)
	switch {
	case len(d) == 0:
		return eventHeld
	case d[0] != '{':
		if string(d) == "[DONE]" {
			return eventDone
		}
		return eventContent // plain text is its own content
	}
	// gjson.Valid recurses once per level of nesting: an event nested
	// millions deep, which a large HoldBytes lets in, would overflow the
	// stack, a fatal error that no recover catches. nestsShallow counts
	// the levels first, without recursion. What follows is safe at any
	// depth: Parse, ForEach and Get with these fixed paths step over a
	// nested value with a counter (gjson's parseSquash), and recurse only
	// once per component of the path.
	if !nestsShallow(d) {
		return eventContent // deeper than any JSON this package reads, as data that is not JSON
	}
	js := unsafe.String(unsafe.SliceData(d), len(d)) // read in place: nothing of it outlives the call
	if !gjson.Valid(js) {
		return eventContent // not a JSON object after all
	}
	return classifyObject(typ, js)
}

// classifyObject is classify for an event whose data js is a valid JSON
// object, nested at most maxJSONDepth deep.
func classifyObject(typ []byte, js string) int {
	// One pass over the top-level members.
	var kind string
	var errv, choices, candidates, block, item gjson.Result
	gjson.Parse(js).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "error":
			errv = v
		case "type":
			kind = v.Str
		case "choices":
			choices = v
		case "candidates":
			candidates = v
		case "content_block":
			block = v
		case "item":
			item = v
		}
		return true
	})
	if kind == "" {
		kind = string(typ)
	}
	switch {
	case nonEmpty(errv), kind == "error", kind == "response.failed":
		return eventError
	case strings.HasSuffix(kind, "delta"):
		// content_block_delta, response.output_text.delta and the other
		// Responses deltas, Cohere's content-delta.
		return eventContent
	case kind == "content_block_start":
		switch block.Get("type").Str {
		case "text":
			return content(nonEmpty(block.Get("text")))
		case "thinking":
			return content(nonEmpty(block.Get("thinking")))
		}
		return eventContent // tool_use and other blocks name their call
	case kind == "response.output_item.added":
		return content(item.Get("type").Str != "reasoning")
	case chatHasContent(choices), geminiHasContent(candidates):
		return eventContent
	}
	return eventHeld
}

func content(ok bool) int {
	if ok {
		return eventContent
	}
	return eventHeld
}

// chatHasContent reports whether an OpenAI chat chunk's choices carry output.
func chatHasContent(choices gjson.Result) bool {
	found := false
	choices.ForEach(func(_, c gjson.Result) bool {
		c.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "text": // completions
				found = nonEmpty(v)
			case "delta":
				v.ForEach(func(k, v gjson.Result) bool {
					switch k.Str {
					case "content", "refusal", "tool_calls", "function_call", "reasoning", "reasoning_content", "audio":
						found = nonEmpty(v)
					}
					return !found
				})
			}
			return !found
		})
		return !found
	})
	return found
}

// geminiHasContent reports whether Gemini candidates carry parts.
func geminiHasContent(candidates gjson.Result) bool {
	found := false
	candidates.ForEach(func(_, c gjson.Result) bool {
		found = nonEmpty(c.Get("content.parts"))
		return !found
	})
	return found
}

// thinking reports whether data, a content event's, is a model's
// reasoning rather than its answer: a Responses API reasoning event, an
// Anthropic thinking block, a chat chunk with only reasoning, or Gemini
// thought parts. A model may think for minutes between such events and
// its answer, so a stream that begins with them keeps the bound on its
// first content for its silences (see guardStream).
func thinking(data []byte) bool {
	d := bytes.TrimSpace(data)
	if len(d) == 0 || d[0] != '{' || !nestsShallow(d) {
		return false
	}
	j := gjson.ParseBytes(d)
	kind := j.Get("type").Str
	switch {
	case strings.Contains(kind, "reasoning"):
		return true
	case kind == "content_block_delta":
		t := j.Get("delta.type").Str
		return t == "thinking_delta" || t == "signature_delta"
	case kind == "content_block_start":
		t := j.Get("content_block.type").Str
		return t == "thinking" || t == "redacted_thinking"
	}
	if c := j.Get("choices.0.delta"); c.Exists() {
		return (nonEmpty(c.Get("reasoning")) || nonEmpty(c.Get("reasoning_content"))) &&
			!nonEmpty(c.Get("content")) && !nonEmpty(c.Get("tool_calls")) && !nonEmpty(c.Get("refusal"))
	}
	return j.Get("candidates.0.content.parts.0.thought").Bool()
}

// nonEmpty reports whether v is there and is not null, false, "", [] or {}.
func nonEmpty(v gjson.Result) bool {
	switch v.Type {
	case gjson.Null, gjson.False:
		return false
	case gjson.String:
		return v.Str != ""
	case gjson.JSON:
		found := false
		v.ForEach(func(_, _ gjson.Result) bool {
			found = true
			return false
		})
		return found
	}
	return true
}

// newStreamError describes an error event by its code and message. It
// reads data at any depth without recursion (see classify), so it needs no
// nesting guard.
func newStreamError(typ, data []byte) error {
	d := bytes.TrimSpace(data)
	var code, msg string
	if len(d) > 0 && d[0] == '{' {
		j := gjson.ParseBytes(d)
		code = firstString(j, "error.code", "error.type", "error.status", "code", "response.error.code")
		if code == "" {
			if c := j.Get("error.code"); c.Type == gjson.Number {
				code = c.Raw
			}
		}
		msg = firstString(j, "error.message", "message", "response.error.message", "error")
	} else {
		msg = string(d)
	}
	detail := code
	if msg != "" {
		if detail != "" {
			detail += ": "
		}
		detail += msg
	}
	return &streamError{code: clip(code), detail: clip(detail)}
}

func firstString(j gjson.Result, paths ...string) string {
	for _, path := range paths {
		if v := j.Get(path); v.Type == gjson.String && v.Str != "" {
			return v.Str
		}
	}
	return ""
}

// clip makes s one line of valid UTF-8 of at most maxErrorDetail bytes.
func clip(s string) string {
	if len(s) > 4*maxErrorDetail {
		s = s[:4*maxErrorDetail]
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > maxErrorDetail {
		i := maxErrorDetail
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
		s = s[:i]
	}
	return s
}

// ErrStreamStalled means a stream whose content had begun went silent
// longer than its bound ([Timeouts.Idle]); the [*StallError] that wraps
// it names the upstream.
var ErrStreamStalled = errors.New("failover: stream stalled")

// StallError is what a read of a stream's body returns when its upstream
// stayed silent past the stream's bound after its content began: the
// stream is closed, and its upstream counts a failure. It matches
// ErrStreamStalled, and its Timeout reports true.
type StallError struct {
	Upstream string        // the upstream's Name
	Silence  time.Duration // how long the read waited
}

func (e *StallError) Error() string {
	return "failover: stream from upstream " + strconv.Quote(e.Upstream) + " stalled: silent for " + e.Silence.String()
}

func (e *StallError) Unwrap() error { return ErrStreamStalled }

// Timeout reports true: the upstream took too long.
func (e *StallError) Timeout() bool { return true }

// stallBody is a stream's Body once it is the caller's: each read that
// waits longer than limit for bytes closes the stream and fails with a
// *StallError. Only time spent in Read counts, so a caller slow to read
// is not taken for a silent upstream.
type stallBody struct {
	rc      io.ReadCloser
	limit   time.Duration
	timer   *time.Timer // stopped but during a read
	stalled atomic.Bool
	onStall func() // counts the stall against the upstream
	err     *StallError
}

// watchStalls returns rc as a stallBody of upstream, with bound limit,
// calling onStall after each stall.
func watchStalls(rc io.ReadCloser, upstream string, limit time.Duration, onStall func()) *stallBody {
	b := &stallBody{rc: rc, limit: limit, onStall: onStall, err: &StallError{Upstream: upstream, Silence: limit}}
	b.timer = time.AfterFunc(limit, b.fire)
	b.timer.Stop()
	return b
}

func (b *stallBody) Read(p []byte) (int, error) {
	if b.stalled.Load() {
		return 0, b.err
	}
	b.timer.Reset(b.limit)
	n, err := b.rc.Read(p)
	b.timer.Stop()
	if err != nil && b.stalled.Load() {
		return n, b.err // the stall closed the body: its error is the stall's (the next Read's too, when this one got bytes)
	}
	return n, err
}

func (b *stallBody) fire() {
	b.stalled.Store(true)
	b.onStall() // before the read in flight ends: its caller finds the stall counted
	b.rc.Close()
}

func (b *stallBody) Close() error {
	b.timer.Stop()
	return b.rc.Close()
}
