package failover

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"time"
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
}

// init prepares the caller's body: GetBody when set, else a buffer of at
// most max bytes.
func (b *replay) init(req *http.Request, max int64) error {
	b.first = req.Body
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		b.replayable = true
	case req.GetBody != nil:
		b.replayable = true
		b.getBody = req.GetBody
	case max < 0:
	default:
		data, err := io.ReadAll(io.LimitReader(req.Body, oneMore(max)))
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
// saturating at the largest int64 (a MaxBodyBuffer of math.MaxInt64 would
// wrap to a negative limit, which reads nothing).
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

// model reads the model of the request's body, for model mapping, and
// returns it with the body it is read from. It uses the body buffered for
// replay, or one read of GetBody; a body that cannot be replayed is left
// alone.
func (b *replay) model(max int64) (string, []byte) {
	data := b.buffered
	if data == nil && b.getBody != nil {
		rc, err := b.getBody()
		if err != nil {
			return "", nil
		}
		data, err = io.ReadAll(io.LimitReader(rc, oneMore(max)))
		rc.Close()
		if err != nil || int64(len(data)) > max {
			return "", nil
		}
	}
	if m, ok := requestModel(data); ok {
		return m, data
	}
	return "", nil
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

// cancelOnClose ends an attempt's context when the caller closes the body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// discard drains a response that will not be returned, so that its
// connection can be reused, and closes it. It reads at most maxDrain bytes
// for at most drainTimeout: a body that is larger or stalls costs its
// connection instead.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	readCapped(resp.Body, io.Discard, maxDrain, drainTimeout)
	resp.Body.Close()
}

// buffer reads body into memory (at most maxDrain bytes, for at most
// drainTimeout) and returns a body that reads the same bytes: from memory,
// with body closed, when it ended in time; otherwise what was read, then
// the rest of body.
func buffer(body io.ReadCloser) io.ReadCloser {
	if body == nil || body == http.NoBody {
		return body
	}
	var buf bytes.Buffer
	if _, err := readCapped(body, &buf, maxDrain+1, drainTimeout); err == io.EOF { // all of it, in time
		body.Close()
		return io.NopCloser(bytes.NewReader(buf.Bytes()))
	}
	return &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf.Bytes()), body), Closer: body}
}

// readCapped copies at most n bytes of body to w, closing body if that takes
// longer than timeout (a body that stalls then ends with an error). It
// returns the bytes copied and the error that ended the copy before n
// bytes, nil at the end of body.
func readCapped(body io.ReadCloser, w io.Writer, n int64, timeout time.Duration) (int64, error) {
	timer := time.AfterFunc(timeout, func() { body.Close() })
	defer timer.Stop()
	return io.CopyN(w, body, n)
}

// prefixedBody is a body whose first bytes were read already: Reader reads
// them, then the rest; Closer closes the original.
type prefixedBody struct {
	io.Reader
	io.Closer
}
