package failover

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A panic in Base during the probe does not hold the probe gate: the next
// request probes.
func TestProbeGateSurvivesPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mode atomic.Value
		mode.Store("fail")
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			switch mode.Load() {
			case "panic":
				panic("boom")
			case "ok":
				return respond(200, "ok"), nil
			}
			return respond(503, "down"), nil
		})
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		get(t, tr, "http://a.test/")
		time.Sleep(time.Second)
		mode.Store("panic")
		func() {
			defer func() {
				if recover() == nil {
					t.Error("Base's panic did not reach the caller")
				}
			}()
			get(t, tr, "http://a.test/")
		}()
		mode.Store("ok")
		if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("after a panicking probe: %d, %v; want the next request to probe", code, err)
		}
	})
}

// A Rejected error (a request no upstream can send) says nothing of the
// upstream: it does not close a half-open circuit whose upstream is down.
func TestInvalidHeaderLeavesBreakerAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if r.Header.Get("X-Bad") != "" {
				return nil, errors.New(`net/http: invalid header field value for "X-Bad"`)
			}
			return nil, errors.New("connection refused")
		})
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		get(t, tr, "http://a.test/")
		time.Sleep(time.Second)
		req := httptestRequest("GET", "http://a.test/", "")
		req.Header.Set("X-Bad", "1")
		if _, err := tr.RoundTrip(req); err == nil {
			t.Fatal("no error")
		}
		if h := tr.Health()[0]; h.State != "half-open" || !h.Available {
			t.Fatalf("after a rejected probe: %s available %v; want half-open, probe handed on", h.State, h.Available)
		}
	})
}

// resp.Request shows where the answer came from, with the caller's own
// headers: the upstream's key stays inside the Transport.
func TestResponseRequestHidesUpstreamKey(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.handle("b.test", func(r *http.Request) (*http.Response, error) {
		resp := respond(200, "ok")
		resp.Request = r
		return resp, nil
	})
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test", Header: http.Header{"Authorization": {"Bearer sk-aaaaaaaaaaaa"}}},
		{Name: "b", BaseURL: "http://b.test", Header: http.Header{"Authorization": {"Bearer sk-bbbbbbbbbbbb"}}},
	}})
	req := httptestRequest("GET", "http://a.test/x", "")
	req.Header.Set("Authorization", "Bearer caller")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Host != "b.test" || resp.Request.Header.Get("Authorization") != "Bearer caller" {
		t.Fatalf("resp.Request: %s with Authorization %q; want b.test with the caller's own", resp.Request.URL, resp.Request.Header.Get("Authorization"))
	}
}

func TestAttemptTimeout(t *testing.T) {
	// In a bubble: the backup's attempt has 50ms too, which a real server
	// on a loaded machine could overrun.
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(time.Hour, "a", new(atomic.Int32))) // accepts, never answers
		n.status("b.test", 200, "ok")
		tr := newTestTransport(t, twoUpstreams(n, Config{AttemptTimeout: 50 * time.Millisecond}))
		start := time.Now()
		if resp := mustGet(t, tr, "http://a.test/v1/models"); readBody(t, resp) != "ok" {
			t.Fatal("not served by the backup")
		}
		if took := time.Since(start); took != 50*time.Millisecond {
			t.Errorf("served after %v, want after the 50ms attempt timeout", took)
		}
		h := tr.Health()[0]
		if h.Requests.Failed != 1 || !strings.Contains(h.LastError, "attempt timed out") {
			t.Fatalf("primary: %+v", h)
		}

		// With no backup the caller gets ErrAttemptTimeout.
		tr = newTestTransport(t, Config{Base: n, AttemptTimeout: 50 * time.Millisecond, Upstreams: []Upstream{{BaseURL: "http://a.test"}}})
		_, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", ""))
		if !errors.Is(err, ErrAttemptTimeout) {
			t.Fatalf("err = %v, want ErrAttemptTimeout", err)
		}
	})
}

// When every upstream times out at once, the evidence points at this
// process (starved of CPU, paused), not at the providers: the timeouts are
// not counted against the circuits, and requests keep being sent, as they
// would be without failover. Before, every circuit opened and requests
// failed at once with ErrCircuitOpen. One upstream that hangs alone still
// opens its circuit.
func TestEveryUpstreamTimingOutOpensNoCircuit(t *testing.T) {
	hang := func(r *http.Request) (*http.Response, error) {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	t.Run("all hang", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			n.handle("a.test", hang)
			n.handle("b.test", hang)
			tr := newTestTransport(t, twoUpstreams(n, Config{AttemptTimeout: 100 * time.Millisecond, Breaker: BreakerConfig{FailureThreshold: 3}}))
			for i := range 20 {
				if _, err := get(t, tr, "http://a.test/"); !errors.Is(err, ErrAttemptTimeout) {
					t.Fatalf("request %d: %v, want both attempts timed out", i, err)
				}
			}
			for _, h := range tr.Health() {
				if h.State != "closed" {
					t.Errorf("%s is %s after every upstream timed out together", h.Name, h.State)
				}
			}
			if got := n.count("a.test") + n.count("b.test"); got != 40 {
				t.Errorf("%d attempts, want 40: every request tries both", got)
			}
			var m strings.Builder
			tr.WritePrometheus(&m)
			if strings.Contains(m.String(), `failover_timeouts_held_back_total{upstream="a"} 0`) || strings.Contains(m.String(), `failover_timeouts_held_back_total{upstream="b"} 0`) {
				t.Errorf("the held-back timeouts are not counted:\n%s", grepLines(m.String(), "held_back"))
			}
		})
	})
	t.Run("one hangs", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			n.handle("a.test", hang)
			n.status("b.test", 200, "b")
			tr := newTestTransport(t, twoUpstreams(n, Config{AttemptTimeout: 100 * time.Millisecond, Breaker: BreakerConfig{FailureThreshold: 3}}))
			for range 5 {
				get(t, tr, "http://a.test/")
			}
			if got := n.count("a.test"); got != 3 {
				t.Errorf("a got %d requests, want 3 before its circuit opened", got)
			}
		})
	})
}

// A request no upstream can send (a header net/http refuses) is the
// caller's own mistake: net/http's error as it is, not an *Error, sent to
// no backup and counted against no upstream.
func TestInvalidRequestErrorAsIs(t *testing.T) {
	primary := newUpstreamServer(t, 200, "primary")
	backup := newUpstreamServer(t, 200, "backup")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "primary", BaseURL: primary.URL}, {Name: "backup", BaseURL: backup.URL}}})
	req := httptestRequest("GET", primary.URL+"/v1", "")
	req.Header.Set("X-Bad", "a\nb")
	_, err := tr.RoundTrip(req)
	var ferr *Error
	if err == nil || errors.As(err, &ferr) {
		t.Fatalf("got %v, want net/http's error as it is", err)
	}
	if primary.count()+backup.count() != 0 {
		t.Fatal("a request no upstream can send reached one")
	}
	for _, h := range tr.Health() {
		if h.Requests.Failed != 0 || h.State != "closed" {
			t.Errorf("%s counted the caller's mistake: %+v", h.Name, h.Requests)
		}
	}
}

// An attempt whose round trip returns well after its deadline shows a
// process that did not run when the deadline passed: its timeout is not
// counted against the upstream, even with one upstream. One that returns
// at the deadline counts as before.
func TestStalledTimeoutNotCounted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		late  time.Duration // how long after the cancel Base returns
		trips bool
	}{
		{"returns at the deadline", 0, true},
		{"returns 50ms late", 50 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				n.handle("a.test", func(r *http.Request) (*http.Response, error) {
					<-r.Context().Done()
					time.Sleep(tc.late) // the process was not running
					return nil, r.Context().Err()
				})
				tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}},
					AttemptTimeout: 100 * time.Millisecond, Breaker: BreakerConfig{FailureThreshold: 2}, LastResort: LastResortConfig{Off: true}})
				for range 3 {
					get(t, tr, "http://a.test/")
				}
				if open := tr.Health()[0].State == "open"; open != tc.trips {
					t.Fatalf("circuit %s after 3 timeouts, want open %v", tr.Health()[0].State, tc.trips)
				}
			})
		})
	}
}

// closeFlag is a body that records its Close.
type closeFlag struct {
	io.Reader
	closed *atomic.Bool
}

func (b closeFlag) Close() error { b.closed.Store(true); return nil }

// A Classifier that panics with an answer in hand leaves no body open: the
// panic reaches the caller, and the answer is closed, as a discarded one
// would be.
func TestClassifyPanicClosesAnswer(t *testing.T) {
	var closed atomic.Bool
	tr := newTestTransport(t, Config{
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test"}},
		Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: closeFlag{strings.NewReader("x"), &closed}, Request: r}, nil
		}),
		Classify: func(*http.Response, error) Outcome { panic("classifier") },
	})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the classifier's panic did not reach the caller")
			}
		}()
		tr.RoundTrip(httptestRequest("GET", "http://a.test/v1", ""))
	}()
	if !closed.Load() {
		t.Fatal("the answer the classifier panicked on was left open")
	}
}

// A Base that breaks the RoundTripper contract (no response, no error)
// gets an error, not a nil dereference.
func TestBaseWithoutResponseOrError(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Second} {
		tr := newTestTransport(t, Config{AttemptTimeout: timeout,
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}},
			Base:      roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil }),
		})
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1", ""))
		if resp != nil || !errors.Is(err, errNoResponse) {
			t.Fatalf("AttemptTimeout %v: got %v, %v; want an error saying Base returned nothing", timeout, resp, err)
		}
	}
}

// A slow GetBody before the round trip is not a stall: the hung upstream
// still opens its circuit, as the deadline is counted from when Base was
// called, not from when the attempt was launched (GetBody runs between).
func TestSlowGetBodyIsNoStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.handle("b.test", func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{AttemptTimeout: time.Second,
			Breaker: BreakerConfig{FailureThreshold: 2}, LastResort: LastResortConfig{Off: true}}))
		for range 2 {
			req := httptestRequest("POST", "http://a.test/v1", chatBody)
			getBody := req.GetBody
			req.GetBody = func() (io.ReadCloser, error) { time.Sleep(300 * time.Millisecond); return getBody() }
			tr.RoundTrip(req) // a's 503, then b with the body from GetBody
		}
		if s := tr.Health()[1].State; s != "open" {
			t.Fatalf("a hung upstream behind a slow GetBody is %s after 2 timeouts, want open", s)
		}
	})
}

// An attempt's ownCtx (a hedged round's, under a caller's context that is
// never done) is done once ended, with the cause it was ended with, and
// gives the caller's deadline and values.
func TestOwnCtx(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")
	var c ownCtx
	c.init(parent, false)
	done := c.Done()
	select {
	case <-done:
		t.Fatal("done before it ended")
	default:
	}
	if c.Err() != nil {
		t.Fatalf("Err %v before it ended", c.Err())
	}
	c.end(errHedgeLost)
	c.end(ErrAttemptTimeout) // once is enough; the first cause stays
	select {
	case <-done:
	default:
		t.Fatal("not done once ended")
	}
	if !errors.Is(c.Err(), context.Canceled) || context.Cause(&c) != errHedgeLost {
		t.Errorf("Err %v, Cause %v: want context.Canceled, %v", c.Err(), context.Cause(&c), errHedgeLost)
	}
	if c.Value(key{}) != "v" {
		t.Error("the caller's value is lost")
	}
	if _, ok := c.Deadline(); ok {
		t.Error("a deadline the caller did not set")
	}
	if s := fmt.Sprint(&c); !strings.Contains(s, "failover attempt") {
		t.Errorf("String %q", s)
	}
}

// An ownCtx released (the caller closed the answer) gives its canceler
// back unended, and no longer ends with the attempt; one ended first gives
// nothing back, and a release after the end does nothing; a bubble's
// canceler, or one that has served cancelerUses attempts, is ended by the
// release instead.
func TestOwnCtxRelease(t *testing.T) {
	var live ownCtx
	live.init(context.Background(), false)
	k := live.c
	uses := k.uses
	live.release()
	live.end(errHedgeLost) // a discarded answer's cleanup, after its Close
	if k.ctx.Err() != nil || k.uses != uses+1 {
		t.Errorf("released: canceler's Err %v, uses %d; want it unended, used once more than %d", k.ctx.Err(), k.uses, uses)
	}
	var ended ownCtx
	ended.init(context.Background(), false)
	ended.end(errHedgeLost)
	uses = ended.c.uses
	ended.release()
	if ended.c.uses != uses || context.Cause(&ended) != errHedgeLost {
		t.Errorf("ended, then released: uses %d (want %d), Cause %v", ended.c.uses, uses, context.Cause(&ended))
	}
	var bubbled ownCtx
	bubbled.init(context.Background(), true)
	bubbled.release()
	if bubbled.Err() == nil {
		t.Error("a bubble's canceler was not ended by its release")
	}
	var old ownCtx
	old.init(context.Background(), false)
	old.c.uses = cancelerUses - 1
	old.release()
	if old.Err() == nil {
		t.Errorf("a canceler that served %d attempts was not retired", cancelerUses)
	}
}

// A context derived from an ownCtx, as http.Transport derives one from
// every request's, takes no goroutine to wait for the ownCtx's end (as one
// derived from context.WithCancelCause's takes none), nor an allocation
// but its own once the canceler has served a request: it joins the
// canceler's children, and is ended with the ownCtx, at once.
func TestOwnCtxDerivedTakesNoGoroutine(t *testing.T) {
	var own ownCtx
	own.init(context.Background(), false)
	before := goroutinesCreated(t)
	var kept []context.Context
	for i := range 100 {
		ctx, cancel := context.WithCancelCause(&own)
		if i%2 == 0 {
			cancel(nil) // net/http's, when the request is done
			continue
		}
		defer cancel(nil)
		kept = append(kept, ctx)
	}
	if n := goroutinesCreated(t) - before; n > 10 {
		t.Errorf("100 contexts derived from an ownCtx started %d goroutines, want none", n)
	}
	if !raceEnabled {
		var plain, derived float64
		plain = testing.AllocsPerRun(100, func() {
			_, cancel := context.WithCancelCause(context.Background())
			cancel(nil)
		})
		derived = testing.AllocsPerRun(100, func() {
			_, cancel := context.WithCancelCause(&own)
			cancel(nil)
		})
		if derived > plain {
			t.Errorf("a context derived from an ownCtx takes %v allocations, one derived from Background %v", derived, plain)
		}
	}
	own.end(nil)
	for _, ctx := range kept {
		select {
		case <-ctx.Done():
		default:
			t.Fatal("a derived context is not done when the ownCtx ends")
		}
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Fatalf("derived Err %v, want context.Canceled", ctx.Err())
		}
	}
	ran := make(chan struct{})
	context.AfterFunc(&own, func() { close(ran) }) // after the end: at once
	<-ran
}

// goroutinesCreated is how many goroutines the process has started. The
// metric is Go 1.26's: with an older Go (CI's check of the oldest one
// go.mod allows) the test is skipped, saying so; CI's main run has it.
func goroutinesCreated(t *testing.T) uint64 {
	t.Helper()
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Skipf("this Go (%s) has no %s metric (Go 1.26 has)", runtime.Version(), s[0].Name)
	}
	return s[0].Value.Uint64()
}

// An answer from another upstream than the one the caller's URL names
// reaches a cookie jar without its Set-Cookie: http.Client keeps a cookie
// for the URL it sent, so the backup's session went to the primary with
// the caller's next request. The addressed upstream's own cookies are
// kept, and sent back to it.
func TestShowRequestKeepsAnotherUpstreamsCookies(t *testing.T) {
	var primaryUp atomic.Bool
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if !primaryUp.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		http.SetCookie(w, &http.Cookie{Name: "primary_sid", Value: "primary-session-0123456789"})
		io.WriteString(w, "primary")
	})
	backup := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "backup_sid", Value: "backup-session-0123456789"})
		io.WriteString(w, "backup")
	})
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL},
		{Name: "backup", BaseURL: backup.URL},
	}})
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: tr, Jar: jar}
	send := func(want string) {
		t.Helper()
		resp, err := c.Get(primary.URL + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != want {
			t.Fatalf("answered by %q, want %q", body, want)
		}
	}
	send("backup") // the primary fails: the backup answers, with its cookie
	primaryUp.Store(true)
	send("primary") // the primary's own cookie, kept
	send("primary") // and sent back to it
	for _, r := range primary.requests() {
		if c := r.Header.Get("Cookie"); strings.Contains(c, "backup") {
			t.Errorf("the primary received the backup's cookie: Cookie: %s", c)
		}
	}
	if reqs := primary.requests(); len(reqs) != 3 || !strings.Contains(reqs[2].Header.Get("Cookie"), "primary-session-0123456789") {
		t.Errorf("the primary's own cookie did not come back to it: %+v", reqs)
	}
	for _, r := range backup.requests() {
		if c := r.Header.Get("Cookie"); c != "" {
			t.Errorf("the backup received a cookie: %s", c)
		}
	}
}

// A 101 Switching Protocols answer's Body is the connection, an
// io.ReadWriteCloser as net/http hands it over, with an AttemptTimeout and
// with hedging alike (each gives the attempt a context of its own).
func TestSwitchingProtocolsBodyIsWritable(t *testing.T) {
	for _, name := range []string{"plain", "AttemptTimeout", "Hedge"} {
		t.Run(name, func(t *testing.T) {
			up := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				conn, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.Close()
				brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
				brw.Flush()
				line, _ := brw.ReadString('\n')
				brw.WriteString("echo: " + line)
				brw.Flush()
			})
			backup := newUpstreamServer(t, 200, "ok")
			cfg := Config{Upstreams: []Upstream{
				{Name: "up", BaseURL: up.URL + "/v1"},
				{Name: "backup", BaseURL: backup.URL + "/v1"},
			}}
			switch name {
			case "AttemptTimeout":
				cfg.AttemptTimeout = time.Minute
			case "Hedge":
				cfg.Hedge = &HedgeConfig{Delay: time.Minute}
			}
			tr := newTestTransport(t, cfg)
			req, _ := http.NewRequest("GET", up.URL+"/v1/realtime", nil)
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "echo")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			rw, ok := resp.Body.(io.ReadWriteCloser)
			if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
				t.Fatalf("got %d with a Body of type %T, want 101 with an io.ReadWriteCloser", resp.StatusCode, resp.Body)
			}
			if _, err := io.WriteString(rw, "hello\n"); err != nil {
				t.Fatal(err)
			}
			got, err := bufio.NewReader(rw).ReadString('\n')
			if got != "echo: hello\n" || err != nil {
				t.Errorf("read %q, %v; want the echo", got, err)
			}
		})
	}
}

// A request with trailers goes chunked, its trailers after the body, to
// every upstream it is sent to, when the Transport buffered its body for
// replay as when it did not.
func TestRequestTrailersSent(t *testing.T) {
	for _, max := range []int64{0, -1} {
		got, primary, backup := trailerServers(t)
		tr := newTestTransport(t, Config{MaxBodyBuffer: max, Upstreams: []Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1"},
		}})
		pr, pw := io.Pipe()
		req, _ := http.NewRequest("POST", primary.URL+"/v1/files", pr)
		req.Trailer = http.Header{"X-Checksum": nil}
		go func() {
			io.WriteString(pw, "part")
			req.Trailer.Set("X-Checksum", "c0ffee")
			pw.Close()
		}()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := []string{`part "c0ffee" length -1`, `part "c0ffee" length -1`}
		if max < 0 {
			want = want[:1] // one attempt: the body cannot be sent again
		}
		for i, w := range want {
			if g := <-got; g != w {
				t.Errorf("MaxBodyBuffer %d, attempt %d: upstream got %s, want %s", max, i+1, g, w)
			}
		}
	}
}

// A body shorter than its ContentLength fails as net/http fails it,
// blaming no upstream, when the Transport buffered it for replay (no
// GetBody) as when it did not: the buffer's length must not stand in for
// the caller's. The upstream is sent nothing, as a bare http.Transport sends
// it nothing: its headers are not flushed ahead of a body in memory.
func TestBufferedBodyKeepsContentLength(t *testing.T) {
	primary := newUpstreamServer(t, 200, "primary")
	backup := newUpstreamServer(t, 200, "backup")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL},
		{Name: "backup", BaseURL: backup.URL},
	}})
	req, _ := http.NewRequest("POST", primary.URL+"/v1/chat", io.NopCloser(strings.NewReader(`{"model":"m"}`)))
	req.ContentLength = 100
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %d, want net/http's error for a body shorter than its ContentLength", resp.StatusCode)
	}
	var ferr *Error
	if errors.As(err, &ferr) {
		t.Fatalf("got %v, want net/http's error as it is", err)
	}
	// Close waits for the handlers of requests that arrived: a request
	// whose headers reached an upstream has been counted once it returns.
	primary.Close()
	backup.Close()
	if n := primary.count() + backup.count(); n != 0 {
		t.Errorf("the upstreams were sent %d requests, want none: net/http fails such a body before writing a byte", n)
	}
	for _, h := range tr.Health() {
		if h.Requests.Failed != 0 || h.BreakerFailures != 0 {
			t.Errorf("%s: %+v: the caller's fault counted", h.Name, h.Requests)
		}
	}
}

// An attempt whose body GetBody cannot give is no failover: the request
// ends with the primary's answer (the latest), the backup is sent nothing,
// and failover_failovers_total counts nothing from the one to the other.
func TestPrepareGetBodyFailsCountsNoFailover(t *testing.T) {
	primary := newUpstreamServer(t, http.StatusServiceUnavailable, "down")
	backup := newUpstreamServer(t, http.StatusOK, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL},
		{Name: "backup", BaseURL: backup.URL},
	}})
	req := httptestRequest("POST", primary.URL+"/v1/chat", `{"model":"m"}`)
	req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("the caller's file went away") }
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("err = %v, want the primary's 503", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("got %d, want the primary's 503", resp.StatusCode)
	}
	if backup.count() != 0 {
		t.Errorf("the backup got %d requests, want none", backup.count())
	}
	if m := scrapeMetrics(tr); strings.Contains(m, "failover_failovers_total") {
		t.Errorf("a failover was counted:\n%s", seriesLines(m, "failover_failovers_total"))
	}
}

// countingCtx is a cancelable context that is never done and counts what
// is registered on it: context.AfterFunc and the children of
// context.WithCancel register through its AfterFunc, and let go when they
// end. It tells whether what a request made outlives its answer under a
// long-lived context, as an agent's or a server's is.
type countingCtx struct {
	context.Context
	done chan struct{}
	live atomic.Int64
}

func newCountingCtx() *countingCtx {
	return &countingCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *countingCtx) Done() <-chan struct{} { return c.done }

func (c *countingCtx) AfterFunc(func()) func() bool {
	c.live.Add(1)
	var stopped atomic.Bool
	return func() bool {
		if stopped.CompareAndSwap(false, true) {
			c.live.Add(-1)
			return true
		}
		return false
	}
}

// An answer read to its end, or to an error, lets go of everything its
// attempts took under the caller's context, though the caller never closes
// it, as a bare http.Transport keeps nothing: with an attempt timeout, a
// hedge (fired or not), a stream guard, a failover and metering; for a
// JSON answer, a stream, an answer without a body, an error answer handed
// back and a body cut short.
func TestAnswerReadToEndKeepsNothing(t *testing.T) {
	const json = `{"id":"x","model":"m","usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`
	ok := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
		case "/v1/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/v1/bad":
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"bad"}}`)
		case "/v1/cut":
			w.Header().Set("Content-Length", "100")
			io.WriteString(w, "0123456789")
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, json)
		}
	})
	down := newUpstreamServer(t, 503, "down")
	hung := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	two := func(primary *server, cfg Config) Config {
		cfg.Upstreams = []Upstream{{Name: "primary", BaseURL: primary.URL + "/v1"}, {Name: "backup", BaseURL: ok.URL + "/v1"}}
		return cfg
	}
	configs := []struct {
		name    string
		cfg     Config
		primary *server
	}{
		{"attempt timeout", Config{AttemptTimeout: time.Hour}, ok},
		{"hedge not fired", Config{Hedge: &HedgeConfig{Delay: time.Hour, Percent: 100}}, ok},
		{"hedge fired", Config{Hedge: &HedgeConfig{Delay: time.Millisecond, Percent: 100}}, hung},
		{"failover, timeout, guard, meter", Config{AttemptTimeout: time.Hour, MeterUsage: true, StreamGuard: &StreamGuard{FirstByteTimeout: time.Hour}}, down},
	}
	paths := []string{"/v1/chat", "/v1/stream", "/v1/empty", "/v1/bad", "/v1/cut"}
	for _, c := range configs {
		tr := newTestTransport(t, two(c.primary, c.cfg))
		for _, path := range paths {
			if c.primary == hung && path == "/v1/bad" {
				continue // the primary answers nothing, and a 400 of the backup is no hedge's answer
			}
			ctx := newCountingCtx()
			for i := range 3 {
				req, _ := http.NewRequestWithContext(ctx, "POST", c.primary.URL+path, strings.NewReader(`{"model":"m"}`))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("%s %s: %v", c.name, path, err)
				}
				if i == 0 && path == "/v1/chat" && c.primary != hung && ctx.live.Load() == 0 {
					t.Errorf("%s: an answer not yet read holds nothing of its attempt: this test cannot see what it looks for", c.name)
				}
				io.ReadAll(resp.Body) // to its end, or the cut; never closed
			}
			// A hedge that lost ends on its own goroutine.
			deadline := time.Now().Add(10 * time.Second)
			for ctx.live.Load() != 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if n := ctx.live.Load(); n != 0 {
				t.Errorf("%s %s: %d registrations on the caller's context outlive 3 answers read to their end", c.name, path, n)
			}
		}
	}

	// What this compares with: a bare http.Transport keeps nothing once an
	// answer ends (one cut short, it keeps until Close).
	bare := http.DefaultTransport.(*http.Transport).Clone()
	defer bare.CloseIdleConnections()
	ctx := newCountingCtx()
	for _, path := range paths[:len(paths)-1] {
		req, _ := http.NewRequestWithContext(ctx, "POST", ok.URL+path, strings.NewReader(`{}`))
		resp, err := bare.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
	}
	if n := ctx.live.Load(); n != 0 {
		t.Errorf("bare http.Transport: %d registrations outlive its answers", n)
	}
}

// An answer that has no body holds nothing of its attempt, read or not, as
// with a bare http.Transport: a HEAD's, a 204 and a 304 over HTTP/2 (whose
// bodies are not http.NoBody), and a Base's answer with a nil Body, which
// the caller may then close or not.
func TestAnswerWithoutBodyKeepsNothing(t *testing.T) {
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/v1/same":
			w.WriteHeader(http.StatusNotModified)
		default:
			io.WriteString(w, `{"id":"x"}`)
		}
	}))
	s.EnableHTTP2 = true
	s.StartTLS()
	defer s.Close()
	h2 := s.Client().Transport.(*http.Transport).Clone()
	defer h2.CloseIdleConnections()
	nilBody := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Request: r}, nil
	})
	for _, cfg := range []Config{
		{AttemptTimeout: time.Hour},
		{Hedge: &HedgeConfig{Delay: time.Hour, Percent: 100}},
	} {
		for _, base := range []struct {
			name string
			rt   http.RoundTripper
		}{{"HTTP/2", h2}, {"nil Body", nilBody}} {
			cfg.Base = base.rt
			cfg.Upstreams = []Upstream{{Name: "primary", BaseURL: s.URL + "/v1"}, {Name: "backup", BaseURL: s.URL + "/v2"}}
			tr := newTestTransport(t, cfg)
			for _, c := range []struct{ method, path string }{{"HEAD", "/v1/chat"}, {"GET", "/v1/empty"}, {"GET", "/v1/same"}} {
				ctx := newCountingCtx()
				req, _ := http.NewRequestWithContext(ctx, c.method, s.URL+c.path, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("%s %s: %v", c.method, c.path, err)
				}
				if base.rt == h2 && resp.ProtoMajor != 2 {
					t.Fatalf("%s %s went over %s, want HTTP/2", c.method, c.path, resp.Proto)
				}
				if n := ctx.live.Load(); n != 0 {
					t.Errorf("%s, %s %s: %d registrations on the caller's context outlive an answer without a body", base.name, c.method, c.path, n)
				}
				if base.rt != h2 {
					if resp.Body != nil {
						t.Errorf("a nil Body came back as a %T", resp.Body)
					}
					break
				}
			}
		}
	}

	// What this compares with: a bare http.Transport keeps nothing of them.
	ctx := newCountingCtx()
	for _, path := range []string{"/v1/empty", "/v1/same"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+path, nil)
		if _, err := h2.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
	}
	if n := ctx.live.Load(); n != 0 {
		t.Errorf("bare http.Transport: %d registrations outlive its answers", n)
	}
}

// The request an answer shows (resp.Request) carries the caller's context,
// also from an upstream the caller did not address: the attempt's own
// ends with the answer's body, and an ownCtx's canceler may be retired or
// ended by a later attempt, which made every 64th answer's context read as
// canceled once read to its end.
func TestAnswerRequestKeepsCallersContext(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 200, "b")
	for _, cfg := range []Config{{Hedge: &HedgeConfig{Delay: time.Hour, Percent: 100}}, {AttemptTimeout: time.Hour}} {
		cfg.Breaker = BreakerConfig{FailureThreshold: 1000}
		tr := newTestTransport(t, twoUpstreams(n, cfg))
		for i := range 130 {
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", ""))
			if err != nil {
				t.Fatal(err)
			}
			io.ReadAll(resp.Body)
			if err := resp.Request.Context().Err(); err != nil {
				t.Fatalf("answer %d: resp.Request's context: %v, want the caller's, live", i, err)
			}
			resp.Body.Close()
		}
	}
}
