package failover

import (
	"testing"
	"testing/synctest"
	"time"
)

// With Retries, the caller still gets the provider's answer when no
// upstream comes back in time, and that answer survives the wait whole.
func TestRetriesKeepTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, `{"error":"a overloaded"}`)
		n.status("b.test", 503, `{"error":"b overloaded"}`)
		tr := newTestTransport(t, twoUpstreams(n, Config{Retries: 1,
			Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: 2 * time.Minute}}))
		start := time.Now()
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/x", ""))
		if err != nil {
			t.Fatalf("got %v after %v, want the last 503", err, time.Since(start))
		}
		if got := readBody(t, resp); resp.StatusCode != 503 || got != `{"error":"b overloaded"}` {
			t.Fatalf("got %d %q", resp.StatusCode, got)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("waited %v for circuits that stay open for 2m", waited)
		}
	})
}
