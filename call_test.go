package failover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"
)

// With Retries, the caller still gets the provider's answer when no
// upstream comes back in time, and that answer survives the wait whole.
func TestRetriesKeepTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, `{"error":"a overloaded"}`)
		n.status("b.test", 503, `{"error":"b overloaded"}`)
		tr := newTestTransport(t, twoUpstreams(n, Config{Retries: 1,
			Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: 2 * time.Minute}}))
		start := time.Now()
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/x", ""))
		if err != nil {
			t.Fatalf("got %v after %v, want the last 503", err, time.Since(start))
		}
		if got := readBody(t, resp); resp.StatusCode != 503 || got != `{"error":"b overloaded"}` {
			t.Fatalf("got %d %q", resp.StatusCode, got)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("waited %v for circuits that stay open for 2m", waited)
		}
	})
}

func TestMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var busy atomic.Bool
		busy.Store(true)
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if busy.Load() {
				return respond(429, "busy", "Retry-After", "2"), nil
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 429, "busy", "Retry-After", "4")
		tr := newTestTransport(t, twoUpstreams(n, Config{RateLimit: RateLimitConfig{MaxWait: 3 * time.Second}, Retry: RetryConfig{Off: true}}))
		get(t, tr, "http://a.test/") // both cool down now
		busy.Store(false)
		start := time.Now()
		code, err := get(t, tr, "http://a.test/")
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v; want a's 200 once its cooldown ended", code, err)
		}
		if waited := time.Since(start); waited != 2*time.Second {
			t.Fatalf("waited %v, want 2s", waited)
		}

		// Beyond MaxWait: no waiting, an error that says when.
		busy.Store(true)
		tr = newTestTransport(t, twoUpstreams(n, Config{RateLimit: RateLimitConfig{MaxWait: time.Second}, Retry: RetryConfig{Off: true}}))
		get(t, tr, "http://a.test/")
		start = time.Now()
		_, err = get(t, tr, "http://a.test/")
		var ra RetryAfterError
		if !errors.Is(err, ErrRateLimited) || !errors.As(err, &ra) || ra.RetryAfter() != 2*time.Second || time.Since(start) != 0 {
			t.Fatalf("err = %v after %v; want ErrRateLimited at once with RetryAfter 2s", err, time.Since(start))
		}

		// Never past the request's deadline.
		tr = newTestTransport(t, twoUpstreams(n, Config{RateLimit: RateLimitConfig{MaxWait: time.Minute}, Retry: RetryConfig{Off: true}}))
		get(t, tr, "http://a.test/")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start = time.Now()
		_, err = tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
		if !errors.Is(err, ErrRateLimited) || time.Since(start) != 0 {
			t.Fatalf("err = %v after %v; want ErrRateLimited at once: the cooldown outlasts the deadline", err, time.Since(start))
		}
	})
}

func TestRetryRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var calls atomic.Int32
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if calls.Add(1) <= 2 {
				return respond(503, "down"), nil
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 502, "bad gateway")
		tr := newTestTransport(t, twoUpstreams(n, Config{Retries: 2, RetryWaitMin: time.Second, RetryWaitMax: 10 * time.Second, Retry: RetryConfig{Off: true}}))
		start := time.Now()
		code, err := get(t, tr, "http://a.test/")
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v; want 200 in the third round", code, err)
		}
		// Rounds wait 1s then 2s (go-retryablehttp's DefaultBackoff).
		if waited := time.Since(start); waited != 3*time.Second {
			t.Fatalf("waited %v, want 3s", waited)
		}
		if n.count("b.test") != 2 {
			t.Fatalf("b got %d requests, want one per failed round", n.count("b.test"))
		}

		// A deadline shorter than the backoff ends the request with the
		// last answer instead of waiting.
		calls.Store(0)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start = time.Now()
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
		if err != nil || resp.StatusCode != 502 || time.Since(start) != 0 {
			t.Fatalf("got %v, %v after %v; want b's 502 at once", resp, err, time.Since(start))
		}
		resp.Body.Close()
	})
}

// failover_requests_total counts requests as their callers saw them: whose
// answer, and how the request went; failover_request_duration_seconds
// times each, by the same outcome.
func TestRequestsMetric(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 100}, LastResort: LastResortConfig{Off: true}, Retry: RetryConfig{Off: true}}))
		send := func(ctx context.Context) {
			t.Helper()
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", "").WithContext(ctx))
			if resp != nil {
				readBody(t, resp)
			} else if err == nil {
				t.Fatal("no response and no error")
			}
		}
		bg := context.Background()
		n.status("a.test", 200, "a")
		send(bg) // answered by a
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(3 * time.Second)
			return respond(503, "down"), nil
		})
		n.status("b.test", 200, "b")
		send(bg) // failed over to b, after 3s
		n.status("b.test", 503, "down too")
		send(bg) // failed: the caller gets b's 503
		n.status("a.test", 429, "slow", "Retry-After", "60")
		n.status("b.test", 429, "slow", "Retry-After", "60")
		send(bg) // failed: b's 429; both cool down
		send(bg) // unavailable: nothing is sent
		ctx, cancel := context.WithCancel(bg)
		cancel()
		send(ctx) // canceled

		for series, want := range map[string]float64{
			`failover_requests_total{upstream="a",outcome="answered"}`:     1,
			`failover_requests_total{upstream="b",outcome="failed_over"}`:  1,
			`failover_requests_total{upstream="b",outcome="failed"}`:       2,
			`failover_requests_total{upstream="",outcome="unavailable"}`:   1,
			`failover_requests_total{upstream="",outcome="canceled"}`:      1,
			`failover_requests_total{upstream="",outcome="failed"}`:        0,
			`failover_requests_total{upstream="a",outcome="failed_over"}`:  0,
			`failover_request_duration_seconds_count{outcome="answered"}`:  1,
			`failover_request_duration_seconds_sum{outcome="failed_over"}`: 3,
			`failover_request_duration_seconds_count{outcome="failed"}`:    2,
			`failover_request_duration_seconds_sum{outcome="failed"}`:      3,
			`failover_attempts_total{upstream="a",outcome="failed"}`:       2,
		} {
			if got := metricValue(t, tr, series); got != want {
				t.Errorf("%s = %v, want %v", series, got, want)
			}
		}
	})
}

// failover_stream_first_byte_seconds times a stream from the request's
// start to the first byte its caller reads.
func TestStreamFirstByteMetric(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(time.Second) // to headers
			r := respond(200, "", "Content-Type", "text/event-stream")
			r.Body = io.NopCloser(io.MultiReader(slowReader{2 * time.Second}, strings.NewReader("data: {}\n\ndata: [DONE]\n\n")))
			return r, nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", `{"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); !strings.HasSuffix(got, "[DONE]\n\n") {
			t.Fatalf("body %q", got)
		}
		for series, want := range map[string]float64{
			`failover_stream_first_byte_seconds_count{upstream="a"}`:    1,
			`failover_stream_first_byte_seconds_sum{upstream="a"}`:      3,
			`failover_request_duration_seconds_sum{outcome="answered"}`: 3, // held until the stream's first event: nothing was the caller's before
		} {
			if got := metricValue(t, tr, series); got != want {
				t.Errorf("%s = %v, want %v", series, got, want)
			}
		}
	})
}

// slowReader waits d, then reports the end of its (empty) content.
type slowReader struct{ d time.Duration }

func (r slowReader) Read([]byte) (int, error) {
	time.Sleep(r.d)
	return 0, io.EOF
}

// A request no upstream can send (an invalid header), or whose body fails
// to read, ends with Base's own error, which a Base that describes the
// request it was given may make quote the upstream's Header: what
// RoundTrip returns says the same without it, and unwraps to Base's error.
// Real server.
func TestCallersOwnErrorCarriesNoUpstreamKey(t *testing.T) {
	const upstreamKey = "sk-upstream-rejected-0123456789"
	errRead := errors.New("caller's body broke")
	for _, tt := range []struct {
		name, want string
		req        func(url string) *http.Request
	}{
		{"invalid header", "invalid header field value", func(url string) *http.Request {
			req := httptestRequest("GET", url, "")
			req.Header.Set("X-Trace", "a\nb") // net/http refuses to send it
			return req
		}},
		{"body fails", errRead.Error(), func(url string) *http.Request {
			req := httptestRequest("POST", url, "")
			req.Body = io.NopCloser(io.MultiReader(strings.NewReader("{"), iotest.ErrReader(errRead)))
			req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("{}")), nil }
			return req
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newUpstreamServer(t, 200, "ok")
			inner := http.DefaultTransport.(*http.Transport).Clone()
			t.Cleanup(inner.CloseIdleConnections)
			var baseErr error
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := inner.RoundTrip(r)
				if err != nil {
					baseErr = fmt.Errorf("%w (sent %v)", err, r.Header)
					return nil, baseErr
				}
				return resp, nil
			})
			tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{
				{Name: "a", BaseURL: srv.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + upstreamKey}}},
			}})
			_, err := tr.RoundTrip(tt.req(srv.URL + "/v1/chat"))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if !errors.Is(err, baseErr) {
				t.Errorf("err = %v does not unwrap to Base's", err)
			}
			if s := fmt.Sprintf("%v %+v", err, err); strings.Contains(s, upstreamKey) {
				t.Errorf("the caller's error shows the upstream's key: %s", s)
			}
		})
	}
}

// A body without GetBody that fails to read while the Transport buffers
// it for replay (Config.MaxBodyBuffer) is the caller's own fault, as
// RequestCanceled says: the Trace's Done and failover_requests_total say
// canceled, not unavailable (which says every upstream was passed over),
// and no upstream is sent anything or blamed.
func TestCallBufferedBodyReadErrorIsCallersOwn(t *testing.T) {
	srv := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}})
	broken := errors.New("the caller's file went away")
	req := httptestRequest("POST", srv.URL+"/v1/chat", "")
	req.Body, req.ContentLength = &failingBody{n: 10, err: broken}, -1
	var r recordTrace
	resp, err := tr.RoundTrip(traced(req, &r))
	if resp != nil || !errors.Is(err, broken) {
		t.Fatalf("got %v, %v; want the body's error", resp, err)
	}
	if r.done.Outcome != RequestCanceled || r.done.Attempts != 0 {
		t.Errorf("Done = %+v, want canceled with no attempt", r.done)
	}
	m := scrapeMetrics(tr)
	if !strings.Contains(m, `failover_requests_total{upstream="",outcome="canceled"} 1`) || strings.Contains(m, `failover_requests_total{upstream="",outcome="unavailable"} 1`) {
		t.Errorf("metrics:\n%s\nwant the request counted as canceled", seriesLines(m, "failover_requests_total"))
	}
	if h := tr.Health()[0]; srv.count() != 0 || h.LastError != "" || h.Requests.Total() != 0 {
		t.Errorf("the upstream got %d requests, health %+v; want none, and nothing counted", srv.count(), h)
	}
}

// A panic of the caller's own code on the request's goroutine (here a
// Router's, between rounds) closes the answer the call holds, as a
// discarded answer is: the held 503 from the first round, too large to be
// read into memory while the request waits, kept its connection out of
// the pool for good.
func TestPanicClosesHeldAnswer(t *testing.T) {
	checkHeldAnswerClosed(t, "panic", func() { panic("the Router's own bug") }, func(send func()) {
		defer func() {
			if v := recover(); v != "the Router's own bug" {
				t.Errorf("recovered %v, want the Router's panic", v)
			}
		}()
		send()
		t.Error("RoundTrip returned, want the Router's panic")
	})
}

// A Router that ends the request's goroutine (runtime.Goexit, as a
// t.FailNow in a test's Router does) between rounds closes the answer the
// call holds too: recover sees no panic then, and the held 503, too large
// to be read into memory, kept its connection for good.
func TestGoexitClosesHeldAnswer(t *testing.T) {
	checkHeldAnswerClosed(t, "Goexit", runtime.Goexit, func(send func()) {
		returned := false
		done := make(chan struct{})
		go func() {
			defer close(done)
			send()
			returned = true
		}()
		<-done
		if returned {
			t.Error("RoundTrip returned, want the Router's Goexit")
		}
	})
}

// checkHeldAnswerClosed sends a request over two upstreams that answer a
// 503 too large to be read into memory, with one more round, and a Router
// that calls fail when asked for the second; run calls send (which runs
// the request) and checks how it ended. Every answer Base gave must be
// closed after it.
func checkHeldAnswerClosed(t *testing.T, how string, fail func(), run func(send func())) {
	t.Helper()
	large := strings.Repeat("x", 2*maxDrain)
	a := newUpstreamServer(t, 503, large)
	b := newUpstreamServer(t, 503, large)
	var mu sync.Mutex
	var bodies []*closedBody
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	track := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := base.RoundTrip(r)
		if resp != nil {
			c := &closedBody{ReadCloser: resp.Body}
			mu.Lock()
			bodies = append(bodies, c)
			mu.Unlock()
			resp.Body = c
		}
		return resp, err
	})
	calls := 0
	r := orderFunc(func(dst []int, cands []Candidate) []int {
		if calls++; calls > 1 {
			fail()
		}
		for i := range cands {
			dst = append(dst, i)
		}
		return dst
	})
	tr := newTestTransport(t, Config{
		Base: track, Router: r, Retries: 1, RetryWaitMin: time.Millisecond, RetryWaitMax: time.Millisecond,
		Upstreams: []Upstream{{BaseURL: a.URL}, {BaseURL: b.URL}},
	})
	run(func() {
		resp, err := tr.RoundTrip(httptestRequest("GET", a.URL+"/v1/models", ""))
		if err == nil {
			resp.Body.Close()
		}
	})
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) == 0 {
		t.Fatalf("no upstream answered before the %s", how)
	}
	for i, c := range bodies {
		if !c.closed.Load() {
			t.Errorf("answer %d of %d was left open after the %s", i+1, len(bodies), how)
		}
	}
}

// closedBody is a body that says whether it was closed.
type closedBody struct {
	io.ReadCloser
	closed atomic.Bool
}

func (b *closedBody) Close() error {
	b.closed.Store(true)
	return b.ReadCloser.Close()
}

// Between rounds, an overloaded upstream's Retry-After is the wait, as a
// 503's is: Anthropic's 529 "overloaded" and Azure's millisecond header
// included. Before, a 529's Retry-After was ignored for the exponential
// backoff.
func TestBackoffHeedsRetryAfterOfEveryOverload(t *testing.T) {
	for _, c := range []struct {
		code   int
		header []string
	}{
		{503, []string{"Retry-After", "3"}},
		{529, []string{"Retry-After", "3"}},
		{529, []string{"X-Ms-Retry-After-Ms", "3000"}},
		{429, []string{"Retry-After-Ms", "3000"}},
	} {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			var calls atomic.Int32
			n.handle("a.test", func(*http.Request) (*http.Response, error) {
				if calls.Add(1) == 1 {
					return respond(c.code, "overloaded", c.header...), nil
				}
				return respond(200, "a"), nil
			})
			tr := newTestTransport(t, Config{Base: n, Retries: 1, Retry: RetryConfig{Off: true},
				Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
			start := time.Now()
			code, err := get(t, tr, "http://a.test/")
			if err != nil || code != 200 {
				t.Fatalf("%d %v: got %d, %v; want the second round's 200", c.code, c.header, code, err)
			}
			if waited := time.Since(start); waited != 3*time.Second {
				t.Errorf("%d %v: the second round came after %v, want after its Retry-After of 3s", c.code, c.header, waited)
			}
		})
	}
}
