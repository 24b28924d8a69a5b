package failover

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// metricValue reads one sample from the Transport's metrics; -1 when
// there is none.
func metricValue(t *testing.T, tr *Transport, series string) float64 {
	t.Helper()
	var b strings.Builder
	tr.WritePrometheus(&b)
	for line := range strings.Lines(b.String()) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return f
		}
	}
	return -1
}

// slowly answers after d, or gives up when the request is canceled, which
// it reports on canceled.
func slowly(d time.Duration, body string, canceled *atomic.Int32) func(*http.Request) (*http.Response, error) {
	return func(r *http.Request) (*http.Response, error) {
		select {
		case <-time.After(d):
			return respond(200, body), nil
		case <-r.Context().Done():
			canceled.Add(1)
			return nil, r.Context().Err()
		}
	}
}

// A slow primary is hedged to the backup after the delay; the backup's
// answer wins, the primary's attempt is canceled without counting against
// it, and the backup receives the body and its own credentials only.
func TestHedgeFirstAnswerWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var canceledA atomic.Int32
		n.handle("a.test", slowly(time.Second, "a", &canceledA))
		n.handle("b.test", slowly(10*time.Millisecond, "b", new(atomic.Int32)))
		tr := newTestTransport(t, Config{Base: n, Hedge: &HedgeConfig{Delay: 50 * time.Millisecond}, Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test", Header: http.Header{"Authorization": {"Bearer key-a"}}},
			{Name: "b", BaseURL: "http://b.test", Header: http.Header{"Authorization": {"Bearer key-b"}}},
		}})
		start := time.Now()
		resp := mustPost(t, tr, "http://a.test/v1/chat/completions", `{"model":"m"}`)
		if got := readBody(t, resp); got != "b" {
			t.Fatalf("body %q, want the backup's", got)
		}
		if d := time.Since(start); d != 60*time.Millisecond {
			t.Errorf("answered after %v, want 60ms (50ms delay + 10ms)", d)
		}
		synctest.Wait()
		if canceledA.Load() != 1 {
			t.Errorf("the primary's attempt was not canceled")
		}
		reqs := n.requests("b.test")
		if len(reqs) != 1 || reqs[0].Body != `{"model":"m"}` || reqs[0].Header.Get("Authorization") != "Bearer key-b" {
			t.Fatalf("backup received %+v", reqs)
		}
		h := tr.Health()
		if h[0].Requests.Failed != 0 || h[0].Requests.Canceled != 1 || h[0].State != "closed" {
			t.Errorf("primary: %+v; a lost hedge race is not a failure", h[0].Requests)
		}
		if h[1].Requests.Success != 1 {
			t.Errorf("backup: %+v", h[1].Requests)
		}
		if got := metricValue(t, tr, "failover_hedges_total"); got != 1 {
			t.Errorf("failover_hedges_total = %v, want 1", got)
		}
		if got := metricValue(t, tr, "failover_hedge_wins_total"); got != 1 {
			t.Errorf("failover_hedge_wins_total = %v, want 1", got)
		}
	})
}

// An attempt that answers within the delay is never hedged; one that
// answers after the hedge was sent but before the hedge still wins.
func TestHedgeDelay(t *testing.T) {
	for _, tt := range []struct {
		name       string
		a          time.Duration
		wantBody   string
		wantHedges float64
	}{
		{"fast primary", 30 * time.Millisecond, "a", 0},
		{"primary beats hedge", 80 * time.Millisecond, "a", 1},
		{"hedge beats primary", 200 * time.Millisecond, "b", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				var canceledA, canceledB atomic.Int32
				n.handle("a.test", slowly(tt.a, "a", &canceledA))
				n.handle("b.test", slowly(100*time.Millisecond, "b", &canceledB))
				tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond}}))
				if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != tt.wantBody {
					t.Fatalf("body %q, want %q", got, tt.wantBody)
				}
				synctest.Wait()
				if got := metricValue(t, tr, "failover_hedges_total"); got != tt.wantHedges {
					t.Errorf("hedges %v, want %v", got, tt.wantHedges)
				}
				if got := float64(n.count("b.test")); got != tt.wantHedges {
					t.Errorf("backup got %v requests, want %v", got, tt.wantHedges)
				}
				loser := &canceledB
				if tt.wantBody == "b" {
					loser = &canceledA
				}
				if tt.wantHedges == 1 && loser.Load() != 1 {
					t.Errorf("the losing attempt was not canceled")
				}
			})
		})
	}
}

// An attempt that fails before the delay fails over at once, as without
// hedging; that is not a hedge and spends no budget.
func TestHedgeFailureFailsOverAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.handle("b.test", slowly(10*time.Millisecond, "b", new(atomic.Int32)))
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: time.Second}}))
		start := time.Now()
		if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "b" {
			t.Fatalf("body %q", got)
		}
		if d := time.Since(start); d != 10*time.Millisecond {
			t.Errorf("took %v, want 10ms: no wait for the hedge delay", d)
		}
		if got := metricValue(t, tr, "failover_hedges_total"); got != 0 {
			t.Errorf("hedges %v, want 0", got)
		}
		if got := tr.Health()[0].Requests.Failed; got != 1 {
			t.Errorf("primary failures %d, want 1", got)
		}
	})
}

// When the hedge fails, the request still takes the primary's later
// answer; when both fail, the caller gets the latest answer as without
// hedging.
func TestHedgeFailedHedgeWaitsForPrimary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(200*time.Millisecond, "a", new(atomic.Int32)))
		n.status("b.test", 503, "down")
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond}}))
		if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "a" {
			t.Fatalf("body %q, want the primary's", got)
		}

		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(200 * time.Millisecond)
			return respond(502, "bad gateway"), nil
		})
		resp := mustGet(t, tr, "http://a.test/")
		if resp.StatusCode != 502 {
			t.Fatalf("status %d, want the latest answer, 502", resp.StatusCode)
		}
		resp.Body.Close()
	})
}

// The budget bounds hedges to Percent of requests plus a burst.
func TestHedgeBudget(t *testing.T) {
	for _, tt := range []struct {
		percent  float64
		min, max float64
	}{
		{10, 15, 20},    // 10 banked + 10 % of 100
		{100, 100, 100}, // every request
	} {
		t.Run(fmt.Sprint(tt.percent), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				n.handle("a.test", slowly(100*time.Millisecond, "a", new(atomic.Int32)))
				n.handle("b.test", slowly(100*time.Millisecond, "b", new(atomic.Int32)))
				tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 10 * time.Millisecond, Percent: tt.percent}}))
				for range 100 {
					readBody(t, mustGet(t, tr, "http://a.test/"))
				}
				hedges := metricValue(t, tr, "failover_hedges_total")
				denied := metricValue(t, tr, "failover_hedges_denied_total")
				if hedges < tt.min || hedges > tt.max {
					t.Errorf("%v hedges in 100 slow requests, want %v to %v", hedges, tt.min, tt.max)
				}
				if hedges+denied != 100 {
					t.Errorf("hedges %v + denied %v != 100", hedges, denied)
				}
				if got := float64(n.count("b.test")); got != hedges {
					t.Errorf("backup got %v requests, hedges_total says %v", got, hedges)
				}
			})
		})
	}
}

// Without a fixed delay, the hedge waits for the upstream's recent p95,
// floored at MinDelay, and MaxDelay while there are too few answers.
func TestHedgeDelayFromLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var latency atomic.Int64
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			return slowly(time.Duration(latency.Load()), "a", new(atomic.Int32))(r)
		})
		// The backup takes 10ms, so that an answer from the primary at
		// the very moment of the hedge still wins.
		n.handle("b.test", slowly(10*time.Millisecond, "b", new(atomic.Int32)))
		tr := newTestTransport(t, twoUpstreams(n, Config{
			Hedge:    &HedgeConfig{MaxDelay: 500 * time.Millisecond, Percent: 100},
			Degraded: DegradedConfig{MinSamples: 5},
		}))
		latency.Store(int64(time.Second))
		start := time.Now()
		readBody(t, mustGet(t, tr, "http://a.test/"))
		if d := time.Since(start); d != 510*time.Millisecond {
			t.Errorf("with no samples the answer came after %v, want MaxDelay (500ms) + 10ms", d)
		}
		latency.Store(int64(40 * time.Millisecond))
		for range 40 { // the first, slow request stays among the samples
			readBody(t, mustGet(t, tr, "http://a.test/"))
		}
		time.Sleep(time.Second) // the recent figures refresh
		latency.Store(int64(time.Second))
		start = time.Now()
		readBody(t, mustGet(t, tr, "http://a.test/"))
		if d := time.Since(start); d != 50*time.Millisecond {
			t.Errorf("with a p95 of 40ms the answer came after %v, want 40ms + 10ms", d)
		}
	})
}

// A caller that gives up while two attempts are in flight gets its
// context's error; both attempts end, neither counts as a failure.
func TestHedgeCallerCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var canceled atomic.Int32
		n.handle("a.test", slowly(time.Hour, "a", &canceled))
		n.handle("b.test", slowly(time.Hour, "b", &canceled))
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 10 * time.Millisecond}}))
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		req := httptestRequest("GET", "http://a.test/", "").WithContext(ctx)
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want the deadline", err)
		}
		synctest.Wait()
		if canceled.Load() != 2 {
			t.Errorf("%d attempts ended, want 2", canceled.Load())
		}
		for _, h := range tr.Health() {
			if h.Requests.Failed != 0 {
				t.Errorf("%s: %+v", h.Name, h.Requests)
			}
		}
	})
}

// A panic in Base during a hedged attempt reaches the caller.
func TestHedgePanicReachesCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) { panic("boom") })
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 10 * time.Millisecond}}))
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want the panic from Base", v)
			}
		}()
		tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
		t.Error("RoundTrip returned")
	})
}

// A body that cannot be sent twice is not hedged.
func TestHedgeNeedsReplayableBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(100*time.Millisecond, "a", new(atomic.Int32)))
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{MaxBodyBuffer: -1, Hedge: &HedgeConfig{Delay: 10 * time.Millisecond}}))
		req := httptestRequest("POST", "http://a.test/", "")
		req.Body = io.NopCloser(strings.NewReader("once"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); got != "a" || n.count("b.test") != 0 {
			t.Fatalf("body %q, backup requests %d: a one-shot body was hedged", got, n.count("b.test"))
		}
	})
}

// Over real connections: the winner's stream stays readable after
// RoundTrip returns (its context is not the loser's), every loser is
// canceled, and no goroutine or connection is left behind (TestMain
// checks goroutines).
func TestHedgeOverHTTP(t *testing.T) {
	const requests = 20
	// The fast upstream answers a request only once the slow one has it:
	// else, on a loaded machine, the hedge could win before the slow
	// attempt reached its server, whose handler then never saw it
	// canceled.
	var arrived [requests]chan struct{}
	for i := range arrived {
		arrived[i] = make(chan struct{})
	}
	reqID := func(r *http.Request) int { i, _ := strconv.Atoi(r.Header.Get("X-Req")); return i }
	var slowCanceled atomic.Int32
	slow := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived[reqID(r)])
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
			slowCanceled.Add(1)
		}
	})
	fast := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-arrived[reqID(r)]:
		case <-time.After(5 * time.Second): // it never will: the count of those canceled fails
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			f.Flush()
			time.Sleep(5 * time.Millisecond)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr := newTestTransport(t, Config{Base: base, Hedge: &HedgeConfig{Delay: 20 * time.Millisecond, Percent: 100}, Upstreams: []Upstream{
		{Name: "slow", BaseURL: slow.URL}, {Name: "fast", BaseURL: fast.URL},
	}})
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			req := httptestRequest("POST", slow.URL+"/v1/chat/completions", `{"stream":true}`)
			req.Header.Set("X-Req", strconv.Itoa(i))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var events int
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: ") {
					events++
				}
			}
			if sc.Err() != nil || events != 4 {
				t.Errorf("read %d events, err %v; want the whole stream", events, sc.Err())
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for slowCanceled.Load() < requests && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := slowCanceled.Load(); got != requests {
		t.Errorf("%d of %d losing attempts were canceled", got, requests)
	}
	// The slow upstream never answers: its canceled attempts are neutral,
	// or failures once it has been silent past the hang limit (on a loaded
	// machine); never successes.
	if h := tr.Health()[0]; h.Requests.Success != 0 || h.Requests.Canceled+h.Requests.Failed != requests {
		t.Errorf("slow upstream: %+v", h.Requests)
	}
}

// A half-open probe is not hedged: the request waits for the probe, whose
// verdict closes the circuit. Hedged and canceled, it would leave the
// circuit half-open and the next request would probe again.
func TestHedgeSparesProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{
			Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Hedge:   &HedgeConfig{Delay: 10 * time.Millisecond},
		}))
		readBody(t, mustGet(t, tr, "http://a.test/"))
		if tr.Health()[0].State != "open" {
			t.Fatal("setup: the primary did not trip")
		}
		time.Sleep(time.Second)
		n.handle("a.test", slowly(100*time.Millisecond, "a", new(atomic.Int32)))
		before := n.count("b.test")
		if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "a" {
			t.Fatalf("the probe's request got %q; it was hedged", got)
		}
		if n.count("b.test") != before {
			t.Error("a hedge went out beside the probe")
		}
		if h := tr.Health()[0]; h.State != "closed" {
			t.Errorf("after the probe answered the circuit is %s", h.State)
		}
	})
}

// A hung upstream's attempts, canceled because their hedges answered, count
// as failures once it is suspected of hanging, so its circuit opens as it
// would have when they timed out. Hedging does not hide the hang.
func TestHedgeHungUpstreamTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(time.Hour, "a", new(atomic.Int32)))
		n.handle("b.test", slowly(5*time.Millisecond, "b", new(atomic.Int32)))
		// Open past the test's end: a probe of the hung primary would wait
		// for it, unhedged.
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100},
			Breaker: BreakerConfig{Cooldown: time.Minute}}))
		var wg sync.WaitGroup
		for range 200 {
			wg.Go(func() {
				if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "b" {
					t.Errorf("body %q", got)
				}
			})
			time.Sleep(10 * time.Millisecond)
		}
		wg.Wait()
		h := tr.Health()[0]
		if h.State != "open" || h.Requests.Failed < 5 {
			t.Fatalf("hung primary: state %s, %+v; want its circuit open on the canceled attempts (%+v)", h.State, h.Requests, h)
		}
		if n.count("a.test") > 50 {
			t.Errorf("the hung primary got %d of 200 requests", n.count("a.test"))
		}
	})
}

// A hedge never goes to a half-open upstream, and does not use up its turn:
// when the first attempt fails, the request still fails over to it.
func TestHedgeLeavesHalfOpenUpstreamForFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 200, "a")
		n.status("b.test", 503, "down")
		tr := newTestTransport(t, twoUpstreams(n, Config{
			Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Hedge:   &HedgeConfig{Delay: 10 * time.Millisecond},
		}))
		n.status("a.test", 503, "down")
		resp, _ := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "")) // a fails, b fails: both open
		resp.Body.Close()
		tr.Reset("a")
		if h := tr.Health(); h[0].State != "closed" || h[1].State != "open" {
			t.Fatalf("setup: %s %s", h[0].State, h[1].State)
		}
		time.Sleep(time.Second) // b half-open
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(50 * time.Millisecond)
			return respond(503, "still down"), nil
		})
		n.status("b.test", 200, "b")
		if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "b" {
			t.Fatalf("body %q: the half-open backup was not failed over to", got)
		}
		if got := metricValue(t, tr, "failover_hedges_total"); got != 0 {
			t.Errorf("%v hedges to a half-open upstream", got)
		}
	})
}

// A hedge whose body cannot be had (GetBody fails) is not sent, and the
// attempt in flight still answers the request.
func TestHedgeGetBodyFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(100*time.Millisecond, "a", new(atomic.Int32)))
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 10 * time.Millisecond}}))
		req := httptestRequest("POST", "http://a.test/", "body")
		calls := 0
		req.GetBody = func() (io.ReadCloser, error) {
			calls++
			return nil, errors.New("gone")
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("the hedge's body failed the request: %v", err)
		}
		// GetBody is called for the state the request references
		// (pin.go), then by the hedge.
		if got := readBody(t, resp); got != "a" || calls != 2 || n.count("b.test") != 0 {
			t.Fatalf("body %q, GetBody calls %d, backup requests %d", got, calls, n.count("b.test"))
		}
	})
}

// A hedge passes over an upstream whose circuit is open and goes to the
// next one that is closed.
func TestHedgePassesOpenUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("b.test", 503, "down")
		n.handle("a.test", slowly(time.Second, "a", new(atomic.Int32)))
		n.handle("c.test", slowly(10*time.Millisecond, "c", new(atomic.Int32)))
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute},
			Hedge:     &HedgeConfig{Delay: 50 * time.Millisecond},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test"}, {Name: "c", BaseURL: "http://c.test"}}})
		n.status("a.test", 503, "down")
		readBody(t, mustGet(t, tr, "http://a.test/")) // a and b fail and open; c answers
		tr.Reset("a")
		n.handle("a.test", slowly(time.Second, "a", new(atomic.Int32)))
		start := time.Now()
		if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "c" {
			t.Fatalf("body %q: no hedge past the open b", got)
		}
		if d := time.Since(start); d != 60*time.Millisecond {
			t.Errorf("answered after %v, want 60ms", d)
		}
	})
}

// A primary that answered well and then hangs, behind one request at a
// time (no concurrency for hang suspicion to see), still opens its
// circuit: each attempt canceled by a winning hedge after more than the
// hang limit of silence is a failure. A primary with no recent latencies
// is not judged so: slow and hung look alike without them.
func TestHedgeHungPrimaryOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(20*time.Millisecond, "a", new(atomic.Int32)))
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 200 * time.Millisecond, Percent: 100}}))
		for range 25 { // Degraded.MinSamples recent latencies: p99 20ms
			readBody(t, mustGet(t, tr, "http://a.test/"))
		}
		time.Sleep(time.Second) // the recent figures refresh
		n.handle("a.test", slowly(time.Hour, "a", new(atomic.Int32)))
		before := n.count("a.test")
		for range 10 {
			if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "b" {
				t.Fatalf("body %q", got)
			}
			synctest.Wait() // the canceled attempt settles after the answer
		}
		if h := tr.Health()[0]; h.State != "open" || n.count("a.test")-before != 5 {
			t.Fatalf("primary %s after %d attempts; want open after 5 (FailureThreshold)", h.State, n.count("a.test")-before)
		}
	})
}

// A healthy but slow primary with no recent latencies (a cold start) that
// loses every race to a faster backup is not taken for hung: its canceled
// attempts are neutral and its circuit stays closed. Nor is a backup that
// only ever loses.
func TestHedgeSlowColdPrimaryStaysClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(3*time.Second, "a", new(atomic.Int32)))
		n.handle("b.test", slowly(500*time.Millisecond, "b", new(atomic.Int32)))
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Percent: 100}}))
		for range 10 {
			if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "b" {
				t.Fatalf("body %q", got)
			}
			synctest.Wait()
		}
		if h := tr.Health()[0]; h.State != "closed" || h.Requests.Failed != 0 {
			t.Fatalf("slow primary: %s, %+v", h.State, h.Requests)
		}
	})
}

// The latency-based hedge delay reads Hedge's own Window and MinSamples,
// whatever Degraded's are.
func TestHedgeDelayOwnWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestTransport(t, twoUpstreams(newFakeNet(), Config{
			Hedge:    &HedgeConfig{MinSamples: 3, Window: time.Second, MaxDelay: time.Second},
			Degraded: DegradedConfig{MinSamples: 1000, Window: time.Hour},
		}))
		u := tr.upstreams[0]
		if d := tr.hedgeDelay(u, time.Now()); d != time.Second {
			t.Fatalf("delay %v with no latencies, want MaxDelay", d)
		}
		time.Sleep(refreshEvery)
		for range 3 {
			u.observe(Success, Success, 50*time.Millisecond, mono.Of(time.Now()))
		}
		if d := tr.hedgeDelay(u, time.Now()); d != 50*time.Millisecond {
			t.Fatalf("delay %v after 3 latencies of 50ms with MinSamples 3, want their p95", d)
		}
		time.Sleep(2 * time.Second) // out of Hedge.Window, well within Degraded's
		if d := tr.hedgeDelay(u, time.Now()); d != time.Second {
			t.Fatalf("delay %v once the latencies left the 1s window, want MaxDelay", d)
		}
	})
}

// A panic in Base after the delay passed, while the timer's goroutine has
// the round, reaches the caller, whether the first attempt (on the
// caller's goroutine) or the hedge (on its own) panics.
func TestHedgePanicAfterDelay(t *testing.T) {
	for _, panicking := range []string{"a.test", "b.test"} {
		t.Run(panicking, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				var canceled atomic.Int32
				for _, host := range []string{"a.test", "b.test"} {
					if host == panicking {
						n.handle(host, func(*http.Request) (*http.Response, error) {
							time.Sleep(50 * time.Millisecond) // past the delay: the hedge is out
							panic("boom")
						})
					} else {
						n.handle(host, slowly(time.Hour, "slow", &canceled))
					}
				}
				tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 10 * time.Millisecond, Percent: 100}}))
				func() {
					defer func() {
						if v := recover(); v != "boom" {
							t.Errorf("recovered %v, want the panic from Base", v)
						}
					}()
					tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
					t.Error("RoundTrip returned")
				}()
				synctest.Wait()
				if canceled.Load() != 1 {
					t.Errorf("%d slow attempts canceled, want 1: the other attempt is ended when the panic goes on", canceled.Load())
				}
			})
		})
	}
}

// A hedgeWait's timer that fires before the delay of the attempt it waits
// for (a fire on its way when the round's attempt before answered, meeting
// the next attempt it is armed for) takes nothing over: that attempt's
// delay has not passed.
func TestHedgeWaitEarlyFire(t *testing.T) {
	n := newFakeNet()
	tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: time.Hour}}))
	a := &attempt{u: tr.upstreams[0], start: time.Now()} // as launch leaves it
	r := &race{req: request{t: tr}, ctx: context.Background(), first: a, targets: tr.upstreams[1:]}
	w := new(hedgeWait)
	w.arm(r)
	w.fire() // as a stale fire would, long before the hour
	if w.state != waiting {
		t.Fatalf("state %d after an early fire, want waiting: the round was taken over before its delay", w.state)
	}
	if raced := w.end(); raced {
		t.Fatal("end says the round raced")
	}
}

// An attempt of a hedged round that answers within the delay is sent on
// the caller's goroutine: nothing of the hedging runs until the delay
// passes.
func TestHedgeFirstAttemptOnCallersGoroutine(t *testing.T) {
	var callers, bases []uint64
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		bases = append(bases, goroutineID())
		return respond(200, "ok"), nil
	})
	tr := newTestTransport(t, Config{Base: base, Hedge: &HedgeConfig{Delay: time.Hour}, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test"},
	}})
	for range 3 {
		callers = append(callers, goroutineID())
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if !slices.Equal(callers, bases) {
		t.Errorf("Base ran on goroutines %v, the callers were %v", bases, callers)
	}
}

// goroutineID is the current goroutine's number, from its stack's first
// line ("goroutine 7 [running]:").
func goroutineID() uint64 {
	var buf [64]byte
	line := strings.TrimPrefix(string(buf[:runtime.Stack(buf[:], false)]), "goroutine ")
	id, _ := strconv.ParseUint(line[:strings.IndexByte(line, ' ')], 10, 64)
	return id
}

// A hedged round tries the demoted upstreams after the others, as a round
// without hedging does, whether the round stays on the caller's goroutine
// or a hedge takes it over: the first attempt skips the primary, out of
// headroom, and the hedge goes to the third upstream before it.
func TestHedgeDemotedLast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var canceled atomic.Int32
		var mu sync.Mutex
		var hosts []string
		record := func(h func(*http.Request) (*http.Response, error)) func(*http.Request) (*http.Response, error) {
			return func(r *http.Request) (*http.Response, error) {
				mu.Lock()
				hosts = append(hosts, r.URL.Host)
				mu.Unlock()
				return h(r)
			}
		}
		n.handle("a.test", record(slowly(0, "a", &canceled)))
		n.handle("b.test", record(slowly(time.Hour, "b", &canceled)))
		n.handle("c.test", record(slowly(0, "c", &canceled)))
		tr := newTestTransport(t, Config{Base: n, Hedge: &HedgeConfig{Delay: 10 * time.Millisecond, Percent: 100}, Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test"}, {Name: "c", BaseURL: "http://c.test"},
		}})
		noteHeadroomAt(tr.upstreams[0], http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"20s"}}, time.Now(), tr.rate)
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); got != "c" {
			t.Errorf("body %q, want the hedge's to c", got)
		}
		resp.Body.Close()
		synctest.Wait()
		if want := []string{"b.test", "c.test"}; !slices.Equal(hosts, want) {
			t.Errorf("attempts went to %v, want %v: the demoted primary last, and not needed", hosts, want)
		}
	})
}

// A caller that gives up before the delay passes, while Base does not
// heed the cancellation, gets no hedge: the delay that passes after the
// request's end sends nothing, spends no budget and counts no hedge. (The
// hedge would be billed by a Base that sends it whatever the context.)
func TestHedgeNotSentAfterCallerCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(200 * time.Millisecond) // deaf to its context
			return respond(200, "a"), nil
		})
		n.handle("b.test", slowly(time.Hour, "b", new(atomic.Int32)))
		var started []TraceAttempt
		trace := &Trace{AttemptStart: func(a TraceAttempt) { started = append(started, a) }}
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
		ctx, cancel := context.WithCancel(WithTrace(context.Background(), trace))
		time.AfterFunc(10*time.Millisecond, cancel)
		if _, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx)); !errors.Is(err, context.Canceled) {
			t.Errorf("err %v, want context.Canceled", err)
		}
		time.Sleep(time.Second)
		if got := n.count("b.test"); got != 0 {
			t.Errorf("the backup got %d requests after the caller gave up, want 0", got)
		}
		if got := metricValue(t, tr, "failover_hedges_total"); got != 0 {
			t.Errorf("failover_hedges_total = %v, want 0", got)
		}
		if len(started) != 1 {
			t.Errorf("AttemptStart for %+v, want the first attempt only", started)
		}
	})
}

// trickle is a body that gives a byte every 100ms, deaf to its request's
// context, until it is closed.
type trickle struct{ closed atomic.Bool }

func (b *trickle) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errors.New("read on closed body")
	}
	time.Sleep(100 * time.Millisecond)
	p[0] = 'x'
	return 1, nil
}

func (b *trickle) Close() error { b.closed.Store(true); return nil }

// When the hedge has won and the first attempt's Base returns an answer
// after all, RoundTrip returns the winner's answer then: draining the
// loser's body (up to drainTimeout) is not on the caller's time, as it is
// not for a losing hedge.
func TestHedgeLoserDrainedOffCallersTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		body := new(trickle)
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(60 * time.Millisecond) // deaf to its context, past the hedge's answer
			resp := respond(200, "")
			resp.Body, resp.ContentLength = body, -1
			return resp, nil
		})
		n.handle("b.test", slowly(5*time.Millisecond, "b", new(atomic.Int32)))
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
		start := time.Now()
		resp := mustGet(t, tr, "http://a.test/")
		if d := time.Since(start); d != 60*time.Millisecond {
			t.Errorf("RoundTrip returned after %v, want 60ms: when the first attempt's Base returned", d)
		}
		if got := readBody(t, resp); got != "b" {
			t.Errorf("body %q, want the hedge's", got)
		}
		time.Sleep(time.Second)
		if !body.closed.Load() {
			t.Error("the loser's body was not closed")
		}
	})
}

// Over http.Transport, with a caller's context that is never done (as
// http.NewRequest's), a hedged request answered within the delay starts
// no goroutine more than one without Hedge: the Transport's context for
// the request, derived from the attempt's, waits for it without one.
func TestHedgeInTimeStartsNoGoroutineOverHTTP(t *testing.T) {
	srv := newUpstreamServer(t, 200, "ok")
	var created [2]uint64
	for i, hedge := range []*HedgeConfig{nil, {Delay: time.Hour}} {
		base := &http.Transport{}
		tr := newTestTransport(t, Config{Base: base, Hedge: hedge, Upstreams: []Upstream{
			{Name: "a", BaseURL: srv.URL}, {Name: "b", BaseURL: srv.URL + "/b"},
		}})
		readBody(t, mustGet(t, tr, srv.URL+"/")) // the connection
		before := goroutinesCreated(t)
		for range 100 {
			readBody(t, mustGet(t, tr, srv.URL+"/"))
		}
		created[i] = goroutinesCreated(t) - before
		base.CloseIdleConnections()
	}
	if created[1] > created[0]+10 {
		t.Errorf("100 requests started %d goroutines with Hedge, %d without", created[1], created[0])
	}
}

// When the hedge has won and RoundTrip waits for the first attempt's Base
// to return (one deaf to its cancellation), Trace.Done's Duration, the
// time to RoundTrip's return, counts that wait: the caller waited for it.
func TestHedgeDoneDurationCountsWaitForFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(200 * time.Millisecond) // deaf to its context
			return nil, errors.New("too late")
		})
		n.handle("b.test", slowly(5*time.Millisecond, "b", new(atomic.Int32)))
		var done TraceDone
		ctx := WithTrace(context.Background(), &Trace{Done: func(d TraceDone) { done = d }})
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
		start := time.Now()
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		resp.Body.Close()
		if done.Upstream != "b" || done.Duration != took {
			t.Errorf("Done %+v; want b's answer after %v, RoundTrip's return", done, took)
		}
	})
}

// A Transport used outside a synctest bubble, then inside one, then
// outside again (a package-level client shared by a suite's tests) hedges
// in the bubble's time and works after it: each round makes its own timer
// (found by review: a pooled timer made outside ran on the real clock in
// the bubble, and one made in the bubble was a fatal error outside).
func TestHedgeTransportSharedWithBubble(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 200, "a")
	tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
	for range 10 {
		readBody(t, mustGet(t, tr, "http://a.test/")) // rounds outside any bubble
	}
	synctest.Test(t, func(t *testing.T) {
		n.handle("a.test", slowly(time.Second, "a", new(atomic.Int32)))
		n.handle("b.test", slowly(10*time.Millisecond, "b", new(atomic.Int32)))
		start := time.Now()
		if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "b" {
			t.Errorf("body %q after %v, want the hedge's after 60ms", got, time.Since(start))
		}
		for range 10 {
			n.handle("a.test", slowly(0, "a", new(atomic.Int32)))
			readBody(t, mustGet(t, tr, "http://a.test/")) // rounds in the bubble, answered in time
		}
		time.Sleep(2 * time.Second) // the loser's end
	})
	n.status("a.test", 200, "a")
	for range 10 {
		if got := readBody(t, mustGet(t, tr, "http://a.test/")); got != "a" { // outside again
			t.Fatalf("body %q", got)
		}
	}
}

// A hedged round answered in time gives its timer's func back to the pool
// (an unfired Hedge costs no allocation, issue 15); one whose timer fired
// on its way, to find the round's attempt answered (end took the round's
// lock first, then found the timer stopped already), keeps it: a func on
// its way must not meet another round.
func TestHedgeFireRecycled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: time.Second}}))
		a := &attempt{u: tr.upstreams[0], start: time.Now()} // as launch leaves it
		r := &race{req: request{t: tr}, ctx: context.Background(), first: a, targets: tr.upstreams[1:]}

		w := new(hedgeWait)
		w.arm(r)
		f := w.f
		if raced := w.end(); raced {
			t.Fatal("end says the round raced")
		}
		w.recycle()
		if w.f != nil || f.w.Load() != nil {
			t.Errorf("answered in time: func kept %v, pointing at %p; want it given back, pointing nowhere", w.f != nil, f.w.Load())
		}

		w = new(hedgeWait)
		w.arm(r)
		f = w.f
		w.mu.Lock()
		w.state = idle // as end does, before the fire comes
		w.mu.Unlock()
		time.Sleep(2 * time.Second)
		synctest.Wait() // the fire has come and found w idle
		if raced := w.end(); raced {
			t.Fatal("end says the round raced")
		}
		w.recycle()
		if w.f != f || f.w.Load() != w {
			t.Error("a func whose timer fired was given back to the pool")
		}
	})
}

// A Base that ends its goroutine (runtime.Goexit, as a t.Fatal in a
// test's Base does) ends the attempt, not the round: on the caller's
// goroutine after the delay passed, the goroutine that took the round over
// does not wait for it; on a hedge's goroutine, the caller gets an error
// rather than a panic. Either way no goroutine is left behind (synctest
// fails on one blocked at the bubble's end). Found by the review of issue
// 15's hedged round.
func TestHedgeBaseGoexit(t *testing.T) {
	goexit := func(d time.Duration) func(*http.Request) (*http.Response, error) {
		return func(*http.Request) (*http.Response, error) {
			time.Sleep(d)
			runtime.Goexit()
			return nil, nil
		}
	}
	t.Run("caller", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			n.handle("a.test", goexit(time.Second))
			n.status("b.test", 500, "down")
			tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
			returned := make(chan bool, 1)
			go func() {
				defer func() { returned <- false }()
				if resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "")); err == nil {
					resp.Body.Close()
				}
				returned <- true
			}()
			if <-returned {
				t.Fatal("RoundTrip returned from a Base that ended its goroutine")
			}
			time.Sleep(time.Minute)
			synctest.Wait()
		})
	})
	t.Run("hedge", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			n.handle("a.test", slowly(time.Second, "a", new(atomic.Int32)))
			n.handle("b.test", goexit(10*time.Millisecond))
			tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
			// The hedge's Base ends its goroutine at 60ms, long before the
			// first attempt's answer at 1s: the request ends with it.
			if err == nil {
				readBody(t, resp)
				t.Fatal("got an answer, want ErrBaseGoexit")
			}
			if !errors.Is(err, ErrBaseGoexit) {
				t.Errorf("err %v, want ErrBaseGoexit", err)
			}
			time.Sleep(time.Minute)
			synctest.Wait()
		})
	})
}

// Once the delay passes, the round's goroutines (the one that takes it
// over and the hedges') carry the caller's profiler labels, as the first
// attempt, on the caller's goroutine, does: a CPU or goroutine profile
// puts them with the caller's work.
func TestHedgeKeepsProfilerLabels(t *testing.T) {
	n := newFakeNet()
	inHedge := make(chan struct{})
	release := make(chan struct{})
	n.handle("a.test", slowly(time.Minute, "a", new(atomic.Int32)))
	n.handle("b.test", func(*http.Request) (*http.Response, error) {
		close(inHedge)
		<-release
		return respond(200, "b"), nil
	})
	tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: time.Millisecond, Percent: 100}}))
	done := make(chan string, 1)
	go pprof.Do(context.Background(), pprof.Labels("caller", "hedge-test"), func(ctx context.Context) {
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
		if err != nil {
			done <- err.Error()
			return
		}
		done <- readBody(t, resp)
	})
	<-inHedge
	var prof strings.Builder
	pprof.Lookup("goroutine").WriteTo(&prof, 1)
	close(release)
	if got := <-done; got != "b" {
		t.Fatalf("got %q, want the hedge's answer", got)
	}
	// The hedge's goroutine, blocked in the handler above, with its labels.
	for _, entry := range strings.Split(prof.String(), "\n\n") {
		if strings.Contains(entry, "TestHedgeKeepsProfilerLabels.func") && strings.Contains(entry, "(*attempt).fly") {
			if !strings.Contains(entry, `"caller":"hedge-test"`) {
				t.Errorf("the hedge's goroutine lacks the caller's labels:\n%s", entry)
			}
			return
		}
	}
	t.Fatalf("no hedge's goroutine in the profile:\n%s", prof.String())
}

// trackedBody is a response body that says whether it was closed.
type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

// A Classify that ends its goroutine (runtime.Goexit) with an answer in
// hand, on a hedge's goroutine or on the caller's, before the delay or
// after: the answer Base returned is closed and the attempt's context
// ended, as a discarded answer's are; the attempt's Goexit must not drop
// them on the floor (goexited cleared a.resp, which nothing had closed:
// the connection leaked).
func TestHedgeGoexitInClassifyClosesResponse(t *testing.T) {
	classify := func(resp *http.Response, err error) Outcome {
		if resp != nil && resp.Header.Get("X-Goexit") != "" {
			runtime.Goexit()
		}
		return DefaultClassifier(resp, err)
	}
	// answering answers after d with body, and keeps the request's context.
	answering := func(d time.Duration, body *trackedBody, ctx *context.Context) func(*http.Request) (*http.Response, error) {
		return func(r *http.Request) (*http.Response, error) {
			*ctx = r.Context()
			time.Sleep(d)
			resp := respond(200, "x", "X-Goexit", "1")
			resp.Body = body
			return resp, nil
		}
	}
	for _, tc := range []struct {
		name   string
		caller bool          // the Goexit is on the caller's goroutine (upstream a), else on the hedge's (b)
		after  time.Duration // when the goexiting upstream answers
	}{
		{"hedge", false, 10 * time.Millisecond},
		{"caller after the delay", true, time.Second},
		{"caller before the delay", true, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				body := &trackedBody{Reader: strings.NewReader("x")}
				var ctx context.Context
				if tc.caller {
					n.handle("a.test", answering(tc.after, body, &ctx))
					n.handle("b.test", slowly(time.Minute, "b", new(atomic.Int32)))
				} else {
					n.handle("a.test", slowly(time.Second, "a", new(atomic.Int32)))
					n.handle("b.test", answering(tc.after, body, &ctx))
				}
				tr := newTestTransport(t, twoUpstreams(n, Config{Classify: classify, Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
				returned := make(chan error, 1)
				go func() {
					resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
					if err == nil {
						resp.Body.Close()
					}
					returned <- err
				}()
				time.Sleep(time.Minute)
				synctest.Wait()
				select {
				case err := <-returned:
					if tc.caller {
						t.Errorf("RoundTrip returned (%v) from a Classify that ended its goroutine", err)
					} else if !errors.Is(err, ErrBaseGoexit) {
						t.Errorf("err %v, want ErrBaseGoexit", err)
					}
				default:
					if !tc.caller {
						t.Error("RoundTrip did not return")
					}
				}
				if !body.closed.Load() {
					t.Error("the answer of the attempt whose Classify ended its goroutine was never closed")
				}
				if ctx == nil || ctx.Err() == nil {
					t.Error("the attempt whose Classify ended its goroutine still has its context")
				}
			})
		})
	}
}

// The Trace of a request whose hedge's Base ended its goroutine tells the
// attempt's end as when its goroutine ended: its AttemptDone's Duration is
// the time it was in Base (10ms here), not a.end's zero less its start (a
// negative Duration of some 292 years).
func TestHedgeGoexitTraceDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(time.Second, "a", new(atomic.Int32)))
		n.handle("b.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(10 * time.Millisecond)
			runtime.Goexit()
			return nil, nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
		var mu sync.Mutex
		var done []TraceAttemptDone
		var total time.Duration
		ctx := WithTrace(context.Background(), &Trace{
			AttemptDone: func(d TraceAttemptDone) { mu.Lock(); done = append(done, d); mu.Unlock() },
			Done:        func(d TraceDone) { total = d.Duration },
		})
		_, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
		if !errors.Is(err, ErrBaseGoexit) {
			t.Fatalf("err %v, want ErrBaseGoexit", err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		found := false
		for _, d := range done {
			if d.Upstream == "b" {
				found = true
				if d.Duration != 10*time.Millisecond {
					t.Errorf("the goexited hedge's AttemptDone Duration %v, want 10ms", d.Duration)
				}
			}
		}
		if !found {
			t.Errorf("no AttemptDone for the goexited hedge: %+v", done)
		}
		if total != 60*time.Millisecond {
			t.Errorf("TraceDone Duration %v, want 60ms", total)
		}
	})
}

// A Trace hook that ends its goroutine (runtime.Goexit, as a t.Fatal in a
// test's hook does) once the delay has passed runs on the goroutine that
// took the round over, not the caller's: the caller must not wait for
// that goroutine's end of the round forever. It ends as it would without
// hedging, the hook on its own goroutine: RoundTrip does not return, and
// no goroutine is left behind (synctest fails on one blocked at the
// bubble's end).
func TestHedgeTraceHookGoexit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var canceled atomic.Int32
		n.handle("a.test", slowly(time.Second, "a", &canceled))
		n.status("b.test", 500, "down")
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
		ctx := WithTrace(context.Background(), &Trace{AttemptDone: func(d TraceAttemptDone) {
			if d.Upstream == "b" {
				runtime.Goexit()
			}
		}})
		returned := make(chan bool, 1)
		go func() {
			defer func() { returned <- false }()
			if resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx)); err == nil {
				resp.Body.Close()
			}
			returned <- true
		}()
		if <-returned {
			t.Fatal("RoundTrip returned from a round whose Trace hook ended its goroutine")
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if canceled.Load() != 1 {
			t.Errorf("the first attempt was canceled %d times, want once", canceled.Load())
		}
	})
}

// inBubble tells a time read in a synctest bubble from one read outside,
// which hedgeFire's pooled timers rely on: a bubble's timer must never be
// pooled, nor a pooled one given to a bubble's round.
func TestInBubble(t *testing.T) {
	if inBubble(time.Now()) {
		t.Error("time.Now outside a bubble reads as in one")
	}
	synctest.Test(t, func(t *testing.T) {
		if !inBubble(time.Now()) {
			t.Error("time.Now in a bubble reads as outside one")
		}
	})
}

// An unfired hedge's timer goes back to the pool with its func, stopped,
// and the next round outside a bubble arms it again, allocating nothing;
// a bubble's round makes its own and keeps it out of the pool.
func TestHedgeTimerPooled(t *testing.T) {
	tr := newTestTransport(t, twoUpstreams(newFakeNet(), Config{Hedge: &HedgeConfig{Delay: time.Hour}}))
	r := &race{req: request{t: tr}, ctx: context.Background(), targets: tr.upstreams[1:]}
	round := func() (*hedgeFire, *time.Timer) {
		a := &attempt{u: tr.upstreams[0], start: time.Now()}
		r.first = a
		w := new(hedgeWait)
		w.arm(r)
		f, timer := w.f, w.timer
		if raced := w.end(); raced {
			t.Fatal("end says the round raced")
		}
		w.recycle()
		return f, timer
	}
	f, timer := round()
	if f.timer != timer {
		t.Fatalf("recycled func holds timer %p, want the round's %p", f.timer, timer)
	}
	synctest.Test(t, func(t *testing.T) {
		a := &attempt{u: tr.upstreams[0], start: time.Now()}
		r := &race{req: request{t: tr}, ctx: context.Background(), first: a, targets: tr.upstreams[1:]}
		w := new(hedgeWait)
		w.arm(r)
		if w.timer == w.f.timer {
			t.Error("a bubble's round got a pooled timer, which runs on the real clock")
		}
		bubbleTimer, f := w.timer, w.f
		w.end()
		w.recycle()
		if f.timer == bubbleTimer {
			t.Error("a bubble's timer went back to the pool")
		}
	})
	want := 2.0 // the attempt and the hedgeWait are this test's; the timer none
	if raceEnabled {
		want = 3.25 // the pool drops a quarter of what it is given: then three allocations more
	}
	if n := testing.AllocsPerRun(1000, func() { round() }); n > want {
		t.Errorf("a round outside a bubble allocates %v times, want at most %v (its attempt and hedgeWait)", n, want)
	}
}

// Many hedged requests at once over loopback, on two Transports sharing
// hedgeFire's pool: on one, a tiny Delay and upstreams slow or failing at
// random, so that rounds fire, fail over (several arms a round) or answer
// in time, their timers pooled and reused; on the other, a Delay of an
// hour, whose hedges must never fire (a pooled timer reaching its round
// armed for another's delay would). Every request gets its own answer,
// and every upstream sees a request at most once.
func TestHedgeStressPooledTimers(t *testing.T) {
	type key struct{ server, id string }
	var mu sync.Mutex
	seenAt := map[key]int{}
	handler := func(name string, chaos bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			id := r.Header.Get("X-Req")
			mu.Lock()
			seenAt[key{name, id}]++
			mu.Unlock()
			if chaos {
				switch rand.IntN(10) {
				case 0:
					w.WriteHeader(503)
					return
				case 1, 2, 3:
					select {
					case <-time.After(time.Duration(rand.IntN(8)) * time.Millisecond):
					case <-r.Context().Done():
						return
					}
				}
			}
			io.WriteString(w, name+" "+id)
		}
	}
	var fast, slow []*server
	for _, n := range []string{"a", "b", "c"} {
		fast = append(fast, newServer(t, handler(n, true)))
	}
	for _, n := range []string{"x", "y"} {
		slow = append(slow, newServer(t, handler(n, false)))
	}
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(base.CloseIdleConnections)
	breaker := BreakerConfig{FailureThreshold: 1000}
	firing := newTestTransport(t, Config{Base: base, Breaker: breaker, Hedge: &HedgeConfig{Delay: 3 * time.Millisecond, Percent: 100, MaxHedges: 2}, Upstreams: []Upstream{
		{Name: "a", BaseURL: fast[0].URL}, {Name: "b", BaseURL: fast[1].URL}, {Name: "c", BaseURL: fast[2].URL},
	}})
	quiet := newTestTransport(t, Config{Base: base, Breaker: breaker, Hedge: &HedgeConfig{Delay: time.Hour, Percent: 100}, Upstreams: []Upstream{
		{Name: "x", BaseURL: slow[0].URL}, {Name: "y", BaseURL: slow[1].URL},
	}})
	const requests = 600
	var quietHedged atomic.Int32 // the quiet Transport's attempts that were hedges
	var wg sync.WaitGroup
	sem := make(chan struct{}, 24)
	for i := range requests {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			tr, url, names := firing, fast[0].URL, "abc"
			if i%2 == 1 {
				tr, url, names = quiet, slow[0].URL, "xy" // y by failing over only
			}
			id := strconv.Itoa(i)
			req := httptestRequest("POST", url+"/v1/chat", "hi")
			req.Header.Set("X-Req", id)
			if tr == quiet {
				req = req.WithContext(WithTrace(req.Context(), &Trace{AttemptStart: func(a TraceAttempt) {
					if a.Hedge {
						quietHedged.Add(1)
					}
				}}))
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				if tr == quiet {
					t.Errorf("request %s: %v", id, err)
				}
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 503 {
				return // every upstream failed this one
			}
			got := string(body)
			if err != nil || len(got) < 2 || !strings.Contains(names, got[:1]) || got[2:] != id {
				t.Errorf("request %s: status %d, body %q, err %v", id, resp.StatusCode, got, err)
			}
		})
	}
	wg.Wait()
	count := func() {
		mu.Lock()
		defer mu.Unlock()
		for k, n := range seenAt {
			if n > 1 {
				t.Errorf("%s got request %s %d times", k.server, k.id, n)
			}
		}
	}
	// A request may still reach y by failing over, when x looks hung
	// (HangConfig) to a process stalled by a loaded machine: what must
	// never happen is a hedge.
	if n, sent := quietHedged.Load(), quiet.hedge.sent.Get(); n != 0 || sent != 0 {
		t.Errorf("the hour-delayed transport hedged: %d hedged attempts traced, %d hedges counted", n, sent)
	}
	if sent := firing.hedge.sent.Get(); sent == 0 {
		t.Error("no hedge fired: the test tries nothing")
	} else {
		t.Logf("%d hedges sent, %d won", sent, firing.hedge.won.Get())
	}
	count()
}

// A panic of Base in a hedged attempt that nobody waits for any more is
// logged, not raised; Base may quote the request it was given, and the log
// shows none of its credentials: the upstream's Header and the caller's
// key=. Real servers: the first hangs until the hedge's answer ends its
// attempt, whose Base then panics.
func TestHedgeAbandonedPanicLogCarriesNoCredential(t *testing.T) {
	const upstreamKey, callerKey = "sk-upstream-panic-0123456789", "AIzaCallerPanic0123456789"
	slow := newServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	fast := newUpstreamServer(t, 200, "ok")
	inner := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(inner.CloseIdleConnections)
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := inner.RoundTrip(r)
		if err != nil && r.URL.Host == slow.Listener.Addr().String() {
			panic(fmt.Sprintf("unexpected failure of %s %v", r.URL, r.Header))
		}
		return resp, err
	})
	var logs logBuffer
	tr := newTestTransport(t, Config{Base: base, Logger: newLogger(&logs), Hedge: &HedgeConfig{Delay: 5 * time.Millisecond}, Upstreams: []Upstream{
		{Name: "slow", BaseURL: slow.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + upstreamKey}}},
		{Name: "fast", BaseURL: fast.URL + "/v1"},
	}})
	resp, err := tr.RoundTrip(httptestRequest("GET", slow.URL+"/v1/models?key="+callerKey, ""))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "unexpected failure") {
		if time.Now().After(deadline) {
			t.Fatalf("no panic logged: %s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, s := range []string{upstreamKey, callerKey} {
		if strings.Contains(logs.String(), s) {
			t.Errorf("the log shows %q: %s", s, logs.String())
		}
	}
}

// A Hedge that is configured but does not fire costs a request at most
// one allocation more than no Hedge (issue 27), over a Base that uses the
// request's context as http.Transport does: it derives a context of its
// own from it (context.WithCancelCause, which asks for its Done channel
// and registers with it), ended once the answer is in. A Base that never
// looks at the context (TestHealthyPathAllocations) hides what the
// attempt's own context costs.
func TestHedgeIdleAllocs(t *testing.T) {
	resp := respond(200, "")
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, cancel := context.WithCancelCause(r.Context())
		cancel(nil)
		resp.Body = http.NoBody
		return resp, nil
	})
	allocs := func(hedge *HedgeConfig) float64 {
		tr := newTestTransport(t, Config{Base: base, Hedge: hedge, Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"},
		}})
		req := httptestRequest("GET", "http://a.test/v1/models", "")
		op := func() {
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		op() // warm up: the health window, the metrics, the pools
		return testing.AllocsPerRun(1000, op)
	}
	without, idle := allocs(nil), allocs(&HedgeConfig{Delay: time.Hour})
	want := without + 1
	if raceEnabled {
		// Under -race sync.Pool drops a quarter of what it is given, at
		// random: the hedge's timer and func (hedgeFires) and the
		// attempt's canceler (cancelers) are then made anew, three
		// allocations each, 1.5 a request on average. Over 1000 requests
		// that mean strays by less than 0.1 (its standard deviation is
		// 0.06), so half an allocation more holds on any run.
		want += 1.5 + 0.5
	}
	t.Logf("%v allocations per request with an idle Hedge, %v without", idle, without)
	if idle > want {
		t.Errorf("%v allocations per request with a Hedge that does not fire, %v without: want at most one more", idle, without)
	}
}

// BenchmarkHedgeIdle is what a Hedge that is configured but never fires
// costs a request over loopback (issue 27): two httptest upstreams that
// answer at once, through a clone of http.DefaultTransport, the request
// addressed to the first. impl=bare is the http.Transport alone,
// impl=failover the Transport without Hedge, impl=failover_router the same
// with a Router, impl=failover_hedge the same with a Hedge whose delay
// (10s) never passes. Compare allocs/op and B/op side by side.
func BenchmarkHedgeIdle(b *testing.B) {
	handler := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, name)
		}
	}
	a, bk := httptest.NewServer(handler("a")), httptest.NewServer(handler("b"))
	b.Cleanup(a.Close)
	b.Cleanup(bk.Close)
	upstreams := []Upstream{{Name: "a", BaseURL: a.URL + "/v1"}, {Name: "b", BaseURL: bk.URL + "/v1"}}
	impls := []struct {
		name string
		cfg  func(*Config) // nil: the bare http.Transport
	}{
		{"bare", nil},
		{"failover", func(*Config) {}},
		{"failover_router", func(c *Config) { c.Router = Priority{} }},
		{"failover_hedge", func(c *Config) { c.Hedge = &HedgeConfig{Delay: 10 * time.Second} }},
	}
	for _, impl := range impls {
		b.Run("impl="+impl.name, func(b *testing.B) {
			base := http.DefaultTransport.(*http.Transport).Clone()
			b.Cleanup(base.CloseIdleConnections)
			var rt http.RoundTripper = base
			if impl.cfg != nil {
				cfg := Config{Base: base, Upstreams: upstreams}
				impl.cfg(&cfg)
				tr, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				rt = tr
			}
			req := httptestRequest("GET", a.URL+"/v1/models", "")
			op := func() {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(body) != "a" {
					b.Fatalf("body %q, %v; want a's", body, err)
				}
			}
			for range 10 {
				op() // the connection, the health window, the metrics
			}
			b.ReportAllocs()
			for b.Loop() {
				op()
			}
			if tr, ok := rt.(*Transport); ok && tr.hedge != nil && tr.hedge.sent.Get() != 0 {
				b.Fatalf("the idle Hedge sent %d hedges", tr.hedge.sent.Get())
			}
		})
	}
}

// A hedge passes over an upstream that does not take the request (its
// Models do not serve the model, or it cools down after a 429) and goes
// to the next one that does, as it passes over an open circuit: such an
// upstream must not use up the request's hedge.
func TestHedgePassesUpstreamThatTakesNoRequest(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(t *testing.T, n *fakeNet, tr *Transport)
		b     []string // b's Models
	}{
		{"model not served", func(*testing.T, *fakeNet, *Transport) {}, []string{"other"}},
		{"rate limited", func(t *testing.T, n *fakeNet, tr *Transport) {
			n.status("b.test", 429, "slow down", "Retry-After", "60")
			ctx := WithUpstreams(context.Background(), "b")
			resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/", `{"model":"m"}`).WithContext(ctx))
			if err == nil {
				resp.Body.Close()
			}
			if h := tr.Health()[1]; h.Unavailable != ReasonRateLimited {
				t.Fatalf("setup: b is %q, want rate_limited", h.Unavailable)
			}
		}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				cfg := threeUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}})
				if tt.b != nil {
					cfg.Upstreams[1].Models = map[string]string{tt.b[0]: "*"}
				}
				tr := newTestTransport(t, cfg)
				tt.setup(t, n, tr)
				n.handle("a.test", slowly(time.Second, "a", new(atomic.Int32)))
				n.status("b.test", 200, "b")
				n.handle("c.test", slowly(10*time.Millisecond, "c", new(atomic.Int32)))
				before := n.count("b.test")
				start := time.Now()
				resp := mustPost(t, tr, "http://a.test/", `{"model":"m"}`)
				if got := readBody(t, resp); got != "c" {
					t.Errorf("body %q, want the hedge's to c", got)
				}
				if d := time.Since(start); d != 60*time.Millisecond {
					t.Errorf("answered after %v, want 60ms (50ms delay + 10ms)", d)
				}
				if got := n.count("b.test") - before; got != 0 {
					t.Errorf("b got %d requests, want 0", got)
				}
				synctest.Wait()
			})
		})
	}
}

// Once an answer ends the request, no further hedge goes out, even while
// the caller still waits for a Base that does not heed its canceled
// context: with MaxHedges 2, the second delay passing after the first
// hedge's answer must not send (and bill) a hedge to c.
func TestHedgeNoneAfterFinalAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(time.Second) // deaf to its context
			return respond(200, "a"), nil
		})
		n.handle("b.test", slowly(10*time.Millisecond, "b", new(atomic.Int32)))
		n.handle("c.test", slowly(10*time.Millisecond, "c", new(atomic.Int32)))
		tr := newTestTransport(t, threeUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, MaxHedges: 2, Percent: 100}}))
		var started []string
		ctx := WithTrace(context.Background(), &Trace{AttemptStart: func(a TraceAttempt) { started = append(started, a.Upstream) }})
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); got != "b" {
			t.Errorf("body %q, want the hedge's to b", got)
		}
		synctest.Wait()
		if got := n.count("c.test"); got != 0 {
			t.Errorf("c got %d requests after b answered, want 0", got)
		}
		if got := metricValue(t, tr, "failover_hedges_total"); got != 1 {
			t.Errorf("failover_hedges_total = %v, want 1", got)
		}
		if want := []string{"a", "b"}; !slices.Equal(started, want) {
			t.Errorf("AttemptStart for %v, want %v", started, want)
		}
	})
}

// The attempts an answer beat are traced as abandoned, with their time to
// the answer that ended the request, whether their results come in before
// the caller's Base returns or after: with MaxHedges 2, c's answer at
// 110ms ends b's hedge (which hears its cancellation at once) and the
// first attempt, whose Base is deaf to it until 1s.
func TestHedgeTraceAbandonedWhileCallerInBase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(time.Second) // deaf to its context
			return respond(200, "a"), nil
		})
		n.handle("b.test", slowly(time.Second, "b", new(atomic.Int32)))
		n.handle("c.test", slowly(10*time.Millisecond, "c", new(atomic.Int32)))
		tr := newTestTransport(t, threeUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, MaxHedges: 2, Percent: 100}}))
		var r recordTrace
		resp, err := tr.RoundTrip(traced(httptestRequest("GET", "http://a.test/", ""), &r))
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); got != "c" {
			t.Errorf("body %q, want the second hedge's, c's", got)
		}
		synctest.Wait()
		r.check(t,
			"start 1 a hedge=false",
			"start 2 b hedge=true",
			"start 3 c hedge=true",
			"done 3 c success 200 abandoned=false",
			"done 2 b canceled 0 abandoned=true",
			"done 1 a canceled 0 abandoned=true",
			"end hedged c #3 of 3 200")
		for _, a := range r.args {
			d, ok := a.(TraceAttemptDone)
			if !ok || !d.Abandoned {
				continue
			}
			if want := 110*time.Millisecond - time.Duration(d.Attempt-1)*50*time.Millisecond; d.Duration != want {
				t.Errorf("abandoned attempt %d (%s): Duration %v, want %v, to c's answer", d.Attempt, d.Upstream, d.Duration, want)
			}
		}
	})
}

// An answer the race took in before the caller gave up is the request's:
// the cancel that comes while the first attempt's Base, deaf to it, still
// runs does not undo it, as it did not before the race moved to the
// caller's goroutine. Found by review of issue 33's race.
func TestHedgeAnswerInHandBeforeCancelStands(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(200 * time.Millisecond) // deaf to its context
			return respond(200, "a"), nil
		})
		n.handle("b.test", slowly(10*time.Millisecond, "b", new(atomic.Int32)))
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: 50 * time.Millisecond, Percent: 100}}))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(65*time.Millisecond, cancel)
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
		if err != nil {
			t.Fatalf("err %v, want b's answer, in hand at 60ms before the cancel at 65ms", err)
		}
		if got := readBody(t, resp); got != "b" {
			t.Errorf("body %q, want b", got)
		}
	})
}

// A streamed request whose headers came at once is not hedged while its
// model thinks before the first content: a hedge covers silence before
// the headers only.
func TestHedgeNotWhileAStreamThinks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		think := func(d time.Duration) func(r *http.Request) (*http.Response, error) {
			return func(r *http.Request) (*http.Response, error) {
				return sseAnswer(r, func(ctx context.Context, pw *io.PipeWriter) {
					io.WriteString(pw, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n")
					if waitOr(ctx, d) {
						io.WriteString(pw, contentEvent+"data: [DONE]\n\n")
					}
				}), nil
			}
		}
		n := newFakeNet()
		n.handle("a.test", think(60*time.Second))
		n.handle("b.test", think(40*time.Second))
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{}}))
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", streamBody))
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		if got := n.count("b.test"); got != 0 {
			t.Errorf("a stream whose headers came at once was hedged %d times while it thought", got)
		}
		t.Logf("%+v", tr.Health()[0])
		if h := tr.Health()[0]; h.BreakerFailures != 0 {
			t.Errorf("thinking primary that lost the hedge: %d breaker failures, want 0: %+v", h.BreakerFailures, h)
		}
	})
}
