package failover

import (
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A pool's revoked key stops costing every request a round trip: after
// Auth.Threshold 401s in a row the upstream is tried after the others,
// shown in Health with its reason and its circuit closed; For after its
// latest 401 a request tries it in its place again, and the first answer
// other than a 401 or 403 ends the demotion.
func TestRevokedKeyDemoted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var revoked atomic.Bool
		revoked.Store(true)
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if revoked.Load() {
				return respond(401, `{"error":{"code":"invalid_api_key"}}`), nil
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		body := func() string { return readBody(t, mustGet(t, tr, "http://a.test/")) }
		for i := range 10 {
			if got := body(); got != "b" {
				t.Fatalf("request %d: %q, want b's", i, got)
			}
		}
		if got := n.count("a.test"); got != defaultAuthThreshold {
			t.Fatalf("a's revoked key was tried %d times in 10 requests, want %d", got, defaultAuthThreshold)
		}
		h := tr.Health()[0]
		if h.Demoted != ReasonAuthFailing || h.State != "closed" || h.Trips != 0 || !h.Available {
			t.Fatalf("a's health: demoted %q, %s, %d trips, available %v; want auth_failing, closed, none, available", h.Demoted, h.State, h.Trips, h.Available)
		}

		time.Sleep(defaultAuthFor) // the demotion lapses: a is tried once more
		body()
		body()
		if got := n.count("a.test"); got != defaultAuthThreshold+1 {
			t.Fatalf("after For, a was tried %d times in all, want %d", got, defaultAuthThreshold+1)
		}

		revoked.Store(false) // the key works again
		time.Sleep(defaultAuthFor)
		for i := range 3 {
			if got := body(); got != "a" {
				t.Fatalf("request %d after the key came back: %q, want a's", i, got)
			}
		}
		if h := tr.Health()[0]; h.Demoted != "" {
			t.Fatalf("a still demoted %q after it answered", h.Demoted)
		}
	})
}

// The demotion reads the row of answers: a key that works for some
// requests (a 403 for one model, another's 200) is never demoted; the
// answers that say nothing of the key (a refused connection) do not end
// the row; a demoted upstream still serves when the others fail; and Off
// keeps every upstream in its place.
func TestAuthDemotionRow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var k atomic.Int32
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if k.Add(1)%2 == 0 {
				return respond(200, "a"), nil
			}
			return respond(403, "forbidden"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		for range 20 {
			readBody(t, mustGet(t, tr, "http://a.test/"))
		}
		if got := n.count("a.test"); got != 20 {
			t.Fatalf("a, refusing every other request, was tried %d times in 20, want all", got)
		}

		n = newFakeNet()
		n.status("a.test", 401, "no")
		tr = newTestTransport(t, twoUpstreams(n, Config{Auth: AuthConfig{Threshold: 2}}))
		for range 2 {
			readBody(t, mustGet(t, tr, "http://a.test/")) // b has no handler: refused
		}
		if h := tr.Health()[0]; h.Demoted != ReasonAuthFailing {
			t.Fatalf("after 2 401s and b's refused connections: demoted %q", h.Demoted)
		}
		resp := mustGet(t, tr, "http://a.test/")
		if resp.StatusCode != 401 || n.count("a.test") != 3 {
			t.Fatalf("with b down, a demoted answered %d after %d tries; want its 401, tried", resp.StatusCode, n.count("a.test"))
		}
		resp.Body.Close()

		n = newFakeNet()
		n.status("a.test", 401, "no")
		n.status("b.test", 200, "b")
		tr = newTestTransport(t, twoUpstreams(n, Config{Auth: AuthConfig{Off: true}}))
		for range 10 {
			readBody(t, mustGet(t, tr, "http://a.test/"))
		}
		if got := n.count("a.test"); got != 10 {
			t.Fatalf("with Auth.Off, a was tried %d times in 10, want all", got)
		}
	})
}
