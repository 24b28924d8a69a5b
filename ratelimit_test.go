package failover

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/internal/clocktest"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
		ok     bool
	}{
		{"seconds", http.Header{"Retry-After": {"20"}}, 20 * time.Second, true},
		{"zero", http.Header{"Retry-After": {"0"}}, 0, true},
		{"spaces", http.Header{"Retry-After": {" 7 "}}, 7 * time.Second, true},
		{"RFC 1123", http.Header{"Retry-After": {"Sun, 29 Nov 2026 12:00:30 GMT"}}, 30 * time.Second, true},
		{"RFC 850", http.Header{"Retry-After": {"Sunday, 29-Nov-26 12:00:45 GMT"}}, 45 * time.Second, true},
		{"asctime", http.Header{"Retry-After": {"Sun Nov 29 12:01:00 2026"}}, time.Minute, true},
		{"date in the past", http.Header{"Retry-After": {"Sun, 29 Nov 2026 11:00:00 GMT"}}, 0, false},
		{"ms wins", http.Header{"Retry-After": {"20"}, "Retry-After-Ms": {"1500"}}, 1500 * time.Millisecond, true},
		{"ms fraction", http.Header{"Retry-After-Ms": {"12.5"}}, 12500 * time.Microsecond, true},
		{"azure ms", http.Header{"X-Ms-Retry-After-Ms": {"250"}}, 250 * time.Millisecond, true},
		{"bad ms falls back", http.Header{"Retry-After-Ms": {"soon"}, "Retry-After": {"3"}}, 3 * time.Second, true},
		{"negative", http.Header{"Retry-After": {"-5"}}, 0, false},
		{"negative ms", http.Header{"Retry-After-Ms": {"-5"}}, 0, false},
		{"garbage", http.Header{"Retry-After": {"tomorrow"}}, 0, false},
		{"huge", http.Header{"Retry-After": {"99999999999999999"}}, maxDuration, true},
		{"huge ms", http.Header{"Retry-After-Ms": {"1e300"}}, 0, false},
		{"absent", http.Header{}, 0, false},
	}
	for _, tt := range tests {
		got, ok := RetryAfter(tt.header, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: RetryAfter = %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func TestCooldownFor(t *testing.T) {
	cfg := RateLimitConfig{}.withDefaults()
	now := time.Now().Truncate(time.Second) // RFC 3339 keeps whole seconds
	tests := []struct {
		name   string
		header http.Header
		body   string
		want   time.Duration
		reason CooldownReason
	}{
		{"retry-after", http.Header{"Retry-After": {"3"}}, `{}`, 3 * time.Second, CooldownRateLimited},
		{"capped", http.Header{"Retry-After": {"3600"}}, `{}`, 60 * time.Second, CooldownRateLimited},
		{"no header", http.Header{}, `{"error":{"type":"rate_limit_exceeded"}}`, time.Second, CooldownRateLimited},
		{"openai quota", http.Header{"Retry-After": {"1"}}, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`, 60 * time.Second, CooldownQuotaExhausted},
		{"spend limit", http.Header{}, `{"error":{"code":"organization_spend_limit_exceeded"}}`, 60 * time.Second, CooldownQuotaExhausted},
		{"gemini retryDelay", http.Header{}, `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay": "22s"}]}}`, 22 * time.Second, CooldownRateLimited},
		{"gemini per day", http.Header{}, `{"error":{"status":"RESOURCE_EXHAUSTED","details":[{"violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},{"retryDelay":"22s"}]}}`, 60 * time.Second, CooldownQuotaExhausted},
		{"openrouter reset in ms", http.Header{"X-Ratelimit-Reset": {strconv.FormatInt(now.Add(40*time.Second).UnixMilli(), 10)}}, `{}`, 40 * time.Second, CooldownRateLimited},
		{"reset in the past", http.Header{"X-Ratelimit-Reset": {"1754667660000"}}, `{}`, time.Second, CooldownRateLimited},
		{"reset in seconds", http.Header{"X-Ratelimit-Reset": {"12"}}, `{}`, 12 * time.Second, CooldownRateLimited},
		{"anthropic resets", http.Header{
			"Anthropic-Ratelimit-Requests-Reset": {now.Add(5 * time.Second).Format(time.RFC3339)},
			"Anthropic-Ratelimit-Tokens-Reset":   {now.Add(20 * time.Second).Format(time.RFC3339)},
		}, `{}`, 20 * time.Second, CooldownRateLimited},
		{"past date: default", http.Header{"Retry-After": {"Sun, 06 Nov 1994 08:49:37 GMT"}}, `{}`, time.Second, CooldownRateLimited},
		{"header beats body delay", http.Header{"Retry-After": {"2"}}, `{"retryDelay":"22s"}`, 2 * time.Second, CooldownRateLimited},
	}
	for _, tt := range tests {
		resp := &http.Response{StatusCode: 429, Header: tt.header, Body: io.NopCloser(strings.NewReader(tt.body))}
		got, reason := cfg.cooldownFor(resp, now)
		if got != tt.want || reason != tt.reason {
			t.Errorf("%s: cooldown = %v %s, want %v %s", tt.name, got, reason, tt.want, tt.reason)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != tt.body {
			t.Errorf("%s: body after inspection = %q, want it intact", tt.name, b)
		}
	}
}

// A body larger than what is inspected is handed back whole, and closing
// it closes the original.
func TestInspect429LargeBody(t *testing.T) {
	big := strings.Repeat("x", 3*quotaPeek) + "insufficient_quota"
	orig := &closeCounter{Reader: strings.NewReader(big)}
	resp := &http.Response{StatusCode: 429, Header: http.Header{}, Body: orig}
	quota, _, _ := inspect429(resp)
	if quota {
		t.Error("a marker past the first 4 KiB was found: more than 4 KiB was read")
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != big {
		t.Fatalf("body length %d, want %d", len(b), len(big))
	}
	resp.Body.Close()
	if orig.closed != 1 {
		t.Fatalf("original body closed %d times, want 1", orig.closed)
	}
}

func TestCooldownOnlyExtends(t *testing.T) {
	var c cooldown
	now := time.Now()
	if !c.extend(now, 10*time.Second, CooldownRateLimited) {
		t.Error("first cooldown did not report a start")
	}
	if c.extend(now, 2*time.Second, CooldownRateLimited) {
		t.Error("a shorter cooldown reported a start")
	}
	if got := c.remaining(now); got != 10*time.Second {
		t.Fatalf("after a shorter 429: remaining %v, want 10s (never shortened)", got)
	}
	c.extend(now, 20*time.Second, CooldownRateLimited)
	if got := c.remaining(now); got != 20*time.Second {
		t.Fatalf("after a longer 429: remaining %v, want 20s", got)
	}
	if got := c.remaining(now.Add(25 * time.Second)); got != 0 {
		t.Fatalf("after it ended: remaining %v, want 0", got)
	}
	if !c.extend(now.Add(25*time.Second), time.Second, CooldownRateLimited) {
		t.Error("a cooldown after the last ended did not report a start")
	}
}

func TestRateLimiterStandalone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			calls++
			if calls == 1 {
				return respond(429, `{"error":"slow down"}`, "Retry-After", "5"), nil
			}
			return respond(200, "ok"), nil
		})
		l, err := NewRateLimiter(next, RateLimitConfig{})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: l}
		resp, err := client.Get("http://a.test/v1")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 429 || readBody(t, resp) != `{"error":"slow down"}` {
			t.Fatalf("first response not handed back as is")
		}
		_, err = client.Get("http://a.test/v1")
		var ra RetryAfterError
		if !errors.Is(err, ErrRateLimited) || !errors.As(err, &ra) || ra.RetryAfter() != 5*time.Second {
			t.Fatalf("during cooldown: err = %v, want ErrRateLimited with RetryAfter 5s", err)
		}
		if calls != 1 {
			t.Fatalf("next called %d times during cooldown, want 1", calls)
		}
		time.Sleep(5 * time.Second)
		resp, err = client.Get("http://a.test/v1")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("after cooldown: %v %v", resp, err)
		}
		resp.Body.Close()
	})
}

// Two 429s from requests that were in flight together: the shorter
// Retry-After, arriving last, does not shorten the cooldown.
func TestLaterShorterRetryAfterDoesNotShorten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		long, short := make(chan struct{}), make(chan struct{})
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if r.Header.Get("X-Which") == "long" {
				<-long
				return respond(429, "", "Retry-After", "10"), nil
			}
			<-short
			return respond(429, "", "Retry-After", "2"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		var wg sync.WaitGroup
		for _, which := range []string{"long", "short"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := httptestRequest("GET", "http://a.test/", "")
				req.Header.Set("X-Which", which)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			}()
		}
		synctest.Wait()
		close(long)
		synctest.Wait()
		close(short)
		wg.Wait()
		if cd := tr.Health()[0].Cooldown; cd != 10*time.Second {
			t.Fatalf("cooldown %v, want 10s: a later, shorter Retry-After must not shorten it", cd)
		}
	})
}

// A wall-clock step of an hour either way neither prolongs nor ends a
// cooldown: it runs on the monotonic clock, and still only extends.
func TestCooldownWallClockStep(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour} {
		start := time.Now()
		at := func(d time.Duration) time.Time { return clocktest.StepWall(start.Add(d), step) }
		var c cooldown
		c.extend(start, time.Second, CooldownRateLimited)
		if got := c.remaining(at(400 * time.Millisecond)); got != 600*time.Millisecond {
			t.Fatalf("step %v: %v left 400ms into a 1s cooldown, want 600ms", step, got)
		}
		if c.extend(at(400*time.Millisecond), 100*time.Millisecond, CooldownRateLimited) || c.remaining(at(400*time.Millisecond)) != 600*time.Millisecond {
			t.Fatalf("step %v: a shorter cooldown after the step shortened it", step)
		}
		if got := c.remaining(at(time.Second)); got != 0 {
			t.Fatalf("step %v: %v left after 1s", step, got)
		}
	}
}
