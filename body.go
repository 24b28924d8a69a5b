package failover

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Bounds on reading the body of a response that is thrown away.
const (
	maxDrain     = 64 << 10
	drainTimeout = 250 * time.Millisecond
)

// replay gives each attempt the caller's body.
type replay struct {
	first      io.ReadCloser // the caller's Body, for the first attempt
	used       bool
	replayable bool
	buffered   []byte                        // the body, when the Transport buffered it
	getBody    func() (io.ReadCloser, error) // for the attempts after the first
	length     int64                         // the request's ContentLength: what data reads in one allocation
}

// init prepares the caller's body: GetBody when set, else a buffer of at
// most max bytes, read until the request's context ends (then the body is
// closed and init returns the context's error).
func (b *replay) init(req *http.Request, max int64) error {
	b.first, b.length = req.Body, req.ContentLength
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		b.replayable = true
	case req.GetBody != nil:
		b.replayable = true
		b.getBody = req.GetBody
	case max < 0:
	default:
		// Read within the request's context: when it ends, the body is
		// closed, as net/http closes it, which ends a read that stalls
		// (a pipe's, a connection's).
		var stop func() bool
		if ctx := req.Context(); ctx.Done() != nil {
			stop = context.AfterFunc(ctx, func() { req.Body.Close() })
		}
		data, err := io.ReadAll(io.LimitReader(req.Body, oneMore(max)))
		if stop != nil && !stop() {
			b.used = true // closed by the context's end
			return req.Context().Err()
		}
		if err != nil {
			req.Body.Close()
			b.used = true
			return err
		}
		if int64(len(data)) > max {
			// Too large to keep: one attempt, that streams the rest.
			b.first = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(data), req.Body), Closer: req.Body}
			return nil
		}
		req.Body.Close()
		b.buffered = data
		b.replayable = true
		b.getBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
		b.first, _ = b.getBody()
	}
	return nil
}

// oneMore is n+1, the read that tells a body of n bytes from a longer one,
// saturating at the largest int64.
func oneMore(n int64) int64 {
	if n == math.MaxInt64 {
		return n
	}
	return n + 1
}

func (b *replay) canSend() bool { return b.replayable || !b.used }

// next returns the body of the next attempt.
func (b *replay) next() (io.ReadCloser, error) {
	if !b.used {
		b.used = true
		return b.first, nil
	}
	if !b.replayable {
		return nil, ErrBodyNotReplayable
	}
	if b.getBody == nil {
		return b.first, nil // nil or http.NoBody
	}
	rc, err := b.getBody()
	if err != nil {
		return nil, &bodyError{err}
	}
	return rc, nil
}

// data returns the request's body for reading (its model, its session,
// the state it references): the body buffered for replay, or one read of
// GetBody; nil when it cannot be replayed or is larger than max.
func (b *replay) data(max int64) []byte {
	if b.buffered != nil || b.getBody == nil {
		return b.buffered
	}
	rc, err := b.getBody()
	if err != nil {
		return nil
	}
	defer rc.Close()
	var buf bytes.Buffer
	if n := b.length; n > 0 && n <= max {
		buf.Grow(int(n) + bytes.MinRead) // one allocation: ReadFrom grows a buffer with less room
	}
	if _, err := buf.ReadFrom(io.LimitReader(rc, oneMore(max))); err != nil || int64(buf.Len()) > max {
		return nil
	}
	return buf.Bytes()
}

// keep has the attempts after the first send data, the body as data
// returned it, rather than read GetBody again.
func (b *replay) keep(data []byte) {
	if data != nil && b.buffered == nil {
		b.buffered = data
		b.getBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	}
}

// closeUnused closes the caller's body when no attempt took it.
func (b *replay) closeUnused() {
	if !b.used && b.first != nil {
		b.first.Close()
	}
}

// bodyError is GetBody failing; it matches ErrBodyNotReplayable.
type bodyError struct{ err error }

func (e *bodyError) Error() string {
	return ErrBodyNotReplayable.Error() + ": GetBody: " + e.err.Error()
}
func (e *bodyError) Unwrap() []error { return []error{ErrBodyNotReplayable, e.err} }

// watchedBody is an attempt's body, watched for the caller's own faults (a
// read error, a length that disagrees with ContentLength), which must blame
// no upstream. Base may read it on a goroutine of its own, hence the
// atomics. Reads after Close are not judged: a transport that gave up on
// the connection closes the body under a read.
type watchedBody struct {
	rc     io.ReadCloser
	want   int64 // ContentLength, or -1 when unknown
	n      atomic.Int64
	closed atomic.Bool
	err    atomic.Pointer[error] // the caller's fault, once seen
	wrote  atomic.Bool           // Base wrote the request (a misfit's: see traced)
}

// memoryLen returns the bytes left in body when net/http knows it to be in
// memory: a *bytes.Reader, *strings.Reader or *bytes.Buffer, bare or in
// io.NopCloser. Such a body fails no read, and net/http writes headers and
// body at once.
func memoryLen(body io.Reader) (int64, bool) {
	// io.NopCloser's first (http.NewRequest wraps the three in it).
	for t := reflect.TypeOf(body); t == nopCloserType || t == nopCloserWriterToType; t = reflect.TypeOf(body) {
		body = nopCloserReader(body)
	}
	switch r := body.(type) {
	case *bytes.Reader:
		return int64(r.Len()), true
	case *strings.Reader:
		return int64(r.Len()), true
	case *bytes.Buffer:
		return int64(r.Len()), true
	}
	return 0, false
}

// watchBody returns the body to send for a request of ContentLength n and
// the watcher that tells the caller's faults (w, or a new one when w is
// nil), nil when there are none to tell. A body in memory of n bytes, the
// usual one, goes unwatched. One in memory that disagrees with n goes as
// it is, with the verdict held ahead, so that net/http fails it as a bare
// http.Transport would, before flushing its headers (see traced). Any other
// body is watched as it is read.
func watchBody(w *watchedBody, body io.ReadCloser, n int64) (io.ReadCloser, *watchedBody) {
	if body == nil || body == http.NoBody {
		return body, nil
	}
	if n > 0 {
		if left, ok := memoryLen(body); ok {
			if left == n {
				return body, nil
			}
			if w == nil {
				w = new(watchedBody)
			}
			w.watch(nil, n)
			w.err.Store(&errBodyLength)
			return body, w
		}
	}
	if w == nil {
		w = new(watchedBody)
	}
	w.watch(body, n)
	return w, w
}

// nopCloserReader returns the reader that body, of one of io.NopCloser's
// types, wraps: read through the interface's data pointer, which is cheaper
// than reflect, unless a Go release changed the types' layout.
func nopCloserReader(body io.Reader) io.Reader {
	if !nopCloserLayout {
		return reflect.ValueOf(body).Field(0).Interface().(io.Reader)
	}
	data := (*[2]unsafe.Pointer)(unsafe.Pointer(&body))[1]
	return *(*io.Reader)(data)
}

// The types io.NopCloser returns (one keeps its reader's WriteTo), which
// memoryLen looks through, as net/http does.
var (
	nopCloserType         = reflect.TypeOf(io.NopCloser(nil))
	nopCloserWriterToType = reflect.TypeOf(io.NopCloser(struct {
		io.Reader
		io.WriterTo
	}{}))

	// nopCloserLayout: both are a struct of one io.Reader at its start,
	// too large to be held in an interface's word, so held by pointer.
	nopCloserLayout = oneReader(nopCloserType) && oneReader(nopCloserWriterToType)
)

func oneReader(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t.NumField() == 1 &&
		t.Field(0).Type == reflect.TypeFor[io.Reader]() && t.Field(0).Offset == 0 &&
		t.Size() > unsafe.Sizeof(uintptr(0))
}

// traced returns req, whose body b watches, with a ClientTrace that tells
// b when Base has written it, when b is a misfit's (see watchBody), which
// reads nothing to tell; req itself otherwise. A Base other than net/http
// tells nothing, and its errors are then judged as any other.
func (b *watchedBody) traced(req *http.Request) *http.Request {
	if b == nil || b.rc != nil {
		return req
	}
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { b.wrote.Store(true) }}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
}

// errBodyLength is a body that disagrees with the request's ContentLength.
var errBodyLength = errors.New("failover: request body length differs from ContentLength")

func (b *watchedBody) watch(rc io.ReadCloser, contentLength int64) {
	b.rc, b.want = rc, contentLength
	if contentLength <= 0 {
		b.want = -1 // net/http reads a body of ContentLength 0 to its end
	}
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	total := b.n.Add(int64(n))
	if b.closed.Load() {
		return n, err
	}
	switch {
	case err != nil && err != io.EOF:
		e := err // a copy: &err would move err to the heap on every Read
		b.err.CompareAndSwap(nil, &e)
	case b.want >= 0 && (total > b.want || err == io.EOF && total != b.want):
		b.err.CompareAndSwap(nil, &errBodyLength)
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.closed.Store(true)
	return b.rc.Close()
}

// faulted reports whether err, an attempt's error, is the caller's own: a
// read error of the caller's body that err carries, or any error of an
// attempt whose body disagreed with its ContentLength (net/http fails such
// a request with an error of its own type).
func (b *watchedBody) faulted(err error) bool {
	if b.rc == nil && !b.wrote.Load() {
		return false // a misfit that Base failed before writing it
	}
	e := b.err.Load()
	return e != nil && (*e == errBodyLength || errors.Is(err, *e))
}

// releasingBody is an answer's body that ends its attempt's context, or
// releases it (an ownCtx), once the body is done: read to its end or to an
// error, or closed. A caller that reads an answer to its end and never
// closes it, under a context that lives on, leaves nothing registered on
// that context, as with a bare http.Transport.
type releasingBody struct {
	io.ReadCloser
	e ender
}

func (b *releasingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.e.closed()
	}
	return n, err
}

func (b *releasingBody) Close() error {
	err := b.ReadCloser.Close()
	b.e.closed()
	return err
}

// discard drains (at most maxDrain bytes, for at most drainTimeout) and
// closes a response that will not be returned, so that its connection can
// be reused. A stream (text/event-stream) is closed unread.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	if ct := resp.Header["Content-Type"]; len(ct) > 0 && isEventStream(ct[0]) {
		// Reading a stream only keeps its upstream generating (and
		// billing) longer.
		resp.Body.Close()
		return
	}
	readCapped(resp.Body, io.Discard, maxDrain, drainTimeout)
	resp.Body.Close()
}

// buffer reads body into memory (at most maxDrain bytes, for at most
// drainTimeout) and returns a body that reads the same bytes: from memory,
// with body closed, when it ended in time; otherwise what was read, then
// the rest of body (see peek: a body that stalls is not cut).
func buffer(body io.ReadCloser) io.ReadCloser {
	if body == nil || body == http.NoBody {
		return body
	}
	_, rc := peek(body, maxDrain+1, drainTimeout, nil)
	return rc
}

// readCapped copies at most n bytes of body to w, closing body if that takes
// longer than timeout. It is for bodies thrown away (discard); one that is
// handed on is peeked instead.
func readCapped(body io.ReadCloser, w io.Writer, n int64, timeout time.Duration) (int64, error) {
	timer := time.AfterFunc(timeout, func() { body.Close() })
	defer timer.Stop()
	return io.CopyN(w, body, n)
}

// peek reads the first bytes of body, for at most timeout, to judge a
// response by them: at most n bytes, until body ends, or until enough (nil:
// never) says it has what it wants and how many bytes to judge (all when
// negative), so that the verdict does not depend on how reads split the
// body. It returns the bytes to judge and a body that reads from the first
// byte. A body that ended is handed back from memory and body is closed; a
// body that stalls is not cut: the pending read goes on behind the
// returned body. The bytes returned are never written again.
func peek(body io.ReadCloser, n int, timeout time.Duration, enough func([]byte) (bool, int)) ([]byte, io.ReadCloser) {
	p := &peekedBody{body: body, done: make(chan struct{}), judged: -1}
	go p.readAhead(n, enough)
	timer := time.NewTimer(timeout)
	select {
	case <-p.done:
		timer.Stop()
		if p.err == io.EOF {
			body.Close()
			prefix := p.buf
			if p.judged >= 0 {
				prefix = p.buf[:p.judged:p.judged]
			}
			m := &memoryBody{prefix: prefix}
			m.r.Reset(p.buf)
			return prefix, m
		}
	case <-timer.C:
		p.handed.Store(true) // the read-ahead stops after the read in progress
	}
	p.mu.Lock()
	end := len(p.buf)
	if p.judged >= 0 {
		end = p.judged
	}
	p.prefix = p.buf[:end:end]
	p.mu.Unlock()
	return p.prefix, p
}

// peekedBody is a response body whose first bytes were read ahead (peek)
// before the response was judged: Read reads them, then the rest of body.
type peekedBody struct {
	body   io.ReadCloser
	prefix []byte        // the bytes the response was judged by (see BodyPrefix)
	done   chan struct{} // closed when the read-ahead has stopped
	handed atomic.Bool   // the caller has the body: the read-ahead stops
	mu     sync.Mutex    // guards buf's header and judged until done
	buf    []byte        // the bytes read ahead: all of them once done
	judged int           // of buf, the bytes to judge, as enough said (-1: all)
	err    error         // the error that stopped the read-ahead, if any (set before done)
	off    int           // bytes of buf Read has returned
	closed atomic.Bool   // Close was called: Read returns nothing more
}

// readAhead reads body into buf (see peek).
func (p *peekedBody) readAhead(n int, enough func([]byte) (bool, int)) {
	defer close(p.done)
	// judge reports whether enough is done with the bytes read, keeping
	// how many of them it judges.
	judge := func() bool {
		if enough == nil {
			return false
		}
		done, judged := enough(p.buf)
		if done {
			p.mu.Lock()
			p.judged = judged
			p.mu.Unlock()
		}
		return done
	}
	chunk := make([]byte, min(n, 4<<10))
	for !p.handed.Load() && !judge() && len(p.buf) < n {
		k, err := p.body.Read(chunk[:min(n-len(p.buf), len(chunk))])
		p.mu.Lock()
		p.buf = append(p.buf, chunk[:k]...)
		p.mu.Unlock()
		if err != nil {
			p.err = err
			judge() // the last bytes may hold the end
			return
		}
	}
}

func (p *peekedBody) Read(b []byte) (int, error) {
	if p.closed.Load() {
		return 0, errReadOnClosedBody // not the bytes read ahead either
	}
	<-p.done
	if p.off < len(p.buf) {
		k := copy(b, p.buf[p.off:])
		p.off += k
		return k, nil
	}
	if p.err != nil {
		return 0, p.err
	}
	return p.body.Read(b)
}

// Close closes body, which ends a read-ahead still waiting on it.
func (p *peekedBody) Close() error {
	p.closed.Store(true)
	return p.body.Close()
}

// errReadOnClosedBody is what a body the Transport read ahead returns when
// read after Close: net/http's own error for a response body then (its
// value is not exported).
var errReadOnClosedBody = errors.New("http: read on closed response body")

// memoryBody is a peeked body that ended within the bytes read ahead.
// After Close it reads nothing more, as net/http's own body does.
type memoryBody struct {
	r      bytes.Reader
	prefix []byte
	closed atomic.Bool
}

func (b *memoryBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errReadOnClosedBody
	}
	return b.r.Read(p)
}

func (b *memoryBody) Close() error {
	b.closed.Store(true)
	return nil
}

// jsonEnd finds where the JSON object or array that a body begins with
// ends, scanning each byte once however often it is asked.
type jsonEnd struct {
	off                      int // bytes scanned
	depth                    int
	started, str, esc, whole bool // whole: the object or array has ended, at off
}

// judge is done for peek: whether the body's first bytes say all they
// will, and, when they hold a whole object or array, its length: the bytes
// after it in the same read are not judged.
func (s *jsonEnd) judge(b []byte) (bool, int) {
	if !s.done(b) {
		return false, -1
	}
	if s.whole {
		return true, s.off
	}
	return true, -1
}

// done reports whether b, the body's first bytes (a longer b each time it
// is asked), holds a whole object or array, or begins with anything else:
// either way its first bytes say all they will.
func (s *jsonEnd) done(b []byte) bool {
	for ; s.off < len(b); s.off++ {
		c := b[s.off]
		switch {
		case s.str:
			switch {
			case s.esc:
				s.esc = false
			case c == '\\':
				s.esc = true
			case c == '"':
				s.str = false
			}
		case c == '{' || c == '[':
			s.depth++
			s.started = true
		case c == '}' || c == ']':
			if s.depth--; s.depth <= 0 {
				s.off++
				s.whole = true
				return true
			}
		case c == '"' && s.started:
			s.str = true
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
		case !s.started:
			return true // not an object or an array
		}
	}
	return false
}

// prefixedBody is a body whose first bytes were read already: Reader reads
// them, then the rest; Closer closes the original.
type prefixedBody struct {
	io.Reader
	io.Closer
}
