package failover

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A panic in Base during the probe does not hold the probe gate: the next
// request probes.
func TestProbeGateSurvivesPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mode atomic.Value
		mode.Store("fail")
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			switch mode.Load() {
			case "panic":
				panic("boom")
			case "ok":
				return respond(200, "ok"), nil
			}
			return respond(503, "down"), nil
		})
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		get(t, tr, "http://a.test/")
		time.Sleep(time.Second)
		mode.Store("panic")
		func() {
			defer func() {
				if recover() == nil {
					t.Error("Base's panic did not reach the caller")
				}
			}()
			get(t, tr, "http://a.test/")
		}()
		mode.Store("ok")
		if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("after a panicking probe: %d, %v; want the next request to probe", code, err)
		}
	})
}

// A Rejected error (a request no upstream can send) says nothing of the
// upstream: it does not close a half-open circuit whose upstream is down.
func TestInvalidHeaderLeavesBreakerAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if r.Header.Get("X-Bad") != "" {
				return nil, errors.New(`net/http: invalid header field value for "X-Bad"`)
			}
			return nil, errors.New("connection refused")
		})
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		get(t, tr, "http://a.test/")
		time.Sleep(time.Second)
		req := httptestRequest("GET", "http://a.test/", "")
		req.Header.Set("X-Bad", "1")
		if _, err := tr.RoundTrip(req); err == nil {
			t.Fatal("no error")
		}
		if h := tr.Health()[0]; h.State != "half-open" || !h.Available {
			t.Fatalf("after a rejected probe: %s available %v; want half-open, probe handed on", h.State, h.Available)
		}
	})
}

// resp.Request shows where the answer came from, with the caller's own
// headers: the upstream's key stays inside the Transport.
func TestResponseRequestHidesUpstreamKey(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.handle("b.test", func(r *http.Request) (*http.Response, error) {
		resp := respond(200, "ok")
		resp.Request = r
		return resp, nil
	})
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test", Header: http.Header{"Authorization": {"Bearer sk-aaaaaaaaaaaa"}}},
		{Name: "b", BaseURL: "http://b.test", Header: http.Header{"Authorization": {"Bearer sk-bbbbbbbbbbbb"}}},
	}})
	req := httptestRequest("GET", "http://a.test/x", "")
	req.Header.Set("Authorization", "Bearer caller")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Host != "b.test" || resp.Request.Header.Get("Authorization") != "Bearer caller" {
		t.Fatalf("resp.Request: %s with Authorization %q; want b.test with the caller's own", resp.Request.URL, resp.Request.Header.Get("Authorization"))
	}
}

func TestAttemptTimeout(t *testing.T) {
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // accepts, never answers
	})
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{
		AttemptTimeout: 50 * time.Millisecond,
		Upstreams:      []Upstream{{BaseURL: primary.URL}, {BaseURL: backup.URL}},
	})
	if resp := mustGet(t, tr, primary.URL+"/v1/models"); readBody(t, resp) != "ok" {
		t.Fatal("not served by the backup")
	}
	h := tr.Health()[0]
	if h.Requests.Failed != 1 || !strings.Contains(h.LastError, "attempt timed out") {
		t.Fatalf("primary: %+v", h)
	}

	// With no backup the caller gets ErrAttemptTimeout.
	tr = newTestTransport(t, Config{AttemptTimeout: 50 * time.Millisecond, Upstreams: []Upstream{{BaseURL: primary.URL}}})
	_, err := tr.RoundTrip(httptestRequest("GET", primary.URL+"/v1/models", ""))
	if !errors.Is(err, ErrAttemptTimeout) {
		t.Fatalf("err = %v, want ErrAttemptTimeout", err)
	}
}
