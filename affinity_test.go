package failover

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// turn is the body of an agent loop's turn-th request of conversation
// conv: the whole history, as the SDKs send it.
func turn(conv, turn int) string {
	msgs := []string{`{"role":"system","content":"You are agent ` + fmt.Sprint(conv%3) + `."}`,
		`{"role":"user","content":"task ` + fmt.Sprint(conv) + `"}`}
	for i := 1; i < turn; i++ {
		msgs = append(msgs, `{"role":"assistant","content":"step `+fmt.Sprint(i)+`"}`,
			`{"role":"user","content":"tool result `+fmt.Sprint(i)+`"}`)
	}
	return `{"model":"gpt-4o","messages":[` + strings.Join(msgs, ",") + `]}`
}

// nameServer answers 200 with its name, or status when set.
func nameServer(t *testing.T, name string, status *atomic.Int32) *server {
	return newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if status != nil && status.Load() != 0 {
			w.WriteHeader(int(status.Load()))
			return
		}
		io.WriteString(w, name)
	})
}

func postTurn(t *testing.T, tr http.RoundTripper, url, body string) string {
	t.Helper()
	resp := mustPost(t, tr, url, body)
	if resp.StatusCode != 200 {
		readBody(t, resp)
		return fmt.Sprint(resp.StatusCode)
	}
	return readBody(t, resp)
}

// Under a balancing Router, every turn of a conversation reaches the
// upstream its first turn reached; without affinity the turns scatter.
func TestAffinityKeepsConversations(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("off=%v", off), func(t *testing.T) {
			a, b := nameServer(t, "a", nil), nameServer(t, "b", nil)
			tr := newTestTransport(t, Config{Router: &Weighted{}, Affinity: AffinityConfig{Off: off}, Upstreams: []Upstream{
				{Name: "a", BaseURL: a.URL + "/v1"}, {Name: "b", BaseURL: b.URL + "/v1"}}})
			scattered, seen := 0, map[string]int{}
			for conv := range 20 {
				first := ""
				moved := false
				for n := 1; n <= 6; n++ {
					got := postTurn(t, tr, a.URL+"/v1/chat/completions", turn(conv, n))
					seen[got]++
					if n == 1 {
						first = got
					} else if got != first {
						moved = true
					}
				}
				if moved {
					scattered++
				}
			}
			if seen["a"] == 0 || seen["b"] == 0 {
				t.Errorf("answers by upstream %v: the Router no longer balances", seen)
			}
			switch {
			case !off && scattered > 0:
				t.Errorf("with affinity, %d of 20 conversations moved between healthy upstreams", scattered)
			case off && scattered == 0:
				t.Errorf("without affinity, no conversation moved: the test shows nothing")
			}
		})
	}
}

// A session whose upstream fails moves at once to another, and stays
// there when the first comes back: it never waits for its upstream.
func TestAffinityMovesOffAFailingUpstream(t *testing.T) {
	var aDown, bDown atomic.Int32
	a, b := nameServer(t, "a", &aDown), nameServer(t, "b", &bDown)
	tr := newTestTransport(t, Config{Router: &Weighted{}, Upstreams: []Upstream{
		{Name: "a", BaseURL: a.URL + "/v1"}, {Name: "b", BaseURL: b.URL + "/v1"}}})
	url := a.URL + "/v1/chat/completions"
	home := postTurn(t, tr, url, turn(1, 1))
	down, other := &aDown, "b"
	if home == "b" {
		down, other = &bDown, "a"
	}
	down.Store(503)
	if got := postTurn(t, tr, url, turn(1, 2)); got != other {
		t.Fatalf("turn 2 with %s down answered by %q, want %s", home, got, other)
	}
	down.Store(0)
	for n := 3; n <= 6; n++ {
		if got := postTurn(t, tr, url, turn(1, n)); got != other {
			t.Fatalf("turn %d answered by %q, want %s: the session moved back", n, got, other)
		}
	}
	var w strings.Builder
	tr.WritePrometheus(&w)
	for _, want := range []string{`failover_affinity_sessions_total{result="new"} 1`, `failover_affinity_sessions_total{result="moved"} 1`, `failover_affinity_sessions_total{result="kept"} 4`} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// A request's session comes from its context, then a header, then
// prompt_cache_key: requests that share one go together whatever their
// bodies.
func TestAffinitySessionKeys(t *testing.T) {
	a, b := nameServer(t, "a", nil), nameServer(t, "b", nil)
	tr := newTestTransport(t, Config{Router: &Weighted{}, Affinity: AffinityConfig{Header: "x-session-id"}, Upstreams: []Upstream{
		{Name: "a", BaseURL: a.URL + "/v1"}, {Name: "b", BaseURL: b.URL + "/v1"}}})
	url := a.URL + "/v1/chat/completions"
	send := func(i int, set func(*http.Request) *http.Request) string {
		req := httptestRequest("POST", url, turn(100+i, 1)) // a new conversation each time
		resp, err := do(t, tr, set(req))
		if err != nil {
			t.Fatal(err)
		}
		return readBody(t, resp)
	}
	for name, set := range map[string]func(*http.Request) *http.Request{
		"context": func(r *http.Request) *http.Request { return r.WithContext(WithSession(r.Context(), "s1")) },
		"header":  func(r *http.Request) *http.Request { r.Header.Set("X-Session-Id", "s2"); return r },
	} {
		first := send(0, set)
		for i := 1; i < 12; i++ {
			if got := send(i, set); got != first {
				t.Errorf("%s: request %d of one session answered by %s, the first by %s", name, i, got, first)
				break
			}
		}
	}
	first := postTurn(t, tr, url, `{"model":"m","prompt_cache_key":"k","messages":[{"role":"user","content":"0"}]}`)
	for i := 1; i < 12; i++ {
		if got := postTurn(t, tr, url, fmt.Sprintf(`{"model":"m","prompt_cache_key":"k","messages":[{"role":"user","content":"%d"}]}`, i)); got != first {
			t.Errorf("prompt_cache_key: request %d answered by %s, the first by %s", i, got, first)
			break
		}
	}
}

// The stable prefix of each API's body names its conversation: later
// turns hash alike, other conversations differ.
func TestConversationPrefix(t *testing.T) {
	tr := newTestTransport(t, Config{Router: &Weighted{}, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"}}})
	c := &call{request: request{t: tr, req: httptestRequest("POST", "http://a.test/v1/x", "")}}
	for _, tc := range []struct{ api, first, later, other string }{
		{"openai chat",
			`{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"Q"}]}`,
			`{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"user","content":"Q2"}],"stream":true}`,
			`{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"other"}]}`},
		{"anthropic",
			`{"model":"c","system":"S","messages":[{"role":"user","content":"Q"}]}`,
			`{"model":"c","max_tokens":9,"system":"S","messages":[{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"user","content":"Q2"}]}`,
			`{"model":"c","system":"S2","messages":[{"role":"user","content":"Q"}]}`},
		{"gemini",
			`{"systemInstruction":{"parts":[{"text":"S"}]},"contents":[{"parts":[{"text":"Q"}]}]}`,
			`{"systemInstruction":{"parts":[{"text":"S"}]},"contents":[{"parts":[{"text":"Q"}]},{"role":"model","parts":[{"text":"A"}]},{"role":"user","parts":[{"text":"Q2"}]}]}`,
			`{"systemInstruction":{"parts":[{"text":"S"}]},"contents":[{"parts":[{"text":"Q3"}]}]}`},
		{"responses",
			`{"model":"m","instructions":"S","input":[{"role":"user","content":"Q"}]}`,
			`{"model":"m","instructions":"S","input":[{"role":"user","content":"Q"},{"type":"function_call_output","call_id":"c","output":"x"}]}`,
			`{"model":"m2","instructions":"S","input":[{"role":"user","content":"Q"}]}`},
	} {
		f, l, o := c.session([]byte(tc.first)), c.session([]byte(tc.later)), c.session([]byte(tc.other))
		if f == 0 || f != l || f == o {
			t.Errorf("%s: first %x, later %x, other %x: want first == later != other, none 0", tc.api, f, l, o)
		}
	}
	for _, body := range []string{"", `{"input":"text to embed"}`, `{"model":"m"}`, `[1,2]`, `not json`} {
		if h := c.session([]byte(body)); h != 0 {
			t.Errorf("session(%q) = %x, want 0: no conversation", body, h)
		}
	}
}

// Affinity applies only where the Router balances.
func TestAffinityOnlyWhereBalanced(t *testing.T) {
	ups := []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"}}
	for _, tc := range []struct {
		cfg  Config
		want bool
	}{
		{Config{Upstreams: ups}, false},
		{Config{Upstreams: ups, Router: Priority{}}, false},
		{Config{Upstreams: ups, Router: &Weighted{}}, true},
		{Config{Upstreams: ups, Router: LeastLatency{}}, true},
		{Config{Upstreams: ups, Router: Score{}}, true},
		{Config{Upstreams: ups, Router: Score{}, Affinity: AffinityConfig{Off: true}}, false},
		{Config{Upstreams: ups[:1], Router: &Weighted{}}, false},
	} {
		tr := newTestTransport(t, tc.cfg)
		if got := tr.affinity != nil; got != tc.want {
			t.Errorf("Router %T, Off %v, %d upstreams: affinity %v, want %v", tc.cfg.Router, tc.cfg.Affinity.Off, len(tc.cfg.Upstreams), got, tc.want)
		}
	}
}

func TestAffinityConfigErrors(t *testing.T) {
	ups := []Upstream{{BaseURL: "http://a.test"}}
	for _, tc := range []struct {
		a     AffinityConfig
		field string
	}{
		{AffinityConfig{TTL: -1}, "Affinity.TTL"},
		{AffinityConfig{TTL: 25 * time.Hour}, "Affinity.TTL"},
		{AffinityConfig{MaxSessions: -1}, "Affinity.MaxSessions"},
		{AffinityConfig{MaxSessions: maxBindings + 1}, "Affinity.MaxSessions"},
		{AffinityConfig{Header: "bad header"}, "Affinity.Header"},
	} {
		_, err := New(Config{Upstreams: ups, Affinity: tc.a})
		if ce, ok := err.(*ConfigError); !ok || ce.Field != tc.field {
			t.Errorf("%+v: %v, want a ConfigError on %s", tc.a, err, tc.field)
		}
	}
}

// A session is forgotten TTL after its last request.
func TestAffinityTTL(t *testing.T) {
	tr := newTestTransport(t, Config{Router: &Weighted{}, Affinity: AffinityConfig{TTL: time.Minute}, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"}}})
	s := tr.affinity.sessions
	now := time.Now()
	s.bind(1, tr.upstreams[1], "", now, 0)
	if b, ok := s.lookup(1, now.Add(50*time.Second)); !ok || b.u != tr.upstreams[1] {
		t.Fatalf("lookup within TTL: %v %v", b.u, ok)
	}
	if _, ok := s.lookup(1, now.Add(100*time.Second)); !ok {
		t.Fatal("the lookup at 50s did not extend the session")
	}
	if _, ok := s.lookup(1, now.Add(161*time.Second)); ok {
		t.Fatal("the session outlived its TTL")
	}
}

// A session stays on its upstream under every balancing Router, the
// pointer forms (&Score{}, which order every request in full) too: a
// session that moved to b while a was down is not sent back to a, which
// the Router would put first.
func TestAffinityUnderEveryBalancingRouter(t *testing.T) {
	for _, r := range []Router{&Weighted{}, LeastLatency{}, new(LeastLatency), Score{}, new(Score)} {
		t.Run(fmt.Sprintf("%T", r), func(t *testing.T) {
			var aDown atomic.Int32
			a, b := nameServer(t, "a", &aDown), nameServer(t, "b", nil)
			tr := newTestTransport(t, Config{Router: r, Upstreams: []Upstream{
				{Name: "a", BaseURL: a.URL + "/v1"}, {Name: "b", BaseURL: b.URL + "/v1"}}})
			url := a.URL + "/v1/chat/completions"
			for conv := range 10 {
				aDown.Store(503)
				if got := postTurn(t, tr, url, turn(conv, 1)); got != "b" {
					t.Fatalf("conversation %d, turn 1 with a down: answered by %q, want b", conv, got)
				}
				aDown.Store(0)
				for n := 2; n <= 4; n++ {
					if got := postTurn(t, tr, url, turn(conv, n)); got != "b" {
						t.Fatalf("conversation %d, turn %d: answered by %q, want b, its upstream", conv, n, got)
					}
				}
			}
		})
	}
}
