package failover

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"
)

// abcUpstreams is twoUpstreams with a third, c.
func abcUpstreams(n *fakeNet, cfg Config) Config {
	cfg.Base = n
	cfg.Upstreams = []Upstream{{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test"}, {Name: "c", BaseURL: "http://c.test"}}
	return cfg
}

// send sends one request through tr with ctx.
func send(tr http.RoundTripper, ctx context.Context, method, url, body string) (*http.Response, error) {
	return tr.RoundTrip(httptestRequest(method, url, body).WithContext(ctx))
}

// status sends a GET through tr with ctx and returns the status (0 with
// an error) and the error.
func status(t *testing.T, tr http.RoundTripper, ctx context.Context, url string) (int, error) {
	t.Helper()
	resp, err := send(tr, ctx, "GET", url, "")
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// metric returns the value of one series of tr's metrics, "" when it is
// not written.
func metric(tr *Transport, series string) string {
	var b strings.Builder
	tr.WritePrometheus(&b)
	for l := range strings.Lines(b.String()) {
		if v, ok := strings.CutPrefix(strings.TrimSuffix(l, "\n"), series+" "); ok {
			return v
		}
	}
	return ""
}

// counts returns how many requests each host of n received.
func counts(n *fakeNet, hosts ...string) []int {
	out := make([]int, len(hosts))
	for i, h := range hosts {
		out[i] = n.count(h)
	}
	return out
}

// open opens u's circuit (FailureThreshold 1) with one failing request
// restricted to it, and makes it fail from then on.
func open(t *testing.T, tr *Transport, n *fakeNet, name string) {
	t.Helper()
	n.status(name+".test", 503, name+" down")
	status(t, tr, WithUpstreams(context.Background(), name), "http://a.test/")
	for _, h := range tr.Health() {
		if h.Name == name && h.State != "open" {
			t.Fatalf("%s is %s, want open", name, h.State)
		}
	}
}

// The list is the order: c, then a; b is never considered, so neither the
// Trace nor failover_skipped_total mentions it, and the Router is not
// asked.
func TestWithUpstreamsOrder(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "a down")
	n.status("b.test", 200, "b")
	n.status("c.test", 503, "c down")
	router := &countingRouter{}
	tr := newTestTransport(t, abcUpstreams(n, Config{Router: router}))
	var r recordTrace
	ctx := WithTrace(WithUpstreams(context.Background(), "c", "a"), r.trace())
	code, err := status(t, tr, ctx, "http://a.test/v1/chat")
	if err != nil || code != 503 {
		t.Fatalf("%d %v, want a's 503: b is not in the list", code, err)
	}
	if got := counts(n, "a.test", "b.test", "c.test"); !slices.Equal(got, []int{1, 0, 1}) {
		t.Errorf("a, b, c got %v requests, want [1 0 1]", got)
	}
	r.check(t,
		"start 1 c hedge=false",
		"done 1 c failed 503 abandoned=false",
		"start 2 a hedge=false",
		"done 2 a failed 503 abandoned=false",
		"end failed a #2 of 2 503")
	if router.calls != 0 {
		t.Errorf("the Router was asked %d times for a restricted request", router.calls)
	}
	if got := metric(tr, `failover_failovers_total{from="c",to="a"}`); got != "1" {
		t.Errorf("failovers c to a = %q, want 1", got)
	}

	// Without a list, the same Transport asks its Router, over every
	// upstream.
	if code, _ := status(t, tr, context.Background(), "http://a.test/v1/chat"); code != 200 || router.calls != 1 {
		t.Errorf("without a list: %d, router asked %d times; want b's 200 and one call", code, router.calls)
	}
}

// countingRouter is Priority, counting its calls.
type countingRouter struct {
	mu    sync.Mutex
	calls int
}

func (r *countingRouter) Order(dst []int, cands []Candidate) []int {
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	return Priority{}.Order(dst, cands)
}

// Within the list, admission still skips an open upstream, with its
// reason in the Trace and the metrics; an upstream left out counts no
// skip. A demoted one (out of headroom) goes after the list's others.
func TestWithUpstreamsAdmission(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 200, "a")
	n.status("b.test", 200, "b")
	tr := newTestTransport(t, abcUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
	open(t, tr, n, "c")
	open(t, tr, n, "b")
	before := counts(n, "a.test", "b.test", "c.test")

	var r recordTrace
	ctx := WithTrace(WithUpstreams(context.Background(), "c", "a"), r.trace())
	n.status("a.test", 200, "a")
	if code, err := status(t, tr, ctx, "http://b.test/"); err != nil || code != 200 {
		t.Fatalf("%d %v, want a's 200", code, err)
	}
	r.check(t,
		"skip c circuit_open",
		"start 1 a hedge=false",
		"done 1 a success 200 abandoned=false",
		"end failed_over a #1 of 1 200")
	if got := metric(tr, famSkipped.series("c", "circuit_open")); got != "1" {
		t.Errorf("c skipped for its circuit %q times, want 1", got)
	}
	if got := metric(tr, famSkipped.series("b", "circuit_open")); got != "0" {
		t.Errorf("b, open but left out of the list, skipped %q times, want 0", got)
	}
	after := counts(n, "a.test", "b.test", "c.test")
	if after[1] != before[1] || after[2] != before[2] {
		t.Errorf("b and c got requests: %v then %v", before, after)
	}

	// a says it has no requests left: it is tried after the list's
	// others, as demoted upstreams are.
	n.status("a.test", 200, "a", "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "30s")
	status(t, tr, WithUpstreams(context.Background(), "a"), "http://a.test/")
	if h := tr.Health()[0]; h.Demoted != ReasonOutOfHeadroom {
		t.Fatalf("a is demoted for %q, want %q", h.Demoted, ReasonOutOfHeadroom)
	}
	tr.Reset("b")
	n.status("b.test", 200, "b")
	r = recordTrace{}
	ctx = WithTrace(WithUpstreams(context.Background(), "a", "b"), r.trace())
	if code, err := status(t, tr, ctx, "http://a.test/"); err != nil || code != 200 {
		t.Fatalf("%d %v", code, err)
	}
	r.check(t,
		"start 1 b hedge=false",
		"done 1 b success 200 abandoned=false",
		"end answered b #1 of 1 200")
}

// A name no upstream has is an error that names it: nothing is sent, the
// body is closed, no upstream counts anything, and the Trace says the
// request was the caller's fault. So is an empty list.
func TestWithUpstreamsUnknown(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 200, "a")
	n.status("b.test", 200, "b")
	tr := newTestTransport(t, twoUpstreams(n, Config{}))
	for _, tc := range []struct {
		names   []string
		unknown []string
		msg     string
	}{
		{[]string{"b", "nope", "a", "nope", "zip"}, []string{"nope", "zip"},
			`failover: unknown upstreams "nope", "zip" in WithUpstreams; the upstreams are "a", "b"`},
		{[]string{"A"}, []string{"A"}, `failover: unknown upstream "A" in WithUpstreams; the upstreams are "a", "b"`},
		{nil, nil, `failover: WithUpstreams names no upstream; the upstreams are "a", "b"`},
	} {
		var r recordTrace
		ctx := WithTrace(WithUpstreams(context.Background(), tc.names...), r.trace())
		req := httptestRequest("POST", "http://a.test/v1/chat", chatBody).WithContext(ctx)
		body := &closeCounter{Reader: strings.NewReader(chatBody)}
		req.Body, req.GetBody = body, nil
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			t.Fatalf("%q: got a response", tc.names)
		}
		var ue *UnknownUpstreamError
		if !errors.Is(err, ErrUnknownUpstream) || !errors.As(err, &ue) {
			t.Fatalf("%q: %v, want an *UnknownUpstreamError", tc.names, err)
		}
		if !slices.Equal(ue.Names, tc.unknown) || !slices.Equal(ue.Upstreams, []string{"a", "b"}) {
			t.Errorf("%q: Names %q, Upstreams %q; want %q and [a b]", tc.names, ue.Names, ue.Upstreams, tc.unknown)
		}
		if err.Error() != tc.msg {
			t.Errorf("%q: error %q, want %q", tc.names, err, tc.msg)
		}
		if body.closed != 1 {
			t.Errorf("%q: body closed %d times, want 1", tc.names, body.closed)
		}
		if r.done.Outcome != RequestCanceled || !errors.Is(r.done.Err, ErrUnknownUpstream) || r.done.Attempts != 0 {
			t.Errorf("%q: Done %+v, want canceled with the error and no attempt", tc.names, r.done)
		}
		r.check(t, "end canceled  #0 of 0 0")
	}
	if got := counts(n, "a.test", "b.test"); !slices.Equal(got, []int{0, 0}) {
		t.Errorf("a and b got %v requests, want none", got)
	}
	for _, h := range tr.Health() {
		if h.Requests.Total() != 0 || h.LastError != "" {
			t.Errorf("%s counts %+v, last error %q: no upstream is to blame", h.Name, h.Requests, h.LastError)
		}
	}
	if got := metric(tr, famRequests.series("", "canceled")); got != "3" {
		t.Errorf("canceled requests %q, want 3", got)
	}
}

// A name given twice keeps its first place; WithUpstreams keeps its own
// copy of the names; a later WithUpstreams replaces the list.
func TestWithUpstreamsNames(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "a down")
	n.status("b.test", 503, "b down")
	n.status("c.test", 503, "c down")
	tr := newTestTransport(t, abcUpstreams(n, Config{Retry: RetryConfig{Off: true}}))
	names := []string{"b", "b", "a", "b"}
	ctx := WithUpstreams(context.Background(), names...)
	names[0] = "c"
	status(t, tr, ctx, "http://a.test/")
	if got := counts(n, "a.test", "b.test", "c.test"); !slices.Equal(got, []int{1, 1, 0}) {
		t.Errorf("a, b, c got %v, want [1 1 0]", got)
	}
	status(t, tr, WithUpstreams(ctx, "c"), "http://a.test/")
	if got := counts(n, "a.test", "b.test", "c.test"); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("after WithUpstreams(c): a, b, c got %v, want [1 1 1]", got)
	}
}

// When every upstream of the list is open, the last resort is the list's:
// the one of the list that opened first, never another, even one that
// opened before.
func TestWithUpstreamsLastResort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		tr := newTestTransport(t, abcUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		open(t, tr, n, "c")
		time.Sleep(time.Millisecond)
		n.status("c.test", 200, "c")
		open(t, tr, n, "a")
		time.Sleep(time.Millisecond)
		open(t, tr, n, "b")
		n.status("a.test", 200, "a")
		n.status("b.test", 200, "b")
		var r recordTrace
		ctx := WithTrace(WithUpstreams(context.Background(), "b", "a"), r.trace())
		if code, err := status(t, tr, ctx, "http://c.test/"); err != nil || code != 200 {
			t.Fatalf("%d %v, want the last resort's answer", code, err)
		}
		r.check(t,
			"skip b circuit_open",
			"skip a circuit_open",
			"start 1 a hedge=false",
			"done 1 a success 200 abandoned=false",
			"end failed_over a #1 of 1 200")
		if n.count("c.test") != 1 {
			t.Errorf("c, open first but left out of the list, got %d requests, want only the one that opened it", n.count("c.test"))
		}
	})
}

// A request whose list is cooling down waits (RateLimit.MaxWait) for the
// list's first to come back, whatever the upstreams left out are doing.
func TestWithUpstreamsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 200, "a")
		n.status("b.test", 429, "busy", "Retry-After", "1")
		tr := newTestTransport(t, twoUpstreams(n, Config{RateLimit: RateLimitConfig{MaxWait: 2 * time.Second}}))
		ctx := WithUpstreams(context.Background(), "b")
		status(t, tr, ctx, "http://a.test/")
		n.status("b.test", 200, "b")
		start := time.Now()
		resp, err := send(tr, ctx, "GET", "http://a.test/", "")
		if err != nil || readBody(t, resp) != "b" || time.Since(start) != time.Second {
			t.Fatalf("%v after %v, want b's answer after its 1s cooldown", err, time.Since(start))
		}
		if n.count("a.test") != 0 {
			t.Errorf("a got %d requests", n.count("a.test"))
		}
	})
}

// WithUpstreams with a hedge: the hedge goes to the next upstream of the
// list.
func TestWithUpstreamsHedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("c.test", slowly(time.Second, "slow c", new(atomic.Int32)))
		n.status("a.test", 200, "a")
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, abcUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 10 * time.Millisecond, Percent: 100}}))
		var r recordTrace
		ctx := WithTrace(WithUpstreams(context.Background(), "c", "a"), r.trace())
		if code, err := status(t, tr, ctx, "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("%d %v", code, err)
		}
		synctest.Wait()
		r.check(t,
			"start 1 c hedge=false",
			"start 2 a hedge=true",
			"done 2 a success 200 abandoned=false",
			"done 1 c canceled 0 abandoned=true",
			"end hedged a #2 of 2 200")
		if n.count("b.test") != 0 {
			t.Errorf("b got %d requests", n.count("b.test"))
		}
	})
}

// WithoutFailover: the primary's failure, answer or error, is what the
// caller gets, and the backup gets nothing.
func TestWithoutFailover(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "a down")
	n.status("b.test", 200, "b")
	tr := newTestTransport(t, twoUpstreams(n, Config{}))
	var r recordTrace
	ctx := WithTrace(WithoutFailover(context.Background()), r.trace())
	resp, err := send(tr, ctx, "POST", "http://a.test/v1/files", "upload")
	if err != nil || resp.StatusCode != 503 || readBody(t, resp) != "a down" {
		t.Fatalf("%v %v, want a's 503", resp, err)
	}
	r.check(t,
		"start 1 a hedge=false",
		"done 1 a failed 503 abandoned=false",
		"end failed a #1 of 1 503")

	n.handle("a.test", nil) // refuses connections
	_, err = send(tr, WithoutFailover(context.Background()), "POST", "http://a.test/v1/files", "upload")
	var fe *Error
	if !errors.As(err, &fe) || len(fe.Attempts) != 1 || fe.Attempts[0].Upstream != "a" || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("%v, want an *Error with a's refusal alone", err)
	}
	if got := counts(n, "a.test", "b.test"); !slices.Equal(got, []int{2, 0}) {
		t.Errorf("a, b got %v requests, want [2 0]", got)
	}

	// Without it, the same requests fail over.
	if code, _ := status(t, tr, context.Background(), "http://a.test/"); code != 200 || n.count("b.test") != 1 {
		t.Errorf("without WithoutFailover: %d, b got %d; want b's 200", code, n.count("b.test"))
	}
}

// WithoutFailover with Hedge configured: no hedge, however slow the
// attempt; with Retries: no second round.
func TestWithoutFailoverHedgeRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(time.Second, "slow a", new(atomic.Int32)))
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 10 * time.Millisecond, Percent: 100}}))
		var r recordTrace
		ctx := WithTrace(WithoutFailover(context.Background()), r.trace())
		resp, err := send(tr, ctx, "POST", "http://a.test/v1/chat", chatBody)
		if err != nil || readBody(t, resp) != "slow a" {
			t.Fatalf("%v %v, want a's answer", resp, err)
		}
		r.check(t,
			"start 1 a hedge=false",
			"done 1 a success 200 abandoned=false",
			"end answered a #1 of 1 200")
		if n.count("b.test") != 0 || metric(tr, famHedges.series()) != "0" {
			t.Errorf("b got %d requests, %s hedges: want none", n.count("b.test"), metric(tr, famHedges.series()))
		}

		// Without it, the same request is hedged.
		status(t, tr, context.Background(), "http://a.test/")
		synctest.Wait()
		if n.count("b.test") != 1 {
			t.Errorf("without WithoutFailover, b got %d requests, want the hedge", n.count("b.test"))
		}

		n = newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 503, "down")
		tr = newTestTransport(t, twoUpstreams(n, Config{Retries: 3, Retry: RetryConfig{Off: true}}))
		start := time.Now()
		if code, err := status(t, tr, WithoutFailover(context.Background()), "http://a.test/"); code != 503 || err != nil {
			t.Fatalf("%d %v, want a's 503", code, err)
		}
		if got := counts(n, "a.test", "b.test"); !slices.Equal(got, []int{1, 0}) || time.Since(start) != 0 {
			t.Errorf("a, b got %v requests in %v, want [1 0] at once", got, time.Since(start))
		}
		status(t, tr, context.Background(), "http://a.test/")
		if got := counts(n, "a.test", "b.test"); !slices.Equal(got, []int{5, 4}) {
			t.Errorf("without WithoutFailover, a, b got %v requests, want 4 rounds more: [5 4]", got)
		}
	})
}

// WithoutFailover passes over an open primary, which sends nothing, to
// the backup's one attempt. Pinned to the primary (WithUpstreams), or with
// every circuit open, it gets ErrCircuitOpen and nothing is sent: no last
// resort. A cooldown within MaxWait is waited out, then the request is
// sent once.
func TestWithoutFailoverCircuitOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		open(t, tr, n, "a")
		n.status("b.test", 503, "b down")
		var r recordTrace
		ctx := WithTrace(WithoutFailover(context.Background()), r.trace())
		if code, err := status(t, tr, ctx, "http://a.test/"); err != nil || code != 503 {
			t.Fatalf("%d %v, want b's one answer", code, err)
		}
		r.check(t,
			"skip a circuit_open",
			"start 1 b hedge=false",
			"done 1 b failed 503 abandoned=false",
			"end failed b #1 of 1 503")

		before := counts(n, "a.test", "b.test")
		r = recordTrace{}
		pinned := WithTrace(WithUpstreams(WithoutFailover(context.Background()), "a"), r.trace())
		_, err := send(tr, pinned, "POST", "http://a.test/v1/files", "upload")
		var fe *Error
		if !errors.Is(err, ErrCircuitOpen) || !errors.As(err, &fe) || fe.RetryAfter() <= 0 {
			t.Fatalf("%v, want an *Error matching ErrCircuitOpen with RetryAfter", err)
		}
		r.check(t, "skip a circuit_open", "end unavailable  #0 of 0 0")
		if got := counts(n, "a.test", "b.test"); !slices.Equal(got, before) {
			t.Errorf("a, b got %v requests, then %v: want nothing sent", before, got)
		}
		if got := metric(tr, famLastResort.series("a")); got != "" && got != "0" {
			t.Errorf("last resorts %q, want none", got)
		}
		// The same request without WithoutFailover is the last resort.
		if code, _ := status(t, tr, WithUpstreams(context.Background(), "a"), "http://a.test/"); code != 503 || n.count("a.test") != before[0]+1 {
			t.Errorf("without WithoutFailover: %d, want the last resort's answer", code)
		}

		// b cools down for 1s, a is open: within MaxWait, the request
		// waits for b, then is sent to it once.
		tr.Reset("b") // open since its 503
		n.status("b.test", 429, "busy", "Retry-After", "1")
		status(t, tr, WithUpstreams(context.Background(), "b"), "http://b.test/")
		n.status("b.test", 200, "b")
		tr.rate.MaxWait = 2 * time.Second
		before = counts(n, "a.test", "b.test")
		start := time.Now()
		if code, err := status(t, tr, WithoutFailover(context.Background()), "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("%d %v, want b's answer after its cooldown", code, err)
		}
		if got := counts(n, "a.test", "b.test"); got[0] != before[0] || got[1] != before[1]+1 || time.Since(start) != time.Second {
			t.Errorf("a, b got %v then %v requests after %v; want one to b after 1s", before, got, time.Since(start))
		}
	})
}

// WithoutFailover does not buffer a body without GetBody: it is sent
// once, as it is.
func TestWithoutFailoverBody(t *testing.T) {
	n := newFakeNet()
	n.handle("a.test", func(r *http.Request) (*http.Response, error) {
		if r.GetBody != nil {
			return respond(500, "buffered"), nil
		}
		return respond(200, "streamed"), nil
	})
	tr := newTestTransport(t, twoUpstreams(n, Config{}))
	for _, tc := range []struct {
		ctx  context.Context
		want string
	}{{context.Background(), "buffered"}, {WithoutFailover(context.Background()), "streamed"}} {
		req := httptestRequest("POST", "http://a.test/v1/files", "").WithContext(tc.ctx)
		req.Body = io.NopCloser(strings.NewReader("file contents"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
	if got := n.requests("a.test"); len(got) != 2 || got[1].Body != "file contents" {
		t.Errorf("a got %+v", got)
	}
}

// A request's attempt timeout, shorter than the Transport's, fails over
// sooner and blames no one; longer, it waits for a slow upstream, and
// when it fires it counts as the Transport's would (and is not taken for
// a stall). Zero removes the bound.
func TestWithAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(time.Second, "slow a", new(atomic.Int32)))
		n.status("b.test", 200, "b")
		cfg := twoUpstreams(n, Config{AttemptTimeout: 500 * time.Millisecond, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}})
		tr := newTestTransport(t, cfg)

		type want struct {
			body  string
			took  time.Duration
			state string
		}
		try := func(ctx context.Context, w want) {
			t.Helper()
			tr.Reset("a")
			var r recordTrace
			start := time.Now()
			resp, err := send(tr, WithTrace(ctx, r.trace()), "GET", "http://a.test/", "")
			if err != nil {
				t.Fatalf("%v", err)
			}
			if got := readBody(t, resp); got != w.body || time.Since(start) != w.took || tr.Health()[0].State != w.state {
				t.Errorf("got %q after %v, a %s; want %q after %v, a %s\n%s", got, time.Since(start), tr.Health()[0].State, w.body, w.took, w.state, strings.Join(r.lines, "\n"))
			}
		}
		bg := context.Background()
		try(WithAttemptTimeout(bg, 100*time.Millisecond), want{"b", 100 * time.Millisecond, "closed"}) // shorter: the caller's impatience
		try(bg, want{"b", 500 * time.Millisecond, "open"})                                             // the Transport's own
		try(WithAttemptTimeout(bg, 2*time.Second), want{"slow a", time.Second, "closed"})              // longer: a answers
		try(WithAttemptTimeout(bg, 0), want{"slow a", time.Second, "closed"})                          // no bound
		try(WithAttemptTimeout(WithAttemptTimeout(bg, 2*time.Second), 100*time.Millisecond), want{"b", 100 * time.Millisecond, "closed"})

		// Longer, and a hangs past it: it counts, as the Transport's
		// would, and the late end is not taken for a stall.
		n.handle("a.test", func(r *http.Request) (*http.Response, error) { <-r.Context().Done(); return nil, r.Context().Err() })
		try(WithAttemptTimeout(bg, 800*time.Millisecond), want{"b", 800 * time.Millisecond, "open"})
		if got := metric(tr, famHeldBack.series("a")); got != "0" {
			t.Errorf("held back %q timeouts, want 0", got)
		}

		// Without a Transport timeout, a request's own counts for nothing.
		tr = newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		try(WithAttemptTimeout(bg, 100*time.Millisecond), want{"b", 100 * time.Millisecond, "closed"})
		var fe *Error
		if _, err := send(tr, WithUpstreams(WithAttemptTimeout(bg, time.Second), "a"), "GET", "http://a.test/", ""); !errors.Is(err, ErrAttemptTimeout) || !errors.As(err, &fe) {
			t.Errorf("%v, want ErrAttemptTimeout", err)
		}
	})
}

// A redirect hop carries the request's context, and with it the options:
// it goes through the list, once.
func TestOptionsRedirect(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/files" {
			http.Redirect(w, r, "/v1/files/1", http.StatusTemporaryRedirect)
			return
		}
		io.WriteString(w, "file 1")
	})
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer backup"}}},
	}})
	ctx := WithUpstreams(WithoutFailover(context.Background()), "backup")
	req, _ := http.NewRequestWithContext(ctx, "POST", primary.URL+"/v1/files", strings.NewReader("contents"))
	req.Header.Set("Authorization", "Bearer caller")
	resp, err := do(t, tr, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := readBody(t, resp); resp.StatusCode != 200 || got != "file 1" {
		t.Fatalf("%d %q, want the hop's answer", resp.StatusCode, got)
	}
	if primary.count() != 0 {
		t.Errorf("primary got %d requests", primary.count())
	}
	got := backup.requests()
	if len(got) != 2 || got[0].Path != "/v1/files" || got[1].Path != "/v1/files/1" || got[1].Body != "contents" {
		t.Fatalf("backup got %+v, want the request and its hop", got)
	}
	for _, s := range got {
		if a := s.Header.Get("Authorization"); a != "Bearer backup" {
			t.Errorf("backup got Authorization %q, want its own", a)
		}
	}
}

// Options are for requests addressed to an upstream: one addressed to
// none goes as Config.Unrouted says.
func TestOptionsUnrouted(t *testing.T) {
	n := newFakeNet()
	n.status("other.test", 200, "other")
	tr := newTestTransport(t, twoUpstreams(n, Config{Unrouted: UnroutedPass}))
	if code, err := status(t, tr, WithUpstreams(context.Background(), "nope"), "http://other.test/"); err != nil || code != 200 {
		t.Errorf("%d %v, want the unrouted request passed", code, err)
	}
}

// The options compose with each other and with WithTrace in any order,
// and a context carrying them serves many requests at once.
func TestOptionsCompose(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "a down")
	n.status("b.test", 503, "b down")
	n.status("c.test", 200, "c")
	tr := newTestTransport(t, abcUpstreams(n, Config{}))
	var r1, r2 recordTrace
	bg := context.Background()
	for _, ctx := range []context.Context{
		WithoutFailover(WithUpstreams(WithTrace(bg, r1.trace()), "b", "c")),
		WithTrace(WithUpstreams(WithoutFailover(bg), "b", "c"), r2.trace()),
	} {
		if code, _ := status(t, tr, ctx, "http://a.test/"); code != 503 {
			t.Errorf("%d, want b's 503", code)
		}
	}
	for _, r := range []*recordTrace{&r1, &r2} {
		r.check(t,
			"start 1 b hedge=false",
			"done 1 b failed 503 abandoned=false",
			"end failed b #1 of 1 503")
	}
	ctx := WithUpstreams(bg, "c", "a")
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if code, err := status(t, tr, ctx, "http://a.test/"); code != 200 || err != nil {
				t.Errorf("%d %v", code, err)
			}
		})
	}
	wg.Wait()
	if got := counts(n, "a.test", "b.test", "c.test"); !slices.Equal(got, []int{0, 2, 20}) {
		t.Errorf("a, b, c got %v, want [0 2 20]", got)
	}
}

// request goes to a hedged attempt's goroutine by value: it stays within
// 128 bytes, the options behind one pointer.
func TestRequestSize(t *testing.T) {
	if n := unsafe.Sizeof(request{}); n > 128 {
		t.Errorf("request is %d bytes, want at most 128", n)
	}
}

// A request's own attempt timeout, shorter than the Transport's, is the
// caller's impatience: it counts for neither success nor failure in the
// upstream's recent figures either, so that impatient callers do not
// degrade an upstream for every other caller, nor lower the success rate
// that Health reports and the Routers rank by.
func TestWithAttemptTimeoutFigures(t *testing.T) {
	// In a bubble: b's attempts are bounded by the request's 20ms too,
	// which a real server on a loaded machine overran (an error, not
	// b's answer).
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(time.Hour, "a", new(atomic.Int32)))
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{
			AttemptTimeout: time.Minute,
			Degraded:       DegradedConfig{SuccessRate: 0.5, MinSamples: 3},
		}))
		ctx := WithAttemptTimeout(context.Background(), 20*time.Millisecond)
		for range 3 {
			resp, err := send(tr, ctx, "GET", "http://a.test/v1/models", "")
			if err != nil {
				t.Fatal(err)
			}
			if got := readBody(t, resp); got != "b" {
				t.Fatalf("got %q, want b's answer", got)
			}
		}
		if got := n.count("a.test"); got != 3 {
			t.Fatalf("a got %d requests, want 3, each timed out", got)
		}
		time.Sleep(refreshEvery + 50*time.Millisecond) // the recent figures are computed again
		if h := tr.Health()[0]; h.Demoted != "" || h.SuccessRate != 1 || h.State != "closed" {
			t.Errorf("a is %s, demoted %q, success rate %v after impatient timeouts; want closed, not demoted, 1", h.State, h.Demoted, h.SuccessRate)
		}
	})
}
