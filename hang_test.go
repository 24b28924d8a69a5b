package failover

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/internal/clocktest"

	"github.com/failover-go/failover/internal/mono"
)

// A primary that accepts requests and answers none is routed around once
// a few requests wait on it past the floor, long before their attempt
// timeout, and trusted again at its first answer.
func TestHangDetection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		release := make(chan struct{})
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			select {
			case <-release:
				return respond(200, "a"), nil
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{AttemptTimeout: 10 * time.Second}))
		var wg sync.WaitGroup
		send := func() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				get(t, tr, "http://a.test/")
			}()
		}
		for range 3 {
			send()
		}
		synctest.Wait()
		if got := n.count("a.test"); got != 3 {
			t.Fatalf("a got %d requests, want 3 before any suspicion", got)
		}
		time.Sleep(50 * time.Millisecond) // under the 100ms floor
		send()
		synctest.Wait()
		if got := n.count("a.test"); got != 4 {
			t.Fatalf("a got %d requests at 50ms, want 4: not suspect yet", got)
		}
		time.Sleep(100 * time.Millisecond)
		if h := tr.Health()[0]; !h.Suspect || h.InFlight != 4 || h.State != "closed" {
			t.Fatalf("after 150ms of silence: %+v; want suspect, 4 in flight, circuit closed", h)
		}
		var m strings.Builder
		tr.WritePrometheus(&m)
		if !strings.Contains(m.String(), `failover_suspect{upstream="a"} 1`) || !strings.Contains(m.String(), `failover_in_flight{upstream="a"} 4`) {
			t.Errorf("metrics do not show the suspicion")
		}
		for range 10 {
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
			if err != nil || readBody(t, resp) != "b" {
				t.Fatalf("request while a is suspect: %v, want b's answer at once", err)
			}
		}
		if got := n.count("a.test"); got != 4 {
			t.Fatalf("a got %d requests while suspect, want none more", got)
		}
		close(release) // a answers: trusted again
		wg.Wait()
		if h := tr.Health()[0]; h.Suspect {
			t.Fatal("still suspect after answering")
		}
		if code, _ := get(t, tr, "http://a.test/"); code != 200 || n.count("a.test") != 5 {
			t.Fatal("a is not tried first again after it answered")
		}
	})
}

// With hang detection off, requests keep going to the silent upstream.
func TestHangDetectionOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		release := make(chan struct{})
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			<-release
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Hang: HangConfig{Off: true}}))
		var wg sync.WaitGroup
		for range 5 {
			wg.Add(1)
			go func() { defer wg.Done(); get(t, tr, "http://a.test/") }()
			synctest.Wait()
			time.Sleep(time.Second)
		}
		if got := n.count("a.test"); got != 5 {
			t.Fatalf("a got %d requests, want all 5", got)
		}
		close(release)
		wg.Wait()
	})
}

// Suspicion counts silence on the monotonic clock: a wall-clock step
// forward does not make busy upstreams look hung, nor a step back hide a
// hung one.
func TestHangWallClockStep(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour} {
		tr := newTestTransport(t, twoUpstreams(newFakeNet(), Config{}))
		u := tr.upstreams[0]
		start := time.Now()
		for range 3 {
			u.live.start(mono.Of(start))
		}
		if tr.suspect(u, clocktest.StepWall(start.Add(50*time.Millisecond), step)) {
			t.Errorf("step %v: suspect after 50ms of silence, under the 100ms floor", step)
		}
		if !tr.suspect(u, clocktest.StepWall(start.Add(150*time.Millisecond), step)) {
			t.Errorf("step %v: not suspect after 150ms of silence", step)
		}
	}
}

// A lone silent attempt is judged on Hang's own MinSamples and Window,
// whatever Degraded's are.
func TestSilentOwnWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTestTransport(t, twoUpstreams(newFakeNet(), Config{
			Hang:     HangConfig{MinSamples: 2, Window: time.Second},
			Degraded: DegradedConfig{MinSamples: 1000},
		}))
		u := tr.upstreams[0]
		for range 2 {
			u.observe(Success, Success, 10*time.Millisecond, mono.Of(time.Now()))
		}
		time.Sleep(time.Millisecond)
		start := time.Now()
		time.Sleep(200 * time.Millisecond) // past the 100ms floor
		// A stream's attempt, judged on the upstream's p99 when known.
		if !tr.silent(&attempt{u: u, start: start, end: time.Now(), streamed: true}) {
			t.Fatal("not silent after 200ms with 2 latencies known and Hang.MinSamples 2")
		}
		time.Sleep(2 * time.Second) // the latencies left Hang.Window: the p99 is unknown again
		if tr.silent(&attempt{u: u, start: start, end: time.Now(), streamed: true}) {
			t.Fatal("judged silent with no recent latencies in Hang.Window")
		}
	})
}

// headerTimeoutError is what http.Transport's ResponseHeaderTimeout
// fails a request with: a net.Error that timed out and matches
// context.DeadlineExceeded.
type headerTimeoutError struct{}

func (headerTimeoutError) Error() string     { return "net/http: timeout awaiting response headers" }
func (headerTimeoutError) Timeout() bool     { return true }
func (headerTimeoutError) Temporary() bool   { return true }
func (headerTimeoutError) Is(err error) bool { return err == context.DeadlineExceeded }

// An attempt that Base timed out (ResponseHeaderTimeout, a dial timeout)
// is no answer: it does not clear the suspicion of an upstream that still
// has requests waiting on it, as the attempt timeout's own does not. (The
// Base is in memory, and times out as http.Transport's
// ResponseHeaderTimeout does, so that the test runs in a synctest bubble
// on its fake clock: a real connection cannot live in one.)
func TestBaseTimeoutIsNoAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			select {
			case <-time.After(1200 * time.Millisecond): // Base's ResponseHeaderTimeout
				return nil, headerTimeoutError{}
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{
			// (Multiple: the timed-out attempt's 1.2s is in the p99.)
			Hang:    HangConfig{MinInFlight: 2, Floor: time.Second, Multiple: 0.1},
			Breaker: BreakerConfig{FailureThreshold: 100},
		}))
		var wg sync.WaitGroup
		for range 3 { // at 0, 300ms and 600ms, each under the 1s floor: all go to a
			wg.Add(1)
			go func() { defer wg.Done(); get(t, tr, "http://a.test/") }()
			synctest.Wait()
			time.Sleep(300 * time.Millisecond)
		}
		time.Sleep(350 * time.Millisecond) // the first timed out at 1.2s; two still wait on a
		synctest.Wait()
		defer wg.Wait()
		if h := tr.Health()[0]; h.InFlight != 2 || !h.Suspect {
			t.Errorf("a at 1.25s: %d in flight, suspect %v; want 2 in flight, silent since 0: suspect", h.InFlight, h.Suspect)
		}
		if code, err := get(t, tr, "http://a.test/"); code != 200 || err != nil {
			t.Fatalf("request at 1.25s: %d %v", code, err)
		}
		if got := n.count("a.test"); got != 3 {
			t.Fatalf("a got %d requests, want 3: the one at 1.25s goes to b first", got)
		}
	})
}

// A primary that hangs under an open loop (a request every 5 ms, a few in
// flight when the hang begins) gets at most 10 requests before it is left
// (19 before hang detection judged by send time, with Multiple 2), and
// its circuit opens on the attempts that timed out. A primary that is only
// slower than its p99, or that streams slowly, is not a hang: no trip,
// and every caller gets its answer.
func TestHungUpstreamGetsFewRequests(t *testing.T) {
	tests := []struct {
		name    string
		fault   func(r *http.Request) (*http.Response, error)
		maxSent int  // requests reaching a after the fault began, at most
		trips   bool // whether a's circuit opens
	}{
		{"hung", func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}, 10, true},
		{"slow", func(r *http.Request) (*http.Response, error) {
			time.Sleep(150 * time.Millisecond) // eight times its p99, under AttemptTimeout
			return respond(200, "a"), nil
		}, 60, false},
		{"slow stream", func(r *http.Request) (*http.Response, error) {
			time.Sleep(18 * time.Millisecond)
			pr, pw := io.Pipe()
			go func() {
				for range 20 {
					time.Sleep(50 * time.Millisecond) // a token every 50 ms for a second
					pw.Write([]byte("data: x\n\n"))
				}
				pw.Close()
			}()
			resp := respond(200, "")
			resp.Body = pr
			return resp, nil
		}, 60, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				var faulty atomic.Bool
				var k atomic.Int32
				n.handle("a.test", func(r *http.Request) (*http.Response, error) {
					if faulty.Load() {
						return tt.fault(r)
					}
					d := 17 * time.Millisecond // the drill's primary: p50 17 ms, p99 46 ms
					if k.Add(1)%10 == 0 {
						d = 45 * time.Millisecond
					}
					time.Sleep(d)
					return respond(200, "a"), nil
				})
				n.status("b.test", 200, "b")
				tr := newTestTransport(t, twoUpstreams(n, Config{
					AttemptTimeout: 250 * time.Millisecond,
					Breaker:        BreakerConfig{FailureThreshold: 5, Cooldown: time.Hour},
					// A floor under a's p99, as the drill scales it (the
					// default 100 ms is 20 requests of this loop).
					Hang: HangConfig{Floor: 5 * time.Millisecond},
				}))
				var wg sync.WaitGroup
				fire := func(k int) {
					for range k {
						wg.Add(1)
						go func() {
							defer wg.Done()
							resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
							if err != nil || resp.StatusCode != 200 {
								t.Errorf("got %v, %v; want 200 from a or b", resp, err)
								return
							}
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}()
						time.Sleep(5 * time.Millisecond)
					}
				}
				fire(60) // well: a's p50 is 17 ms, its p99 45 ms
				wg.Wait()
				before := n.count("a.test")
				faulty.Store(true)
				fire(60) // 300 ms of requests
				wg.Wait()
				h := tr.Health()[0]
				if got := n.count("a.test") - before; got > tt.maxSent {
					t.Errorf("%d requests reached a after the fault began, want at most %d", got, tt.maxSent)
				}
				if opened := h.Trips > 0; opened != tt.trips {
					t.Errorf("a's circuit tripped %d times, want a trip: %v", h.Trips, tt.trips)
				}
			})
		})
	}
}

// A caller's deadline that ends an unstreamed request at a healthy
// upstream still generating (90s, under callers' 60s deadlines) says
// nothing against it: an answer not streamed may take Timeouts.Attempt.
func TestDeadlineNeverBlamesALongUnstreamedAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if !waitOr(r.Context(), 90*time.Second) {
				return nil, r.Context().Err()
			}
			return respond(200, `{"ok":true}`), nil
		})
		n.status("b.test", 200, "backup")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		for range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", unstreamBody).WithContext(ctx))
			cancel()
			if err == nil {
				resp.Body.Close()
			}
		}
		if h := tr.Health()[0]; h.BreakerFailures != 0 || h.State != Closed.String() {
			t.Errorf("healthy slow upstream after callers' deadlines: %s, %d breaker failures; want closed, 0", h.State, h.BreakerFailures)
		}
	})
}

// An unstreamed attempt that loses to a hedge while its upstream still
// generates (60s against the hedge's 38s) says nothing against it.
func TestLostHedgeNeverBlamesALongUnstreamedAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if !waitOr(r.Context(), 60*time.Second) {
				return nil, r.Context().Err()
			}
			return respond(200, `{"a":true}`), nil
		})
		n.handle("b.test", func(r *http.Request) (*http.Response, error) {
			if !waitOr(r.Context(), 38*time.Second) {
				return nil, r.Context().Err()
			}
			return respond(200, `{"b":true}`), nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{Hedge: &HedgeConfig{}}))
		for range 5 {
			resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", unstreamBody))
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
		}
		if h := tr.Health()[0]; h.BreakerFailures != 0 || h.State != Closed.String() {
			t.Errorf("healthy slow upstream that lost hedges: %s, %d breaker failures; want closed, 0", h.State, h.BreakerFailures)
		}
	})
}
