package failover

// Continuation: a streamed answer that breaks after its content began
// (cut, stalled, or ended by an error event) is continued by another
// upstream, from the answer so far as the assistant's prefix, and the
// two streams are spliced into one for the caller (splice.go). This file
// says when a stream may be continued, where, and with what request.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode"

	"github.com/tidwall/gjson"
)

// ContinueConfig turns on the continuation of streamed answers that break
// once they are the caller's (after their first content, or once the
// [StreamGuard] passed them on): the answer so far goes, as the assistant's
// prefix, to the next upstream whose [Upstream.Prefill] says how it takes
// one, and what it generates is spliced into the caller's stream. The
// caller reads one well-formed stream: one message start, contiguous
// indices, one finish reason, and a usage that adds what every upstream of
// the stream reported.
//
// The continuation is another generation, by another upstream and maybe
// another model: it reads the answer so far, but it is not the answer the
// first upstream would have given. Use it where a complete answer
// matters more than one model's voice.
//
// A stream breaks when its body fails (a cut connection, a silence past
// [Timeouts.Idle]), when it sends an error event after its content, or
// when it ends without its last event ("[DONE]", message_stop). Only
// OpenAI chat completions and Anthropic Messages streams with one choice,
// of text and tool calls so far, are continued; and never a request sent
// at most once ([WithoutFailover]) or one that references state an
// upstream holds ([PinConfig]). A prefix holds text alone: the
// continuation makes the caller's tool calls again, and the caller gets
// only the arguments it lacks. Where no upstream can continue it, or the
// continuation fails before its own content or makes other tool calls,
// the caller's read fails with the
// original cause, or gets the original error event: never the
// continuation's own error, never a stream that ends like a success.
//
// The zero value is off.
type ContinueConfig struct {
	// On turns continuation on for every upstream whose Prefill says how
	// it takes a prefix.
	On bool

	// Max is how many continuations one stream may take, from 1 to 4.
	// Zero means 1. Each takes a place in the retry budget
	// ([RetryConfig]) while it is sent, and is bounded by the request's
	// context.
	Max int
}

// maxContinuations bounds ContinueConfig.Max.
const maxContinuations = 4

func (c ContinueConfig) withDefaults() ContinueConfig {
	if c.Max == 0 {
		c.Max = 1
	}
	return c
}

func (c *ContinueConfig) validate() error {
	switch {
	case c.Max < 0:
		return configError("Continue.Max", "must not be negative")
	case c.Max > maxContinuations:
		return configError("Continue.Max", "must be at most 4")
	}
	return nil
}

// Prefill says how an upstream takes the answer so far as the prefix of
// its own (see [ContinueConfig]): providers differ, and some models refuse
// a prefix. The zero value takes none: the upstream never continues a
// stream.
type Prefill struct {
	// Chat says how the upstream's OpenAI chat completions continue a
	// trailing assistant message. Zero: they do not.
	Chat ChatPrefill

	// Messages says the upstream's Anthropic Messages continue an
	// assistant prefill (trailing whitespace trimmed, as the API
	// requires). Recent Claude models refuse prefill: leave it
	// false for them, or list the models that take it in Models.
	Messages bool

	// Models, when not empty, are the only models the upstream continues
	// for, as it names them (after [Upstream.Models]).
	Models []string
}

// ChatPrefill is how an upstream's chat completions take a trailing
// assistant message to continue.
type ChatPrefill uint8

const (
	// ChatNoPrefill: they do not.
	ChatNoPrefill ChatPrefill = iota
	// ChatTrailingAssistant: a trailing assistant message, as it is
	// (OpenRouter, Groq, Together, llama.cpp's server).
	ChatTrailingAssistant
	// ChatPrefixFlag: a trailing assistant message marked "prefix": true
	// (DeepSeek's beta API, Mistral).
	ChatPrefixFlag
	// ChatContinueFinal: a trailing assistant message, with
	// "continue_final_message": true and "add_generation_prompt": false
	// (vLLM, SGLang).
	ChatContinueFinal
)

func (p *Prefill) validate(field func(string) string) error {
	if p.Chat > ChatContinueFinal {
		return configError(field("Prefill.Chat"), "must be ChatNoPrefill, ChatTrailingAssistant, ChatPrefixFlag or ChatContinueFinal")
	}
	for j, m := range p.Models {
		if m == "" {
			return configError(field(fmt.Sprintf("Prefill.Models[%d]", j)), "must not be empty")
		}
	}
	return nil
}

// A streamKind is the dialect of a stream that can be continued.
type streamKind uint8

const (
	kindNone     streamKind = iota
	kindChat                // OpenAI chat completions: chat.completion.chunk events, then [DONE]
	kindMessages            // Anthropic Messages: message_start ... message_stop
)

// kindOf is the dialect of a request's answer, by its path.
func kindOf(path string) streamKind {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return kindChat
	case strings.HasSuffix(path, "/messages"):
		return kindMessages
	}
	return kindNone
}

// takes reports whether u continues a stream of kind for model ("" when
// the request names none).
func (u *upstream) takes(kind streamKind, model string) bool {
	p := &u.cfg.Prefill
	switch {
	case kind == kindChat && p.Chat == ChatNoPrefill, kind == kindMessages && !p.Messages, kind == kindNone:
		return false
	case len(p.Models) == 0 || model == "":
		return true // (a model not known yet is read before the continuation is sent)
	}
	if model != "" {
		if m, ok := u.models.lookup(model); ok {
			model = m
		}
	}
	return slices.Contains(p.Models, model)
}

// continuation is what a continued request carries to its call: the
// upstreams it may go to and the answer so far, which prepare turns into
// each upstream's body (see request.mapped).
type continuation struct {
	kind   streamKind
	ups    []*upstream // in the request's order, those that broke the stream left out
	prefix string      // the answer so far, with the caller's own prefill in front
	base   []byte      // the caller's body, its own trailing assistant message removed when it had one
	sent   int32       // the attempts the caller's request sent before, then with the continuation's
}

// bodyFor is the continued request's body for u: the caller's, with the
// answer so far as a trailing assistant message in u's dialect.
func (k *continuation) bodyFor(u *upstream) []byte {
	msg := []byte(`{"role":"assistant","content":`)
	prefix := k.prefix
	if k.kind == kindMessages {
		prefix = strings.TrimRightFunc(prefix, unicode.IsSpace) // the API refuses trailing whitespace
	}
	msg = appendJSONString(msg, prefix)
	if k.kind == kindChat && u.cfg.Prefill.Chat == ChatPrefixFlag {
		msg = append(msg, `,"prefix":true`...)
	}
	msg = append(msg, '}')
	body := appendMessage(k.base, msg)
	if k.kind == kindChat && u.cfg.Prefill.Chat == ChatContinueFinal {
		body = setTopLevel(body, `"continue_final_message":true,"add_generation_prompt":false`, "continue_final_message", "add_generation_prompt")
	}
	return body
}

// continuation is the stream whose continuation r is; nil for a request
// of the caller's.
func (r *request) continuation() *continuation {
	if r.opts == nil {
		return nil
	}
	return r.opts.cont
}

// continued is the body of r, the continuation k, for u: the answer so
// far in u's dialect, and the model as u's Models name it.
func (k *continuation) continued(r *request, u *upstream) []byte {
	body := k.bodyFor(u)
	if r.model != "" && len(u.models) > 0 {
		if target, ok := u.models.lookup(r.model); ok && target != r.model {
			if b, err := rewriteModel(body, target); err == nil {
				body = b
			}
		}
	}
	return body
}

// appendMessage returns a copy of body, a JSON object with a "messages"
// array, with msg appended to that array.
func appendMessage(body, msg []byte) []byte {
	ms := gjson.GetBytes(body, "messages")
	end := ms.Index + len(ms.Raw) - 1 // the array's ']'
	out := make([]byte, 0, len(body)+len(msg)+1)
	out = append(out, body[:end]...)
	if len(bytes.TrimSpace(body[ms.Index+1:end])) > 0 {
		out = append(out, ',')
	}
	out = append(out, msg...)
	return append(out, body[end:]...)
}

// setTopLevel returns a copy of body, a JSON object, with members (JSON
// text such as `"a":true`) added at its start, and no other member named
// in names: a later member of a name wins in most decoders.
func setTopLevel(body []byte, members string, names ...string) []byte {
	out := []byte("{" + members)
	gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
		if !slices.Contains(names, k.Str) {
			out = append(out, ',')
			out = append(out, k.Raw...)
			out = append(out, ':')
			out = append(out, v.Raw...)
		}
		return true
	})
	return append(out, '}')
}

// newContinuation makes the continuation of a stream of kind from the
// caller's body and the answer so far; it fails when the body cannot be
// continued (not a JSON object with messages, several choices, a trailing
// assistant message whose content is not text).
func newContinuation(kind streamKind, body []byte, answer string) (*continuation, error) {
	if !nestsShallow(body) || !gjson.ValidBytes(body) {
		return nil, errNotJSONObject
	}
	j := gjson.ParseBytes(body)
	ms := j.Get("messages")
	if !j.IsObject() || !ms.IsArray() || ms.Index <= 0 {
		return nil, errCannotContinue
	}
	if n := j.Get("n"); n.Exists() && n.Type != gjson.Null && n.Int() != 1 {
		return nil, errCannotContinue // one prefix cannot continue several choices
	}
	k := &continuation{kind: kind, base: body, prefix: answer}
	list := ms.Array()
	if len(list) == 0 {
		return nil, errCannotContinue
	}
	last := list[len(list)-1]
	if last.Get("role").Str != "assistant" {
		return k, nil
	}
	// The caller's own prefill: the answer continues it, so the prefix is
	// both, in one trailing message.
	own, ok := textOf(last.Get("content"))
	if !ok || last.Get("tool_calls").Exists() {
		return nil, errCannotContinue
	}
	k.prefix = own + answer
	start := ms.Index + strings.LastIndex(ms.Raw, last.Raw)
	cut := start
	for cut > ms.Index+1 && body[cut-1] != ',' && body[cut-1] != '[' {
		cut--
	}
	if body[cut-1] == ',' {
		cut--
	}
	k.base = slices.Concat(body[:cut], body[start+len(last.Raw):])
	return k, nil
}

// textOf reads a message's content as text: a string, or an array of text
// blocks or parts.
func textOf(c gjson.Result) (string, bool) {
	switch {
	case c.Type == gjson.String:
		return c.Str, true
	case !c.IsArray():
		return "", false
	}
	var b strings.Builder
	ok := true
	c.ForEach(func(_, part gjson.Result) bool {
		if part.Get("type").Str != "text" {
			ok = false
			return false
		}
		b.WriteString(part.Get("text").Str)
		return true
	})
	return b.String(), ok
}

// contFrom is what a stream's continuation is made from: the caller's
// request and the upstreams it may use, kept by the call that answered it.
type contFrom struct {
	t      *Transport
	req    *http.Request // the caller's, never modified
	kind   streamKind
	ups    []*upstream // the request's WithUpstreams list; nil: every upstream
	model  string      // the request's model, when the call read it
	broken []*upstream // the upstreams whose streams broke, first the one that answered
	sent   int32       // the attempts sent so far, continuations' included: a continuation's are numbered after them
	kept   []byte      // the body, when the call kept it in memory (no GetBody)
}

// continuable returns resp, the call's answer, with a body that continues
// the stream when it breaks (splice), when continuation is on and the
// answer is a stream of a dialect that can be continued, some other
// upstream may continue it, and the request may be sent again.
func (c *call) continuable(resp *http.Response) *http.Response {
	u := c.answer.u
	if resp == nil || u == nil || c.continuation() != nil || c.once() || c.pin != nil || !c.body.canSend() ||
		resp.StatusCode/100 != 2 || resp.Body == nil || resp.Body == http.NoBody || !isEventStream(resp.Header.Get("Content-Type")) {
		return resp
	}
	if !identity(resp.Header.Get("Content-Encoding")) {
		return resp // compressed at the caller's asking: the events cannot be read
	}
	kind := kindOf(c.req.URL.Path)
	if kind == kindNone {
		return resp
	}
	from := &contFrom{t: c.t, req: c.req, kind: kind, ups: c.ups, model: c.model, broken: []*upstream{u}, sent: c.sent}
	if len(from.others()) == 0 {
		return resp // no other upstream continues it
	}
	if c.req.GetBody == nil {
		if from.kept = c.body.buffered; from.kept == nil {
			return resp // nothing to send again
		}
	}
	resp.Body = newSplice(from, resp.Body, c.t.cont.Max)
	return resp
}

// others are the upstreams that may continue the stream, in the
// request's order: those that take a prefix of its kind for its model,
// and whose streams did not break.
func (f *contFrom) others() []*upstream {
	ups := f.ups
	if ups == nil {
		ups = f.t.upstreams
	}
	var out []*upstream
	for _, u := range ups {
		if !slices.Contains(f.broken, u) && u.takes(f.kind, f.model) {
			out = append(out, u)
		}
	}
	return out
}

// body returns the caller's body again.
func (f *contFrom) body() ([]byte, error) {
	if f.kept != nil {
		return f.kept, nil
	}
	rc, err := f.req.GetBody()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	limit := f.t.readLimit()
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, errCannotContinue
	}
	return data, nil
}

// send sends the continuation of the stream, answer being what the caller
// was sent so far, with ctx (the caller's, which Close of the spliced
// body ends). It returns the continuation's stream and its upstream, or
// an error when none may go or none came.
func (f *contFrom) send(ctx context.Context, answer string) (*http.Response, *upstream, error) {
	data, err := f.body()
	if err != nil {
		return nil, nil, err
	}
	if f.model == "" {
		f.model = gjson.GetBytes(data, "model").Str
	}
	ups := f.others()
	if len(ups) == 0 {
		return nil, nil, errNoContinuer
	}
	k, err := newContinuation(f.kind, data, answer)
	if err != nil {
		return nil, nil, err
	}
	k.ups, k.sent = ups, f.sent
	t := f.t
	if !t.retry.budget.take() {
		return nil, nil, errContinueBudget
	}
	defer t.retry.budget.done(1)
	body := k.bodyFor(ups[0])
	req := f.req.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
	req.Header.Del("Content-Length")
	req.Header.Del("Accept-Encoding") // the splice reads the events: net/http decompresses what it asked for
	req.TransferEncoding = nil
	resp, u, err := t.roundTrip(req, k)
	f.sent = k.sent
	switch {
	case err != nil:
		return nil, nil, err
	case resp.StatusCode/100 != 2 || !isEventStream(resp.Header.Get("Content-Type")):
		discard(resp)
		return nil, u, &continueRefused{status: resp.StatusCode}
	case !identity(resp.Header.Get("Content-Encoding")):
		discard(resp)
		return nil, u, errContinueEncoded
	}
	return resp, u, nil
}

// identity reports whether a Content-Encoding leaves the body as it is.
func identity(ce string) bool { return ce == "" || strings.EqualFold(ce, "identity") }

// Why a stream was not continued; the caller's read fails with the
// stream's own cause all the same, and these go to the log and the Trace.
var (
	errCannotContinue  = errors.New("failover: the answer so far cannot be continued")
	errNoContinuer     = errors.New("failover: no other upstream continues the stream")
	errContinueBudget  = errors.New("failover: the retry budget is spent")
	errContinueEncoded = errors.New("failover: the continuation's stream is compressed")
)

// continueRefused is a continuation answered with no stream.
type continueRefused struct{ status int }

func (e *continueRefused) Error() string {
	return fmt.Sprintf("failover: the continuation was answered %d", e.status)
}
