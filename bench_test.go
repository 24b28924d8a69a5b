package failover_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/VictoriaMetrics/metrics"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/failover-go/failover"
	"github.com/failover-go/failover/failovertest"
)

// The benchmarks of the hot path, side by side with what users would pick
// instead. bench/run.sh runs them with -benchmem, -count and -cpu 1,2 and
// prints benchstat tables with the ratios to the first column:
//
//	BenchmarkRoundTrip/impl={bare,failover,failover_2up,failsafehttp,retryablehttp}/mode={serial,parallel}
//	BenchmarkDecision/impl={canned,floor,sketch,sketch_full,failover,failover_2up,failover_2up_hedged,failover_traced}/mode={serial,parallel}
//	BenchmarkFailover/case={direct,refused,open,429,429_each}/mode={serial,parallel}
//
// Every variant has its own clone of http.DefaultTransport (with room for 16
// idle connections per host, so that RunParallel never closes and reopens
// connections) and reaches a loopback httptest server through an
// http.Client, as an SDK would. Each request is built anew, as an SDK
// builds it: a POST of a small chat request with GetBody, Content-Type,
// Accept and the caller's own Authorization.

const (
	// benchRequest is the body the caller sends.
	benchRequest = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hi"}],"max_tokens":8}`

	// benchReply is the upstream's answer: a 57-byte chat completion.
	benchReply = `{"id":"chatcmpl","object":"chat.completion","choices":[]}`

	// benchRateLimited is a 429's body, as OpenAI sends it.
	benchRateLimited = `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`

	benchCallerAuth  = "Bearer sk-caller-0123456789abcdef0123456789"
	benchPrimaryAuth = "Bearer sk-primary-0123456789abcdef0123456789"
	benchBackupAuth  = "Bearer sk-backup-0123456789abcdef0123456789"
)

var (
	benchJSON = []string{"application/json"}
	benchAuth = []string{benchCallerAuth}
)

// newBenchServer starts a loopback upstream that answers every request with
// code, body and the header pairs kv, and stops it when tb ends.
func newBenchServer(tb testing.TB, code int, body string, kv ...string) *httptest.Server {
	tb.Helper()
	extra := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		extra.Set(kv[i], kv[i+1])
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h["Content-Type"] = benchJSON
		for k, v := range extra {
			h[k] = v
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// newHTTPTransport returns a variant's own connection pool.
func newHTTPTransport(tb testing.TB) *http.Transport {
	ht := http.DefaultTransport.(*http.Transport).Clone()
	ht.MaxIdleConnsPerHost = 16
	tb.Cleanup(ht.CloseIdleConnections)
	return ht
}

func newBenchTransport(tb testing.TB, cfg failover.Config) *failover.Transport {
	tb.Helper()
	tr, err := failover.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		tr.Close() // a Config.Shared's goroutines, a Config.Probe's
		tr.CloseIdleConnections()
	})
	return tr
}

// newChatRequest builds the request an SDK sends to url.
func newChatRequest(ctx context.Context, url string) *http.Request {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(benchRequest))
	if err != nil {
		panic(err) // the URLs here are all well formed
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", benchCallerAuth)
	return req
}

// chat sends one chat request through c and reads the whole answer.
func chat(c *http.Client, url string) error {
	resp, err := c.Do(newChatRequest(context.Background(), url))
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return err
	case resp.StatusCode != http.StatusOK || n != int64(len(benchReply)):
		return fmt.Errorf("got %d with %d bytes, want 200 with %d", resp.StatusCode, n, len(benchReply))
	}
	return nil
}

// chatWorker sends chat requests to url through rt, from any goroutine.
func chatWorker(rt http.RoundTripper, url string) func() func() error {
	c := &http.Client{Transport: rt}
	op := func() error { return chat(c, url) }
	return func() func() error { return op }
}

// benchModes runs mode=serial and mode=parallel sub-benchmarks. setup
// builds a fresh variant for each and returns a factory of workers: each
// goroutine gets its own worker, an op to repeat. A few ops run before the
// timer starts (connections opened, a circuit opened, a cooldown started),
// then check, when not nil, says whether the variant is in the state it
// is meant to measure.
func benchModes(b *testing.B, setup func(b *testing.B) (worker func() func() error, check func() error)) {
	prepare := func(b *testing.B) func() func() error {
		worker, check := setup(b)
		op := worker()
		for range 10 {
			if err := op(); err != nil {
				b.Fatal(err)
			}
		}
		if check != nil {
			if err := check(); err != nil {
				b.Fatal(err)
			}
		}
		return worker
	}
	b.Run("mode=serial", func(b *testing.B) {
		op := prepare(b)()
		b.ReportAllocs()
		for b.Loop() {
			if err := op(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("mode=parallel", func(b *testing.B) {
		worker := prepare(b)
		b.ReportAllocs()
		b.ResetTimer()
		runParallel(b, worker)
	})
}

// runParallel runs worker's ops from b.RunParallel's goroutines, one worker
// each.
func runParallel(b *testing.B, worker func() func() error) {
	b.RunParallel(func(pb *testing.PB) {
		op := worker()
		for pb.Next() {
			if err := op(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRoundTrip is the healthy path end to end, this package against
// a bare http.Transport and the alternatives. impl=failover is the usual
// configuration: one upstream carrying its own Authorization while the
// caller sets its own.
func BenchmarkRoundTrip(b *testing.B) {
	srv := newBenchServer(b, http.StatusOK, benchReply)
	url := srv.URL + "/v1/chat/completions"
	impls := []struct {
		name string
		rt   func(b *testing.B) http.RoundTripper
	}{
		{"bare", func(b *testing.B) http.RoundTripper { return newHTTPTransport(b) }},
		{"floor", func(b *testing.B) http.RoundTripper {
			return &floorWrapper{base: newHTTPTransport(b), auth: benchPrimaryAuth}
		}},
		{"failover", func(b *testing.B) http.RoundTripper {
			return newBenchTransport(b, failover.Config{
				Base: newHTTPTransport(b),
				Upstreams: []failover.Upstream{
					{Name: "primary", BaseURL: srv.URL + "/v1", Header: http.Header{"Authorization": {benchPrimaryAuth}}},
				},
			})
		}},
		{"failover_2up", func(b *testing.B) http.RoundTripper {
			return newBenchTransport(b, failover.Config{
				Base: newHTTPTransport(b),
				Upstreams: []failover.Upstream{
					{Name: "primary", BaseURL: srv.URL + "/v1", Header: http.Header{"Authorization": {benchPrimaryAuth}}},
					{Name: "backup", BaseURL: srv.URL + "/backup/v1", Header: http.Header{"Authorization": {benchBackupAuth}}},
				},
			})
		}},
		{"failsafehttp", func(b *testing.B) http.RoundTripper {
			// What a user of failsafe-go writes: a breaker that
			// counts errors and 5xx, inside failsafehttp's retries.
			cb := circuitbreaker.NewBuilder[*http.Response]().
				HandleIf(func(resp *http.Response, err error) bool { return err != nil || resp.StatusCode >= 500 }).
				WithFailureThreshold(5).
				WithDelay(30 * time.Second).
				Build()
			return failsafehttp.NewRoundTripper(newHTTPTransport(b), failsafehttp.NewRetryPolicyBuilder().Build(), cb)
		}},
		{"retryablehttp", func(b *testing.B) http.RoundTripper {
			c := retryablehttp.NewClient()
			c.Logger = nil
			c.HTTPClient = &http.Client{Transport: newHTTPTransport(b)}
			return &retryablehttp.RoundTripper{Client: c}
		}},
	}
	for _, impl := range impls {
		b.Run("impl="+impl.name, func(b *testing.B) {
			benchModes(b, func(b *testing.B) (func() func() error, func() error) {
				return chatWorker(impl.rt(b), url), nil
			})
		})
	}
}

// floorWrapper is the least a wrapper that swaps credentials can do, the
// floor the Transport's own work is measured against (issue 15): it
// shallow-copies the request, gives it a new header map with its
// Authorization swapped, reads the clock before and after, and bumps two
// atomic counters. It routes nothing, judges nothing, and fails over to
// nothing.
type floorWrapper struct {
	base           http.RoundTripper
	auth           string
	requests, took atomic.Int64
}

func (f *floorWrapper) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	out := *req
	h := make(http.Header, len(req.Header))
	for k, v := range req.Header {
		h[k] = v
	}
	h["Authorization"] = []string{f.auth}
	out.Header = h
	resp, err := f.base.RoundTrip(&out)
	f.requests.Add(1)
	f.took.Add(int64(time.Since(start)))
	return resp, err
}

// sketchWrapper is the floor with every per-request step of this
// package in the least form each could take, with nothing around them: no
// call or attempt, no Router, no hedging, no Trace, no options, no
// failover path, no panic safety but the permit's. It routes by a map
// from host to upstream, admits with two atomic loads, drops the caller's
// credential headers, checks the body is in memory, classifies the
// status, counts the breaker's window, the health window's ring and the
// hang detector's two timestamps, reads two headroom headers, updates the
// real VictoriaMetrics counters and histograms the metrics export, and
// looks whether the answer is a stream. What it costs over the floor is
// the least any design with these features can cost on this path (issue
// 15): the decision path's target is measured against both.
type sketchWrapper struct {
	base  http.RoundTripper
	hosts map[string]*sketchUpstream
	epoch time.Time
	reqs  *metrics.Counter
	took  *metrics.PrometheusHistogram
}

type sketchUpstream struct {
	path                 string
	auth                 []string // made once, as the Transport's Upstream.Header
	state, coolUntil     atomic.Int64
	successes, failures  atomic.Int64
	busySince, lastReply atomic.Int64
	ring                 [1024]atomic.Int64
	next                 atomic.Uint64
	remaining            atomic.Int64
	requests             *metrics.Counter
	duration             *metrics.PrometheusHistogram
}

func newSketchWrapper(base http.RoundTripper) *sketchWrapper {
	s := metrics.NewSet()
	return &sketchWrapper{
		base:  base,
		epoch: time.Now(),
		reqs:  s.NewCounter(`sketch_requests_total{outcome="ok"}`),
		took:  s.NewPrometheusHistogram(`sketch_request_seconds`),
		hosts: map[string]*sketchUpstream{"primary.example": {
			path:     "/v1",
			auth:     []string{benchPrimaryAuth},
			requests: s.NewCounter(`sketch_attempts_total{upstream="primary"}`),
			duration: s.NewPrometheusHistogram(`sketch_attempt_seconds{upstream="primary"}`),
		}},
	}
}

var errSketchRefused = fmt.Errorf("sketch: upstream not admitted")

// handOver is the sketches' last step: it looks whether the answer is a
// stream (whose body the package wraps), and shows the caller's request.
func handOver(req *http.Request, resp *http.Response) {
	if resp != nil {
		if ct := resp.Header["Content-Type"]; len(ct) > 0 && strings.HasPrefix(ct[0], "text/event-stream") {
			resp.Body = io.NopCloser(resp.Body)
		}
		resp.Request = req
	}
}

func (s *sketchWrapper) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	u := s.hosts[req.URL.Host]
	if u == nil || !strings.HasPrefix(req.URL.Path, u.path) {
		return s.base.RoundTrip(req)
	}
	now := int64(start.Sub(s.epoch))
	if u.state.Load() != 0 || u.coolUntil.Load() > now {
		return nil, errSketchRefused
	}
	defer u.state.CompareAndSwap(2, 0) // the permit, handed back even on a panic
	out := *req
	h := make(http.Header, len(req.Header))
	for k, v := range req.Header {
		switch k {
		case "Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key":
			continue
		}
		h[k] = v
	}
	h["Authorization"] = u.auth
	out.Header = h
	if sr, ok := out.Body.(interface{ Len() int }); ok && int64(sr.Len()) != out.ContentLength {
		return nil, errSketchRefused
	}
	u.busySince.Store(now)
	resp, err := s.base.RoundTrip(&out)
	end := time.Now()
	d := end.Sub(start)
	at := int64(end.Sub(s.epoch))
	u.lastReply.Store(at)
	ok := err == nil && resp.StatusCode < 500 && resp.StatusCode != 429
	if ok {
		u.successes.Add(1)
		if v := resp.Header["X-Ratelimit-Remaining-Requests"]; len(v) > 0 && v[0] == "0" {
			u.remaining.Store(0)
		}
		if v := resp.Header["Anthropic-Ratelimit-Requests-Remaining"]; len(v) > 0 && v[0] == "0" {
			u.remaining.Store(0)
		}
	} else {
		u.failures.Add(1)
	}
	u.ring[u.next.Add(1)%1024].Store(at)
	u.requests.Inc()
	u.duration.Update(d.Seconds())
	s.reqs.Inc()
	s.took.Update(d.Seconds())
	handOver(req, resp)
	return resp, err
}

// sketchFullWrapper is the sketch with, in the least form each could
// take, every other check this package's features make on the healthy
// path: a flag for each feature that is off (Trace, per-request options,
// Hedge, Router, Models, StreamGuard, Degraded), the caller's context
// looked at before the attempt, a candidate loop with the call's state on
// the stack, Upstream.Header's entries set by a loop, the upstream's own
// headers left out of the caller's by a lookup, the body kept for replay,
// the Classifier called through a func value, the hang detector's
// in-flight count and quiet time, the headroom's and cooldown's
// deadlines, the body's look for a reader in memory inside io.NopCloser
// (the sketch's looks at the wrapper only, which never holds one), and one
// deferred func that hands the permit back and closes the answer on a
// panic. What it costs over the sketch is the least those
// features can cost on this path (issue 15).
type sketchFullWrapper struct {
	sketchWrapper
	tracing, optioning, hedge, routed, models, guard, degraded bool
	classify                                                   func(*http.Response, error) int
	ups                                                        []*sketchFullUpstream
	hangMin                                                    int64
	hangFor                                                    int64
}

type sketchFullUpstream struct {
	*sketchUpstream
	header [1]struct {
		key    string
		values []string
	}
	inflight     atomic.Int64
	headroomTill atomic.Int64
}

type sketchTraceKey struct{}

// sketchInMemory is the least form of the package's look at the body: is
// it, inside the io.NopCloser that http.NewRequest wraps it in (read
// through the interface's data word), a reader in memory holding exactly
// n bytes? Such a body fails no read and disagrees with no
// ContentLength; any other would need a watcher, and its allocation.
func sketchInMemory(body io.Reader, n int64) bool {
	if t := reflect.TypeOf(body); t == sketchNopCloser || t == sketchNopCloserWriterTo {
		body = *(*io.Reader)((*[2]unsafe.Pointer)(unsafe.Pointer(&body))[1])
	}
	switch r := body.(type) {
	case *strings.Reader:
		return int64(r.Len()) == n
	case *bytes.Reader:
		return int64(r.Len()) == n
	}
	return false
}

var (
	sketchNopCloser         = reflect.TypeOf(io.NopCloser(nil))
	sketchNopCloserWriterTo = reflect.TypeOf(io.NopCloser(strings.NewReader("")))
)

func newSketchFullWrapper(base http.RoundTripper) *sketchFullWrapper {
	s := &sketchFullWrapper{sketchWrapper: *newSketchWrapper(base), hangMin: 2, hangFor: int64(time.Minute)}
	u := &sketchFullUpstream{sketchUpstream: s.hosts["primary.example"]}
	u.header[0].key, u.header[0].values = "Authorization", u.auth
	s.ups = []*sketchFullUpstream{u}
	s.classify = func(resp *http.Response, err error) int {
		if err != nil || resp.StatusCode >= 500 || resp.StatusCode == 429 {
			return 1
		}
		return 0
	}
	return s
}

func (s *sketchFullWrapper) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	ctx := req.Context()
	if s.tracing && ctx.Value(sketchTraceKey{}) != nil {
		return nil, errSketchRefused
	}
	if s.optioning && ctx.Value(sketchTraceKey{}) != nil {
		return nil, errSketchRefused
	}
	if s.hosts[req.URL.Host] == nil || !strings.HasPrefix(req.URL.Path, "/v1") || req.Response != nil {
		return s.base.RoundTrip(req)
	}
	first, getBody := req.Body, req.GetBody // the body's replay
	var held *http.Response
	for i, u := range s.ups {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if s.hedge || s.routed || s.models {
			return nil, errSketchRefused
		}
		now := int64(start.Sub(s.epoch))
		if u.state.Load() != 0 || u.coolUntil.Load() > now {
			continue
		}
		if u.headroomTill.Load() > now || s.degraded ||
			(u.inflight.Load() >= s.hangMin && now-max(u.busySince.Load(), u.lastReply.Load()) > s.hangFor) {
			continue // demoted: tried after the others
		}
		resp, err, ok := s.attempt(req, u, i, first, getBody, start, now)
		if ok {
			return resp, err
		}
		held = resp // the latest answer, returned if nothing better comes
	}
	if held != nil {
		return held, nil
	}
	return nil, errSketchRefused
}

func (s *sketchFullWrapper) attempt(req *http.Request, u *sketchFullUpstream, i int, body io.ReadCloser, getBody func() (io.ReadCloser, error), start time.Time, now int64) (resp *http.Response, err error, ok bool) {
	u.inflight.Add(1)
	u.busySince.Store(now)
	defer func() {
		v := recover()
		u.inflight.Add(-1)
		u.state.CompareAndSwap(2, 0) // the permit
		if v != nil {
			if resp != nil {
				resp.Body.Close()
			}
			panic(v)
		}
	}()
	out := *req
	h := make(http.Header, len(req.Header)+len(u.header))
	for k, v := range req.Header {
		if k == u.header[0].key {
			continue // the upstream sets it
		}
		if i > 0 {
			switch k {
			case "Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key":
				continue
			}
		}
		h[k] = v
	}
	for _, f := range u.header {
		h[f.key] = f.values
	}
	out.Header = h
	out.Body, out.GetBody = body, getBody
	if out.Body != nil && !sketchInMemory(out.Body, out.ContentLength) {
		return nil, errSketchRefused, true
	}
	resp, err = s.base.RoundTrip(&out)
	if s.guard {
		return nil, errSketchRefused, true
	}
	end := time.Now()
	d := end.Sub(start)
	at := int64(end.Sub(s.epoch))
	u.lastReply.Store(at)
	if s.classify(resp, err) == 0 {
		u.successes.Add(1)
		if v := resp.Header["X-Ratelimit-Remaining-Requests"]; len(v) > 0 && v[0] == "0" {
			u.remaining.Store(0)
		}
		if v := resp.Header["Anthropic-Ratelimit-Requests-Remaining"]; len(v) > 0 && v[0] == "0" {
			u.remaining.Store(0)
		}
		ok = true
	} else {
		u.failures.Add(1)
	}
	u.ring[u.next.Add(1)%1024].Store(at)
	u.requests.Inc()
	u.duration.Update(d.Seconds())
	if !ok {
		return resp, err, false
	}
	s.reqs.Inc()
	s.took.Update(d.Seconds())
	handOver(req, resp)
	return resp, err, true
}

// refusedWorker sends chat requests through rt to url, a port that refuses
// them: every request must fail.
func refusedWorker(rt http.RoundTripper, url string) func() func() error {
	c := &http.Client{Transport: rt}
	op := func() error {
		resp, err := c.Do(newChatRequest(context.Background(), url))
		if err == nil {
			resp.Body.Close()
			return fmt.Errorf("got %d from a port that refuses connections", resp.StatusCode)
		}
		return nil
	}
	return func() func() error { return op }
}

// cannedKey is the context key of a decision-path worker's response.
type cannedKey struct{}

// cannedBase is a Base that sends nothing: it answers every request with the
// response that the request's context carries, one per worker and reused,
// so that it allocates nothing and the decision path times only the
// package's own work.
type cannedBase struct{}

func (cannedBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		r.Body.Close()
	}
	resp := r.Context().Value(cannedKey{}).(*http.Response)
	resp.Body = http.NoBody
	resp.Request = r
	return resp, nil
}

// cannedWorker sends one request, built once per worker, through rt again
// and again (a Transport never changes the caller's request).
func cannedWorker(rt http.RoundTripper, url string) func() func() error {
	return cannedWorkerTraced(rt, url, nil)
}

// cannedWorkerTraced is cannedWorker with trace attached to every request
// (none when nil).
func cannedWorkerTraced(rt http.RoundTripper, url string, trace *failover.Trace) func() func() error {
	return func() func() error {
		resp := &http.Response{
			Status:     "200 OK",
			StatusCode: http.StatusOK,
			Proto:      "HTTP/1.1",
			ProtoMajor: 1,
			ProtoMinor: 1,
			Header:     http.Header{"Content-Type": benchJSON},
		}
		req := newChatRequest(failover.WithTrace(context.WithValue(context.Background(), cannedKey{}, resp), trace), url)
		return func() error { return roundTripOK(rt, req) }
	}
}

// decisionConfig is the usual configuration over a Base that answers at
// once: impl=failover has one upstream, impl=failover_2up a backup too.
func decisionConfig(upstreams int) failover.Config {
	cfg := failover.Config{
		Base: cannedBase{},
		Upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: "https://primary.example/v1", Header: http.Header{"Authorization": {benchPrimaryAuth}}},
			{Name: "backup", BaseURL: "https://backup.example/v1", Header: http.Header{"Authorization": {benchBackupAuth}}},
		},
	}
	cfg.Upstreams = cfg.Upstreams[:upstreams]
	return cfg
}

// BenchmarkDecision is the package's own work on the healthy path, with no
// I/O: routing, the clone and rewrite, the breaker, classification, metrics
// and the health window. impl=canned is the Base alone.
func BenchmarkDecision(b *testing.B) {
	const url = "https://primary.example/v1/chat/completions"
	impls := []struct {
		name string
		rt   func(b *testing.B) http.RoundTripper
	}{
		{"canned", func(*testing.B) http.RoundTripper { return cannedBase{} }},
		{"floor", func(*testing.B) http.RoundTripper { return &floorWrapper{base: cannedBase{}, auth: benchPrimaryAuth} }},
		{"sketch", func(*testing.B) http.RoundTripper { return newSketchWrapper(cannedBase{}) }},
		{"sketch_full", func(*testing.B) http.RoundTripper { return newSketchFullWrapper(cannedBase{}) }},
		{"failover", func(b *testing.B) http.RoundTripper { return newBenchTransport(b, decisionConfig(1)) }},
		{"failover_2up", func(b *testing.B) http.RoundTripper { return newBenchTransport(b, decisionConfig(2)) }},
		{"failover_2up_hedged", func(b *testing.B) http.RoundTripper {
			// A hedge that never fires: what Config.Hedge costs a
			// request answered within the delay.
			cfg := decisionConfig(2)
			cfg.Hedge = &failover.HedgeConfig{Delay: time.Minute}
			return newBenchTransport(b, cfg)
		}},
	}
	for _, impl := range impls {
		b.Run("impl="+impl.name, func(b *testing.B) {
			benchModes(b, func(b *testing.B) (func() func() error, func() error) {
				return cannedWorker(impl.rt(b), url), nil
			})
		})
	}
	// A request that carries a Trace with every hook set, each doing
	// nothing: what the hooks cost (impl=failover is the same request
	// without one).
	b.Run("impl=failover_traced", func(b *testing.B) {
		benchModes(b, func(b *testing.B) (func() func() error, func() error) {
			var n atomic.Int64
			trace := &failover.Trace{
				Skipped:      func(failover.TraceSkip) { n.Add(1) },
				AttemptStart: func(failover.TraceAttempt) { n.Add(1) },
				AttemptDone:  func(failover.TraceAttemptDone) { n.Add(1) },
				Done:         func(failover.TraceDone) { n.Add(1) },
			}
			return cannedWorkerTraced(newBenchTransport(b, decisionConfig(1)), url, trace), nil
		})
	})
}

// BenchmarkScale is the decision path as a larger user configures it:
// 1, 8 and 64 upstreams (the request addressed to the first, each on its
// own host) under the default order, each Router, and a Hedge that never
// fires. No upstream has a Cost, so nothing is metered. Its figures are
// the scale table of bench/run.sh (issue 15: the cost at 64 at most 1.5
// times the cost at 1).
func BenchmarkScale(b *testing.B) {
	const url = "https://u0.example/v1/chat/completions"
	routers := []struct {
		name string
		cfg  func(*failover.Config)
	}{
		{"default", func(*failover.Config) {}},
		{"priority", func(c *failover.Config) { c.Router = failover.Priority{} }},
		{"weighted", func(c *failover.Config) { c.Router = &failover.Weighted{} }},
		{"leastlatency", func(c *failover.Config) { c.Router = failover.LeastLatency{} }},
		{"score", func(c *failover.Config) { c.Router = failover.Score{} }},
		{"hedge", func(c *failover.Config) { c.Hedge = &failover.HedgeConfig{Delay: time.Minute} }},
	}
	for _, n := range []int{1, 8, 64} {
		for _, r := range routers {
			b.Run(fmt.Sprintf("upstreams=%d/router=%s", n, r.name), func(b *testing.B) {
				cfg := failover.Config{Base: cannedBase{}}
				for i := range n {
					cfg.Upstreams = append(cfg.Upstreams, failover.Upstream{
						Name:    fmt.Sprint("u", i),
						BaseURL: fmt.Sprintf("https://u%d.example/v1", i),
						Header:  http.Header{"Authorization": {benchPrimaryAuth}},
					})
					if i == 0 {
						// Weighted sends nearly every request to the
						// addressed upstream, as the others do: a request
						// another upstream serves costs more (a URL copy,
						// the view of resp.Request) whatever n is.
						// LeastLatency spreads the requests over equal
						// candidates by design, and pays that.
						cfg.Upstreams[0].Weight = 1e6
					}
				}
				r.cfg(&cfg)
				tr := newBenchTransport(b, cfg)
				benchModes(b, func(b *testing.B) (func() func() error, func() error) {
					return cannedWorker(tr, url), nil
				})
			})
		}
	}
}

// BenchmarkContention is the decision path from many goroutines at once:
// parallelism 1, 16 and 256 goroutines per CPU, to compare at -cpu 1 and
// -cpu 2 (issue 15: no lock every request takes, so ns/op at -cpu 2 no
// worse than at -cpu 1). impl=weighted has two upstreams under Weighted,
// whose pick takes a lock; impl=failover the default order.
func BenchmarkContention(b *testing.B) {
	const url = "https://primary.example/v1/chat/completions"
	for _, impl := range []struct {
		name string
		cfg  func() failover.Config
	}{
		{"failover", func() failover.Config { return decisionConfig(1) }},
		{"weighted", func() failover.Config {
			cfg := decisionConfig(2)
			cfg.Router = &failover.Weighted{}
			return cfg
		}},
	} {
		for _, p := range []int{1, 16, 256} {
			b.Run(fmt.Sprintf("impl=%s/parallelism=%d", impl.name, p), func(b *testing.B) {
				worker := cannedWorker(newBenchTransport(b, impl.cfg()), url)
				b.ReportAllocs()
				b.SetParallelism(p)
				runParallel(b, worker)
			})
		}
	}
}

// BenchmarkFailover is what failing over costs, against case=direct, the
// same request sent straight to the backup (its only upstream):
//
//   - case=refused: the primary refuses connections (its circuit never
//     opens here, so every request tries it first);
//   - case=open: the primary's circuit is open, so it is skipped;
//   - case=429: the primary answers 429 with Retry-After: 1, so it cools
//     down and is skipped, and about once a second meets the 429 again;
//   - case=429_each: the primary answers 429 with retry-after-ms: 0, so
//     every request meets the 429 before the backup serves it;
//   - case=dial_refused: no failover, a bare http.Transport's request to the
//     refusing port, which fails: what the refused dial costs by itself,
//     so that direct + dial_refused is the floor of case=refused.
func BenchmarkFailover(b *testing.B) {
	backup := newBenchServer(b, http.StatusOK, benchReply)
	limited := newBenchServer(b, http.StatusTooManyRequests, benchRateLimited, "Retry-After", "1")
	limitedEach := newBenchServer(b, http.StatusTooManyRequests, benchRateLimited, "Retry-After-Ms", "0")
	refused := failovertest.ClosedURL(b)

	backupUp := failover.Upstream{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {benchBackupAuth}}}
	primary := func(base string) failover.Upstream {
		return failover.Upstream{Name: "primary", BaseURL: base + "/v1", Header: http.Header{"Authorization": {benchPrimaryAuth}}}
	}
	health := func(tr *failover.Transport) failover.UpstreamHealth { return tr.Health()[0] }
	cases := []struct {
		name    string
		primary string // "" for none
		breaker failover.BreakerConfig
		check   func(failover.UpstreamHealth) error
	}{
		{name: "direct"},
		{
			name:    "refused",
			primary: refused,
			// A failure rate that needs more requests within its
			// period than any run sends: the circuit stays closed.
			// (FailureThreshold is at most 1000, which a run passes.)
			breaker: failover.BreakerConfig{FailureRate: 1, MinRequests: 1 << 30},
			check: func(h failover.UpstreamHealth) error {
				if h.State != "closed" || h.Requests.Failed == 0 {
					return fmt.Errorf("primary %s with %d failures, want closed and failing", h.State, h.Requests.Failed)
				}
				return nil
			},
		},
		{
			name:    "open",
			primary: refused,
			breaker: failover.BreakerConfig{Cooldown: time.Hour},
			check: func(h failover.UpstreamHealth) error {
				if h.State != "open" {
					return fmt.Errorf("primary %s, want open", h.State)
				}
				return nil
			},
		},
		{
			name:    "429",
			primary: limited.URL,
			check: func(h failover.UpstreamHealth) error {
				if h.Requests.RateLimited == 0 || h.Cooldown <= 0 {
					return fmt.Errorf("primary rate limited %d times, cooling down %v, want a cooldown", h.Requests.RateLimited, h.Cooldown)
				}
				return nil
			},
		},
		{
			name:    "429_each",
			primary: limitedEach.URL,
			check: func(h failover.UpstreamHealth) error {
				if h.Requests.RateLimited < 10 {
					return fmt.Errorf("primary rate limited %d times in 10 requests, want every time", h.Requests.RateLimited)
				}
				return nil
			},
		},
		{name: "dial_refused"},
	}
	for _, tc := range cases {
		b.Run("case="+tc.name, func(b *testing.B) {
			benchModes(b, func(b *testing.B) (func() func() error, func() error) {
				if tc.name == "dial_refused" {
					return refusedWorker(newHTTPTransport(b), refused+"/v1/chat/completions"), nil
				}
				cfg := failover.Config{Base: newHTTPTransport(b), Breaker: tc.breaker, Upstreams: []failover.Upstream{backupUp}}
				url := backup.URL + "/v1/chat/completions"
				if tc.primary != "" {
					cfg.Upstreams = []failover.Upstream{primary(tc.primary), backupUp}
					url = tc.primary + "/v1/chat/completions"
				}
				tr := newBenchTransport(b, cfg)
				var check func() error
				if tc.check != nil {
					check = func() error { return tc.check(health(tr)) }
				}
				return chatWorker(tr, url), check
			})
		})
	}
}

// TestDecisionPathMemory checks that memory stays bounded: heap in use after
// 1,000,000 requests through the decision path is within 1 MiB of what it
// was after 10,000. One request in a hundred fails on the primary and fails
// over, so that failure state (windows, last errors, failover counters) is
// exercised too. It takes a few seconds: it runs when FAILOVER_MEMTEST is
// set (bench/run.sh sets it), never in -short.
func TestDecisionPathMemory(t *testing.T) {
	if os.Getenv("FAILOVER_MEMTEST") == "" || testing.Short() {
		t.Skip("set FAILOVER_MEMTEST=1 to send 1,000,000 requests")
	}
	var n int
	cfg := decisionConfig(2)
	cfg.Base = roundTripper(func(r *http.Request) (*http.Response, error) {
		code := http.StatusOK
		if r.URL.Host == "primary.example" {
			n++
			if n%100 == 0 {
				code = http.StatusServiceUnavailable
			}
		}
		return &http.Response{StatusCode: code, Header: http.Header{"Content-Type": benchJSON}, Body: http.NoBody, Request: r}, nil
	})
	tr := newBenchTransport(t, cfg)
	req := newChatRequest(context.Background(), "https://primary.example/v1/chat/completions")
	run := func(n int) {
		for range n {
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("got %d, want 200", resp.StatusCode)
			}
		}
	}
	heap := func() (inuse, alloc uint64) {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse, m.HeapAlloc
	}
	run(10_000)
	inuse0, alloc0 := heap()
	run(990_000)
	inuse1, alloc1 := heap()
	t.Logf("heap in use after 10,000 requests: %d B; after 1,000,000: %d B (%+d B); live heap %d B -> %d B (%+d B)",
		inuse0, inuse1, int64(inuse1)-int64(inuse0), alloc0, alloc1, int64(alloc1)-int64(alloc0))
	if inuse1 > inuse0+1<<20 {
		t.Errorf("heap in use grew by %d B over 990,000 requests, want at most 1 MiB", inuse1-inuse0)
	}
	h := tr.Health()
	if got := h[0].Requests.Total(); got != 1_000_000 {
		t.Errorf("primary counted %d attempts, want 1000000", got)
	}
	if got := h[1].Requests.Success; got != 10_000 {
		t.Errorf("backup served %d, want 10000", got)
	}
	if h[0].State != "closed" {
		t.Errorf("primary %s, want closed (failures are 1 in 100)", h[0].State)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// BenchmarkWritePrometheus is a /metrics scrape of a Transport with
// upstreams=N upstreams (and Config.Hedge), each of which has answered one
// request, the first after failing over from the last: the series of every
// family the Transport registers up front, a failover pair, and histograms
// with an observation each.
func BenchmarkWritePrometheus(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("upstreams=%d", n), func(b *testing.B) {
			tr := scrapedTransport(b, n)
			var out strings.Builder
			tr.WritePrometheus(&out)
			b.ReportAllocs()
			for b.Loop() {
				tr.WritePrometheus(io.Discard)
			}
			b.ReportMetric(float64(strings.Count(out.String(), "\n")), "lines")
		})
	}
}

// BenchmarkHealth is Health's snapshot of the Transport that
// BenchmarkWritePrometheus scrapes (issue 15: linear in the number of
// upstreams).
func BenchmarkHealth(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("upstreams=%d", n), func(b *testing.B) {
			tr := scrapedTransport(b, n)
			if h := tr.Health(); len(h) != n {
				b.Fatalf("Health has %d upstreams, want %d", len(h), n)
			}
			b.ReportAllocs()
			for b.Loop() {
				tr.Health()
			}
		})
	}
}

// scrapedTransport is a Transport with n upstreams (and Config.Hedge), each
// of which has answered one request, the first after failing over from the
// last.
func scrapedTransport(b *testing.B, n int) *failover.Transport {
	cfg := failover.Config{
		Base: roundTripper(func(r *http.Request) (*http.Response, error) {
			code := http.StatusOK
			if r.URL.Host == fmt.Sprintf("u%d.example", n-1) && n > 1 {
				code = http.StatusServiceUnavailable
			}
			return &http.Response{StatusCode: code, Header: http.Header{"Content-Type": benchJSON}, Body: http.NoBody, Request: r}, nil
		}),
		Hedge: &failover.HedgeConfig{Delay: time.Minute},
	}
	for i := range n {
		cfg.Upstreams = append(cfg.Upstreams, failover.Upstream{Name: fmt.Sprintf("u%d", i), BaseURL: fmt.Sprintf("https://u%d.example/v1", i)})
	}
	tr := newBenchTransport(b, cfg)
	for i := range n {
		resp, err := tr.RoundTrip(newChatRequest(context.Background(), fmt.Sprintf("https://u%d.example/v1/chat/completions", i)))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
	return tr
}

// BenchmarkParallel is how the package scales with the cores (issue 27):
// 16 and 256 goroutines in all, whatever -cpu is, to compare at -cpu 1 and
// -cpu 2. Throughput at -cpu 2 over throughput at -cpu 1 (ns/op at -cpu 1
// over ns/op at -cpu 2) must be at least impl=bare's of the same base.
//
//   - base=loopback: an httptest upstream through an http.Client, as
//     BenchmarkRoundTrip's, with room for as many idle connections as
//     there are goroutines; impl=bare is the clone of
//     http.DefaultTransport alone.
//   - base=memory: no I/O, as BenchmarkDecision's (loopback networking
//     costs several times the Transport's work, and hides its
//     contention); impl=bare is the Base alone.
//
// impl=failover is the usual configuration, one upstream;
// impl=failover_failing has a backup, and the primary fails one request
// in failEvery (a 503) so that the failure paths (breaker counting, the
// failover, the window's failures) run too; impl=failover_shared is that
// with a Config.Shared that stores nothing, so that each failure is told
// to the fleet (the request rate it carries, u.rate, and the failures'
// density). Whether a request fails is the worker's choice, through a
// header (loopback) or its context (memory), so that no state is shared
// but the Transport's.
func BenchmarkParallel(b *testing.B) {
	srv := newBenchServer(b, http.StatusOK, benchReply)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header()["Content-Type"] = benchJSON
		if r.Header.Get(benchFailHeader) != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, benchReply)
	}))
	b.Cleanup(failing.Close)
	primary := func(base string) failover.Upstream {
		return failover.Upstream{Name: "primary", BaseURL: base + "/v1", Header: http.Header{"Authorization": {benchPrimaryAuth}}}
	}
	backup := func(base string) failover.Upstream {
		return failover.Upstream{Name: "backup", BaseURL: base + "/backup/v1", Header: http.Header{"Authorization": {benchBackupAuth}}}
	}
	// Consecutive failures as by default, but more than any run sends:
	// the primary's circuit stays closed and counts every result. (With
	// 256 requests in flight, a success that started before the latest
	// failure resets no count, and one failure in failEvery trips a
	// threshold of 8.)
	breaker := failover.BreakerConfig{FailureThreshold: 1000}
	bases := []struct {
		name     string
		upstream string // the primary's
		failing  string // the failing primary's
		backup   string // the failing primary's backup's
		base     func(b *testing.B, g int) http.RoundTripper
		worker   func(rt http.RoundTripper, url string, fail bool) func() func() error
	}{
		{"loopback", srv.URL, failing.URL, srv.URL, func(b *testing.B, g int) http.RoundTripper {
			ht := newHTTPTransport(b)
			ht.MaxIdleConnsPerHost = g // no connection closed and reopened
			return ht
		}, loopbackWorker},
		{"memory", "https://primary.example", "https://primary.example", "https://backup.example", func(*testing.B, int) http.RoundTripper {
			return parallelBase{}
		}, memoryWorker},
	}
	for _, base := range bases {
		impls := []struct {
			name string
			fail bool
			rt   func(b *testing.B, g int) http.RoundTripper
		}{
			{"bare", false, base.base},
			{"failover", false, func(b *testing.B, g int) http.RoundTripper {
				return newBenchTransport(b, failover.Config{Base: base.base(b, g), Upstreams: []failover.Upstream{primary(base.upstream)}})
			}},
			{"failover_failing", true, func(b *testing.B, g int) http.RoundTripper {
				return newBenchTransport(b, failover.Config{Base: base.base(b, g), Breaker: breaker, Upstreams: []failover.Upstream{primary(base.failing), backup(base.backup)}})
			}},
			{"failover_shared", true, func(b *testing.B, g int) http.RoundTripper {
				return newBenchTransport(b, failover.Config{
					Base:      base.base(b, g),
					Breaker:   breaker,
					Upstreams: []failover.Upstream{primary(base.failing), backup(base.backup)},
					Shared:    nopShared{},
				})
			}},
		}
		for _, impl := range impls {
			for _, g := range []int{16, 256} {
				b.Run(fmt.Sprintf("base=%s/impl=%s/goroutines=%d", base.name, impl.name, g), func(b *testing.B) {
					url := base.upstream + "/v1/chat/completions"
					if impl.fail {
						url = base.failing + "/v1/chat/completions"
					}
					rt := impl.rt(b, g)
					worker := base.worker(rt, url, impl.fail)
					op := worker()
					for range 2 * failEvery {
						if err := op(); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportAllocs()
					b.SetParallelism(max(g/runtime.GOMAXPROCS(0), 1))
					b.ResetTimer()
					runParallel(b, worker)
					b.StopTimer()
					if tr, ok := rt.(*failover.Transport); ok && impl.fail {
						// The primary's circuit must stay closed: one
						// failure in failEvery never trips it.
						if h := tr.Health()[0]; h.Requests.Failed == 0 || h.State != "closed" {
							b.Fatalf("primary %s with %d failures, want closed and failing", h.State, h.Requests.Failed)
						}
					}
				})
			}
		}
	}
}

// failEvery is how often a failing primary fails a worker's request: one
// in failEvery.
const failEvery = 32

// failPhase is where a new worker starts counting its requests to
// failEvery: the workers fail in turn, not all at once.
var failPhase atomic.Int64

func nextFailPhase() int { return int(failPhase.Add(13) % failEvery) }

// benchFailHeader asks the failing loopback primary to answer 503.
const benchFailHeader = "X-Bench-Fail"

// loopbackWorker is chatWorker whose requests, with fail, ask a failing
// primary to fail one in failEvery.
func loopbackWorker(rt http.RoundTripper, url string, fail bool) func() func() error {
	if !fail {
		return chatWorker(rt, url)
	}
	c := &http.Client{Transport: rt}
	return func() func() error {
		n := nextFailPhase()
		return func() error {
			req := newChatRequest(context.Background(), url)
			if n++; n%failEvery == 0 {
				req.Header.Set(benchFailHeader, "1")
			}
			resp, err := c.Do(req)
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("got %d, want 200", resp.StatusCode)
			}
			return err
		}
	}
}

// memoryWorker is cannedWorker whose requests, with fail, are answered
// 503 by the primary one in failEvery (the primary's host is
// primary.example).
func memoryWorker(rt http.RoundTripper, url string, fail bool) func() func() error {
	if !fail {
		return cannedWorker(rt, url)
	}
	return func() func() error {
		ok := &http.Response{StatusCode: http.StatusOK, ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{"Content-Type": benchJSON}}
		bad := &http.Response{StatusCode: http.StatusServiceUnavailable, ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{"Content-Type": benchJSON}}
		w := &failingCanned{ok: ok, bad: bad, n: nextFailPhase()}
		req := newChatRequest(context.WithValue(context.Background(), failingKey{}, w), url)
		return func() error {
			w.n++
			return roundTripOK(rt, req)
		}
	}
}

// failingKey is the context key of a failing memory worker's state.
type failingKey struct{}

// failingCanned is what cannedBase answers a failing memory worker's
// request with: bad, for the primary's attempt of one request in
// failEvery (n counts the worker's requests), else ok.
type failingCanned struct {
	ok, bad *http.Response
	n       int
}

// parallelBase is cannedBase that answers a failing memory worker's
// requests too.
type parallelBase struct{}

func (parallelBase) RoundTrip(r *http.Request) (*http.Response, error) {
	w, ok := r.Context().Value(failingKey{}).(*failingCanned)
	if !ok {
		return cannedBase{}.RoundTrip(r)
	}
	if r.Body != nil {
		r.Body.Close()
	}
	resp := w.ok
	if r.URL.Host == "primary.example" && w.n%failEvery == 0 {
		resp = w.bad
	}
	resp.Body = http.NoBody
	resp.Request = r
	return resp, nil
}

// nopShared is a Config.Shared that stores and tells nothing.
type nopShared struct{}

func (nopShared) Publish(context.Context, failover.SharedEvent) error { return nil }
func (nopShared) Load(context.Context, []string) ([]failover.SharedEvent, error) {
	return nil, nil
}
func (nopShared) Subscribe(ctx context.Context, _ func(failover.SharedEvent)) error {
	<-ctx.Done()
	return ctx.Err()
}
func (nopShared) AcquireProbe(context.Context, string, string, time.Duration) (bool, error) {
	return true, nil
}

// roundTripOK sends req through rt and closes the answer, which must be a
// 200.
func roundTripOK(rt http.RoundTripper, req *http.Request) error {
	r, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		return fmt.Errorf("got %d, want 200", r.StatusCode)
	}
	return nil
}

// BenchmarkStreamRead reads a 400-chunk chat completion stream through the
// Transport, with Config.Continue off and on: what the splice (which reads
// the stream an event at a time, to continue it if it breaks) costs an
// unbroken stream. Base answers from memory, so the Transport's own work
// is all that is timed.
func BenchmarkStreamRead(b *testing.B) {
	var stream bytes.Buffer
	for i := range 400 {
		fmt.Fprintf(&stream, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"token %d "},"finish_reason":null}]}`+"\n\n", i)
	}
	stream.WriteString("data: [DONE]\n\n")
	data := stream.Bytes()
	base := roundTripper(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
			Body: io.NopCloser(bytes.NewReader(data)), Request: r}, nil
	})
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("continue=%v", on), func(b *testing.B) {
			tr, err := failover.New(failover.Config{
				Base:     base,
				Continue: failover.ContinueConfig{On: on},
				Upstreams: []failover.Upstream{
					{Name: "a", BaseURL: "http://a.test/v1"},
					{Name: "b", BaseURL: "http://b.test/v1", Prefill: failover.Prefill{Chat: failover.ChatTrailingAssistant}},
				},
			})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"count"}]}`
			buf := make([]byte, 32<<10)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("POST", "http://a.test/v1/chat/completions", strings.NewReader(body))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{resp.Body}, buf); err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}
