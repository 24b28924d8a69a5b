package failover

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "ok")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		for i := range 4 {
			get(t, tr, "http://a.test/")
			if s := tr.Health()[0].State; s != "closed" {
				t.Fatalf("after %d failures: %s, want closed", i+1, s)
			}
		}
		get(t, tr, "http://a.test/")
		h := tr.Health()[0]
		if h.State != "open" || h.Trips != 1 || h.OpenFor != time.Second || h.OpenTime != time.Second {
			t.Fatalf("after 5 failures: %s, trips %d, open for %v of %v; want open for the 1s default Cooldown", h.State, h.Trips, h.OpenFor, h.OpenTime)
		}
		for range 10 {
			if code, _ := get(t, tr, "http://a.test/"); code != 200 {
				t.Fatalf("status %d while a is open", code)
			}
		}
		if n.count("a.test") != 5 {
			t.Fatalf("a got %d requests, want 5: an open circuit gets none", n.count("a.test"))
		}
	})
}

// A success between failures resets the count: the default rule needs
// consecutive failures.
func TestBreakerNeedsConsecutiveFailures(t *testing.T) {
	n := newFakeNet()
	var i atomic.Int64
	n.handle("a.test", func(*http.Request) (*http.Response, error) {
		if i.Add(1)%5 == 0 {
			return respond(200, "ok"), nil
		}
		return respond(503, "down"), nil
	})
	n.status("b.test", 200, "ok")
	tr := newTestTransport(t, twoUpstreams(n, Config{}))
	for range 100 {
		get(t, tr, "http://a.test/")
	}
	if h := tr.Health()[0]; h.Trips != 0 || h.Requests.Failed != 80 {
		t.Fatalf("4 failures in every 5 tripped the breaker or were not counted: %+v", h)
	}
}

// Real providers fail 0.3-0.8 % of requests on a good day. At high traffic
// that noise must never open a circuit under the default rule.
func TestBreakerRidesThroughBackgroundErrors(t *testing.T) {
	n := newFakeNet()
	rng := rand.New(rand.NewPCG(1, 2))
	var mu sync.Mutex
	n.handle("a.test", func(*http.Request) (*http.Response, error) {
		mu.Lock()
		fail := rng.Float64() < 0.008
		mu.Unlock()
		if fail {
			return respond(503, "blip"), nil
		}
		return respond(200, "ok"), nil
	})
	n.status("b.test", 200, "ok")
	// Hang detection off: on a loaded machine 8 workers can wait past its
	// 100ms floor and move traffic to b, which this test is not about
	// (only the breaker's judgement of a's stray errors is).
	tr := newTestTransport(t, twoUpstreams(n, Config{Hang: HangConfig{Off: true}}))
	const requests = 20000
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range requests / 8 {
				if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
					t.Errorf("worker %d: %d %v", w, code, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	h := tr.Health()[0]
	if h.Requests.Failed < 100 {
		t.Fatalf("only %d background failures in %d requests: the test injects too few", h.Requests.Failed, requests)
	}
	if h.Trips != 0 {
		t.Fatalf("%d trips from %d background failures in %d requests; want none", h.Trips, h.Requests.Failed, requests)
	}
}

func TestBreakerFailureRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var i atomic.Int64
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if i.Add(1)%2 == 0 {
				return respond(503, "down"), nil
			}
			return respond(200, "ok"), nil
		})
		n.status("b.test", 200, "ok")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureRate: 0.5, MinRequests: 10, FailurePeriod: time.Minute}}))
		for range 9 {
			get(t, tr, "http://a.test/")
			time.Sleep(time.Second)
		}
		if h := tr.Health()[0]; h.State != "closed" {
			t.Fatalf("opened before MinRequests: %+v", h)
		}
		get(t, tr, "http://a.test/")
		if h := tr.Health()[0]; h.State != "open" || h.Trips != 1 {
			t.Fatalf("50%% failures over 10 requests: %s, want open", h.State)
		}
	})
}

// After Cooldown exactly one probe goes through; other requests never
// queue behind it. Its success closes the circuit.
func TestHalfOpenSingleFlightProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		healthy := atomic.Bool{}
		release := make(chan struct{})
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if !healthy.Load() {
				return respond(503, "down"), nil
			}
			<-release // the probe blocks until the test lets it go
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{Cooldown: 10 * time.Second}}))
		for range 5 {
			get(t, tr, "http://a.test/")
		}
		time.Sleep(10 * time.Second)
		healthy.Store(true)
		if s := tr.Health()[0].State; s != "half-open" {
			t.Fatalf("after cooldown: %s, want half-open", s)
		}

		probeDone := make(chan int)
		go func() {
			code, _ := get(t, tr, "http://a.test/")
			probeDone <- code
		}()
		synctest.Wait() // the probe is blocked in a.test
		if h := tr.Health()[0]; h.Available {
			t.Fatal("a reads available while its probe is in flight")
		}
		for range 20 {
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
			if err != nil || readBody(t, resp) != "b" {
				t.Fatalf("request during the probe: %v, want the backup", err)
			}
		}
		if got := n.count("a.test"); got != 6 {
			t.Fatalf("a got %d requests, want 5 failures and 1 probe", got)
		}
		close(release)
		if code := <-probeDone; code != 200 {
			t.Fatalf("probe status %d", code)
		}
		if s := tr.Health()[0].State; s != "closed" {
			t.Fatalf("after a successful probe: %s, want closed", s)
		}
		if code, _ := get(t, tr, "http://a.test/"); code != 200 || n.count("a.test") != 7 {
			t.Fatal("a closed circuit does not take requests")
		}
	})
}

func TestProbeFailureReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{Cooldown: 10 * time.Second, FailureThreshold: 2}}))
		get(t, tr, "http://a.test/")
		get(t, tr, "http://a.test/")
		time.Sleep(10 * time.Second)
		get(t, tr, "http://a.test/") // the probe fails
		h := tr.Health()[0]
		if h.State != "open" || h.OpenFor != 10*time.Second || h.Trips != 1 {
			t.Fatalf("after a failed probe: %s for %v, trips %d; want open for another 10s, still 1 trip", h.State, h.OpenFor, h.Trips)
		}
		if n.count("a.test") != 3 {
			t.Fatalf("a got %d requests, want 3", n.count("a.test"))
		}
	})
}

// SuccessThreshold probes, one at a time, close the circuit.
func TestSuccessThreshold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var healthy atomic.Bool
		gate := make(chan struct{})
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if !healthy.Load() {
				return respond(503, "down"), nil
			}
			<-gate
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{Cooldown: time.Second, FailureThreshold: 1, SuccessThreshold: 3}}))
		get(t, tr, "http://a.test/")
		time.Sleep(time.Second)
		healthy.Store(true)
		for probe := 1; probe <= 3; probe++ {
			done := make(chan struct{})
			go func() { get(t, tr, "http://a.test/"); close(done) }()
			synctest.Wait()
			// While this probe is in flight, nothing else reaches a.
			for range 5 {
				get(t, tr, "http://a.test/")
			}
			if got := n.count("a.test"); got != 1+probe {
				t.Fatalf("probe %d: a got %d requests, want %d (one probe at a time)", probe, got, 1+probe)
			}
			gate <- struct{}{}
			<-done
			want := "half-open"
			if probe == 3 {
				want = "closed"
			}
			if s := tr.Health()[0].State; s != want {
				t.Fatalf("after probe %d: %s, want %s", probe, s, want)
			}
		}
	})
}

// A probe that ends without a verdict (the caller canceled) records
// nothing: the next request probes.
func TestCanceledProbeHandsOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var healthy atomic.Bool
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if !healthy.Load() {
				return respond(503, "down"), nil
			}
			if r.Header.Get("X-Hang") != "" {
				<-r.Context().Done()
				return nil, r.Context().Err()
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{Cooldown: time.Second, FailureThreshold: 1}}))
		get(t, tr, "http://a.test/")
		time.Sleep(time.Second)
		healthy.Store(true)

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req := httptestRequest("GET", "http://a.test/", "").WithContext(ctx)
		req.Header.Set("X-Hang", "1")
		if _, err := tr.RoundTrip(req); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("hung probe: %v", err)
		}
		if h := tr.Health()[0]; h.State != "half-open" || !h.Available || h.Requests.Canceled != 1 {
			t.Fatalf("after a canceled probe: %+v; want half-open and available", h)
		}
		if code, _ := get(t, tr, "http://a.test/"); code != 200 {
			t.Fatal("next probe failed")
		}
		if s := tr.Health()[0].State; s != "closed" {
			t.Fatalf("after the next probe succeeded: %s", s)
		}
	})
}

// A success that was admitted before the circuit opened cannot close it
// when it arrives during the half-open probe.
func TestLateResultIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		slow := make(chan struct{})
		probe := make(chan struct{})
		var phase atomic.Int32
		var both sync.WaitGroup
		both.Add(2)
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			switch {
			case r.Header.Get("X-Slow") != "":
				<-slow
				return respond(200, "late"), nil
			case phase.Load() == 1:
				<-probe
				return respond(503, "still down"), nil
			}
			both.Done() // the two failures are in flight at once: with
			both.Wait() // the slow one, two more could not go after one
			return respond(503, "down"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{Cooldown: time.Second, FailureThreshold: 2}}))

		slowDone := make(chan struct{})
		go func() {
			req := httptestRequest("GET", "http://a.test/", "")
			req.Header.Set("X-Slow", "1")
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			close(slowDone)
		}()
		synctest.Wait()
		var two sync.WaitGroup
		for range 2 {
			two.Go(func() { get(t, tr, "http://a.test/") })
		}
		two.Wait()
		time.Sleep(time.Second)
		phase.Store(1)
		probeDone := make(chan struct{})
		go func() { get(t, tr, "http://a.test/"); close(probeDone) }()
		synctest.Wait()

		close(slow) // the late success arrives while the probe is in flight
		<-slowDone
		if s := tr.Health()[0].State; s != "half-open" {
			t.Fatalf("a success admitted before the trip moved the circuit to %s", s)
		}
		close(probe)
		<-probeDone
		if s := tr.Health()[0].State; s != "open" {
			t.Fatalf("after the probe failed: %s, want open", s)
		}
	})
}

func TestOpenCircuitError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) { return nil, errors.New("connection reset by peer") })
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: 20 * time.Second}, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}},
			LastResort: LastResortConfig{Off: true}})
		get(t, tr, "http://a.test/")
		time.Sleep(5 * time.Second)
		_, err := get(t, tr, "http://a.test/")
		var ferr *Error
		if !errors.Is(err, ErrCircuitOpen) || !errors.As(err, &ferr) || ferr.RetryAfter() != 15*time.Second {
			t.Fatalf("err = %v, want ErrCircuitOpen with RetryAfter 15s", err)
		}
		if got := n.count("a.test"); got != 1 {
			t.Fatalf("a got %d requests, want 1: nothing goes to an open circuit without a last resort", got)
		}
	})
}

func TestBreakerStandalone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 500, "boom")
		b, err := NewBreaker(n, BreakerConfig{FailureThreshold: 2, Cooldown: time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: b}
		for range 2 {
			resp, err := client.Get("http://a.test/")
			if err != nil || resp.StatusCode != 500 {
				t.Fatalf("breaker changed the response: %v %v", resp, err)
			}
			resp.Body.Close()
		}
		if b.State() != Open {
			t.Fatalf("state %v, want open", b.State())
		}
		_, err = client.Get("http://a.test/")
		if !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("err = %v, want ErrCircuitOpen", err)
		}
		if n.count("a.test") != 2 {
			t.Fatal("an open breaker let a request through")
		}
		b.Reset()
		if b.State() != Closed {
			t.Fatal("Reset did not close")
		}
		if _, err := NewBreaker(nil, BreakerConfig{Cooldown: -1}, nil); err == nil {
			t.Fatal("NewBreaker accepted a negative cooldown")
		}
	})
}

// Many goroutines through one Transport, upstreams failing at random: every
// request ends in a response or an *Error, and the counts add up.
func TestConcurrentUse(t *testing.T) {
	n := newFakeNet()
	rng := rand.New(rand.NewPCG(3, 4))
	var mu sync.Mutex
	pick := func() int {
		mu.Lock()
		defer mu.Unlock()
		return rng.IntN(100)
	}
	for _, h := range []string{"a.test", "b.test", "c.test"} {
		n.handle(h, func(*http.Request) (*http.Response, error) {
			switch p := pick(); {
			case p < 5:
				return respond(503, "down"), nil
			case p < 7:
				return respond(429, "busy", "Retry-After-Ms", "5"), nil
			case p < 10:
				return nil, errors.New("connection reset by peer")
			}
			return respond(200, "ok"), nil
		})
	}
	tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{Cooldown: 10 * time.Millisecond}, RateLimit: RateLimitConfig{MaxWait: time.Second}, Upstreams: []Upstream{
		{BaseURL: "http://a.test"}, {BaseURL: "http://b.test"}, {BaseURL: "http://c.test"},
	}})
	const workers, each = 50, 40
	var ok, answered, failed atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1", chatBody))
				var ferr *Error
				switch {
				case err == nil && resp.StatusCode == 200:
					ok.Add(1)
				case err == nil:
					answered.Add(1)
				case errors.As(err, &ferr):
					failed.Add(1)
				default:
					t.Errorf("undocumented error %T: %v", err, err)
				}
				if resp != nil {
					resp.Body.Close()
				}
			}
		}()
	}
	wg.Wait()
	if total := ok.Load() + answered.Load() + failed.Load(); total != workers*each {
		t.Fatalf("%d outcomes for %d requests", total, workers*each)
	}
	// Each 429 takes its upstream out for 5ms, which at this rate skips
	// it for many requests: most, not nearly all, succeed.
	if ok.Load() < workers*each*85/100 {
		t.Errorf("only %d of %d succeeded with three upstreams each 90%% healthy", ok.Load(), workers*each)
	}
	t.Logf("%d succeeded, %d answered otherwise, %d failed", ok.Load(), answered.Load(), failed.Load())
	var attempts uint64
	for _, h := range tr.Health() {
		attempts += h.Requests.Total()
	}
	sent := uint64(n.count("a.test") + n.count("b.test") + n.count("c.test"))
	if attempts != sent {
		t.Fatalf("health counts %d attempts, upstreams saw %d", attempts, sent)
	}
}

// A probe that never returns (no Timeouts, a caller without a deadline)
// is presumed hung after Cooldown or 30s, whichever is longer (LLM
// requests take seconds), and Reset frees its gate. (With Timeouts, the
// gate is held as long as the probe's attempt may take:
// TestProbeHoldsTheGateForItsAttempt.)
func TestHungProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mode atomic.Value
		mode.Store("fail")
		release := make(chan struct{})
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			switch mode.Load() {
			case "hang":
				<-release
				return respond(200, "late"), nil
			case "ok":
				return respond(200, "ok"), nil
			}
			return respond(503, "down"), nil
		})
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: 10 * time.Second},
			Timeouts:  Timeouts{Headers: -1, FirstContent: -1, Idle: -1, Attempt: -1},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		get(t, tr, "http://a.test/")
		time.Sleep(10 * time.Second)
		mode.Store("hang")
		done := make(chan struct{})
		go func() { defer close(done); get(t, tr, "http://a.test/") }()
		synctest.Wait()
		mode.Store("ok")
		if _, err := get(t, tr, "http://a.test/"); !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("while the probe is young: %v, want ErrCircuitOpen", err)
		}
		time.Sleep(10 * time.Second)
		if _, err := get(t, tr, "http://a.test/"); !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("a Cooldown after the probe hung: %v, want ErrCircuitOpen: a probe lives 30s at least", err)
		}
		time.Sleep(20 * time.Second)
		if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("30s after the probe hung: %d, %v; want a new probe", code, err)
		}

		// Trip again, hang a probe, Reset: the gate is free at once.
		mode.Store("fail")
		get(t, tr, "http://a.test/")
		time.Sleep(10 * time.Second)
		mode.Store("hang")
		done2 := make(chan struct{})
		go func() { defer close(done2); get(t, tr, "http://a.test/") }()
		synctest.Wait()
		tr.Reset("a")
		mode.Store("fail")
		get(t, tr, "http://a.test/") // trips again
		time.Sleep(10 * time.Second)
		mode.Store("ok")
		if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("after Reset and a new trip: %d, %v", code, err)
		}
		close(release)
		<-done
		<-done2
	})
}

// Requests sent before a fault that succeed after its first failures are
// older evidence and reset nothing: the circuit opens after exactly
// FailureThreshold failed requests sent since the fault began. (In the
// drill, in-flight successes reset the consecutive count and the circuit
// opened after 12 requests reached the failing primary, where nginx's
// max_fails=5 stops at 5.)
func TestDetectionIgnoresOlderSuccesses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var faulty atomic.Bool
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if faulty.Load() {
				return respond(503, "down"), nil
			}
			time.Sleep(20 * time.Millisecond) // slow, but well
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		var wg sync.WaitGroup
		for range 10 { // in flight when the fault begins, answering from 20ms to 29ms
			wg.Add(1)
			go func() {
				defer wg.Done()
				get(t, tr, "http://a.test/")
			}()
			time.Sleep(time.Millisecond)
		}
		faulty.Store(true)
		before := n.count("a.test")
		for sent := 0; tr.Health()[0].State == "closed" && sent < 50; sent++ {
			get(t, tr, "http://a.test/") // a's 503, then b's answer; or b's, while a is failing
			time.Sleep(3 * time.Millisecond)
		}
		wg.Wait()
		if got := n.count("a.test") - before; got != defaultFailureThreshold {
			t.Fatalf("the circuit opened after %d requests reached a since the fault, want %d", got, defaultFailureThreshold)
		}
	})
}

// A failing upstream gets no more requests than its FailureThreshold,
// however many are in flight when its fault begins: in an open loop of 200
// requests a second whose 503s take 18ms, four more had gone out before
// the first came back, and nine reached it before its circuit opened with
// FailureThreshold 5. Once two failures in a row are counted, the
// requests in flight count toward the threshold as if they failed too
// (ReasonFailing), and the others serve the rest. Below the four sent
// before anything was known, those four are the figure.
func TestFailingUpstreamGetsThresholdRequests(t *testing.T) {
	for _, threshold := range []uint{2, 5, 8} {
		t.Run(fmt.Sprint("threshold=", threshold), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				var faulty atomic.Bool
				n.handle("a.test", func(*http.Request) (*http.Response, error) {
					time.Sleep(18 * time.Millisecond) // off the 5ms beat: no answer comes as a request goes
					if faulty.Load() {
						return respond(503, "down"), nil
					}
					return respond(200, "a"), nil
				})
				n.status("b.test", 200, "b")
				tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: threshold, Cooldown: time.Hour}}))
				var wg sync.WaitGroup
				fire := func(k int) {
					for range k {
						wg.Add(1)
						go func() {
							defer wg.Done()
							if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
								t.Errorf("got %d, %v; want 200 from a or b", code, err)
							}
						}()
						time.Sleep(5 * time.Millisecond)
					}
				}
				fire(20) // well: a serves them all
				wg.Wait()
				if got := n.count("a.test"); got != 20 {
					t.Fatalf("a served %d of 20 before the fault", got)
				}
				faulty.Store(true)
				fire(40) // 200ms of requests, four in flight when the first 503 is back
				wg.Wait()
				if got := tr.Health()[0].State; got != "open" {
					t.Fatalf("a's circuit is %s after the fault, want open", got)
				}
				// The four sent before the first 503 came back cannot
				// be called back.
				if got, want := n.count("a.test")-20, max(int(threshold), 4); got != want {
					t.Errorf("%d requests reached a after its fault began, want %d (FailureThreshold %d)", got, want, threshold)
				}
			})
		})
	}
}

// A Breaker, like the Transport, blames its upstream for nothing the
// caller's own body does: a body whose read fails, or one shorter than its
// ContentLength, makes net/http fail the request (the first as a
// *net.OpError that DefaultClassifier reads as the upstream's), and
// before, with FailureThreshold 1, either opened the circuit, so that
// every caller's well-formed requests were then refused.
func TestBreakerCallerBodyFaultBlamesNoUpstream(t *testing.T) {
	srv := newUpstreamServer(t, 200, "ok")
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	br, err := NewBreaker(base, BreakerConfig{FailureThreshold: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	broken := errors.New("the caller's file went away")
	for _, req := range []*http.Request{
		func() *http.Request {
			req := httptestRequest("POST", srv.URL+"/v1/chat", "")
			req.Body, req.ContentLength = &failingBody{n: 10, err: broken}, 1000
			return req
		}(),
		func() *http.Request {
			req := httptestRequest("POST", srv.URL+"/v1/chat", `{"model":"m"}`)
			req.ContentLength = 100
			return req
		}(),
	} {
		if resp, err := br.RoundTrip(req); err == nil {
			resp.Body.Close()
			t.Fatalf("got %d, want the body's error", resp.StatusCode)
		}
		if s := br.State(); s != Closed {
			t.Fatalf("circuit %v after the caller's broken body, want closed", s)
		}
	}
	resp, err := br.RoundTrip(httptestRequest("POST", srv.URL+"/v1/chat", `{"model":"m"}`))
	if err != nil {
		t.Fatalf("a well-formed request: %v", err)
	}
	readBody(t, resp)
}

// A request whose Cancel channel the caller closed (http.Client closes it
// for its Timeout in front of a RoundTripper not its own) counts against
// no circuit, as a canceled context does not.
func TestBreakerCancelChannelIsNoFailure(t *testing.T) {
	release := make(chan struct{})
	up := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	base := http.DefaultTransport.(*http.Transport).Clone()
	defer base.CloseIdleConnections()
	b, err := NewBreaker(base, BreakerConfig{FailureThreshold: 2, Cooldown: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		cancel := make(chan struct{})
		req, _ := http.NewRequest("GET", up.URL+"/v1/models", nil)
		req.Cancel = cancel
		time.AfterFunc(10*time.Millisecond, func() { close(cancel) })
		if resp, err := b.RoundTrip(req); err == nil {
			resp.Body.Close()
			t.Fatal("a canceled request got an answer")
		}
	}
	if b.State() != Closed {
		t.Fatalf("state %v after the caller's cancellations, want closed", b.State())
	}
}

// A next that breaks the RoundTripper contract (no response, no error: a
// middleware that dropped a real server's answer) gets an error that
// counts as the upstream's failure, as a Transport's Base does, not a nil
// dereference in the classifier.
func TestBreakerNextWithoutResponseOrError(t *testing.T) {
	s := newUpstreamServer(t, 200, "ok")
	next := droppingNext(t)
	b, err := NewBreaker(next, BreakerConfig{FailureThreshold: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Fatalf("RoundTrip panicked: %v", v)
			}
		}()
		resp, err := b.RoundTrip(httptestRequest("GET", s.URL+"/v1", ""))
		if resp != nil || !errors.Is(err, errNextNoResponse) {
			t.Fatalf("got %v, %v; want an error saying next returned nothing", resp, err)
		}
	}()
	if b.State() != Open {
		t.Fatalf("state %v, want open: no answer is the upstream's failure", b.State())
	}
}

// outageNet is a Base whose primary (a) answers 503 from start until
// start+outage, then 200 "a", recording when each attempt reached it; the
// backup (b) always answers. It runs in the bubble: real TCP servers do
// not block durably inside a synctest bubble, so these tests drive the
// Transport through an in-memory Base.
type outageNet struct {
	*fakeNet
	start, end time.Time
	mu         sync.Mutex
	hits       []time.Duration // since start, during the outage
}

func newOutageNet(outage time.Duration) *outageNet {
	o := &outageNet{fakeNet: newFakeNet(), start: time.Now()}
	o.end = o.start.Add(outage)
	o.status("b.test", 200, "b")
	o.handle("a.test", func(*http.Request) (*http.Response, error) {
		now := time.Now()
		if now.Before(o.end) {
			o.mu.Lock()
			o.hits = append(o.hits, now.Sub(o.start))
			o.mu.Unlock()
			return respond(503, "down"), nil
		}
		return respond(200, "a"), nil
	})
	return o
}

// attempts returns when attempts reached the primary during its outage.
func (o *outageNet) attempts() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Duration(nil), o.hits...)
}

// untilServed sends one request through tr every interval until the
// primary serves one after the outage, and returns how long after the
// recovery that was.
func (o *outageNet) untilServed(t *testing.T, tr http.RoundTripper, every time.Duration) time.Duration {
	t.Helper()
	for {
		if body := readBody(t, mustGet(t, tr, "http://a.test/")); body == "a" {
			return time.Since(o.end)
		}
		if time.Since(o.end) > time.Hour {
			t.Fatal("the primary served nothing within an hour of its recovery")
		}
		time.Sleep(every)
	}
}

// gaps returns the time between consecutive attempts in hits that end
// after from.
func gaps(hits []time.Duration, from time.Duration) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(hits); i++ {
		if hits[i] >= from {
			out = append(out, hits[i]-hits[i-1])
		}
	}
	return out
}

// recoveries runs the outage once for each of phases starting points of
// the traffic within every (the first request that many steps into the
// outage), a default Transport each time, and returns the worst time from
// the recovery to the first request the primary served, and the
// attempts that reached the primary down in that run.
func recoveries(t *testing.T, outage, every time.Duration, phases int) (worst time.Duration, hits []time.Duration) {
	t.Helper()
	for i := range phases {
		synctest.Test(t, func(t *testing.T) {
			o := newOutageNet(outage)
			tr := newTestTransport(t, twoUpstreams(o.fakeNet, Config{}))
			time.Sleep(every * time.Duration(i) / time.Duration(phases))
			if lost := o.untilServed(t, tr, every); lost >= worst {
				worst, hits = lost, o.attempts()
			}
		})
	}
	return worst, hits
}

// T1: with the default Config, a 5 s blip under steady traffic (one
// request every 100ms) costs the primary about a second of traffic after
// it recovers, whatever the phase of the traffic: its open time stays at
// Cooldown (1s) while it has been failing for seconds. With a fixed 30s
// open time it was 25 s.
func TestRecoveryAfterBlip(t *testing.T) {
	worst, hits := recoveries(t, 5*time.Second, 100*time.Millisecond, 10)
	t.Logf("5s blip, a request every 100ms: the primary serves again at worst %v after its recovery (%d attempts reached it down)", worst, len(hits))
	if worst > 2*time.Second {
		t.Errorf("the primary serves again %v after a 5s blip ended, want at most 2s", worst)
	}
}

// T2: with the default Config, after a 60 s outage with one request every
// 4 s, the primary carries traffic again within 10 s of its recovery,
// whatever the phase of the traffic: the open time a minute into an
// outage is a few seconds. With a fixed 30s open time it was up to 33 s.
func TestRecoveryAfterMinute(t *testing.T) {
	worst, hits := recoveries(t, time.Minute, 4*time.Second, 16)
	t.Logf("60s outage, a request every 4s: the primary serves again at worst %v after its recovery; attempts while down at %v", worst, hits)
	if worst > 10*time.Second {
		t.Errorf("the primary serves again %v after a 60s outage ended, want within 10s", worst)
	}
}

// T3: with the default Config, a 10-minute outage with one request every
// 4 s gets at most one probe a minute by its end: the open time grows
// past a minute. With a fixed 30s open time it got two a minute.
func TestProbesThinOutInLongOutage(t *testing.T) {
	for phase := range 4 {
		synctest.Test(t, func(t *testing.T) {
			o := newOutageNet(10 * time.Minute)
			tr := newTestTransport(t, twoUpstreams(o.fakeNet, Config{}))
			time.Sleep(time.Duration(phase) * time.Second)
			lost := o.untilServed(t, tr, 4*time.Second)
			hits := o.attempts()
			late := gaps(hits, 8*time.Minute)
			t.Logf("10m outage, a request every 4s from %ds: %d attempts reached the primary down, %d in the last 2 minutes, gaps before them %v; served again %v after recovery",
				phase, len(hits), len(late), late, lost)
			if len(late) == 0 {
				t.Fatal("no probe in the outage's last 2 minutes")
			}
			for _, g := range late {
				if g < time.Minute {
					t.Errorf("probes %v apart in the outage's last 2 minutes, want at least a minute", g)
				}
			}
			if h := tr.Health()[0]; h.OpenTime < time.Minute || h.OpenTime > 5*time.Minute {
				t.Errorf("Health shows an open time of %v after the outage, want between 1m and the 5m cap", h.OpenTime)
			}
		})
	}
}

// A half-open probe that is an unstreamed answer generating for a minute
// holds the gate for as long as its attempt may take: no second request
// reaches the half-open upstream meanwhile.
func TestProbeHoldsTheGateForItsAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 500, "down")
		cfg := Config{Base: n, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}}
		tr := newTestTransport(t, cfg)
		for range 5 {
			resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", unstreamBody))
			if err == nil {
				resp.Body.Close()
			}
		}
		if h := tr.Health()[0]; h.State != Open.String() {
			t.Fatalf("state %s, want open", h.State)
		}
		time.Sleep(5 * time.Second)
		before := n.count("a.test")
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if !waitOr(r.Context(), time.Minute) {
				return nil, r.Context().Err()
			}
			return respond(200, `{"ok":true}`), nil
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", unstreamBody)); err == nil {
				resp.Body.Close()
			}
		}()
		time.Sleep(40 * time.Second)
		go func() {
			if resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", unstreamBody)); err == nil {
				resp.Body.Close()
			}
		}()
		<-done
		synctest.Wait()
		time.Sleep(2 * time.Minute)
		if got := n.count("a.test") - before; got != 1 {
			t.Errorf("%d requests reached the half-open upstream while its probe generated, want 1", got)
		}
	})
}
