package failover

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// responsesServer answers POST /v1/responses with a new response whose ID
// starts with name, as a JSON answer or, for "stream": true, as an event
// stream, unless status is set.
func responsesServer(t *testing.T, name string, status *atomic.Int32) *server {
	var n atomic.Int32
	return newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if s := status.Load(); s != 0 {
			w.WriteHeader(int(s))
			io.WriteString(w, `{"error":{"message":"down"}}`)
			return
		}
		id := fmt.Sprintf("resp_%s%d", name, n.Add(1))
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%q,\"status\":\"in_progress\"}}\n\n", id)
			fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q,\"status\":\"completed\"}}\n\n", id)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"object":"response","output":[]}`, id)
	})
}

// pinPair is a primary and a backup that serve the Responses API.
type pinPair struct {
	a, b         *server
	aDown, bDown atomic.Int32
	tr           *Transport
	url          string
}

func newPinPair(t *testing.T, cfg Config) *pinPair {
	p := &pinPair{}
	p.a, p.b = responsesServer(t, "a", &p.aDown), responsesServer(t, "b", &p.bDown)
	cfg.Upstreams = []Upstream{{Name: "a", BaseURL: p.a.URL + "/v1"}, {Name: "b", BaseURL: p.b.URL + "/v1"}}
	p.tr = newTestTransport(t, cfg)
	p.url = p.a.URL + "/v1/responses"
	return p
}

// create makes a response through the Transport and returns its ID.
func (p *pinPair) create(t *testing.T, stream bool) string {
	t.Helper()
	body := `{"model":"gpt-5","input":"hi"}`
	if stream {
		body = `{"model":"gpt-5","input":"hi","stream":true}`
	}
	resp := mustPost(t, p.tr, p.url, body)
	got := readBody(t, resp)
	i := strings.Index(got, "resp_")
	if resp.StatusCode != 200 || i < 0 {
		t.Fatalf("create: %d %s", resp.StatusCode, got)
	}
	return got[i : i+len("resp_a1")]
}

// A response created at the backup while the primary was down is
// continued only at the backup: when the primary is back, and when the
// backup is down (its answer, then, once its circuit opened, an error at
// once that names the backup and the reference). The primary never sees
// a request that references it.
func TestPinnedToWhereStateLives(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			p := newPinPair(t, Config{Breaker: BreakerConfig{FailureThreshold: 2, Cooldown: time.Minute}})
			p.aDown.Store(503)
			id := p.create(t, stream)
			if !strings.HasPrefix(id, "resp_b") {
				t.Fatalf("created %s, want it at b", id)
			}
			p.aDown.Store(0)
			next := fmt.Sprintf(`{"model":"gpt-5","previous_response_id":%q,"input":"more"}`, id)
			before := p.a.count()
			if got := readBody(t, mustPost(t, p.tr, p.url, next)); !strings.Contains(got, "resp_b") {
				t.Fatalf("continued with a up: %s, want b's", got)
			}
			p.bDown.Store(503)
			resp := mustPost(t, p.tr, p.url, next)
			readBody(t, resp)
			if resp.StatusCode != 503 {
				t.Fatalf("continued with b down: %d, want b's 503", resp.StatusCode)
			}
			// b, tried again at once (the request goes nowhere else),
			// failed twice: its circuit is open.
			req := httptestRequest("POST", p.url, next)
			_, err := p.tr.RoundTrip(req)
			var pe *PinnedError
			if !errors.Is(err, ErrPinned) || !errors.As(err, &pe) || !errors.Is(err, ErrCircuitOpen) {
				t.Fatalf("continued with b open: %v, want a PinnedError for its circuit", err)
			}
			if pe.Upstream != "b" || pe.Ref != id || pe.RetryAfter() <= 0 || err.(*Error).RetryAfter() <= 0 {
				t.Errorf("PinnedError %+v (retry after %v), want upstream b, ref %s, a Retry-After", pe, pe.RetryAfter(), id)
			}
			for _, want := range []string{`"b"`, id, "not failed over", "retry after"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %s", err, want)
				}
			}
			if n := p.a.count() - before; n != 0 {
				t.Errorf("a got %d requests that reference b's state", n)
			}
			var w strings.Builder
			p.tr.WritePrometheus(&w)
			for _, want := range []string{`failover_pinned_requests_total{result="refused"} 1`, `failover_pinned_requests_total{result="sent"} 2`, `failover_pins_learned_total 2`} {
				if !strings.Contains(w.String(), want) {
					t.Errorf("metrics lack %s", want)
				}
			}
		})
	}
}

// A reference the Transport never learned lives where the caller sent
// it: the request is not failed over, whether its body was read at once
// (a state path) or only when it was about to go elsewhere (a chat
// completion's file).
func TestPinnedUnknownReferenceStaysAddressed(t *testing.T) {
	for _, tc := range []struct{ path, body string }{
		{"/v1/responses", `{"model":"gpt-5","previous_response_id":"resp_elsewhere","input":"x"}`},
		{"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-abc123"}}]}]}`},
		{"/v1/responses", `{"model":"gpt-5","input":[{"type":"reasoning","id":"rs_1","encrypted_content":"gAAAA"}]}`},
	} {
		p := newPinPair(t, Config{})
		p.aDown.Store(503)
		resp := mustPost(t, p.tr, p.a.URL+tc.path, tc.body)
		readBody(t, resp)
		if resp.StatusCode != 503 || p.b.count() != 0 {
			t.Errorf("%s %s: %d, b got %d: want a's 503 and nothing at b", tc.path, tc.body, resp.StatusCode, p.b.count())
		}
		// Without references, the same path fails over.
		resp = mustPost(t, p.tr, p.a.URL+tc.path, `{"model":"gpt-5","input":"fresh"}`)
		readBody(t, resp)
		if resp.StatusCode != 200 || p.b.count() != 1 {
			t.Errorf("%s without references: %d, b got %d: want b's answer", tc.path, resp.StatusCode, p.b.count())
		}
	}
}

// Pinning off, a reference fails over like any request.
func TestPinningOff(t *testing.T) {
	p := newPinPair(t, Config{Pinning: PinConfig{Off: true}})
	p.aDown.Store(503)
	resp := mustPost(t, p.tr, p.url, `{"model":"gpt-5","previous_response_id":"resp_x","input":"x"}`)
	readBody(t, resp)
	if resp.StatusCode != 200 || p.b.count() != 1 {
		t.Errorf("%d, b got %d: want b's answer", resp.StatusCode, p.b.count())
	}
}

// WithPinned sends a request only to the upstream it names, even with
// pinning off; an unknown name is the caller's error; WithUpstreams that
// leaves the pin out fails the request.
func TestWithPinned(t *testing.T) {
	p := newPinPair(t, Config{Pinning: PinConfig{Off: true}})
	p.bDown.Store(503)
	req := httptestRequest("POST", p.url, `{"model":"gpt-5","input":"x"}`)
	resp, err := p.tr.RoundTrip(req.WithContext(WithPinned(req.Context(), "b")))
	if err != nil || resp.StatusCode != 503 || p.a.count() != 0 {
		t.Fatalf("pinned to b, b down: %v %v, a got %d: want b's 503 alone", resp, err, p.a.count())
	}
	resp.Body.Close()
	req = httptestRequest("POST", p.url, `{"model":"gpt-5","input":"x"}`)
	_, err = p.tr.RoundTrip(req.WithContext(WithPinned(req.Context(), "nope")))
	if !errors.Is(err, ErrUnknownUpstream) {
		t.Errorf("pinned to an unknown name: %v", err)
	}
	req = httptestRequest("POST", p.url, `{"model":"gpt-5","input":"x"}`)
	_, err = p.tr.RoundTrip(req.WithContext(WithUpstreams(WithPinned(req.Context(), "b"), "a")))
	var pe *PinnedError
	if !errors.Is(err, ErrLeftOut) || !errors.As(err, &pe) || pe.Upstream != "b" || pe.Ref != "" {
		t.Errorf("pinned to b, restricted to a: %v", err)
	}
	if p.a.count() != 0 {
		t.Errorf("a got %d requests", p.a.count())
	}
}

// What one member of a fleet learns, the others follow.
func TestPinnedAcrossFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, `{"id":"resp_b77","object":"response"}`, "Content-Type", "application/json")
		shared := newMemShared()
		one := newTestTransport(t, twoUpstreams(n, Config{Shared: shared}))
		two := newTestTransport(t, twoUpstreams(n, Config{Shared: shared}))
		t.Cleanup(func() { one.Close(); two.Close() })
		synctest.Wait()
		readBody(t, mustPost(t, one, "http://a.test/v1/responses", `{"model":"m","input":"x"}`))
		time.Sleep(2 * time.Second) // the fleet's period
		synctest.Wait()
		if shared.published(SharedPin) != 1 {
			t.Fatalf("%d pins published, want 1", shared.published(SharedPin))
		}
		n.status("a.test", 200, `{"id":"resp_a1"}`)
		n.status("b.test", 503, "down")
		before := n.count("a.test")
		resp := mustPost(t, two, "http://a.test/v1/responses", `{"model":"m","previous_response_id":"resp_b77","input":"x"}`)
		readBody(t, resp)
		if resp.StatusCode != 503 || n.count("a.test") != before {
			t.Errorf("the other member: %d, a got %d: want b's 503 and nothing at a", resp.StatusCode, n.count("a.test")-before)
		}
	})
}

func TestPinConfigErrors(t *testing.T) {
	ups := []Upstream{{BaseURL: "http://a.test"}}
	for _, tc := range []struct {
		p     PinConfig
		field string
	}{
		{PinConfig{TTL: -1}, "Pinning.TTL"},
		{PinConfig{TTL: 31 * 24 * time.Hour}, "Pinning.TTL"},
		{PinConfig{MaxRefs: -1}, "Pinning.MaxRefs"},
		{PinConfig{MaxRefs: maxBindings + 1}, "Pinning.MaxRefs"},
	} {
		_, err := New(Config{Upstreams: ups, Pinning: tc.p})
		if ce, ok := err.(*ConfigError); !ok || ce.Field != tc.field {
			t.Errorf("%+v: %v, want a ConfigError on %s", tc.p, err, tc.field)
		}
	}
}

// The table of references stays within its bound, forgetting the oldest.
func TestBindingsBounded(t *testing.T) {
	b := newBindings(64, time.Hour)
	u := &upstream{name: "u"}
	now := time.Now()
	for i := range 10_000 {
		b.bind(hashName(fmt.Sprint("ref", i)), u, "", now, 0)
	}
	if n := b.len(); n > 64+bindingShards {
		t.Errorf("%d entries kept, want about 64", n)
	}
	if _, ok := b.peek(hashName("ref9999"), now); !ok {
		t.Error("the newest entry was forgotten")
	}
	if _, ok := b.peek(hashName("ref0"), now); ok {
		t.Error("the oldest entry was kept")
	}
	// An entry bound again keeps its place; one that expired and came
	// back takes a new one, which the old place does not free.
	b = newBindings(bindingShards, time.Minute) // one per shard
	h := hashName("x")
	b.bind(h, u, "", now, 0)
	if _, ok := b.lookup(h, now.Add(2*time.Minute)); ok {
		t.Fatal("an expired entry was found")
	}
	b.bind(h, u, "", now.Add(2*time.Minute), 0)
	if _, ok := b.peek(h, now.Add(2*time.Minute)); !ok {
		t.Error("an entry bound again after it expired is missing")
	}
}

// A reference made with one key of a pool is continued with that key
// alone: another key of the same provider may belong to another
// organisation.
func TestPinnedToKey(t *testing.T) {
	var n atomic.Int32
	a := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		k := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		fmt.Fprintf(w, `{"id":"resp_%s_%d"}`, k, n.Add(1))
	})
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: a.URL + "/v1", Keys: []Key{
		{Name: "one", Header: http.Header{"Authorization": {"Bearer key1-0123456789"}}},
		{Name: "two", Header: http.Header{"Authorization": {"Bearer key2-0123456789"}}},
	}}}})
	url := a.URL + "/v1/responses"
	ids := map[string]string{}
	for range 2 {
		got := readBody(t, mustPost(t, tr, url, `{"model":"m","input":"x"}`))
		ids[got[len(`{"id":"resp_`):][:4]] = got[len(`{"id":"`) : len(got)-2]
	}
	for k, id := range ids {
		for range 3 {
			got := readBody(t, mustPost(t, tr, url, fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"y"}`, id)))
			if !strings.Contains(got, "resp_"+k) {
				t.Fatalf("%s, made with %s, continued as %s", id, k, got)
			}
		}
	}
	if len(ids) != 2 {
		t.Fatalf("the keys made %v: the pool did not take turns", ids)
	}
}

// Every circuit open, the last resort would send a request to the
// upstream whose circuit opened first: not one that references state the
// Transport never learned, which lives where it was addressed.
func TestPinnedNoLastResortElsewhere(t *testing.T) {
	p := newPinPair(t, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}})
	p.aDown.Store(503)
	p.bDown.Store(503)
	req := httptestRequest("POST", p.url, `{"model":"m","input":"x"}`)
	resp, err := p.tr.RoundTrip(req.WithContext(WithUpstreams(req.Context(), "b"))) // b opens first
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req = httptestRequest("POST", p.url, `{"model":"m","input":"x"}`)
	resp, err = p.tr.RoundTrip(req.WithContext(WithUpstreams(req.Context(), "a"))) // then a
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	p.bDown.Store(0)
	before := p.b.count()
	chat := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-abc123"}}]}]}`
	_, err = p.tr.RoundTrip(httptestRequest("POST", p.a.URL+"/v1/chat/completions", chat))
	var pe *PinnedError
	if !errors.As(err, &pe) || pe.Upstream != "a" || pe.Ref != "file-abc123" || p.b.count() != before {
		t.Errorf("every circuit open: %v, b got %d: want a PinnedError for a, nothing at b", err, p.b.count()-before)
	}
	// Without a reference, the last resort goes to b, open first.
	resp = mustPost(t, p.tr, p.a.URL+"/v1/chat/completions", `{"model":"gpt-4o","messages":[]}`)
	readBody(t, resp)
	if resp.StatusCode != 200 || p.b.count() != before+1 {
		t.Errorf("without a reference: %d, b got %d: want b's answer as the last resort", resp.StatusCode, p.b.count()-before)
	}
}

// When every circuit is open, a request whose state lives at the upstream
// it was addressed to does not go to the last resort elsewhere, even when
// its body was not read before (a chat completion's file, nothing
// learned): it fails at once, naming the upstream and the reference.
func TestPinnedNotToTheLastResort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "a down")
		n.status("b.test", 503, "b down")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		for _, name := range []string{"b", "a"} { // b's circuit opens first: the last resort's
			req := httptestRequest("POST", "http://a.test/chat/completions", chatBody)
			if resp, err := tr.RoundTrip(req.WithContext(WithUpstreams(req.Context(), name))); err == nil {
				resp.Body.Close()
			}
			time.Sleep(time.Second)
		}
		n.status("a.test", 200, "{}")
		n.status("b.test", 200, "{}")
		body := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-abc123"}}]}]}`
		_, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/chat/completions", body))
		var pe *PinnedError
		if !errors.As(err, &pe) || pe.Upstream != "a" || pe.Ref != "file-abc123" || !errors.Is(err, ErrCircuitOpen) {
			t.Errorf("every circuit open: %v, want a PinnedError for a's open circuit", err)
		}
		if n.count("b.test") != 1 {
			t.Errorf("b got %d requests, want only the one that opened its circuit", n.count("b.test"))
		}
		// Without a reference, the last resort takes it.
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/chat/completions", chatBody))
		if err != nil || n.count("b.test") != 2 {
			t.Fatalf("without a reference: %v, b got %d, want the last resort's answer", err, n.count("b.test"))
		}
		resp.Body.Close()
	})
}

// What a request pinned by WithPinned creates is learned: a later
// request that references it, without WithPinned, goes where it lives.
func TestWithPinnedLearns(t *testing.T) {
	p := newPinPair(t, Config{})
	req := httptestRequest("POST", p.url, `{"model":"gpt-5","input":"x"}`)
	resp, err := p.tr.RoundTrip(req.WithContext(WithPinned(req.Context(), "b")))
	if err != nil {
		t.Fatal(err)
	}
	got := readBody(t, resp)
	if !strings.HasPrefix(got, `{"id":"resp_b1"`) {
		t.Fatalf("created %s, want resp_b1", got)
	}
	next := `{"model":"gpt-5","previous_response_id":"resp_b1","input":"more"}`
	if got := readBody(t, mustPost(t, p.tr, p.url, next)); !strings.Contains(got, "resp_b") || p.a.count() != 0 {
		t.Errorf("continued with %s, a got %d: want b's answer and nothing at a", got, p.a.count())
	}
}

// A request whose body is read only when the Router picks another
// upstream than the one it was addressed to (a chat completion's file,
// nothing learned) is made a new plan, its pin alone: none of the old
// plan's Router order is left to send it to a third upstream.
func TestPinnedLateGoesNowhereElse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "a down")
		n.status("b.test", 200, "{}")
		n.status("c.test", 200, "{}")
		tr := newTestTransport(t, threeUpstreams(n, Config{Router: &Weighted{}, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		req := httptestRequest("POST", "http://a.test/chat/completions", chatBody)
		if resp, err := tr.RoundTrip(req.WithContext(WithUpstreams(req.Context(), "a"))); err == nil {
			resp.Body.Close() // a's circuit opens: the Router picks b or c
		}
		for i := range 10 {
			body := fmt.Sprintf(`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-%d"}}]}]}`, i)
			_, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/chat/completions", body))
			var pe *PinnedError
			if !errors.As(err, &pe) || pe.Upstream != "a" || !errors.Is(err, ErrCircuitOpen) {
				t.Errorf("request %d: %v, want a PinnedError for a's open circuit", i, err)
			}
		}
		if b, c := n.count("b.test"), n.count("c.test"); b+c != 0 {
			t.Errorf("b got %d, c got %d requests that reference a's files", b, c)
		}
	})
}

// The RetryAfter of a pinned request's Error is its pin's, not that of
// an upstream passed over before its body was read.
func TestPinnedRetryAfterIsThePins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "a down")
		n.status("b.test", 429, "slow down", "Retry-After", "2")
		n.status("c.test", 200, "{}")
		tr := newTestTransport(t, threeUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		for _, name := range []string{"a", "b"} { // a's circuit opens, b cools down
			req := httptestRequest("POST", "http://a.test/chat/completions", chatBody)
			if resp, err := tr.RoundTrip(req.WithContext(WithUpstreams(req.Context(), name))); err == nil {
				resp.Body.Close()
			}
		}
		body := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-abc123"}}]}]}`
		_, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/chat/completions", body))
		var pe *PinnedError
		var e *Error
		if !errors.As(err, &pe) || !errors.As(err, &e) || pe.Upstream != "a" {
			t.Fatalf("%v, want a PinnedError at a", err)
		}
		if e.RetryAfter() != pe.RetryAfter() || e.RetryAfter() < 50*time.Second {
			t.Errorf("Error.RetryAfter %v, PinnedError's %v: want a's open time", e.RetryAfter(), pe.RetryAfter())
		}
		if n.count("c.test") != 0 {
			t.Errorf("c got %d requests", n.count("c.test"))
		}
	})
}

// A request found pinned to the upstream it was addressed to only when
// it was about to go elsewhere does not go there twice in the round: the
// upstream that failed it once, or was passed over, had its turn.
func TestPinnedLateHadItsTurn(t *testing.T) {
	p := newPinPair(t, Config{})
	p.aDown.Store(503)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-abc123"}}]}]}`
	resp := mustPost(t, p.tr, p.a.URL+"/v1/chat/completions", body)
	readBody(t, resp)
	if resp.StatusCode != 503 || p.a.count() != 1 || p.b.count() != 0 {
		t.Errorf("%d, a got %d, b %d requests: want a's 503 after one attempt, as without the reference", resp.StatusCode, p.a.count(), p.b.count())
	}
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "a down")
		n.status("b.test", 200, "{}")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		get(t, tr, "http://a.test/") // a's circuit opens
		_, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/chat/completions", body))
		var e *Error
		if !errors.As(err, &e) || len(e.Attempts) != 1 || !errors.Is(err, ErrPinned) {
			t.Errorf("%v, want a's open circuit said once", err)
		}
	})
}

// A Google resumable upload's session, named by the upload_id of its
// URL's query, lives where it began: its chunks do not fail over, and
// its error does not say the upload_id, which lets anyone upload.
func TestPinnedUploadSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "a down")
		n.status("b.test", 200, "{}")
		tr := newTestTransport(t, twoUpstreams(n, Config{Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Minute}}))
		req := httptestRequest("POST", "http://a.test/upload/v1beta/files?upload_id=AbC-123_x&upload_protocol=resumable", "chunk")
		req.Header.Set("X-Goog-Upload-Command", "upload, finalize")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || n.count("b.test") != 0 {
			t.Errorf("%d, b got %d: want a's 503 and nothing at b", resp.StatusCode, n.count("b.test"))
		}
		_, err = tr.RoundTrip(httptestRequest("POST", "http://a.test/upload/v1beta/files?upload_id=AbC-123_x", "chunk"))
		var pe *PinnedError
		if !errors.As(err, &pe) || pe.Ref != "resumable upload session" || strings.Contains(err.Error(), "AbC-123_x") {
			t.Errorf("a open: %v, want a PinnedError that does not say the upload_id", err)
		}
		if n.count("b.test") != 0 {
			t.Errorf("b got %d requests", n.count("b.test"))
		}
	})
}

// A PinnedError, found by errors.As and printed on its own, scrubs the
// credentials from its cause as the Error that holds it does.
func TestPinnedErrorScrubsKeys(t *testing.T) {
	const secret = "sk-secret-0123456789abcdef"
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return nil, errors.New("broken: sent " + r.Header.Get("Authorization"))
	})
	tr := newTestTransport(t, Config{Base: base, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test/v1", Header: http.Header{"Authorization": {"Bearer " + secret}}},
		{Name: "b", BaseURL: "http://b.test/v1"}}})
	_, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/responses", `{"model":"m","previous_response_id":"resp_1","input":"x"}`))
	var pe *PinnedError
	if !errors.As(err, &pe) || !strings.Contains(pe.Error(), "broken") {
		t.Fatalf("%v, want a PinnedError that says its cause", err)
	}
	if strings.Contains(err.Error(), secret) || strings.Contains(pe.Error(), secret) {
		t.Errorf("the key is in the error: %v", pe)
	}
}
