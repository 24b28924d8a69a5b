package failover

// Splicing: the body of a stream that may be continued (continue.go). It
// passes the first upstream's events on as they are, whole events at a
// time, and keeps the text the caller was sent. When the stream breaks,
// it has the continuation sent, and passes that stream's events on
// rewritten into the first's: its message start dropped, its indices and
// id the first's, its usage added to what the streams before reported.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unsafe"

	"github.com/tidwall/gjson"
)

// ErrStreamTruncated is what a read of a continued stream's body
// ([ContinueConfig]) fails with when the stream ended, with no error,
// before its last event ("[DONE]", message_stop, a finish reason) and no
// upstream continued it.
var ErrStreamTruncated = errors.New("failover: stream ended before its last event")

// Bounds of a splice.
const (
	// maxSpliceEvent bounds the bytes of one event a splice holds: a
	// larger event is passed on as it comes, and the stream is no longer
	// continued.
	maxSpliceEvent = 1 << 20
	spliceBufSize  = 4 << 10
)

// splice is the body of a stream that may be continued.
type splice struct {
	from *contFrom
	max  int // continuations it may take
	made int // continuations sent

	// mu guards rc, closed and cancel: Close may come from another
	// goroutine while Read waits.
	mu     sync.Mutex
	rc     io.ReadCloser // the stream read now
	closed bool
	cancel context.CancelFunc // ends the continuation's context

	buf     []byte // the read buffer
	pend    []byte // bytes of events not complete yet
	out     []byte // bytes ready for the caller
	obuf    []byte // out's buffer, kept from one fill to the next
	err     error  // what Read returns once out is empty: io.EOF at the end, or why it broke
	raw     bool   // passed on as it comes: continuation is off for the stream
	tail    string // the blank line the first stream's last event lacks, owed before a continuation's
	scan    int    // where in pend the search for the end of its first event goes on
	scanned int64  // bytes the searches looked at: about each byte once (see TestSpliceLargeEventsLinear)
	empty   int    // reads in a row that returned nothing

	a        soFar
	inband   error  // the error event that broke the stream read now
	errEvent []byte // that event, as it came, for the caller when nothing continues the stream
	gave     bool   // the stream read now, a continuation, sent content

	// The break the stream read now continues, as the caller gets it
	// when the continuation breaks before its own content.
	prior      error
	priorEvent []byte
}

func newSplice(from *contFrom, rc io.ReadCloser, max int) *splice {
	return &splice{from: from, rc: rc, max: max, a: soFar{kind: from.kind}}
}

func (s *splice) Read(p []byte) (int, error) {
	for {
		if len(s.out) > 0 {
			n := copy(p, s.out)
			s.out = s.out[n:]
			return n, nil
		}
		if s.err != nil {
			return 0, s.err
		}
		if len(p) == 0 {
			return 0, nil
		}
		s.fill()
	}
}

// fill reads the stream once and decides what the bytes read mean.
func (s *splice) fill() {
	s.mu.Lock()
	rc, closed := s.rc, s.closed
	s.mu.Unlock()
	if closed {
		s.err = errReadOnClosedBody
		return
	}
	if s.buf == nil {
		s.buf = make([]byte, spliceBufSize)
	}
	n, err := rc.Read(s.buf)
	if s.raw {
		s.out = s.buf[:n]
		s.err = err
		return
	}
	s.out = s.obuf[:0] // (empty: fill is called when the caller has read it all)
	defer func() {
		if !s.raw {
			s.obuf = s.out[:0]
		}
	}()
	s.pend = append(s.pend, s.buf[:n]...)
	s.events(err != nil)
	switch {
	case s.raw:
		s.err = err
	case s.inband != nil:
		s.broke(s.inband)
	case err == nil && n == 0:
		if s.empty++; s.empty >= maxEmptyReads {
			s.broke(io.ErrNoProgress)
		}
	case err == nil:
		s.empty = 0
	case s.a.ended || s.a.finished:
		s.flush()
		s.err = err // the answer was whole: an error after it is the stream's own
	case err == io.EOF:
		s.broke(ErrStreamTruncated)
	default:
		s.broke(err)
	}
}

// events handles each event complete in pend (at the end of the stream,
// the last one needs no blank line after it), and keeps what is left.
func (s *splice) events(end bool) {
	off, from := 0, s.scan
	s.scan = 0
	for s.inband == nil && !s.raw {
		n, resume := eventScan(s.pend[off:], from, end)
		if n < 0 {
			s.scanned += int64(len(s.pend) - off - from)
		} else {
			s.scanned += int64(n - min(from, n))
		}
		if n < 0 {
			s.scan = resume
			break
		}
		from = 0
		if end && s.made == 0 && eventEnd(s.pend[off:off+n], false) != n {
			s.tail = string(s.pend[off+n-1]) // the line end that makes a blank line after it
		}
		s.event(s.pend[off : off+n])
		off += n
	}
	if off > 0 {
		s.pend = s.pend[:copy(s.pend, s.pend[off:])]
	}
	if len(s.pend) > maxSpliceEvent {
		if s.made > 0 && s.inband == nil {
			s.inband = errEventTooLarge
		}
		s.passRaw()
	}
	if s.raw {
		s.out = append(s.out, s.pend...)
		s.pend, s.scan = s.pend[:0], 0
	}
}

// passRaw has the stream passed on as it comes from now on (what is left
// of pend included): no longer read as events, never continued. Only the
// first stream can be: a continuation's must be rewritten to its end, so
// that one whose event outgrows the splice breaks, for good.
func (s *splice) passRaw() {
	if s.made > 0 {
		s.a.blocked = true
		return
	}
	s.raw = true
}

// flush passes on what is left of an event the stream did not complete.
func (s *splice) flush() {
	if s.made == 0 {
		s.out = append(s.out, s.pend...)
	}
	s.pend, s.scan = s.pend[:0], 0
}

// event handles one whole event, block being its bytes as they came.
func (s *splice) event(block []byte) {
	typ, data := eventFields(block)
	// The data is validated once, for classify's verdict and for read.
	d := bytes.TrimSpace(data)
	var js string
	verdict := eventContent // data deeper than any JSON this package reads, as data that is not JSON
	switch {
	case len(d) == 0 || d[0] != '{' || string(typ) == "error":
		verdict = classify(typ, d)
	case nestsShallow(d):
		if js = unsafe.String(unsafe.SliceData(d), len(d)); gjson.Valid(js) {
			verdict = classifyObject(typ, js) // read in place: nothing of it outlives the event
		} else {
			js = ""
		}
	}
	switch verdict {
	case eventError:
		s.inband = newStreamError(typ, data)
		s.errEvent = bytes.Clone(block)
		return
	}
	if s.made == 0 {
		s.a.read(typ, d, js)
		s.out = append(s.out, block...)
	} else {
		// A continuation's content counts once the caller gets some: of
		// a tool call made again, what it had is dropped.
		n := len(s.out)
		s.out = s.a.rewrite(s.out, typ, data)
		s.gave = s.gave || verdict == eventContent && len(s.out) > n
		if s.a.diverged {
			s.inband = errDiverged
			return
		}
	}
	if s.a.text.Len()+s.a.argBytes > int(s.from.t.readLimit()) {
		s.passRaw() // an answer too long to send again
	}
}

// broke handles the end of the stream read now before its answer's end,
// for cause: the continuation's stream takes its place, or the caller
// gets cause (or the error event that broke it).
func (s *splice) broke(cause error) {
	s.mu.Lock()
	rc, closed := s.rc, s.closed
	s.mu.Unlock()
	rc.Close()
	if closed || s.from.req.Context().Err() != nil {
		// The caller ended the stream (Close, its context): no break of
		// the upstream's, nothing to continue or report.
		s.flush()
		s.err = cause
		return
	}
	own, ownEvent := cause, s.errEvent
	if s.made > 0 && !s.gave {
		// The continuation broke before its content: the break it
		// continues is the stream's, not the continuation's own.
		own, ownEvent = s.prior, s.priorEvent
	}
	from, err := s.from.broken[len(s.from.broken)-1], error(nil)
	if s.a.blocked || s.a.finished || s.a.ended {
		err = errCannotContinue
	} else if s.made >= s.max {
		err = errContinueLimit
	} else {
		s.made++
		if err = s.resume(); err == nil {
			s.prior, s.priorEvent = own, ownEvent
			s.report(from, cause, nil)
			return
		}
	}
	s.report(from, cause, err)
	s.errEvent = nil
	if ownEvent != nil {
		s.out = append(s.out, ownEvent...)
		s.err = io.EOF // the SDK reads the error event as it would have
		return
	}
	s.flush()
	s.err = own
}

// resume sends the continuation and reads its stream from now on.
func (s *splice) resume() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errReadOnClosedBody
	}
	if s.cancel != nil {
		s.cancel() // the continuation before, whose stream broke
	}
	ctx, cancel := context.WithCancel(s.from.req.Context())
	s.cancel = cancel
	s.mu.Unlock()
	resp, u, err := s.from.send(ctx, s.a.text.String())
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		resp.Body.Close()
		return errReadOnClosedBody
	}
	s.rc = resp.Body
	s.from.broken = append(s.from.broken, u)
	s.out, s.tail = append(s.out, s.tail...), ""
	s.a.resumed()
	s.pend, s.scan, s.inband, s.errEvent, s.empty, s.gave = s.pend[:0], 0, nil, nil, 0, false
	return nil
}

// report tells the metrics, the log and the Trace how a break of from's
// stream for cause ended: continued, or not for err.
func (s *splice) report(from *upstream, cause, err error) {
	t, req := s.from.t, s.from.req
	to := ""
	if err == nil {
		to = s.from.broken[len(s.from.broken)-1].name
		from.m.continued.Inc()
		t.log(slog.LevelWarn, "stream continued", from, slog.String("to", to), slog.String("cause", t.scrub(cause, req, nil).Error()))
	} else {
		from.m.notContinued.Inc()
		t.log(slog.LevelWarn, "stream not continued", from, slog.String("cause", t.scrub(cause, req, nil).Error()), slog.String("error", t.scrub(err, req, nil).Error()))
	}
	if tr := requestTrace(req.Context()); tr != nil && tr.Continued != nil {
		tr.Continued(TraceContinued{From: from.name, To: to, Cause: t.scrub(cause, req, nil), Err: t.scrub(err, req, nil)})
	}
}

// errDiverged: a continuation did not make the caller's tool calls again.
var errDiverged = errors.New("failover: the continuation made other tool calls than the stream it continues")

// errEventTooLarge: a continuation's event outgrew maxSpliceEvent.
var errEventTooLarge = errors.New("failover: a continuation's stream event is larger than 1 MiB")

// errContinueLimit: the stream took ContinueConfig.Max continuations.
var errContinueLimit = errors.New("failover: the stream took its continuations")

// Close closes the stream read now and ends a continuation in flight.
func (s *splice) Close() error {
	s.mu.Lock()
	s.closed = true
	rc, cancel := s.rc, s.cancel
	s.mu.Unlock()
	if cancel != nil {
		defer cancel()
	}
	return rc.Close()
}

// eventEnd returns the length of the first event of b, up to and with the
// blank line that ends it, or -1 when b holds none whole. At the end of
// the stream (end), what is left is an event whether a blank line ends it
// or not, once a line ends it.
func eventEnd(b []byte, end bool) int {
	n, _ := eventScan(b, 0, end)
	return n
}

// eventScan is eventEnd with the scan begun at from, where a scan of b
// before it grew stopped: what is before from is lines none of which is
// blank, and maybe the start of a line that is not blank either. With no
// event whole in b, it also returns where the next scan may begin, so
// that an event that comes in many reads is scanned once, not once a read.
func eventScan(b []byte, from int, end bool) (n, resume int) {
	line := from // where the current line starts; -1: before from
	if from > 0 && b[from-1] != '\n' && b[from-1] != '\r' {
		line = -1
	}
	for i := from; i < len(b); i++ {
		c := b[i]
		if c != '\n' && c != '\r' {
			continue
		}
		next := i + 1
		if c == '\r' {
			if next == len(b) && !end {
				return -1, i // maybe a CRLF split between reads
			}
			if next < len(b) && b[next] == '\n' {
				next++
			}
		}
		if i == line {
			return next, 0 // a blank line
		}
		line, i = next, next-1
	}
	if end && line == len(b) && line > 0 {
		return line, 0
	}
	return -1, len(b)
}

// eventFields reads an event's type and data from its bytes.
func eventFields(block []byte) (typ, data []byte) {
	lines := 0
	for len(block) > 0 {
		i := bytes.IndexAny(block, "\r\n")
		line := block
		if i >= 0 {
			line, block = block[:i], block[i+1:]
		} else {
			block = nil
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(name) {
		case "event":
			typ = value
		case "data":
			if lines++; lines == 1 {
				data = value[:len(value):len(value)] // block's own bytes: a second line copies them
			} else {
				data = append(append(data, '\n'), value...)
			}
		}
	}
	return typ, data
}

// soFar is what a spliced stream's caller was sent: its text, whether it
// can be continued, and what the streams so far reported of their usage.
type soFar struct {
	kind     streamKind
	text     strings.Builder
	blocked  bool // it holds more than text (a tool call, several choices): it cannot be continued
	finished bool // a finish reason came
	ended    bool // the last event came: "[DONE]", message_stop

	// Chat: the first stream's id and created, as JSON.
	id, created string

	// Messages: the caller's content blocks, and the index in them of
	// each block of the stream read now (a continuation's).
	blocks []msgBlock
	index  map[int64]int
	trim   bool // the prefix lost trailing whitespace: the continuation's first text loses its leading whitespace

	prior usage // what the streams before reported, summed
	now   usage // what the stream read now reported, each figure's last report

	// Tool calls the caller was sent (chat: by index; Messages: the
	// tool_use blocks, in order). A continuation cannot take a tool call
	// as a prefix: it is asked to go on from the text, and makes the
	// calls again, of which the caller gets only what it lacks (regen).
	tools    []toolSoFar
	argBytes int  // the bytes of the tools' arguments, which count with the text against its bound
	regens   int  // tools that a continuation makes again: those of the streams before
	started  int  // Messages: tool_use blocks the continuation started
	cont     bool // the stream read now is a continuation
	diverged bool // the continuation made a tool call other than the caller's
}

type msgBlock struct {
	open, text bool
	tool       int // the index in tools of a tool_use block, else -1
}

// toolSoFar is one tool call the caller was sent.
type toolSoFar struct {
	name    string
	args    strings.Builder // its arguments so far
	block   int             // Messages: its block's index
	matched int             // the bytes of args that the continuation made again
	seen    bool            // the continuation began it again
}

// maxTools bounds the tool calls of a continued answer.
const maxTools = 64

// usage is a stream's usage report as paths ("input_tokens",
// "prompt_tokens_details.cached_tokens") to counts, or to amounts that
// need not be whole (OpenRouter's "cost").
type usage map[string]float64

// take records the counts of a usage object.
func (u *usage) take(obj gjson.Result) {
	if !obj.IsObject() {
		return
	}
	if *u == nil {
		*u = usage{}
	}
	obj.ForEach(func(k, v gjson.Result) bool {
		switch {
		case v.Type == gjson.Number:
			u.set(k.Str, v.Float())
		case v.IsObject():
			v.ForEach(func(k2, v2 gjson.Result) bool {
				if v2.Type == gjson.Number {
					(*u)[k.Str+"."+k2.Str] = v2.Float()
				}
				return true
			})
		}
		return true
	})
}

// set sets the count of path, a name that may point into a stream's
// buffer: a new one is cloned.
func (u usage) set(path string, v float64) {
	if _, ok := u[path]; !ok {
		path = strings.Clone(path)
	}
	u[path] = v
}

// read takes in one event of the first stream, its data d (trimmed): js
// when it is a valid JSON object, read in place ("" otherwise).
func (a *soFar) read(typ, d []byte, js string) {
	if string(d) == "[DONE]" {
		a.ended = true
		return
	}
	if js == "" {
		return
	}
	j := gjson.Parse(js) // what is kept of it is cloned
	switch a.kind {
	case kindChat:
		a.chat(j)
	case kindMessages:
		a.message(msgType(typ, j), j, false)
	}
}

// chat reads a chat completion chunk.
func (a *soFar) chat(j gjson.Result) {
	// One pass over each object, as classify reads them.
	j.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "id":
			if a.id == "" {
				a.id = strings.Clone(v.Raw)
			}
		case "created":
			if a.created == "" {
				a.created = strings.Clone(v.Raw)
			}
		case "usage":
			a.now.take(v)
		case "choices":
			v.ForEach(func(_, c gjson.Result) bool {
				a.choice(c)
				return true
			})
		}
		return true
	})
}

// chatTool reads a tool call's delta of a chat completion chunk.
func (a *soFar) chatTool(tc gjson.Result) {
	i := int(tc.Get("index").Int())
	switch {
	case a.blocked:
		return
	case i < 0 || i >= maxTools || i > len(a.tools):
		a.blocked = true
		return
	case i == len(a.tools):
		a.tools = append(a.tools, toolSoFar{})
	}
	t := &a.tools[i]
	if n := tc.Get("function.name").Str; n != "" {
		t.name += strings.Clone(n) // (tc is read in place)
	}
	a.addArgs(t, tc.Get("function.arguments").Str)
}

// choice reads one choice of a chat completion chunk.
func (a *soFar) choice(c gjson.Result) {
	c.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "index":
			if v.Int() != 0 {
				a.blocked = true // several choices
			}
		case "finish_reason":
			if nonEmpty(v) {
				a.finished = true
			}
		case "delta":
			v.ForEach(func(k, v gjson.Result) bool {
				switch k.Str {
				case "content":
					if v.Type == gjson.String {
						if v.Str != "" && len(a.tools) > 0 {
							a.blocked = true // text after a tool call: no prefix holds both
						}
						a.add(v.Str)
					}
				case "tool_calls":
					if !a.cont {
						v.ForEach(func(_, tc gjson.Result) bool {
							a.chatTool(tc)
							return true
						})
					}
				case "function_call", "refusal", "audio":
					if nonEmpty(v) {
						a.blocked = true
					}
				}
				return true
			})
		}
		return true
	})
}

func msgType(typ []byte, j gjson.Result) string {
	if t := j.Get("type").Str; t != "" {
		return t
	}
	return string(typ)
}

// message reads an Anthropic Messages event; cont says it is a
// continuation's, whose block indices are its own.
func (a *soFar) message(kind string, j gjson.Result, cont bool) {
	switch kind {
	case "message_start":
		a.now.take(j.Get("message.usage"))
	case "content_block_start":
		if cont {
			return // (rewriteMessage reads it)
		}
		cb := j.Get("content_block")
		b := msgBlock{open: true, tool: -1}
		switch cb.Get("type").Str {
		case "text":
			b.text = true
			if len(a.tools) > 0 {
				a.blocked = true // text after a tool call: no prefix holds both
			}
			a.add(cb.Get("text").Str)
		case "tool_use":
			if len(a.tools) >= maxTools {
				a.blocked = true
				break
			}
			b.tool = len(a.tools)
			a.tools = append(a.tools, toolSoFar{name: strings.Clone(cb.Get("name").Str), block: len(a.blocks)}) // (j is read in place)
		default:
			a.blocked = true // thinking, a server tool: not text
		}
		a.blocks = append(a.blocks, b)
	case "content_block_delta":
		if cont {
			return
		}
		d := j.Get("delta")
		switch d.Get("type").Str {
		case "text_delta":
			a.add(d.Get("text").Str)
		case "input_json_delta":
			if i := j.Get("index").Int(); i >= 0 && i < int64(len(a.blocks)) && a.blocks[i].tool >= 0 {
				a.addArgs(&a.tools[a.blocks[i].tool], d.Get("partial_json").Str)
			} else {
				a.blocked = true
			}
		default:
			a.blocked = true
		}
	case "content_block_stop":
		if i := j.Get("index").Int(); !cont && i >= 0 && i < int64(len(a.blocks)) {
			a.blocks[i].open = false
		}
	case "message_delta":
		a.now.take(j.Get("usage"))
		if nonEmpty(j.Get("delta.stop_reason")) {
			a.finished = true
		}
	case "message_stop":
		a.ended = true
	}
}

// resumed readies the answer for a continuation's stream.
func (a *soFar) resumed() {
	for k, v := range a.now {
		if a.prior == nil {
			a.prior = usage{}
		}
		a.prior[k] += v
	}
	a.now, a.index = nil, map[int64]int{}
	a.cont, a.regens, a.started = true, len(a.tools), 0
	for i := range a.tools {
		a.tools[i].matched, a.tools[i].seen = 0, false
	}
	if a.kind == kindMessages {
		s := a.text.String()
		a.trim = len(strings.TrimRightFunc(s, unicode.IsSpace)) < len(s)
	}
}

// rewrite appends to out one event of a continuation's stream, rewritten
// into the first's; or nothing, for an event the caller had already.
func (a *soFar) rewrite(out []byte, typ, data []byte) []byte {
	d := bytes.TrimSpace(data)
	if string(d) == "[DONE]" {
		a.ended = true
		return append(out, "data: [DONE]\n\n"...)
	}
	if len(d) == 0 || d[0] != '{' || !nestsShallow(d) || !gjson.ValidBytes(d) {
		return out // nothing an SDK reads: a comment, a keep-alive
	}
	j := gjson.ParseBytes(d)
	var m map[string]json.RawMessage
	if json.Unmarshal(d, &m) != nil {
		return out
	}
	switch a.kind {
	case kindChat:
		return a.rewriteChat(out, j, m)
	case kindMessages:
		return a.rewriteMessage(out, msgType(typ, j), j, m)
	}
	return out
}

// rewriteChat rewrites a continuation's chat completion chunk: the
// first's id, no role (the caller had it), the usage summed, and no
// chunk that says nothing new.
func (a *soFar) rewriteChat(out []byte, j gjson.Result, m map[string]json.RawMessage) []byte {
	a.chat(j)
	if a.id != "" {
		m["id"] = json.RawMessage(a.id)
	}
	if _, ok := m["created"]; ok && a.created != "" {
		m["created"] = json.RawMessage(a.created)
	}
	var choices []map[string]json.RawMessage
	if c, ok := m["choices"]; ok && json.Unmarshal(c, &choices) == nil && len(choices) > 0 {
		kept := choices[:0]
		for _, c := range choices {
			var delta map[string]json.RawMessage
			if json.Unmarshal(c["delta"], &delta) == nil {
				delete(delta, "role")
				if string(delta["content"]) == `""` {
					delete(delta, "content")
				}
				if _, ok := delta["content"]; ok && a.regenPending() {
					a.diverged = true // text where the caller's tool calls were to come again
					return out
				}
				if tc, ok := delta["tool_calls"]; ok {
					if tc = a.regenChat(tc); a.diverged {
						return out
					} else if tc == nil {
						delete(delta, "tool_calls")
					} else {
						delta["tool_calls"] = tc
					}
				}
				c["delta"] = marshalRaw(delta)
			}
			if !isNull(c["finish_reason"]) {
				if a.regenDone(); a.diverged {
					return out
				}
			}
			if len(delta) == 0 && isNull(c["finish_reason"]) && isNull(c["logprobs"]) {
				continue // a role chunk: the caller had it
			}
			kept = append(kept, c)
		}
		m["choices"] = marshalRaw(kept)
		if len(kept) == 0 && isNull(m["usage"]) {
			return out
		}
	}
	if u := j.Get("usage"); u.IsObject() {
		m["usage"] = a.summed(m["usage"])
	}
	return appendEvent(out, "", marshalRaw(m))
}

// regenChat rewrites a continuation's tool call deltas (raw, a JSON
// array): of a call the caller has, only the arguments past what it was
// sent, under its index (the caller has its id and name); a new call as it
// is. It returns nil when nothing is left.
func (a *soFar) regenChat(raw json.RawMessage) json.RawMessage {
	var tcs []map[string]json.RawMessage
	if json.Unmarshal(raw, &tcs) != nil {
		return raw
	}
	kept := tcs[:0]
	for _, tc := range tcs {
		j := gjson.ParseBytes(marshalRaw(tc))
		i := int(j.Get("index").Int())
		if i < 0 || i >= a.regens {
			a.blocked = true // its own call: a later continuation would have two to match
			kept = append(kept, tc)
			continue
		}
		rest, ok := a.regen(i, j.Get("function.name").Str, j.Get("function.arguments").Str)
		if !ok {
			a.diverged = true
			return nil
		}
		if rest == "" {
			continue
		}
		kept = append(kept, map[string]json.RawMessage{
			"index":    json.RawMessage(strconv.Itoa(i)),
			"function": marshalRaw(map[string]string{"arguments": rest}),
		})
	}
	if len(kept) == 0 {
		return nil
	}
	return marshalRaw(kept)
}

// regen takes in part of tool call i that a continuation makes again: its
// name, if it says one, and args, the next arguments. It returns the part
// of args the caller lacks, and false when the call is not the caller's
// (another name, other arguments).
func (a *soFar) regen(i int, name, args string) (string, bool) {
	t := &a.tools[i]
	t.seen = true
	if name != "" && name != t.name {
		return "", false
	}
	sent := t.args.String()
	if t.matched < len(sent) {
		n := min(len(args), len(sent)-t.matched)
		if args[:n] != sent[t.matched:t.matched+n] {
			return "", false
		}
		t.matched += n
		args = args[n:]
	}
	if args != "" {
		a.addArgs(t, args)
		t.matched += len(args)
	}
	return args, true
}

// regenPending reports whether a tool call of the caller's is still to be
// made again, whole.
func (a *soFar) regenPending() bool {
	for i := range a.regens {
		if t := &a.tools[i]; !t.seen || t.matched < t.args.Len() {
			return true
		}
	}
	return false
}

// regenDone checks, at the continuation's finish, that it made again
// every tool call the caller had, whole: otherwise the caller's calls
// would end where they broke off.
func (a *soFar) regenDone() {
	if a.regenPending() {
		a.diverged = true
	}
}

// rewriteMessage rewrites a continuation's Anthropic Messages event: no
// message start (the caller had one), its blocks after the caller's (its
// first text continuing the caller's open one), its usage summed.
func (a *soFar) rewriteMessage(out []byte, kind string, j gjson.Result, m map[string]json.RawMessage) []byte {
	a.message(kind, j, true)
	switch kind {
	case "message_start":
		return out
	case "content_block_start":
		i := j.Get("index").Int()
		cb := j.Get("content_block")
		typ := cb.Get("type").Str
		if a.started < a.regens {
			// The caller's tool calls come first, made again.
			if typ != "tool_use" {
				a.diverged = true // text before them: another answer
				return out
			}
			t := &a.tools[a.started]
			a.started++
			if _, ok := a.regen(a.started-1, cb.Get("name").Str, ""); !ok {
				a.diverged = true
				return out
			}
			a.index[i] = t.block
			return out // the caller has its start
		}
		if typ != "text" {
			a.blocked = true // its own tool call, thinking: a later continuation could not take it
		}
		if len(a.index) == 0 && typ == "text" && len(a.blocks) > 0 && a.blocks[len(a.blocks)-1].open && a.blocks[len(a.blocks)-1].text {
			a.index[i] = len(a.blocks) - 1 // it goes on with the caller's open text
			if t := a.trimmed(cb.Get("text").Str); t != "" {
				a.add(t)
				out = appendEvent(out, "content_block_delta", marshalRaw(map[string]any{
					"type": "content_block_delta", "index": len(a.blocks) - 1,
					"delta": map[string]string{"type": "text_delta", "text": t},
				}))
			}
			return out
		}
		out = a.closeOpen(out)
		a.index[i] = len(a.blocks)
		a.blocks = append(a.blocks, msgBlock{open: true, text: typ == "text", tool: -1})
		a.add(cb.Get("text").Str)
		m["index"] = json.RawMessage(strconv.Itoa(a.index[i]))
	case "content_block_delta", "content_block_stop":
		at, ok := a.index[j.Get("index").Int()]
		if !ok {
			return out // of no block it started
		}
		m["index"] = json.RawMessage(strconv.Itoa(at))
		if k := a.blocks[at].tool; k >= 0 && k < a.regens {
			// A tool call of the caller's, made again.
			if kind == "content_block_stop" {
				if t := &a.tools[k]; t.matched < t.args.Len() {
					a.diverged = true // it ends short of what the caller has
					return out
				}
				if !a.blocks[at].open {
					return out // the caller had its stop
				}
				a.blocks[at].open = false
				break
			}
			d := j.Get("delta")
			if d.Get("type").Str != "input_json_delta" {
				a.diverged = true
				return out
			}
			rest, ok := a.regen(k, "", d.Get("partial_json").Str)
			if !ok {
				a.diverged = true
				return out
			}
			if rest == "" {
				return out
			}
			m["delta"] = marshalRaw(map[string]string{"type": "input_json_delta", "partial_json": rest})
			break
		}
		if kind == "content_block_stop" {
			a.blocks[at].open = false
		} else if d := j.Get("delta"); d.Get("type").Str == "text_delta" {
			t := d.Get("text").Str
			if a.trim {
				if t = a.trimmed(t); t == "" {
					return out
				}
				m["delta"] = marshalRaw(map[string]string{"type": "text_delta", "text": t})
			}
			a.add(t)
		}
	case "message_delta":
		if a.regenDone(); a.diverged {
			return out
		}
		out = a.closeOpen(out)
		m["usage"] = a.summed(m["usage"])
	}
	return appendEvent(out, kind, marshalRaw(m))
}

// trimmed is a continuation's text t, its leading whitespace dropped when
// the prefix lost its trailing whitespace (which it stands for), until
// the first text that is not whitespace alone.
func (a *soFar) trimmed(t string) string {
	if !a.trim {
		return t
	}
	t = strings.TrimLeftFunc(t, unicode.IsSpace)
	if t != "" {
		a.trim = false
	}
	return t
}

// closeOpen appends a content_block_stop for each block of the streams
// before that is still open: a continuation's blocks come after them.
func (a *soFar) closeOpen(out []byte) []byte {
	for i := range a.blocks {
		if a.blocks[i].open && !a.mapped(i) {
			a.blocks[i].open = false
			out = appendEvent(out, "content_block_stop", []byte(`{"type":"content_block_stop","index":`+strconv.Itoa(i)+`}`))
		}
	}
	return out
}

// mapped reports whether block i of the caller's is one of the stream
// read now.
func (a *soFar) mapped(i int) bool {
	for _, v := range a.index {
		if v == i {
			return true
		}
	}
	return false
}

// summed is a continuation's usage object raw with each count the sum of
// what the streams before reported and what this one reported so far (a
// count it leaves out, such as a message_delta's input_tokens, too).
func (a *soFar) summed(raw json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		m = map[string]json.RawMessage{}
	}
	total := usage{}
	for k, v := range a.prior {
		total[k] += v
	}
	for k, v := range a.now {
		total[k] += v
	}
	for path, n := range total {
		parent, child, nested := strings.Cut(path, ".")
		if !nested {
			m[path] = json.RawMessage(strconv.FormatFloat(n, 'f', -1, 64))
			continue
		}
		var sub map[string]json.RawMessage
		if json.Unmarshal(m[parent], &sub) != nil || sub == nil {
			sub = map[string]json.RawMessage{}
		}
		sub[child] = json.RawMessage(strconv.FormatFloat(n, 'f', -1, 64))
		m[parent] = marshalRaw(sub)
	}
	return marshalRaw(m)
}

// appendEvent appends an event of type typ ("" for none) with data.
func appendEvent(out []byte, typ string, data []byte) []byte {
	if typ != "" {
		out = append(out, "event: "...)
		out = append(out, typ...)
		out = append(out, '\n')
	}
	out = append(out, "data: "...)
	out = append(out, data...)
	return append(out, "\n\n"...)
}

// marshalRaw is v as JSON, with <, > and & as they are.
func marshalRaw(v any) json.RawMessage {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if e.Encode(v) != nil {
		return json.RawMessage("null")
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

// addArgs adds s to the arguments so far of t, one of tools.
func (a *soFar) addArgs(t *toolSoFar, s string) {
	if a.blocked {
		return // held to be matched by a later continuation: there is none
	}
	t.args.WriteString(s)
	a.argBytes += len(s)
}

// add adds s to the text so far, while it can still be continued: the
// text is held for that alone.
func (a *soFar) add(s string) {
	if !a.blocked {
		a.text.WriteString(s)
	}
}
