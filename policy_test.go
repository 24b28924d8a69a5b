package failover

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// An upstream's Breaker and AttemptTimeout are checked as Config's are,
// and the error names the field under the upstream.
func TestUpstreamPolicyRejected(t *testing.T) {
	ok := Upstream{Name: "a", BaseURL: "https://a.example/v1"}
	with := func(u Upstream) Config {
		u.Name, u.BaseURL = "b", "https://b.example/v1"
		return Config{Upstreams: []Upstream{ok, u}}
	}
	for _, tt := range []struct {
		name  string
		cfg   Config
		field string
	}{
		{"negative cooldown", with(Upstream{Breaker: &BreakerConfig{Cooldown: -1}}), "Upstreams[1].Breaker.Cooldown"},
		{"negative max cooldown", with(Upstream{Breaker: &BreakerConfig{MaxCooldown: -time.Second}}), "Upstreams[1].Breaker.MaxCooldown"},
		{"huge threshold", with(Upstream{Breaker: &BreakerConfig{FailureThreshold: 1001}}), "Upstreams[1].Breaker.FailureThreshold"},
		{"huge success threshold", with(Upstream{Breaker: &BreakerConfig{SuccessThreshold: math.MaxUint}}), "Upstreams[1].Breaker.SuccessThreshold"},
		{"NaN rate", with(Upstream{Breaker: &BreakerConfig{FailureRate: math.NaN()}}), "Upstreams[1].Breaker.FailureRate"},
		{"rate above 1", with(Upstream{Breaker: &BreakerConfig{FailureRate: 2}}), "Upstreams[1].Breaker.FailureRate"},
		{"period in nanoseconds", with(Upstream{Breaker: &BreakerConfig{FailureRate: 0.5, FailurePeriod: 5}}), "Upstreams[1].Breaker.FailurePeriod"},
		{"negative period", with(Upstream{Breaker: &BreakerConfig{FailurePeriod: -1}}), "Upstreams[1].Breaker.FailurePeriod"},
		{"negative timeout", with(Upstream{AttemptTimeout: -time.Second}), "Upstreams[1].AttemptTimeout"},
		{"most negative timeout", with(Upstream{AttemptTimeout: math.MinInt64}), "Upstreams[1].AttemptTimeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			var cerr *ConfigError
			if !errors.As(err, &cerr) || cerr.Field != tt.field {
				t.Fatalf("got %v, want a ConfigError naming Config.%s", err, tt.field)
			}
			if want := "failover: Config." + tt.field + " "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("got %q, want it to begin with %q", err, want)
			}
		})
	}
}

// A non-nil Upstream.Breaker's zero fields inherit Config.Breaker's, and
// what both leave zero is the default; a zero AttemptTimeout inherits
// Config's. Health shows what is in effect, in Go and in JSON.
func TestUpstreamPolicyInherits(t *testing.T) {
	tr := newTestTransport(t, Config{
		Base:           newFakeNet(),
		Breaker:        BreakerConfig{FailureThreshold: 7, Cooldown: time.Minute, MaxCooldown: 10 * time.Minute},
		AttemptTimeout: 2 * time.Second,
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: "http://a.test", Breaker: &BreakerConfig{FailureThreshold: 3, Cooldown: 15 * time.Second}, AttemptTimeout: 500 * time.Millisecond},
			{Name: "backup", BaseURL: "http://b.test"},
			{Name: "partial", BaseURL: "http://c.test", Breaker: &BreakerConfig{SuccessThreshold: 2, MaxCooldown: time.Second}},
			{Name: "rate", BaseURL: "http://d.test", Breaker: &BreakerConfig{FailureRate: 0.5, FailurePeriod: time.Minute, MaxCooldown: 5 * time.Minute}},
		},
	})
	want := []struct {
		breaker BreakerConfig
		timeout time.Duration
	}{
		{BreakerConfig{FailureThreshold: 3, MinRequests: 20, FailurePeriod: 10 * time.Second, Cooldown: 15 * time.Second, MaxCooldown: 10 * time.Minute, SuccessThreshold: 1}, 500 * time.Millisecond},
		{BreakerConfig{FailureThreshold: 7, MinRequests: 20, FailurePeriod: 10 * time.Second, Cooldown: time.Minute, MaxCooldown: 10 * time.Minute, SuccessThreshold: 1}, 2 * time.Second},
		{BreakerConfig{FailureThreshold: 7, MinRequests: 20, FailurePeriod: 10 * time.Second, Cooldown: time.Minute, MaxCooldown: time.Minute, SuccessThreshold: 2}, 2 * time.Second},
		{BreakerConfig{FailureThreshold: 7, FailureRate: 0.5, MinRequests: 20, FailurePeriod: time.Minute, Cooldown: time.Minute, MaxCooldown: 5 * time.Minute, SuccessThreshold: 1}, 2 * time.Second},
	}
	hs := tr.Health()
	for i, h := range hs {
		if h.Breaker != want[i].breaker || h.AttemptTimeout != want[i].timeout {
			t.Errorf("%s: Breaker %+v, AttemptTimeout %v; want %+v, %v", h.Name, h.Breaker, h.AttemptTimeout, want[i].breaker, want[i].timeout)
		}
	}

	js, err := json.Marshal(hs)
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Breaker  map[string]any     `json:"breaker"`
		Timeouts map[string]float64 `json:"timeouts"`
	}
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatal(err)
	}
	for i, w := range []string{
		`{"cooldown_seconds":15,"failure_threshold":3,"max_cooldown_seconds":600,"success_threshold":1}`,
		`{"cooldown_seconds":60,"failure_threshold":7,"max_cooldown_seconds":600,"success_threshold":1}`,
		`{"cooldown_seconds":60,"failure_threshold":7,"max_cooldown_seconds":60,"success_threshold":2}`,
		`{"cooldown_seconds":60,"failure_period_seconds":60,"failure_rate":0.5,"max_cooldown_seconds":300,"min_requests":20,"success_threshold":1}`,
	} {
		b, _ := json.Marshal(got[i].Breaker) // map keys sorted
		if string(b) != w {
			t.Errorf("%s: breaker JSON %s, want %s", hs[i].Name, b, w)
		}
		if w := want[i].timeout.Seconds(); got[i].Timeouts["headers_seconds"] != w || got[i].Timeouts["attempt_seconds"] != w {
			t.Errorf("%s: timeouts %v, want headers and attempt %v", hs[i].Name, got[i].Timeouts, w)
		}
	}

	// Without a timeout anywhere, the JSON says the defaults; -1 says
	// none, as 0.
	tr = newTestTransport(t, Config{Base: newFakeNet(), Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test"},
		{Name: "b", BaseURL: "http://b.test", Timeouts: Timeouts{Headers: -1, FirstContent: -1, Idle: -1, Attempt: -1}},
	}})
	for i, w := range []string{`"timeouts":{"headers_seconds":30,"first_content_seconds":600,"idle_seconds":20,"attempt_seconds":600}`, `"timeouts":{"headers_seconds":0,"first_content_seconds":0,"idle_seconds":0,"attempt_seconds":0}`} {
		js, _ = json.Marshal(tr.Health()[i])
		if !strings.Contains(string(js), w) || strings.Contains(string(js), "attempt_timeout") {
			t.Errorf("JSON %s, want %s and no attempt_timeout", js, w)
		}
	}
}

// The field's reference setup: the primary trips after 3 failures and
// stays open 15 s, the backup after the default 5 and, set here, 30 s. Both fail
// together: the primary opens after its third failure, two requests
// before the backup; it probes again after its 15 s while the backup
// waits out its 30 s.
func TestPrimaryTripsFaster(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "primary down")
		n.status("b.test", 503, "backup down")
		n.status("c.test", 200, "last")
		tr := newTestTransport(t, Config{Base: n, Breaker: BreakerConfig{Cooldown: 30 * time.Second}, Upstreams: []Upstream{
			{Name: "primary", BaseURL: "http://a.test", Breaker: &BreakerConfig{FailureThreshold: 3, Cooldown: 15 * time.Second}},
			{Name: "backup", BaseURL: "http://b.test"},
			{Name: "last", BaseURL: "http://c.test"},
		}})
		states := func() (string, string) {
			h := tr.Health()
			return h[0].State, h[1].State
		}
		for i := 1; i <= 5; i++ {
			if code, err := get(t, tr, "http://a.test/"); code != 200 || err != nil {
				t.Fatalf("request %d: %d %v, want the last upstream's 200", i, code, err)
			}
			p, b := states()
			wantP, wantB := "closed", "closed"
			if i >= 3 {
				wantP = "open"
			}
			if i >= 5 {
				wantB = "open"
			}
			if p != wantP || b != wantB {
				t.Fatalf("after request %d: primary %s, backup %s; want %s, %s", i, p, b, wantP, wantB)
			}
		}
		if got := n.count("a.test"); got != 3 {
			t.Errorf("the primary got %d requests, want 3 before its circuit opened", got)
		}
		if got := n.count("b.test"); got != 5 {
			t.Errorf("the backup got %d requests, want 5 before its circuit opened", got)
		}
		h := tr.Health()
		if h[0].OpenFor != 15*time.Second || h[1].OpenFor != 30*time.Second {
			t.Errorf("open for %v and %v, want 15s and 30s", h[0].OpenFor, h[1].OpenFor)
		}

		// Both come back; at 15 s only the primary's cooldown is over,
		// and the next request probes it.
		n.status("a.test", 200, "primary")
		n.status("b.test", 200, "backup")
		time.Sleep(15 * time.Second)
		if p, b := states(); p != "half-open" || b != "open" {
			t.Errorf("after 15s: primary %s, backup %s; want half-open, open", p, b)
		}
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
		if err != nil {
			t.Fatal(err)
		}
		if body := readBody(t, resp); body != "primary" {
			t.Errorf("after 15s the answer is %q, want the primary's probe", body)
		}
		if p, b := states(); p != "closed" || b != "open" {
			t.Errorf("after the probe: primary %s, backup %s; want closed, open", p, b)
		}
		time.Sleep(15 * time.Second)
		if p, b := states(); p != "closed" || b != "half-open" {
			t.Errorf("after 30s: primary %s, backup %s; want closed, half-open", p, b)
		}
	})
}

// Each upstream's attempt timeout bounds its own attempts: a primary slower
// than its 100 ms fails over, and a backup as slow, allowed 1 s, answers.
// With Config's 100 ms for both, the same request fails.
func TestUpstreamAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", slowly(300*time.Millisecond, "primary", new(atomic.Int32)))
		n.handle("b.test", slowly(300*time.Millisecond, "backup", new(atomic.Int32)))
		cfg := Config{Base: n, AttemptTimeout: 100 * time.Millisecond, Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test"},
			{Name: "b", BaseURL: "http://b.test", AttemptTimeout: time.Second},
		}}
		tr := newTestTransport(t, cfg)
		start := time.Now()
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
		if err != nil {
			t.Fatalf("%v, want the backup's answer within its 1s", err)
		}
		if body := readBody(t, resp); body != "backup" {
			t.Fatalf("answer %q, want the backup's", body)
		}
		if took := time.Since(start); took != 400*time.Millisecond {
			t.Errorf("took %v, want 100ms (the primary's timeout) + 300ms (the backup's answer)", took)
		}
		h := tr.Health()
		if h[0].Requests.Failed != 1 || !strings.Contains(h[0].LastError, "attempt timed out") {
			t.Errorf("primary: %d failed, last error %q; want its timeout", h[0].Requests.Failed, h[0].LastError)
		}
		if h[1].Requests.Success != 1 {
			t.Errorf("backup: %+v, want one success", h[1].Requests)
		}

		cfg.Upstreams[1].AttemptTimeout = 0 // Config's 100ms
		tr = newTestTransport(t, cfg)
		if _, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "")); !errors.Is(err, ErrAttemptTimeout) {
			t.Errorf("with 100ms for both: %v, want ErrAttemptTimeout", err)
		}
	})
}

// stalled reads the upstream's own timeout: a round trip that returns
// 50 ms past its deadline is late for 100 ms (held back), not for 1 s
// (counted; the circuit opens).
func TestStalledReadsUpstreamTimeout(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // the upstream's; Config says 100ms
		trips   bool
	}{
		{"Config's 100ms", 0, false},
		{"its own 1s", time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				n.handle("a.test", func(r *http.Request) (*http.Response, error) {
					<-r.Context().Done()
					time.Sleep(50 * time.Millisecond) // the process was not running
					return nil, r.Context().Err()
				})
				tr := newTestTransport(t, Config{Base: n, AttemptTimeout: 100 * time.Millisecond, LastResort: LastResortConfig{Off: true},
					Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test", AttemptTimeout: tc.timeout, Breaker: &BreakerConfig{FailureThreshold: 2}}}})
				for range 3 {
					get(t, tr, "http://a.test/")
				}
				if open := tr.Health()[0].State == "open"; open != tc.trips {
					t.Fatalf("circuit %s after 3 late timeouts, want open %v", tr.Health()[0].State, tc.trips)
				}
			})
		})
	}
}

// Every upstream hanging at once still opens no circuit when their
// timeouts differ: the primary times out after 100 ms, the backup after
// 1 s, so the backup's timeouts come 1 s after the primary's. Each
// compares within two of the longer timeout of the pair; within two of
// the other's own (the primary's 100 ms), the backup's would all count and
// its circuit open, as every circuit did before issue 12.
func TestEveryUpstreamTimingOutWithOwnTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}
		n := newFakeNet()
		n.handle("a.test", hang)
		n.handle("b.test", hang)
		tr := newTestTransport(t, Config{Base: n, AttemptTimeout: 100 * time.Millisecond, Breaker: BreakerConfig{FailureThreshold: 3},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test", AttemptTimeout: time.Second}}})
		for i := range 10 {
			if _, err := get(t, tr, "http://a.test/"); !errors.Is(err, ErrAttemptTimeout) {
				t.Fatalf("request %d: %v, want both attempts timed out", i, err)
			}
		}
		for _, h := range tr.Health() {
			if h.State != "closed" {
				t.Errorf("%s is %s after every upstream timed out together", h.Name, h.State)
			}
		}
		if got := n.count("a.test") + n.count("b.test"); got != 20 {
			t.Errorf("%d attempts, want 20: every request tries both", got)
		}
	})
}
