package failover

import (
	"context"
	"fmt"
	"net/http"
	"slices"
)

// Served is what [ServedBy] tells of an answer the [Transport] returned:
// whose answer it is and how the request got there.
type Served struct {
	// Upstream is the Name of the upstream whose answer this is; empty
	// for an answer the Transport made itself for an SDK (see
	// [AnswerError]).
	Upstream string

	// Key is the Name of the upstream's key the answer was sent with
	// (Upstream.Keys); empty for an upstream without Keys.
	Key string

	// Attempt is the number of the attempt that got the answer, from 1,
	// and Attempts how many the request sent in all (hedges included).
	Attempt, Attempts int

	// Hedged says the answer came from a hedge (see [HedgeConfig]).
	Hedged bool

	// Problems are the misconfigurations behind an answer that is not a
	// success, as [UpstreamHealth.Problems] says them.
	Problems []string
}

// ServedBy returns what the Transport recorded of resp, an answer its
// RoundTrip returned, and true; false for a response it did not produce.
// It reads resp.Request, which the Transport sets; it works for streamed
// and hedged answers alike.
func ServedBy(resp *http.Response) (Served, bool) {
	if resp == nil || resp.Request == nil {
		return Served{}, false
	}
	c, ok := resp.Request.Context().Value(servedKey{}).(*servedCtx)
	if !ok || c.view.view != resp.Request {
		return Served{}, false // a request built on an answer's context is not its answer
	}
	s := Served{Upstream: c.upstream, Key: c.key.nameOf(), Attempt: int(c.attempt), Attempts: int(c.attempts), Hedged: c.hedged}
	if c.problems != nil {
		s.Problems = slices.Clone(*c.problems)
	}
	return s, true
}

// servedKey is the context key of an answer's servedCtx.
type servedKey struct{}

// servedRequest is an answer's Request as the Transport returns it: the
// request it had, in one allocation with a context that carries what
// ServedBy reads; an attempt's parts hold one (outParts).
type servedRequest struct {
	r   http.Request
	ctx servedCtx
}

// servedCtx is the context of an answer's Request: the one it had, with
// what ServedBy reads. Its view names the answer's Request; when the
// request it stands in for was a view (rewrite.go), it is that view's
// mark made out to it, so that a redirect that follows the answer finds
// the chain's first request as before.
type servedCtx struct {
	context.Context
	view              viewMark
	upstream          string
	key               *key // the upstream's key it went with; nil: none (Upstream.Keys)
	attempt, attempts int32
	hedged, isView    bool
	problems          *[]string // nil: none
}

func (c *servedCtx) Value(key any) any {
	switch key {
	case servedKey{}:
		return c
	case viewKey{}:
		if c.isView {
			return &c.view
		}
	}
	return c.Context.Value(key)
}

// String names it for a panic's or a log's %v, as context.WithValue's
// does.
func (c *servedCtx) String() string {
	return fmt.Sprintf("%v.WithValue(failover.servedKey)", c.Context)
}

// served marks resp, the answer RoundTrip returns for c, for ServedBy,
// and sets Config.ServedHeader on it; u is the upstream whose answer it
// is, nil for an answer the Transport made.
func (t *Transport) served(c *call, resp *http.Response, u *upstream, notes []string) *http.Response {
	prev := resp.Request
	if prev == nil {
		prev = c.req
	}
	sr := c.answerRoom // made with the attempt's parts, when it has them
	if sr == nil || u == nil {
		sr = new(servedRequest)
	}
	x := &sr.ctx
	x.Context, x.attempts = prev.Context(), c.sent
	if u != nil {
		x.upstream, x.key, x.attempt, x.hedged = u.name, c.answer.k, c.answer.n, c.answer.hedge
		if t.servedHeader != "" {
			if resp.Header == nil {
				resp.Header = http.Header{}
			}
			resp.Header[t.servedHeader] = []string{u.name}
		}
	}
	if len(notes) > 0 {
		x.problems = new([]string)
		*x.problems = notes
	}
	if m, ok := prev.Context().Value(viewKey{}).(*viewMark); ok && m.view == prev {
		x.view.origin, x.isView = m.origin, true
	}
	x.view.view = &sr.r
	sr.r = *prev.WithContext(x)
	resp.Request = &sr.r
	return resp
}
