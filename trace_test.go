package failover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// recordTrace is a Trace that writes each event as one line, and keeps the
// arguments for closer checks.
type recordTrace struct {
	lines []string
	args  []any
	done  TraceDone
}

func (r *recordTrace) trace() *Trace {
	return &Trace{
		Skipped: func(s TraceSkip) {
			r.lines = append(r.lines, fmt.Sprintf("skip %s %s", s.Upstream, s.Reason))
			r.args = append(r.args, s)
		},
		AttemptStart: func(a TraceAttempt) {
			r.lines = append(r.lines, fmt.Sprintf("start %d %s hedge=%v", a.Attempt, a.Upstream, a.Hedge))
			r.args = append(r.args, a)
		},
		AttemptDone: func(d TraceAttemptDone) {
			r.lines = append(r.lines, fmt.Sprintf("done %d %s %v %d abandoned=%v", d.Attempt, d.Upstream, d.Outcome, d.StatusCode, d.Abandoned))
			r.args = append(r.args, d)
		},
		Done: func(d TraceDone) {
			r.lines = append(r.lines, fmt.Sprintf("end %s %s #%d of %d %d", d.Outcome, d.Upstream, d.Attempt, d.Attempts, d.StatusCode))
			r.args = append(r.args, d)
			r.done = d
		},
	}
}

func (r *recordTrace) check(t *testing.T, want ...string) {
	t.Helper()
	if got := strings.Join(r.lines, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("trace:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

func traced(req *http.Request, r *recordTrace) *http.Request {
	return req.WithContext(WithTrace(req.Context(), r.trace()))
}

// A request that fails over: each attempt, its outcome, and whose answer
// the caller got.
func TestTraceFailover(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "up")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	var r recordTrace
	resp, err := tr.RoundTrip(traced(httptestRequest("POST", primary.URL+"/v1/chat/completions", chatBody), &r))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	r.check(t,
		"start 1 primary hedge=false",
		"done 1 primary failed 503 abandoned=false",
		"start 2 backup hedge=false",
		"done 2 backup success 200 abandoned=false",
		"end failed_over backup #2 of 2 200")
	if r.done.Duration <= 0 || r.done.Err != nil {
		t.Errorf("Done = %+v, want a duration and no error", r.done)
	}
	for _, a := range r.args {
		if d, ok := a.(TraceAttemptDone); ok && (d.Duration <= 0 || d.Err != nil) {
			t.Errorf("AttemptDone = %+v, want a duration and no error", d)
		}
	}

	// With the primary healthy again, the first attempt answers.
	var r2 recordTrace
	tr2 := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "backup", BaseURL: backup.URL + "/v1"}}})
	resp, err = tr2.RoundTrip(traced(httptestRequest("GET", backup.URL+"/v1/models", ""), &r2))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	r2.check(t, "start 1 backup hedge=false", "done 1 backup success 200 abandoned=false", "end answered backup #1 of 1 200")
}

// Upstreams passed over say why, with the admission decision's reasons,
// and a request nothing was sent for is unavailable.
func TestTraceSkipped(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 429, "slow down", "Retry-After", "30")
	tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1}, LastResort: LastResortConfig{Off: true}}))
	get := func(r *recordTrace) error {
		resp, err := tr.RoundTrip(traced(httptestRequest("GET", "http://a.test/v1/models", ""), r))
		if resp != nil {
			resp.Body.Close()
		}
		return err
	}
	var r1 recordTrace
	if err := get(&r1); err != nil {
		t.Fatal(err)
	}
	r1.check(t,
		"start 1 a hedge=false",
		"done 1 a failed 503 abandoned=false",
		"start 2 b hedge=false",
		"done 2 b rate_limited 429 abandoned=false",
		"end failed b #2 of 2 429")

	var r2 recordTrace
	err := get(&r2)
	if !errors.Is(err, ErrCircuitOpen) || !errors.Is(err, ErrRateLimited) {
		t.Fatalf("err = %v, want both upstreams unavailable", err)
	}
	r2.check(t, "skip a circuit_open", "skip b rate_limited", "end unavailable  #0 of 0 0")
	for _, a := range r2.args[:2] {
		if s := a.(TraceSkip); s.RetryAfter <= 0 {
			t.Errorf("%+v: no RetryAfter", s)
		}
	}
	if r2.done.Err != err {
		t.Errorf("Done.Err = %v, want RoundTrip's %v", r2.done.Err, err)
	}
}

// A hedge that wins: its start says so, the attempt it beat is abandoned,
// and the request is hedged.
func TestTraceHedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(time.Second, "a", new(atomic.Int32)))
		n.handle("b.test", slowly(10*time.Millisecond, "b", new(atomic.Int32)))
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond}}))
		var r recordTrace
		resp, err := tr.RoundTrip(traced(httptestRequest("POST", "http://a.test/v1/chat/completions", chatBody), &r))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		synctest.Wait()
		r.check(t,
			"start 1 a hedge=false",
			"start 2 b hedge=true",
			"done 2 b success 200 abandoned=false",
			"done 1 a canceled 0 abandoned=true",
			"end hedged b #2 of 2 200")
		for _, a := range r.args {
			if d, ok := a.(TraceAttemptDone); ok && d.Abandoned && d.Duration != 60*time.Millisecond {
				t.Errorf("the abandoned attempt's Duration = %v, want 60ms", d.Duration)
			}
		}
	})
}

// The caller's cancellation, and a request addressed to no upstream.
func TestTraceCanceledAndUnrouted(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 200, "ok")
	tr := newTestTransport(t, twoUpstreams(n, Config{}))
	ctx, cancel := context.WithCancel(context.Background())
	n.handle("a.test", func(r *http.Request) (*http.Response, error) {
		cancel()
		return nil, r.Context().Err()
	})
	var r recordTrace
	_, err := tr.RoundTrip(traced(httptestRequest("GET", "http://a.test/v1/models", "").WithContext(ctx), &r))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	r.check(t, "start 1 a hedge=false", "done 1 a canceled 0 abandoned=false", "end canceled  #0 of 1 0")

	var u recordTrace
	_, err = tr.RoundTrip(traced(httptestRequest("GET", "http://c.test/v1/models", ""), &u))
	u.check(t, "end unrouted  #0 of 0 0")
	if !errors.Is(u.done.Err, ErrUnrouted) || u.done.Err != err {
		t.Errorf("Done.Err = %v, want the refusal RoundTrip returned", u.done.Err)
	}
}

// No credential, the caller's or an upstream's, reaches any hook, even
// when Base's errors quote them.
func TestTraceCarriesNoCredential(t *testing.T) {
	const callerKey, callerQuery, ownKey = "sk-caller-zqzq", "q-secret-zqzq", "sk-upstream-zqzq"
	n := newFakeNet()
	n.handle("a.test", func(r *http.Request) (*http.Response, error) {
		return nil, fmt.Errorf("dial %s with %q: refused", r.URL, r.Header.Get("Authorization"))
	})
	n.handle("b.test", func(r *http.Request) (*http.Response, error) {
		return nil, fmt.Errorf("reset by %s (%s)", r.URL, r.Header.Get("X-Api-Key"))
	})
	tr := newTestTransport(t, Config{Base: n, LastResort: LastResortConfig{Off: true}, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test/v1"},
		{Name: "b", BaseURL: "http://b.test/v1", Header: http.Header{"X-Api-Key": {ownKey}}},
	}})
	var r recordTrace
	req := httptestRequest("POST", "http://a.test/v1/chat/completions?key="+callerQuery, chatBody)
	req.Header.Set("Authorization", "Bearer "+callerKey)
	_, err := tr.RoundTrip(traced(req, &r))
	if err == nil {
		t.Fatal("no error")
	}
	if len(r.args) != 5 {
		t.Fatalf("trace: %q", r.lines)
	}
	// The errors came back with every secret in them: the hooks got them scrubbed.
	if !strings.Contains(fmt.Sprint(n.requests("a.test")), callerKey) {
		t.Fatal("the test is broken: the caller's key never reached the primary")
	}
	for _, a := range r.args {
		s := fmt.Sprintf("%+v", a)
		if d, ok := a.(TraceAttemptDone); ok && d.Err != nil {
			s += d.Err.Error()
			var ae *AttemptError
			if !errors.As(d.Err, &ae) || ae.Upstream != d.Upstream {
				t.Errorf("AttemptDone.Err = %#v, want an *AttemptError of %s", d.Err, d.Upstream)
			}
		}
		if d, ok := a.(TraceDone); ok && d.Err != nil {
			s += d.Err.Error()
		}
		for _, secret := range []string{callerKey, callerQuery, ownKey} {
			if strings.Contains(s, secret) {
				t.Errorf("a hook got %q: %s", secret, s)
			}
		}
	}
}

// Two Traces on one context are both called, the newer first.
func TestTraceCompose(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 200, "ok")
	tr := newTestTransport(t, twoUpstreams(n, Config{}))
	var order []string
	ctx := WithTrace(context.Background(), &Trace{Done: func(TraceDone) { order = append(order, "outer") }})
	ctx = WithTrace(ctx, &Trace{Done: func(TraceDone) { order = append(order, "inner") }, AttemptStart: func(TraceAttempt) { order = append(order, "start") }})
	if WithTrace(ctx, nil) != ctx {
		t.Error("WithTrace(ctx, nil) made a new context")
	}
	resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", "").WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := strings.Join(order, ","); got != "start,inner,outer" {
		t.Errorf("hooks ran %s, want start,inner,outer", got)
	}
}

// swallowPanic runs f and reports whether it panicked.
func swallowPanic(f func()) (panicked bool) {
	defer func() {
		if recover() != nil {
			panicked = true
		}
	}()
	f()
	return false
}

// A panicking AttemptStart hook runs after launch took the last resort's
// slot and the circuit's permit, before send, which gives them back: launch
// hands them back itself, and the next request gets its last resort.
func TestTraceAttemptStartPanicKeepsLastResortSlot(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 200, "ok")
	tr := newTestTransport(t, Config{Base: n, LastResort: LastResortConfig{MaxInFlight: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
	tr.upstreams[0].circuit.Trip(time.Now())
	ctx := WithTrace(context.Background(), &Trace{AttemptStart: func(TraceAttempt) { panic("hook") }})
	if !swallowPanic(func() { tr.RoundTrip(httptestRequest("GET", "http://a.test/x", "").WithContext(ctx)) }) {
		t.Fatal("the hook did not panic")
	}
	if got := tr.lastResortInFlight.Load(); got != 0 {
		t.Errorf("last-resort slots in flight after the request = %d, want 0", got)
	}
	if code, err := get(t, tr, "http://a.test/x"); code != 200 {
		t.Errorf("the next request, untraced: %d %v; want the last resort's 200", code, err)
	}
}

// The same for the half-open probe: a panicking AttemptStart does not keep
// the probe gate (every request would be refused, probe_in_flight, for a
// Cooldown).
func TestTraceAttemptStartPanicFreesProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 200, "ok")
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{Cooldown: time.Minute},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		tr.upstreams[0].circuit.Trip(time.Now())
		time.Sleep(time.Minute + time.Second) // half-open: the next request probes
		ctx := WithTrace(context.Background(), &Trace{AttemptStart: func(TraceAttempt) { panic("hook") }})
		swallowPanic(func() { tr.RoundTrip(httptestRequest("GET", "http://a.test/x", "").WithContext(ctx)) })
		if code, err := get(t, tr, "http://a.test/x"); code != 200 {
			t.Errorf("the next request: %d %v; want the probe's 200 (the panicked probe was never sent)", code, err)
		}
	})
}

// A panicking AttemptDone for an abandoned hedge attempt still leaves
// abandon to cancel the attempt in flight, which would otherwise hold a
// goroutine and a connection until the upstream answered, and leave that
// answer undrained.
func TestTraceAbandonedHookPanicEndsAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var canceled atomic.Int32
		n.handle("a.test", slowly(time.Hour, "a", &canceled))
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 10 * time.Millisecond, Percent: 100}}))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel() // frees the leaked attempt at the end
		ctx = WithTrace(ctx, &Trace{AttemptDone: func(d TraceAttemptDone) {
			if d.Abandoned {
				panic("hook")
			}
		}})
		if !swallowPanic(func() { tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat", chatBody).WithContext(ctx)) }) {
			t.Fatal("the hook did not panic")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if canceled.Load() != 1 {
			t.Errorf("the abandoned attempt to a was not canceled after the hook's panic (it would run for the hour)")
		}
	})
}

// A panicking AttemptDone (plain round) or Done closes the answer in hand,
// as send does when Classify panics: its connection is given back.
func TestTraceHookPanicClosesAnswer(t *testing.T) {
	for _, hook := range []string{"AttemptDone", "Done"} {
		t.Run(hook, func(t *testing.T) {
			body := &closeCounter{Reader: strings.NewReader("ok")}
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp := respond(200, "")
				resp.Body = body
				return resp, nil
			})
			tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
			var tc Trace
			if hook == "Done" {
				tc.Done = func(TraceDone) { panic("hook") }
			} else {
				tc.AttemptDone = func(TraceAttemptDone) { panic("hook") }
			}
			ctx := WithTrace(context.Background(), &tc)
			if !swallowPanic(func() { tr.RoundTrip(httptestRequest("GET", "http://a.test/x", "").WithContext(ctx)) }) {
				t.Fatal("the hook did not panic")
			}
			if body.closed == 0 {
				t.Errorf("%s panicked: the answer's body was never closed", hook)
			}
		})
	}
}

// The first upstream answers in the request's first attempt; a hedge that
// found the second upstream cooling down passed nothing over before it:
// the request is answered, not failed_over.
func TestTraceHedgeSkipIsNotFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(50*time.Millisecond, "a", new(atomic.Int32)))
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 10 * time.Millisecond, Percent: 100}}))
		tr.coolDown(tr.upstreams[1], nil, respond(429, "", "Retry-After", "30"), time.Now())
		var r recordTrace
		resp, err := tr.RoundTrip(traced(httptestRequest("POST", "http://a.test/v1/chat", chatBody), &r))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if r.done.Outcome != RequestAnswered || r.done.Upstream != "a" || r.done.Attempt != 1 {
			t.Errorf("Done = %+v (trace %q); want answered by a's attempt 1: nothing before it was passed over", r.done, r.lines)
		}
		if m := scrapeMetrics(tr); !strings.Contains(m, `failover_requests_total{upstream="a",outcome="answered"} 1`) {
			t.Errorf("metrics:\n%s\nwant a's request counted answered", seriesLines(m, "failover_requests_total"))
		}
	})
}

// A custom Classifier that returns Canceled for a response while the
// caller's context is alive: the caller gets that answer with a nil
// error, so the request is failed (not served) under the upstream that
// answered, in the metric as in Done.
func TestTraceClassifierCanceledWithResponse(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 499, "client closed")
	n.status("b.test", 200, "b")
	tr := newTestTransport(t, twoUpstreams(n, Config{Classify: func(resp *http.Response, err error) Outcome {
		if resp != nil && resp.StatusCode == 499 {
			return Canceled
		}
		return DefaultClassifier(resp, err)
	}}))
	var r recordTrace
	resp, err := tr.RoundTrip(traced(httptestRequest("GET", "http://a.test/x", ""), &r))
	if err != nil || resp.StatusCode != 499 {
		t.Fatalf("got %v %v, want a's 499", resp, err)
	}
	resp.Body.Close()
	if r.done.Outcome == RequestCanceled {
		t.Errorf("Done.Outcome = canceled for an answer the caller got with a live context (Done = %+v)", r.done)
	}
	m := scrapeMetrics(tr)
	if !strings.Contains(m, `failover_requests_total{upstream="a",`) || strings.Contains(m, `failover_requests_total{upstream="",outcome="canceled"} 1`) {
		t.Errorf("metrics:\n%s\nwant the request under upstream=\"a\", whose answer the caller got", seriesLines(m, "failover_requests_total"))
	}
}

// A held answer returned after a wait between rounds: Duration (and
// failover_request_duration_seconds) include the wait the caller sat
// through, not only the time to the held attempt's end.
func TestTraceDurationIncludesWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		tr := newTestTransport(t, Config{Base: n, Retries: 1, RetryWaitMin: time.Second, RetryWaitMax: time.Second, Retry: RetryConfig{Off: true},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		calls := 0
		req := httptestRequest("POST", "http://a.test/x", "{}")
		req.GetBody = func() (io.ReadCloser, error) {
			calls++
			return nil, errors.New("gone")
		}
		req.Body = io.NopCloser(bytes.NewReader([]byte("{}")))
		var r recordTrace
		start := time.Now()
		resp, err := tr.RoundTrip(traced(req, &r))
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if took < time.Second || calls == 0 {
			t.Fatalf("the test is broken: RoundTrip took %v, GetBody called %d times", took, calls)
		}
		if r.done.Duration < took {
			t.Errorf("Done.Duration = %v, but RoundTrip took %v (Done = %+v)", r.done.Duration, took, r.done)
		}
	})
}

// UnroutedFirst leaves alone a request to another upstream's own host
// whose path lies outside that upstream's base path but under the first's:
// Done's Err is scrubbed on the paths that return Base's own error:
// UnroutedPass, and a routed request that no upstream can send (Rejected
// with an error), as AttemptDone's is.
func TestTraceDoneErrCarriesNoCredential(t *testing.T) {
	const key = "sk-caller-qwqw"
	t.Run("pass", func(t *testing.T) {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return nil, fmt.Errorf("proxy refused %s", r.URL)
		})
		tr := newTestTransport(t, Config{Base: base, Unrouted: UnroutedPass, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}})
		var r recordTrace
		tr.RoundTrip(traced(httptestRequest("GET", "http://c.test/v1/x?key="+key, ""), &r))
		if r.done.Err != nil && strings.Contains(r.done.Err.Error(), key) {
			t.Errorf("Done.Err = %q holds the caller's key", r.done.Err)
		}
	})
	t.Run("rejected", func(t *testing.T) {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return nil, fmt.Errorf("net/http: invalid header field value %q for key Authorization", r.Header.Get("Authorization"))
		})
		tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}})
		var r recordTrace
		req := httptestRequest("GET", "http://a.test/v1/x", "")
		req.Header.Set("Authorization", "Bearer "+key)
		_, err := tr.RoundTrip(traced(req, &r))
		if err == nil {
			t.Fatal("no error")
		}
		for _, a := range r.args {
			if d, ok := a.(TraceAttemptDone); ok && d.Err != nil && strings.Contains(d.Err.Error(), key) {
				t.Errorf("AttemptDone.Err holds the key: %q", d.Err)
			}
		}
		if r.done.Err != nil && strings.Contains(r.done.Err.Error(), key) {
			t.Errorf("Done.Err = %q holds the caller's key (AttemptDone's was scrubbed)", r.done.Err)
		}
	})
}

// A redirect hop to a host no upstream has is a RoundTrip of its own with
// scrapeMetrics returns tr's exposition.
func scrapeMetrics(tr *Transport) string {
	var b bytes.Buffer
	tr.WritePrometheus(&b)
	return b.String()
}

// seriesLines returns the sample lines of exposition s that contain sub.
func seriesLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// AttemptDone says where each attempt went, without the query.
func TestTraceAttemptURL(t *testing.T) {
	primary := newUpstreamServer(t, 503, "down")
	backup := newUpstreamServer(t, 200, "up")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	var got []string
	ctx := WithTrace(context.Background(), &Trace{AttemptDone: func(d TraceAttemptDone) { got = append(got, d.URL) }})
	req := httptestRequest("POST", primary.URL+"/v1/chat/completions?key=secret", chatBody).WithContext(ctx)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := []string{primary.URL + "/v1/chat/completions", backup.URL + "/v1/chat/completions"}
	if !slices.Equal(got, want) {
		t.Errorf("URLs %q, want %q", got, want)
	}
}

// TestWithTraceComposesEveryHook: each hook of a Trace, present or added
// later, is called for both Traces of a context.
func TestWithTraceComposesEveryHook(t *testing.T) {
	calls := map[string]int{}
	hooks := func() *Trace {
		tr := &Trace{}
		v := reflect.ValueOf(tr).Elem()
		for i := range v.NumField() {
			f, name := v.Field(i), v.Type().Field(i).Name
			if f.Kind() != reflect.Func {
				continue
			}
			f.Set(reflect.MakeFunc(f.Type(), func([]reflect.Value) []reflect.Value { calls[name]++; return nil }))
		}
		return tr
	}
	ctx := WithTrace(WithTrace(context.Background(), hooks()), hooks())
	v := reflect.ValueOf(ContextTrace(ctx)).Elem()
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		if f.Kind() != reflect.Func {
			continue
		}
		if f.IsNil() {
			t.Errorf("%s not composed", name)
			continue
		}
		f.Call([]reflect.Value{reflect.New(f.Type().In(0)).Elem()})
		if calls[name] != 2 {
			t.Errorf("%s called %d times, want both", name, calls[name])
		}
	}
}
