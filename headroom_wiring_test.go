package failover

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A success that reports a window at 0 puts the upstream behind the others
// until the window resets, instead of collecting the next request's 429.
func TestHeadroomExhaustedGoesLast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var left atomic.Int64
		left.Store(2)
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			return respond(200, "a",
				"X-Ratelimit-Remaining-Requests", itoa(left.Add(-1)),
				"X-Ratelimit-Reset-Requests", "20s",
				"X-Ratelimit-Remaining-Tokens", "4000"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		get(t, tr, "http://a.test/") // 1 left
		if h := tr.Health()[0]; h.OutOfHeadroom || h.Headroom == nil || h.Headroom.RemainingRequests != 1 || h.Headroom.RemainingTokens != 4000 {
			t.Fatalf("after a success with 1 left: %+v", h)
		}
		time.Sleep(time.Second)
		get(t, tr, "http://a.test/") // 0 left: a goes last
		h := tr.Health()[0]
		if !h.OutOfHeadroom || h.Headroom.RemainingRequests != 0 {
			t.Fatalf("after a success with 0 left: %+v", h)
		}
		js, _ := json.Marshal(h)
		if !strings.Contains(string(js), `"remaining_requests":0`) || !strings.Contains(string(js), `"out_of_headroom":true`) {
			t.Errorf("health JSON: %s", js)
		}
		var m strings.Builder
		tr.WritePrometheus(&m)
		if !strings.Contains(m.String(), `failover_headroom_requests{upstream="a"} 0`) {
			t.Error("metrics do not show the headroom")
		}
		for range 5 {
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
			if err != nil || readBody(t, resp) != "b" {
				t.Fatal("a request went to the upstream with no headroom left")
			}
		}
		time.Sleep(20 * time.Second) // the window resets
		left.Store(100)
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
		if err != nil || readBody(t, resp) != "a" {
			t.Fatal("a is not first again after its window reset")
		}
	})
}

// A 429 without Retry-After cools down until the reset its headers
// announce.
func TestRateLimitCooldownFromResetHeaders(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 429, `{"error":{"type":"requests"}}`,
		"X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "6m0s")
	n.status("b.test", 200, "b")
	tr := newTestTransport(t, twoUpstreams(n, Config{RateLimit: RateLimitConfig{MaxCooldown: time.Hour}}))
	get(t, tr, "http://a.test/")
	if cd := tr.Health()[0].Cooldown; cd < 5*time.Minute || cd > 6*time.Minute {
		t.Fatalf("cooldown %v, want the announced 6m", cd)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
