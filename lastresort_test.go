package failover

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// When every circuit is open, a request goes past the circuit of the
// upstream that opened first rather than failing at once; its success
// half-opens that circuit, so that the next request probes it. Without the
// last resort the same request fails with ErrCircuitOpen and reaches no
// one.
func TestLastResort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "a down")
		n.status("b.test", 503, "b down")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		get(t, tr, "http://a.test/") // a opens, then b
		n.status("b.test", 200, "b")
		n.status("a.test", 200, "a")
		code, err := get(t, tr, "http://a.test/")
		if err != nil || code != 200 {
			t.Fatalf("%d %v, want the last resort's answer", code, err)
		}
		if got := n.count("a.test"); got != 2 {
			t.Fatalf("a (opened first) got %d requests, want 2", got)
		}
		if n.count("b.test") != 1 {
			t.Fatalf("b got %d requests, want 1: the last resort goes to one upstream", n.count("b.test"))
		}
		if h := tr.Health(); h[0].State != "half-open" || h[1].State != "open" {
			t.Fatalf("after the last resort's success: a %s, b %s; want a half-open", h[0].State, h[1].State)
		}
		var m strings.Builder
		tr.WritePrometheus(&m)
		if !strings.Contains(m.String(), `failover_last_resort_total{upstream="a"} 1`) {
			t.Errorf("the last resort is not counted:\n%s", grepLines(m.String(), "last_resort"))
		}
		code, err = get(t, tr, "http://a.test/") // probes a, which closes
		if err != nil || code != 200 || tr.Health()[0].State != "closed" {
			t.Fatalf("%d %v, a %s; want a's probe to close it", code, err, tr.Health()[0].State)
		}

		off := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}, LastResort: LastResortConfig{Off: true}}))
		n.status("a.test", 503, "a down")
		n.status("b.test", 503, "b down")
		get(t, off, "http://a.test/")
		before := n.count("a.test") + n.count("b.test")
		if _, err := get(t, off, "http://a.test/"); !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("with the last resort off: %v, want ErrCircuitOpen", err)
		}
		if got := n.count("a.test") + n.count("b.test") - before; got != 0 {
			t.Fatalf("with the last resort off, %d requests were sent", got)
		}
	})
}

// At most MaxInFlight last-resort requests are in flight: an upstream down
// for real is not flooded, and the rest fail at once as without it. A
// failure keeps the circuit open.
func TestLastResortBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}},
			Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}, LastResort: LastResortConfig{MaxInFlight: 2}})
		get(t, tr, "http://a.test/")
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(time.Second)
			return respond(503, "still down"), nil
		})
		var wg sync.WaitGroup
		var mu sync.Mutex
		refused := 0
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := get(t, tr, "http://a.test/"); errors.Is(err, ErrCircuitOpen) {
					mu.Lock()
					refused++
					mu.Unlock()
				}
			}()
		}
		synctest.Wait()
		if got := n.count("a.test"); got != 3 {
			t.Fatalf("%d requests reached a, want 1 and the last resort's 2", got)
		}
		wg.Wait()
		if refused != 8 {
			t.Fatalf("%d requests failed at once, want 8", refused)
		}
		if h := tr.Health()[0]; h.State != "open" {
			t.Fatalf("a is %s after the last resort failed, want open", h.State)
		}
	})
}

// Upstreams cooling down after a 429 said when to come back: they are no
// last resort, and neither is an upstream whose probe is in flight.
func TestLastResortSkipsCoolingAndProbing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 429, "busy", "Retry-After", "30")
		release := make(chan struct{})
		n.handle("b.test", func(r *http.Request) (*http.Response, error) {
			if r.URL.Path == "/probe" {
				<-release
				return respond(200, "b"), nil
			}
			return respond(503, "down"), nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second}}))
		get(t, tr, "http://a.test/") // a cools down, b opens
		if code, err := get(t, tr, "http://a.test/"); err != nil || code != 503 {
			t.Fatalf("%d %v: want b, the only open circuit, as the last resort", code, err)
		}
		if got := n.count("a.test"); got != 1 {
			t.Fatalf("a, cooling down, got %d requests: it is no last resort", got)
		}
		time.Sleep(time.Second)
		go get(t, tr, "http://b.test/probe")
		synctest.Wait()
		before := n.count("b.test")
		if _, err := get(t, tr, "http://b.test/"); !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("%v: want b's probe in flight to refuse it", err)
		}
		if got := n.count("b.test") - before; got != 0 {
			t.Fatalf("%d requests went beside b's probe", got)
		}
		close(release)
		synctest.Wait()
	})
}
