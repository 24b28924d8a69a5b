// Package failovertest provides scripted upstreams for testing code that
// talks to LLM providers, through the failover transport or not.
//
//	primary := failovertest.NewServer(t,
//		failovertest.Step{Status: 503, Body: `{"error":{"message":"overloaded"}}`},
//		failovertest.Step{Body: `{"choices":[{"message":{"content":"hi"}}]}`},
//	)
//	backup := failovertest.NewServer(t, failovertest.Step{Body: `{"choices":[]}`})
//	// point failover.Upstream.BaseURL at primary.URL and backup.URL, send
//	// requests, then look at primary.Calls() and backup.Requests().
//
// A [Server] is a real HTTP server on a loopback address (an
// httptest.Server) that answers its n-th request with the n-th [Step] of its
// script, and every request after the script with the last step again: a
// status, headers, a body, a delay before the headers, server-sent event
// chunks. It records every request it receives ([Request]), lets a test
// wait for them ([Server.Received]) and shuts down when the test ends.
package failovertest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"time"
)

// Step is one scripted response. The zero Step is a 200 with no body.
type Step struct {
	// Status is the response's status code. Zero means 200.
	Status int

	// Header is sent with the response. When it has no Content-Type, the
	// Content-Type is text/event-stream for a step with Chunks,
	// application/json for a Body that is valid JSON, and what net/http
	// sniffs otherwise.
	Header http.Header

	// Body is written right after the headers.
	Body string

	// Delay is how long the server waits before it sends the headers. The
	// wait ends early, and nothing is sent, when the client gives up; when
	// the server shuts down, the connection is dropped. A Delay longer
	// than the client's timeout plays an upstream that hangs.
	Delay time.Duration

	// Chunks, when not nil, are written after Body one at a time, each
	// flushed to the client at once, as a server-sent event stream is:
	// each chunk is written as is, so it carries its own framing
	// ("data: {...}\n\n").
	Chunks []string

	// End says how a step with Chunks ends after its last chunk: as the
	// answer ends (the zero value), or as a stream that breaks.
	End End
}

// End is how a streamed step ends after its last chunk.
type End uint8

const (
	// EndDone ends the answer as HTTP ends it.
	EndDone End = iota
	// EndCut drops the connection, as a provider cut off mid-stream:
	// the client's read fails (io.ErrUnexpectedEOF over HTTP/1.1).
	EndCut
	// EndStall keeps the connection open and silent until the client
	// gives up or the server shuts down, as a provider that stalls.
	EndStall
)

// Request is a request as a Server received it.
type Request struct {
	Method   string
	Path     string     // decoded, as in url.URL.Path
	RawQuery string     // the query as sent, byte for byte
	Query    url.Values // the query, parsed
	Header   http.Header
	Body     []byte
}

// TB is the part of testing.TB that NewServer uses: *testing.T, *testing.B
// and *testing.F satisfy it, and so can code outside a test (an example, a
// local demo) that runs the cleanups itself.
type TB interface {
	Cleanup(func())
}

// Server is a scripted upstream: a loopback HTTP server that plays a script
// of responses, one per request, and records the requests. It is safe for
// concurrent use by multiple goroutines; concurrent requests get the steps
// in the order the server receives them.
type Server struct {
	// URL is the server's base URL, of the form http://ipaddr:port, with
	// no trailing slash.
	URL string

	srv    *httptest.Server
	steps  []Step
	closed chan struct{} // closed when the server shuts down

	mu      sync.Mutex
	reqs    []Request // every request received, in order
	waiters []waiter  // channels of Received not closed yet
}

// waiter is a channel to close once the server has received n requests.
type waiter struct {
	n  int
	ch chan struct{}
}

// NewServer starts a Server that plays steps and shuts it down when tb's
// test ends, through tb.Cleanup. The server answers its n-th request
// (counting from 0) with steps[n], and every request after the last step
// with the last step; with no steps, every request gets a 200 with no
// body. NewServer keeps its own copy of steps. It panics when a Status
// is neither 0 nor between 200 and 999.
func NewServer(tb TB, steps ...Step) *Server {
	s := &Server{closed: make(chan struct{})}
	for i, st := range steps {
		if st.Status != 0 && (st.Status < 200 || st.Status > 999) {
			panic(fmt.Sprintf("failovertest: steps[%d].Status %d is not a final HTTP status", i, st.Status))
		}
		st.Header = st.Header.Clone()
		st.Chunks = slices.Clone(st.Chunks)
		s.steps = append(s.steps, st)
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	tb.Cleanup(func() {
		close(s.closed) // ends every Delay, so that Close does not wait on it
		s.srv.Close()
	})
	return s
}

// Calls returns how many requests the server has received.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// Received returns a channel that is closed once the server has received n
// requests: a test can wait for a request to reach an upstream that hangs
// before it cancels the caller.
//
//	select {
//	case <-primary.Received(1):
//	case <-time.After(10 * time.Second):
//		t.Fatal("the primary got no request")
//	}
func (s *Server) Received(n int) <-chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) >= n {
		close(ch)
	} else {
		s.waiters = append(s.waiters, waiter{n, ch})
	}
	return ch
}

// Requests returns a copy of every request the server has received, in
// the order it received them.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.reqs))
	for i, r := range s.reqs {
		r.Query = cloneValues(r.Query)
		r.Header = r.Header.Clone()
		r.Body = slices.Clone(r.Body)
		out[i] = r
	}
	return out
}

func cloneValues(v url.Values) url.Values { return url.Values(http.Header(v).Clone()) }

// serve records r and answers it with the step of its turn.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body) // what arrived, even if the client gave up
	rec := Request{
		Method:   r.Method,
		Path:     r.URL.Path,
		RawQuery: r.URL.RawQuery,
		Query:    r.URL.Query(),
		Header:   r.Header.Clone(),
		Body:     body,
	}
	s.mu.Lock()
	n := len(s.reqs)
	s.reqs = append(s.reqs, rec)
	s.waiters = slices.DeleteFunc(s.waiters, func(w waiter) bool {
		if w.n <= n+1 {
			close(w.ch)
			return true
		}
		return false
	})
	s.mu.Unlock()

	var st Step
	if len(s.steps) > 0 {
		st = s.steps[min(n, len(s.steps)-1)]
	}
	if st.Delay > 0 {
		timer := time.NewTimer(st.Delay)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-r.Context().Done(): // the client gave up
			return
		case <-s.closed:
			panic(http.ErrAbortHandler) // drop the connection: no answer at all
		}
	}

	h := w.Header()
	for k, vs := range st.Header {
		h[k] = slices.Clone(vs)
	}
	if h.Get("Content-Type") == "" {
		switch {
		case st.Chunks != nil:
			h.Set("Content-Type", "text/event-stream")
		case json.Valid([]byte(st.Body)):
			h.Set("Content-Type", "application/json")
		}
	}
	w.WriteHeader(cmp.Or(st.Status, http.StatusOK))
	if _, err := io.WriteString(w, st.Body); err != nil {
		return
	}
	if st.Chunks == nil {
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	for _, c := range st.Chunks {
		if _, err := io.WriteString(w, c); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
	switch st.End {
	case EndCut:
		panic(http.ErrAbortHandler) // net/http drops the connection, quietly
	case EndStall:
		select {
		case <-r.Context().Done():
		case <-s.closed:
			panic(http.ErrAbortHandler)
		}
	}
}
