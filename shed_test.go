package failover

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// clockHeader carries the time of the test's bubble (synctest) to a
// loopback server, which runs outside it.
const clockHeader = "X-Test-Clock"

// clocked is a Base for a Transport in a synctest bubble that talks to
// loopback servers started outside it: each attempt says the bubble's time
// in clockHeader, and no connection is kept idle (a goroutine blocked on
// a socket would keep the bubble's time from advancing).
func clocked() http.RoundTripper {
	base := &http.Transport{DisableKeepAlives: true}
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set(clockHeader, strconv.FormatInt(time.Now().UnixNano(), 10))
		return base.RoundTrip(r)
	})
}

// clock reads clockHeader.
func clock(r *http.Request) time.Time {
	n, _ := strconv.ParseInt(r.Header.Get(clockHeader), 10, 64)
	return time.Unix(0, n)
}

// budgetServer is a loopback upstream that takes limit requests a window,
// reporting its limit, what is left and the window's reset as OpenAI does,
// and answers 429 once the window's budget is spent.
type budgetServer struct {
	*httptest.Server
	limit  int
	window time.Duration

	mu       sync.Mutex
	start    time.Time // the current window's; zero before the first request
	used     int
	tooMany  int // 429s answered
	answered int // 200s answered
}

func newBudgetServer(t *testing.T, limit int, window time.Duration) *budgetServer {
	t.Helper()
	b := &budgetServer{limit: limit, window: window}
	b.Server = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.Close)
	return b
}

func (b *budgetServer) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	now := clock(r)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.start.IsZero() {
		b.start = now
	}
	for now.Sub(b.start) >= b.window {
		b.start, b.used = b.start.Add(b.window), 0
	}
	code := http.StatusOK
	if b.used < b.limit {
		b.used++
		b.answered++
	} else {
		code = http.StatusTooManyRequests
		b.tooMany++
	}
	h := w.Header()
	h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(b.limit))
	h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(b.limit-b.used))
	h.Set("X-Ratelimit-Reset-Requests", b.start.Add(b.window).Sub(now).String())
	w.WriteHeader(code)
	io.WriteString(w, "{}")
}

// remaining is what is left of the current window's budget.
func (b *budgetServer) remaining() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limit - b.used
}

// TestShedKeepsInteractive sends a steady mixed load, one request each
// 100ms, a tenth of them interactive and the rest batch, to an upstream
// that takes 20 requests in each 3s window: with the batch requests
// sheddable, every interactive request succeeds and the batch ones are
// refused with ErrShed once less than 10% of the window is left; without
// (the control), the batch requests spend the budget and interactive ones
// get 429s.
func TestShedKeepsInteractive(t *testing.T) {
	const (
		limit  = 20
		window = 3 * time.Second
		step   = 100 * time.Millisecond
		steps  = 60 // two windows
	)
	type result struct {
		interactiveFailed, batchShed, batchServed, tooMany int
	}
	run := func(t *testing.T, sheddable bool) (r result) {
		srv := newBudgetServer(t, limit, window)
		synctest.Test(t, func(t *testing.T) {
			tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}, Base: clocked(), Retry: RetryConfig{Off: true}})
			for i := range steps {
				interactive := i%10 == 0
				ctx := context.Background()
				if !interactive && sheddable {
					ctx = WithSheddable(ctx)
				}
				left := srv.remaining() // before the request
				req := httptestRequest("POST", srv.URL+"/v1/chat/completions", "{}").WithContext(ctx)
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				switch {
				case err != nil && !interactive && errors.Is(err, ErrShed):
					r.batchShed++
					var ra RetryAfterError
					if !errors.As(err, &ra) || ra.RetryAfter() <= 0 {
						t.Errorf("step %d: shed without a RetryAfter: %v", i, err)
					}
					if since := time.Since(start); since != 0 {
						t.Errorf("step %d: shed after %v, want at once", i, since)
					}
					if float64(left) >= 0.1*limit {
						t.Errorf("step %d: shed with %d of %d left", i, left, limit)
					}
				case err != nil:
					if interactive {
						r.interactiveFailed++
					} else if sheddable {
						t.Errorf("step %d: batch request: %v, want ErrShed", i, err)
					}
				case resp.StatusCode != http.StatusOK:
					resp.Body.Close()
					if interactive {
						r.interactiveFailed++
					}
				default:
					readBody(t, resp)
					if !interactive {
						r.batchServed++
					}
				}
				time.Sleep(step)
			}
		})
		r.tooMany = srv.tooMany
		return r
	}

	t.Run("sheddable", func(t *testing.T) {
		r := run(t, true)
		if r.interactiveFailed != 0 || r.tooMany != 0 {
			t.Errorf("%d interactive requests failed, %d 429s answered; want none", r.interactiveFailed, r.tooMany)
		}
		// Each window: 3 interactive requests; 17 batch requests served
		// until 1 of 20 is left (under 10%), the other 10 shed.
		if r.batchServed != 2*17 || r.batchShed != 2*10 {
			t.Errorf("batch requests: %d served, %d shed; want %d and %d", r.batchServed, r.batchShed, 2*17, 2*10)
		}
	})
	t.Run("control", func(t *testing.T) {
		r := run(t, false)
		if r.interactiveFailed == 0 || r.batchShed != 0 {
			t.Errorf("without WithSheddable: %d interactive requests failed, %d shed; want some failed and none shed", r.interactiveFailed, r.batchShed)
		}
	})
}

// TestShedEveryUpstreamCooling: when every upstream cools down after a
// 429, a sheddable request is refused at once with ErrShed and the
// cooldown's end as RetryAfter, while an interactive one waits for the
// first to come back within RateLimit.MaxWait, as it always did.
func TestShedEveryUpstreamCooling(t *testing.T) {
	var srvs [2]*server
	var mu sync.Mutex
	cool := true
	for i := range srvs {
		srvs[i] = newServer(t, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			c := cool
			mu.Unlock()
			if c {
				w.Header().Set("Retry-After", strconv.Itoa(10*(i+1)))
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			io.WriteString(w, "ok")
		})
	}
	synctest.Test(t, func(t *testing.T) {
		tr := newTestTransport(t, Config{
			Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}, {Name: "b", BaseURL: srvs[1].URL}},
			Base:      clocked(),
			RateLimit: RateLimitConfig{MaxWait: time.Minute},
			Retry:     RetryConfig{Off: true},
		})
		resp, err := tr.RoundTrip(httptestRequest("GET", srvs[0].URL+"/v1/models", ""))
		if err != nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("first request: %v, %v; want the 429", resp, err)
		}
		resp.Body.Close()
		mu.Lock()
		cool = false
		mu.Unlock()

		start := time.Now()
		req := httptestRequest("GET", srvs[0].URL+"/v1/models", "")
		_, err = tr.RoundTrip(req.WithContext(WithSheddable(req.Context())))
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, ErrShed) || !errors.Is(err, ErrRateLimited) {
			t.Fatalf("sheddable: %v; want an *Error matching ErrShed and ErrRateLimited", err)
		}
		if since := time.Since(start); since != 0 {
			t.Errorf("sheddable refused after %v, want at once", since)
		}
		if e.RetryAfter() != 10*time.Second {
			t.Errorf("RetryAfter = %v, want 10s (a's cooldown)", e.RetryAfter())
		}
		if !strings.HasPrefix(err.Error(), "failover: sheddable request refused: ") {
			t.Errorf("Error() = %q", err)
		}

		start = time.Now()
		resp, err = tr.RoundTrip(httptestRequest("GET", srvs[0].URL+"/v1/models", ""))
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("interactive: %v, %v; want 200 after the wait", resp, err)
		}
		resp.Body.Close()
		if since := time.Since(start); since != 10*time.Second {
			t.Errorf("interactive answered after %v, want 10s", since)
		}
		if n := srvs[0].count() + srvs[1].count(); n != 3 {
			t.Errorf("%d requests reached the upstreams, want 3", n)
		}
	})
}

// TestShedEveryCircuitOpen: when every circuit is open, a sheddable
// request is refused at once, with the first circuit's open time as
// RetryAfter, and does not go to the last resort, which an interactive
// request still takes.
func TestShedEveryCircuitOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 500, "a")
		n.status("b.test", 500, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: 30 * time.Second}}))
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		time.Sleep(time.Second)

		req := httptestRequest("GET", "http://a.test/v1/models", "")
		_, err = tr.RoundTrip(req.WithContext(WithSheddable(req.Context())))
		var ra RetryAfterError
		if !errors.Is(err, ErrShed) || !errors.Is(err, ErrCircuitOpen) || !errors.As(err, &ra) || ra.RetryAfter() != 29*time.Second {
			t.Fatalf("sheddable: %v; want ErrShed and ErrCircuitOpen, RetryAfter 29s", err)
		}
		if got := n.count("a.test") + n.count("b.test"); got != 2 {
			t.Fatalf("%d requests sent, want 2: the sheddable one went to the last resort", got)
		}
		resp, err = tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", ""))
		if err != nil {
			t.Fatalf("interactive: %v, want the last resort's answer", err)
		}
		resp.Body.Close()
		if got := n.count("a.test") + n.count("b.test"); got != 3 {
			t.Fatalf("%d requests sent, want 3", got)
		}
	})
}

// TestShedPassesOver: a sheddable request passes over an upstream short of
// headroom for the next, says so in the Trace and the skipped metric, and
// an interactive one still goes first to it; with Shed.Headroom -1, the
// sheddable request goes there too, until a window there reports 0 left.
func TestShedPassesOver(t *testing.T) {
	var mu sync.Mutex
	left := 1 // of a's 20
	a := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("X-Ratelimit-Limit-Requests", "20")
		w.Header().Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(left))
		w.Header().Set("X-Ratelimit-Reset-Requests", "30s")
		io.WriteString(w, "a")
	})
	b := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "b") })
	for _, tt := range []struct {
		headroom float64
		want     string // who answers the sheddable request
	}{
		{0, "b"},
		{0.04, "a"}, // 1 of 20 is 5%: enough
		{-1, "a"},
	} {
		synctest.Test(t, func(t *testing.T) {
			mu.Lock()
			left = 1
			mu.Unlock()
			tr := newTestTransport(t, Config{
				Upstreams: []Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
				Base:      clocked(),
				Shed:      ShedConfig{Headroom: tt.headroom},
			})
			send := func(sheddable bool) (string, []TraceSkip) {
				t.Helper()
				var skips []TraceSkip
				ctx := WithTrace(context.Background(), &Trace{Skipped: func(s TraceSkip) { skips = append(skips, s) }})
				if sheddable {
					ctx = WithSheddable(ctx)
				}
				resp, err := tr.RoundTrip(httptestRequest("GET", a.URL+"/v1/models", "").WithContext(ctx))
				if err != nil {
					t.Fatalf("Headroom %v, sheddable %v: %v", tt.headroom, sheddable, err)
				}
				return readBody(t, resp), skips
			}
			onlyA := func(sheddable bool) error {
				t.Helper()
				ctx := WithUpstreams(context.Background(), "a")
				if sheddable {
					ctx = WithSheddable(ctx)
				}
				resp, err := tr.RoundTrip(httptestRequest("GET", a.URL+"/v1/models", "").WithContext(ctx))
				if err == nil {
					resp.Body.Close()
				}
				return err
			}
			if got, _ := send(false); got != "a" {
				t.Fatalf("interactive answered by %s, want a", got)
			}
			h := tr.Health()
			if h[0].HeadroomShare != 0.05 || h[1].HeadroomShare != -1 {
				t.Errorf("HeadroomShare: a %v, b %v; want 0.05 and -1", h[0].HeadroomShare, h[1].HeadroomShare)
			}
			if js, _ := json.Marshal(h); !strings.Contains(string(js), `"headroom_share":0.05`) || strings.Count(string(js), "headroom_share") != 1 {
				t.Errorf("Health's JSON: %s", js)
			}
			time.Sleep(headroomEvery)
			got, skips := send(true)
			if got != tt.want {
				t.Fatalf("Headroom %v: sheddable answered by %s, want %s", tt.headroom, got, tt.want)
			}
			out, _ := exposed(t, tr)
			shedSeries := `failover_skipped_total{upstream="a",reason="shed"} `
			if tt.want == "b" {
				if len(skips) != 1 || skips[0].Upstream != "a" || skips[0].Reason != ReasonShed || skips[0].RetryAfter != 30*time.Second-headroomEvery {
					t.Errorf("Trace.Skipped heard %+v, want a shed for 29.9s", skips)
				}
				if !strings.Contains(out, shedSeries+"1\n") {
					t.Errorf("no %s1 in\n%s", shedSeries, out)
				}
			} else if len(skips) != 0 || !strings.Contains(out, shedSeries+"0\n") {
				t.Errorf("Headroom %v: skipped %+v; metrics:\n%s", tt.headroom, skips, out)
			}
			if got, _ := send(false); got != "a" {
				t.Errorf("interactive answered by %s, want a", got)
			}

			// A window at 0 sheds whatever Headroom; an interactive
			// request still goes there.
			mu.Lock()
			left = 0
			mu.Unlock()
			time.Sleep(headroomEvery)
			if err := onlyA(false); err != nil {
				t.Fatal(err)
			}
			if err := onlyA(true); !errors.Is(err, ErrShed) {
				t.Errorf("Headroom %v, a out of headroom: sheddable: %v, want ErrShed", tt.headroom, err)
			}
			if err := onlyA(false); err != nil {
				t.Errorf("Headroom %v, a out of headroom: interactive: %v", tt.headroom, err)
			}
		})
	}
}

// TestShed429 checks that a sheddable request that gets a 429 is not sent
// again after the wait its Retry-After asks, as an interactive one is:
// it ends at once with the answer.
func TestShed429(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if n++; n%2 == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		io.WriteString(w, "ok")
	})
	synctest.Test(t, func(t *testing.T) {
		tr := newTestTransport(t, Config{
			Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}},
			Base:      clocked(),
			Retries:   2,
			RateLimit: RateLimitConfig{MaxWait: time.Minute},
		})
		for _, sheddable := range []bool{false, true} {
			time.Sleep(time.Minute) // past any cooldown
			ctx := context.Background()
			if sheddable {
				ctx = WithSheddable(ctx)
			}
			start := time.Now()
			before := srv.count()
			resp, err := tr.RoundTrip(httptestRequest("GET", srv.URL+"/v1/models", "").WithContext(ctx))
			if err != nil {
				t.Fatalf("sheddable %v: %v", sheddable, err)
			}
			resp.Body.Close()
			want, wantSent, minTook := http.StatusOK, 2, 2*time.Second // (the wait has up to 10% added)
			if sheddable {
				want, wantSent, minTook = http.StatusTooManyRequests, 1, 0
			}
			took := time.Since(start)
			if resp.StatusCode != want || srv.count()-before != wantSent || took < minTook || took > minTook*11/10 {
				t.Errorf("sheddable %v: %d after %d attempts and %v; want %d after %d and %v",
					sheddable, resp.StatusCode, srv.count()-before, took, want, wantSent, minTook)
			}
		}
	})
}

// TestShedNotHedged checks that a sheddable request is never hedged: a
// hedge spends capacity twice.
func TestShedNotHedged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(time.Second)
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 100 * time.Millisecond, Percent: 100}}))
		for _, sheddable := range []bool{false, true} {
			ctx := context.Background()
			want := "b" // the hedge's
			if sheddable {
				ctx, want = WithSheddable(ctx), "a"
			}
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", "").WithContext(ctx))
			if err != nil {
				t.Fatal(err)
			}
			if got := readBody(t, resp); got != want {
				t.Errorf("sheddable %v: answered by %s, want %s", sheddable, got, want)
			}
			synctest.Wait()
		}
		if got := n.count("b.test"); got != 1 {
			t.Errorf("b got %d requests, want 1 (the interactive request's hedge)", got)
		}
	})
}

// TestShedAnswer checks that a Stainless SDK's sheddable request, shed
// for short headroom, gets a 503 with the Retry-After of the Error it
// stands for, as for a request every upstream refused.
func TestShedAnswer(t *testing.T) {
	e := &Error{
		Attempts: []*AttemptError{{Upstream: "a", Err: &unavailableError{err: ErrShed, retryAfter: 1500 * time.Millisecond}}},
		retry:    1500 * time.Millisecond,
		shed:     true,
	}
	resp := errorAnswer(httptestRequest("GET", "http://a.test/", ""), e)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" {
		t.Errorf("answer %d, Retry-After %q; want 503 and 2", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestShedOptionsCompose checks that WithSheddable keeps the options
// given before and after it.
func TestShedOptionsCompose(t *testing.T) {
	ctx := WithSheddable(WithoutFailover(context.Background()))
	ctx = WithAttemptTimeout(ctx, time.Second)
	o := contextOptions(ctx)
	if o == nil || !o.shed || !o.once || !o.timeoutSet {
		t.Fatalf("options %+v, want shed, once and a timeout", o)
	}
	if o := contextOptions(WithUpstreams(ctx, "a")); !o.shed || !o.restricted {
		t.Fatalf("options %+v after WithUpstreams, want shed and restricted", o)
	}
	if contextOptions(WithoutFailover(context.Background())).shed {
		t.Fatal("shed without WithSheddable")
	}
}

func TestShedConfigValidation(t *testing.T) {
	for _, h := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 1.01, -0.5, -2, -1.01} {
		_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}, Shed: ShedConfig{Headroom: h}})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "Shed.Headroom" {
			t.Errorf("Headroom %v: %v, want a ConfigError naming Shed.Headroom", h, err)
		}
	}
	for _, h := range []float64{0, 0.5, 1, -1} {
		if _, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}, Shed: ShedConfig{Headroom: h}}); err != nil {
			t.Errorf("Headroom %v: %v", h, err)
		}
	}
}

// A sheddable request to an upstream with Keys goes with a key that has
// headroom, never with one short of it, though the upstream takes it; a
// pinned session's key short of headroom sheds it.
func TestShedKeysShortKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			k := keyOf(r.Header)
			left := "50"
			if k == "A" {
				left = "5" // 5% of 100: short
			}
			return respond(200, k, "X-Ratelimit-Limit-Requests", "100", "X-Ratelimit-Remaining-Requests", left, "X-Ratelimit-Reset-Requests", "30s"), nil
		})
		n.status("b.test", 200, "backup")
		cfg := twoUpstreams(n, Config{})
		cfg.Upstreams[0].Keys = threeKeys()
		tr := newTestTransport(t, cfg)
		for range 3 {
			readBody(t, mustGet(t, tr, "http://a.test/v1/models"))
		}
		if got := keysSent(n.requests("a.test")); got != "ABC" {
			t.Fatalf("keys sent %q, want ABC", got)
		}
		if ks := tr.Health()[0].Keys; ks[0].HeadroomShare != 0.05 || ks[1].HeadroomShare != 0.5 {
			t.Errorf("keys' HeadroomShare: A %v, B %v; want 0.05 and 0.5", ks[0].HeadroomShare, ks[1].HeadroomShare)
		}
		if js, _ := json.Marshal(tr.Health()); strings.Count(string(js), `"headroom_share":0.05`) != 1 {
			t.Errorf("Health's JSON does not say key A's share: %s", js)
		}
		time.Sleep(headroomEvery)
		for i := range 9 {
			req := httptestRequest("GET", "http://a.test/v1/models", "")
			resp, err := tr.RoundTrip(req.WithContext(WithSheddable(req.Context())))
			if err != nil {
				t.Fatalf("sheddable request %d: %v", i, err)
			}
			if got := readBody(t, resp); got != "B" && got != "C" {
				t.Fatalf("sheddable request %d answered by %q, want key B or C: key A is short of headroom", i, got)
			}
		}

		now := time.Now()
		p := plan{t: tr, order: tr.upstreams, demote: true, shed: true, wantKey: "A", strictKey: true}
		var s step
		if !p.next(now, &s) || s.u != tr.upstreams[0] {
			t.Fatal("the plan does not start with the keyed upstream")
		}
		if s.av.reason != ReasonShed || s.k != nil || s.av.wait <= 0 || s.av.wait > 30*time.Second {
			t.Fatalf("sheddable, pinned to key A short of headroom: %+v, key %v; want shed until its window resets", s.av, s.k.nameOf())
		}
	})
}
