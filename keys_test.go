package failover

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// Key values of the tests: long enough to be scrubbed, and each naming
// its key so that a handler can tell them apart.
const (
	keyA = "Bearer sk-key-A-0123456789abcdef"
	keyB = "Bearer sk-key-B-0123456789abcdef"
	keyC = "Bearer sk-key-C-0123456789abcdef"
)

// threeKeys are keys A, B and C in Authorization.
func threeKeys() []Key {
	return []Key{
		{Name: "A", Header: http.Header{"Authorization": {keyA}}},
		{Name: "B", Header: http.Header{"Authorization": {keyB}}},
		{Name: "C", Header: http.Header{"Authorization": {keyC}}},
	}
}

// keyOf names the key a request was sent with; "" for none.
func keyOf(h http.Header) string {
	switch h.Get("Authorization") {
	case keyA:
		return "A"
	case keyB:
		return "B"
	case keyC:
		return "C"
	}
	return ""
}

// keysSent names the keys of reqs, in order.
func keysSent(reqs []seen) string {
	var b strings.Builder
	for _, r := range reqs {
		b.WriteString(cmpOr(keyOf(r.Header), "-"))
	}
	return b.String()
}

func cmpOr(s, or string) string {
	if s == "" {
		return or
	}
	return s
}

// A key answered 429: the request goes at once to the next key of the
// same upstream, the key cools down alone, and later requests go round
// the other keys until its cooldown ends.
func TestKeysRotateOn429(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		limited := true
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			k := keyOf(r.Header)
			if k == "A" && limited {
				limited = false
				return respond(429, `{"error":"slow down"}`, "Retry-After", "30"), nil
			}
			return respond(200, k), nil
		})
		n.status("b.test", 200, "backup")
		cfg := twoUpstreams(n, Config{})
		cfg.Upstreams[0].Keys = threeKeys()
		tr := newTestTransport(t, cfg)

		start := time.Now()
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", ""))
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); got != "B" {
			t.Fatalf("answered by %q, want key B of the same upstream", got)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("the next key was tried after %v, want at once", d)
		}
		if got := keysSent(n.requests("a.test")); got != "AB" {
			t.Fatalf("keys sent %q, want AB", got)
		}
		if n.count("b.test") != 0 {
			t.Fatal("the request went to the next upstream; want the next key")
		}
		h := tr.Health()[0]
		if !h.Available || h.Cooldown != 0 {
			t.Fatalf("upstream Available %v, Cooldown %v: want available, one key cooling", h.Available, h.Cooldown)
		}
		if k := h.Keys[0]; k.Name != "A" || k.Cooldown != 30*time.Second || k.CooldownReason != CooldownRateLimited {
			t.Fatalf("key A in Health: %+v, want cooling 30s, rate_limited", k)
		}
		if h.Keys[1].Cooldown != 0 || h.Keys[2].Cooldown != 0 {
			t.Fatalf("keys B and C cooling: %+v", h.Keys)
		}
		if got := metricValue(t, tr, `failover_key_cooldowns_total{upstream="a",key="A"}`); got != 1 {
			t.Fatalf("failover_key_cooldowns_total of A = %v, want 1", got)
		}

		for range 6 {
			resp := mustGet(t, tr, "http://a.test/v1/models")
			if got := readBody(t, resp); got != "B" && got != "C" {
				t.Fatalf("answered by %q while A cools down, want B or C", got)
			}
		}
		if got := keysSent(n.requests("a.test")[2:]); strings.Count(got, "B") != 3 || strings.Count(got, "C") != 3 {
			t.Fatalf("keys sent while A cools down: %q, want B and C in turn", got)
		}

		time.Sleep(30 * time.Second)
		seenA := false
		for range 3 {
			seenA = seenA || readBody(t, mustGet(t, tr, "http://a.test/v1/models")) == "A"
		}
		if !seenA {
			t.Fatalf("A not used again after its cooldown: %q", keysSent(n.requests("a.test")))
		}
	})
}

// A 5xx or a connection reset keeps the key: the request moves on to the
// next upstream, as without keys, and the key does not cool down.
func TestKeysKeptOnFailure(t *testing.T) {
	for _, tt := range []struct {
		name string
		fail func(w http.ResponseWriter)
	}{
		{"503", func(w http.ResponseWriter) { w.WriteHeader(503) }},
		{"reset", func(w http.ResponseWriter) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			primary := newServer(t, func(w http.ResponseWriter, r *http.Request) { tt.fail(w) })
			backup := newUpstreamServer(t, 200, "backup")
			tr := newTestTransport(t, Config{
				Retry: RetryConfig{Off: true},
				Upstreams: []Upstream{
					{Name: "p", BaseURL: primary.URL, Keys: threeKeys()},
					{Name: "b", BaseURL: backup.URL},
				},
			})
			if got := readBody(t, mustGet(t, tr, primary.URL+"/v1/models")); got != "backup" {
				t.Fatalf("answered %q, want the backup's", got)
			}
			if got := keysSent(primary.requests()); got != "A" {
				t.Fatalf("keys sent to the primary %q, want A alone: no other key after a %s", got, tt.name)
			}
			for _, k := range tr.Health()[0].Keys {
				if k.Cooldown != 0 || k.AuthFailing {
					t.Fatalf("key %+v after a %s, want neither cooling nor failing", k, tt.name)
				}
			}
		})
	}
}

// A key answered 401: the request goes on to the next key, and the key,
// once it looks revoked, is tried after the others. When every key
// answers 429, the upstream is rate limited and the request goes to the
// next upstream.
func TestKeysRevokedAndAllRateLimited(t *testing.T) {
	limited := make(chan bool, 1)
	limited <- false
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		l := <-limited
		limited <- l
		switch k := keyOf(r.Header); {
		case l:
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(429)
		case k == "A":
			w.WriteHeader(401)
		default:
			io.WriteString(w, k)
		}
	})
	backup := newUpstreamServer(t, 200, "backup")
	tr := newTestTransport(t, Config{
		Auth: AuthConfig{Threshold: 1},
		Upstreams: []Upstream{
			{Name: "p", BaseURL: primary.URL, Keys: threeKeys()},
			{Name: "b", BaseURL: backup.URL},
		},
	})
	if got := readBody(t, mustGet(t, tr, primary.URL+"/v1/models")); got != "B" {
		t.Fatalf("answered by %q, want key B after A's 401", got)
	}
	h := tr.Health()[0]
	if !h.Keys[0].AuthFailing || h.Keys[1].AuthFailing || h.Demoted != "" {
		t.Fatalf("after A's 401: keys %+v, upstream demoted %q; want A alone failing, the upstream not demoted", h.Keys, h.Demoted)
	}
	for range 4 {
		if got := readBody(t, mustGet(t, tr, primary.URL+"/v1/models")); got != "B" && got != "C" {
			t.Fatalf("answered by %q, want B or C while A looks revoked", got)
		}
	}
	if got := keysSent(primary.requests()); strings.Count(got, "A") != 1 {
		t.Fatalf("keys sent %q: the revoked A was tried again", got)
	}

	<-limited
	limited <- true
	before := primary.count()
	if got := readBody(t, mustGet(t, tr, primary.URL+"/v1/models")); got != "backup" {
		t.Fatalf("answered %q with every key rate limited, want the backup's", got)
	}
	if got := keysSent(primary.requests()[before:]); len(got) != 3 || got[2] != 'A' {
		t.Fatalf("keys sent %q, want each key once, the revoked A last", got)
	}
	h = tr.Health()[0]
	if h.Available || h.Unavailable != ReasonRateLimited || h.Cooldown <= 29*time.Second || h.Cooldown > 30*time.Second {
		t.Fatalf("upstream Available %v, Unavailable %q, Cooldown %v; want rate_limited for about 30s", h.Available, h.Unavailable, h.Cooldown)
	}
	before = primary.count()
	if got := readBody(t, mustGet(t, tr, primary.URL+"/v1/models")); got != "backup" || primary.count() != before {
		t.Fatalf("answered %q, primary asked %d times; want the backup, the primary passed over", got, primary.count()-before)
	}
}

// A request that wants its key alone (a pinned session's) passes its
// upstream over as rate limited while that key cools down, with its
// wait, even when other keys could go; without strictKey it goes with
// another.
func TestKeysStrictWant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		cfg := twoUpstreams(n, Config{})
		cfg.Upstreams[0].Keys = threeKeys()
		tr := newTestTransport(t, cfg)
		u := tr.upstreams[0]
		now := time.Now()
		tr.coolDown(u, u.keys[0], respond(429, "", "Retry-After", "30"), now)
		tr.coolDown(u, u.keys[1], respond(429, "", "Retry-After", "10"), now)

		p := plan{t: tr, model: "", order: tr.upstreams, demote: true, wantKey: "A", strictKey: true}
		var s step
		if !p.next(now, &s) || s.u != u {
			t.Fatal("the plan does not start with the keyed upstream")
		}
		if s.av.reason != ReasonRateLimited || s.av.wait != 30*time.Second || s.k != nil {
			t.Fatalf("pinned to cooling key A: %+v, key %v; want rate_limited for 30s", s.av, s.k)
		}
		if !p.next(now, &s) || s.u != tr.upstreams[1] || s.av.reason != "" {
			t.Fatalf("next step %v %+v, want the other upstream admitted", s.u.name, s.av)
		}
		if p.nextKey(u, u.keys[0].bit, now) != nil {
			t.Fatal("nextKey moved a request pinned to A to another key")
		}

		p = plan{t: tr, model: "", order: tr.upstreams, demote: true, wantKey: "A"}
		if !p.next(now, &s) || s.av.reason != "" || s.k == nil || s.k.name != "C" {
			t.Fatalf("wanting A, not strictly: %+v, key %v; want C, the one key not cooling", s.av, s.k)
		}
		u.circuit.Done(s.p, 0, now) // (the permit the step took)
		tr.admittedKey(u, "", "B", true, now, &s)
		if s.av.reason != ReasonRateLimited || s.av.wait != 10*time.Second {
			t.Fatalf("pinned to B: %+v, want rate_limited for B's 10s", s.av)
		}
	})
}

// A key's values appear in no error, Health, log or metric, and a key's
// header names are credentials: the caller's values of them reach no
// upstream but the one it addressed.
func TestKeysNeverLeak(t *testing.T) {
	const secret = "tenant-secret-0123456789"
	var backupSaw http.Header
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Host == "b.test" {
			backupSaw = r.Header.Clone()
			return nil, fmt.Errorf("dial tcp: refused %s", r.Header.Get("Authorization"))
		}
		return nil, fmt.Errorf("read tcp: reset by peer, sent %s and %s", r.Header.Get("Authorization"), r.Header.Get("X-Tenant"))
	})
	var logs logBuffer
	tr := newTestTransport(t, Config{
		Base:   base,
		Logger: newLogger(&logs),
		Retry:  RetryConfig{Off: true},
		Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test", Keys: []Key{
				{Name: "A", Header: http.Header{"Authorization": {keyA}, "X-Tenant": {secret}}},
				{Name: "B", Header: http.Header{"Authorization": {keyB}, "X-Tenant": {secret}}},
			}},
			{Name: "b", BaseURL: "http://b.test"},
		},
	})
	req := httptestRequest("GET", "http://a.test/v1/models", "")
	req.Header.Set("X-Tenant", "the-callers-own-tenant")
	_, err := tr.RoundTrip(req)
	if err == nil {
		t.Fatal("no error from upstreams that all failed")
	}
	if backupSaw == nil || backupSaw.Get("X-Tenant") != "" {
		t.Fatalf("the backup got X-Tenant %q: a key's header name is a credential's", backupSaw.Get("X-Tenant"))
	}
	var prom bytes.Buffer
	tr.WritePrometheus(&prom)
	health, _ := json.Marshal(tr.Health())
	for what, s := range map[string]string{"error": err.Error(), "log": logs.String(), "metrics": prom.String(), "Health": string(health)} {
		for _, v := range []string{keyA, strings.TrimPrefix(keyA, "Bearer "), strings.TrimPrefix(keyB, "Bearer "), secret} {
			if strings.Contains(s, v) {
				t.Errorf("the %s holds a key's value %q:\n%s", what, v, s)
			}
		}
	}
	if !strings.Contains(prom.String(), `failover_key_attempts_total{upstream="a",key="A"} 1`) {
		t.Errorf("metrics do not count key A's attempt:\n%s", prom.String())
	}
	if !strings.Contains(string(health), `"keys":[{"name":"A"`) {
		t.Errorf("Health's JSON does not name the keys: %s", health)
	}
}

// A key's 429 log names the key, never its value.
func TestKeysLogName(t *testing.T) {
	n := newFakeNet()
	n.handle("a.test", func(r *http.Request) (*http.Response, error) {
		if keyOf(r.Header) == "A" {
			return respond(429, "", "Retry-After", "5"), nil
		}
		return respond(200, "ok"), nil
	})
	var logs logBuffer
	cfg := twoUpstreams(n, Config{Logger: newLogger(&logs)})
	cfg.Upstreams[0].Keys = threeKeys()
	tr := newTestTransport(t, cfg)
	readBody(t, mustGet(t, tr, "http://a.test/v1"))
	if out := logs.String(); !strings.Contains(out, "key=A") || strings.Contains(out, "sk-key-A") {
		t.Fatalf("log %q: want the key's name, never its value", out)
	}
}

// New refuses Keys that can never work, naming the field.
func TestKeysConfigErrors(t *testing.T) {
	hdr := http.Header{"Authorization": {keyA}}
	many := make([]Key, maxKeys+1)
	for i := range many {
		many[i] = Key{Name: fmt.Sprint(i), Header: hdr}
	}
	for _, tt := range []struct {
		name  string
		keys  []Key
		field string
	}{
		{"empty name", []Key{{Header: hdr}}, "Upstreams[0].Keys[0].Name"},
		{"control in name", []Key{{Name: "a\nb", Header: hdr}}, "Upstreams[0].Keys[0].Name"},
		{"same name", []Key{{Name: "A", Header: hdr}, {Name: "A", Header: hdr}}, "Upstreams[0].Keys[1].Name"},
		{"no header", []Key{{Name: "A"}}, "Upstreams[0].Keys[0].Header"},
		{"bad header name", []Key{{Name: "A", Header: http.Header{"Bad Name": {"v"}}}}, "Upstreams[0].Keys[0].Header"},
		{"bad header value", []Key{{Name: "A", Header: http.Header{"Authorization": {"Bearer sk-\nsecret-123456"}}}}, "Upstreams[0].Keys[0].Header"},
		{"header without values", []Key{{Name: "A", Header: http.Header{"Authorization": nil}}}, "Upstreams[0].Keys[0].Header"},
		{"header with an empty value", []Key{{Name: "A", Header: http.Header{"Authorization": {""}}}}, "Upstreams[0].Keys[0].Header"},
		{"too many", many, "Upstreams[0].Keys"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{Upstreams: []Upstream{{BaseURL: "http://a.test", Keys: tt.keys}}})
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field {
				t.Fatalf("err = %v, want a ConfigError naming %s", err, tt.field)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("err %q quotes a key's value", err)
			}
		})
	}
}

// A success that says a key's rate-limit window is exhausted puts that
// key behind the others, not its upstream.
func TestKeysHeadroom(t *testing.T) {
	n := newFakeNet()
	n.handle("a.test", func(r *http.Request) (*http.Response, error) {
		k := keyOf(r.Header)
		left := "10"
		if k == "A" {
			left = "0"
		}
		return respond(200, k, "X-Ratelimit-Remaining-Requests", left, "X-Ratelimit-Reset-Requests", "20s"), nil
	})
	cfg := twoUpstreams(n, Config{})
	cfg.Upstreams[0].Keys = threeKeys()
	tr := newTestTransport(t, cfg)
	if got := readBody(t, mustGet(t, tr, "http://a.test/v1")); got != "A" {
		t.Fatalf("first answered by %q, want A", got)
	}
	h := tr.Health()[0]
	if k := h.Keys[0]; !k.OutOfHeadroom || k.Headroom == nil || k.Headroom.RemainingRequests != 0 {
		t.Fatalf("key A %+v, want out of headroom", k)
	}
	if h.OutOfHeadroom || h.Demoted != "" || h.Headroom != nil {
		t.Fatalf("upstream OutOfHeadroom %v, Demoted %q, Headroom %v: want neither, the key's alone", h.OutOfHeadroom, h.Demoted, h.Headroom)
	}
	for range 4 {
		if got := readBody(t, mustGet(t, tr, "http://a.test/v1")); got == "A" {
			t.Fatal("A, out of headroom, went before B and C")
		}
	}
}

// Every key revoked: the upstream is auth_failing, tried after the
// others. Keys are credentials of the upstream's own: a 401 is its
// keys', not a sign that the caller's credentials were held back.
func TestKeysAllRevoked(t *testing.T) {
	primary := newUpstreamServer(t, 401, "revoked")
	backup := newUpstreamServer(t, 503, "down")
	tr := newTestTransport(t, Config{
		Auth:  AuthConfig{Threshold: 1},
		Retry: RetryConfig{Off: true},
		Upstreams: []Upstream{
			{Name: "p", BaseURL: primary.URL, Keys: threeKeys()},
			{Name: "b", BaseURL: backup.URL},
		},
	})
	req := httptestRequest("GET", backup.URL+"/v1", "")
	req.Header.Set("Authorization", "Bearer the-callers-own-key-123")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := keysSent(primary.requests()); got != "ABC" {
		t.Fatalf("keys sent %q, want each key once", got)
	}
	h := tr.Health()[0]
	if h.Demoted != ReasonAuthFailing || len(h.Problems) != 0 {
		t.Fatalf("upstream Demoted %q, Problems %q; want auth_failing and none", h.Demoted, h.Problems)
	}
}

// An active probe of a keyed upstream carries a key that does not cool
// down, and Reset ends the keys' cooldowns with the upstream's.
func TestKeysProbeAndReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 200, "ok")
		n.status("b.test", 200, "b")
		cfg := twoUpstreams(n, Config{Probe: ProbeConfig{Interval: time.Second}})
		cfg.Upstreams[0].Keys = threeKeys()
		tr := newTestTransport(t, cfg)
		defer tr.Close()
		u := tr.upstreams[0]
		tr.coolDown(u, u.keys[0], respond(429, "", "Retry-After", "60"), time.Now())
		time.Sleep(1500 * time.Millisecond) // one probe
		probes := n.requests("a.test")
		if len(probes) != 1 || keyOf(probes[0].Header) != "B" {
			t.Fatalf("probes sent with keys %q, want one with B, the first not cooling", keysSent(probes))
		}
		if err := tr.Reset("a"); err != nil {
			t.Fatal(err)
		}
		if k := tr.Health()[0].Keys[0]; k.Cooldown != 0 {
			t.Fatalf("key A after Reset: %+v, want not cooling", k)
		}
	})
}

// ServedBy and the Trace name the key an answer and each attempt went
// with.
func TestKeysServedAndTraced(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer key-one-0123456789" {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(429)
			return
		}
		io.WriteString(w, "ok")
	})
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL + "/v1", Keys: []Key{
		{Name: "one", Header: http.Header{"Authorization": {"Bearer key-one-0123456789"}}},
		{Name: "two", Header: http.Header{"Authorization": {"Bearer key-two-0123456789"}}},
	}}}})
	var keys []string
	ctx := WithTrace(context.Background(), &Trace{AttemptStart: func(a TraceAttempt) { keys = append(keys, a.Key) }})
	req := httptestRequest("GET", srv.URL+"/v1/models", "").WithContext(ctx)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s, ok := ServedBy(resp)
	if !ok || s.Upstream != "a" || s.Key != "two" || strings.Join(keys, ",") != "one,two" {
		t.Errorf("served %+v, attempts with keys %v: want two, after one", s, keys)
	}
}

// An active probe of a keyed upstream goes with a key whose last answer
// was no 401 or 403 when there is one: a probe with a revoked key says
// nothing of the upstream.
func TestKeysProbeSkipsRevoked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 200, "ok")
		n.status("b.test", 200, "b")
		cfg := twoUpstreams(n, Config{Probe: ProbeConfig{Interval: time.Second}})
		cfg.Upstreams[0].Keys = threeKeys()
		tr := newTestTransport(t, cfg)
		defer tr.Close()
		u := tr.upstreams[0]
		for range tr.auth.Threshold {
			tr.noteAuth(&u.keys[0].auth, AuthFailed, true, mono.Of(time.Now()))
		}
		if !tr.Health()[0].Keys[0].AuthFailing {
			t.Fatal("key A does not look revoked")
		}
		time.Sleep(1500 * time.Millisecond) // one probe
		probes := n.requests("a.test")
		if len(probes) != 1 || keyOf(probes[0].Header) != "B" {
			t.Fatalf("probes sent with keys %q, want one with B, the first not revoked", keysSent(probes))
		}
	})
}

// With hedging on, a key's 429 that comes before any hedge went still
// rotates the request to the next key, not to the next upstream.
func TestKeysRotateHedged(t *testing.T) {
	a := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer key-one-0123456789" {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(429)
			return
		}
		io.WriteString(w, "a")
	})
	b := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "backup") })
	tr := newTestTransport(t, Config{Hedge: &HedgeConfig{Delay: time.Hour}, Upstreams: []Upstream{
		{Name: "a", BaseURL: a.URL + "/v1", Keys: []Key{
			{Name: "one", Header: http.Header{"Authorization": {"Bearer key-one-0123456789"}}},
			{Name: "two", Header: http.Header{"Authorization": {"Bearer key-two-0123456789"}}},
		}},
		{Name: "b", BaseURL: b.URL + "/v1"},
	}})
	resp := mustPost(t, tr, a.URL+"/v1/chat/completions", `{"model":"m"}`)
	s, _ := ServedBy(resp)
	if got := readBody(t, resp); got != "a" || s.Key != "two" || b.count() != 0 {
		t.Errorf("answered %q by %s/%s, backup got %d: want a with key two", got, s.Upstream, s.Key, b.count())
	}
}

// A quota error rotates the key as a 429 does: OpenAI's 429
// insufficient_quota, and the 402 of OpenRouter and DeepSeek when the
// account's credits are spent. Each cools its key down for MaxCooldown.
func TestKeysRotateOnQuota(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"openai insufficient_quota", `{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"You exceeded your current quota"}}`, 429},
		{"openrouter credits", `{"error":{"code":402,"message":"Insufficient credits"}}`, 402},
		{"deepseek balance", `{"error":{"message":"Insufficient Balance","type":"unknown_error"}}`, 402},
	} {
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") == "Bearer key-one-0123456789" {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
				return
			}
			io.WriteString(w, "ok")
		})
		tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL + "/v1", Keys: []Key{
			{Name: "one", Header: http.Header{"Authorization": {"Bearer key-one-0123456789"}}},
			{Name: "two", Header: http.Header{"Authorization": {"Bearer key-two-0123456789"}}},
		}}}})
		resp := mustPost(t, tr, srv.URL+"/v1/chat/completions", `{"model":"m"}`)
		s, _ := ServedBy(resp)
		readBody(t, resp)
		k := tr.Health()[0].Keys[0]
		if resp.StatusCode != 200 || s.Key != "two" || k.CooldownReason != CooldownQuotaExhausted || k.Cooldown < 30*time.Second {
			t.Errorf("%s: %d by key %q; key one %+v: want key two, key one cooling for its quota", tc.name, resp.StatusCode, s.Key, k)
		}
	}
}
