package failover

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// A slow upstream is degraded: tried after the others while its recent p99
// is over the bound, without opening its circuit, and back first once its
// slow samples age out.
func TestDegraded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(200 * time.Millisecond)
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Degraded: DegradedConfig{Latency: 100 * time.Millisecond, MinSamples: 5, Window: 10 * time.Second}}))
		for range 5 {
			if code, _ := get(t, tr, "http://a.test/"); code != 200 {
				t.Fatal("a failed")
			}
		}
		time.Sleep(time.Second) // past the refresh interval
		h := tr.Health()[0]
		if !h.Degraded || h.State != "closed" || h.Trips != 0 {
			t.Fatalf("a after 5 slow answers: %+v; want degraded, circuit closed", h)
		}
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
		if err != nil || readBody(t, resp) != "b" {
			t.Fatal("a degraded upstream was tried first")
		}
		time.Sleep(10 * time.Second) // the slow samples age out
		if code, _ := get(t, tr, "http://a.test/"); code != 200 || n.count("a.test") != 6 {
			t.Fatal("a is not tried first again once its figures recovered")
		}
		if tr.Health()[0].Degraded {
			t.Fatal("still degraded")
		}
	})
}

func TestDegradedBySuccessRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		calls := 0
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			calls++
			if calls%2 == 0 {
				return respond(500, "flaky"), nil
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{Degraded: DegradedConfig{SuccessRate: 0.9, MinSamples: 10}}))
		for range 10 {
			get(t, tr, "http://a.test/")
		}
		time.Sleep(time.Second)
		if h := tr.Health()[0]; !h.Degraded || h.SuccessRate > 0.6 || h.Trips != 0 {
			t.Fatalf("a at 50%% success: %+v; want degraded and no trip", h)
		}
	})
}
