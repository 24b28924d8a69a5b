package failover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/internal/clocktest"
	"github.com/failover-go/failover/internal/ratelimit"
)

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
		// Waits too long for a Duration ask for the longest cooldown, not
		// the default (the old code ignored them and cooled down 1s).
		{"huge retry-after-ms", http.Header{"Retry-After-Ms": {"1e300"}}, `{}`, 60 * time.Second, CooldownRateLimited},
		{"gemini retryDelay beyond a Duration", http.Header{}, `{"error":{"details":[{"retryDelay":"315576000000s"}]}}`, 60 * time.Second, CooldownRateLimited},
		{"gemini retryDelay in hours beyond a Duration", http.Header{}, `{"retryDelay":"99999999999999h"}`, 60 * time.Second, CooldownRateLimited},
		{"negative retryDelay", http.Header{}, `{"retryDelay":"-22s"}`, time.Second, CooldownRateLimited},
		{"deep body", http.Header{}, strings.Repeat("[", 1<<20) + `{"retryDelay":"7s"}`, time.Second, CooldownRateLimited}, // past the first 4 KiB
		{"deep body, early delay", http.Header{}, `{"retryDelay":"7s","x":` + strings.Repeat("[", 1<<20), 7 * time.Second, CooldownRateLimited},
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
	big := strings.Repeat("x", 3*ratelimit.QuotaPeek) + "insufficient_quota"
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

// inspect429 on arbitrary bodies, delivered in random small chunks and
// possibly ending in a read error, never panics, reads at most 4 KiB before
// it decides, decides on those bytes alone, hands the body back byte for byte
// (and its error), and closes the original exactly once when the caller
// closes.
func FuzzInspect429(f *testing.F) {
	for _, s := range []struct {
		body  string
		pad   uint16
		sizes string
		fail  int
		read  bool
	}{
		{`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`, 0, "\x05\x01\x00\x3f", -1, true},
		{`{"error":{"code":"insufficient_quota"}}`, ratelimit.QuotaPeek - 40, "\x07", -1, true},
		{`insufficient_quota`, ratelimit.QuotaPeek - 18, "", -1, true}, // ends at byte 4096: detected
		{`insufficient_quota`, ratelimit.QuotaPeek - 17, "", -1, true}, // ends at byte 4097: not read
		{`{"error":{"type":"rate_limit_exceeded"}}`, 0, "\x81", -1, false},
		{`{"details":[{"retryDelay": "22s"}]}`, 100, "\x02\x00\x00\x00\x03", 20, true},
		{`{"quotaId":"GenerateRequestsPerDayPerProjectPerModel"}`, ratelimit.QuotaPeek, "\x3f\x3f", ratelimit.QuotaPeek + 10, true},
		{"", 0, "", -1, true},
		{"", 0, "", 0, true},
		{`{"error":{"details":[{"retryDelay":"315576000000s"}]}}`, 0, "\x09", -1, true},
		{`{"retryDelay":"-315576000000s"}`, 0, "", -1, true},
		{`{"retryDelay":"7s","x":` + strings.Repeat("[{", ratelimit.QuotaPeek), 0, "\x3f", -1, true},
	} {
		f.Add([]byte(s.body), s.pad, []byte(s.sizes), s.fail, s.read)
	}
	f.Fuzz(func(t *testing.T, body []byte, pad uint16, sizes []byte, failAt int, readBack bool) {
		if len(body) > 64<<10 {
			body = body[:64<<10]
		}
		full := append(bytes.Repeat([]byte{'.'}, int(pad)%(2*ratelimit.QuotaPeek+1)), body...)
		fail := failAt >= 0
		if fail {
			full = full[:min(failAt, len(full))]
		}
		in := fmt.Sprintf("body of %d bytes %.80q..., chunks %q, read error at the end: %v", len(full), full, sizes, fail)

		orig := &chunkedBody{data: full, fail: fail, sizes: sizes}
		resp := &http.Response{StatusCode: 429, Header: http.Header{}, Body: orig}
		start := time.Now()
		quota, delay, ok := inspect429(resp)
		if time.Since(start) >= drainTimeout*9/10 {
			return // the stall timer may have cut the body: nothing holds then
		}
		if orig.pos > ratelimit.QuotaPeek {
			t.Fatalf("%s: read %d bytes before deciding, more than %d", in, orig.pos, ratelimit.QuotaPeek)
		}
		peek := full[:min(len(full), ratelimit.QuotaPeek)]
		if bytes.Contains(peek, []byte("insufficient_quota")) && !quota {
			t.Fatalf("%s: insufficient_quota within the first 4 KiB, but no quota detected", in)
		}
		if want := containsAny(peek, ratelimit.QuotaMarkers); quota != want {
			t.Fatalf("%s: quota = %v, but a marker in the first 4 KiB: %v", in, quota, want)
		}
		if ok && delay < 0 {
			t.Fatalf("%s: a negative retryDelay %v", in, delay)
		}
		// How the bytes arrive does not matter.
		whole := &http.Response{StatusCode: 429, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(full))}
		if q, d, o := inspect429(whole); q != quota || d != delay || o != ok {
			t.Fatalf("%s: inspect429 = %v, %v, %v in chunks, %v, %v, %v at once", in, quota, delay, ok, q, d, o)
		}

		switch closes := orig.closes.Load(); {
		case closes > 1:
			t.Fatalf("%s: inspect429 closed the body %d times", in, closes)
		case closes == 1 && (fail || orig.pos != len(full)):
			t.Fatalf("%s: inspect429 closed a body it had not read to its end", in)
		}
		if readBack {
			got, err := io.ReadAll(resp.Body)
			if !bytes.Equal(got, full) {
				t.Fatalf("%s: the body handed back is %d bytes %.80q..., not the %d sent", in, len(got), got, len(full))
			}
			if fail && !errors.Is(err, errChunkedBody) {
				t.Fatalf("%s: reading the body handed back: %v, want the original's read error", in, err)
			}
			if !fail && err != nil {
				t.Fatalf("%s: reading the body handed back: %v", in, err)
			}
		}
		if orig.readAfterClose.Load() {
			t.Fatalf("%s: the original body was read after it was closed", in)
		}
		if err := resp.Body.Close(); err != nil {
			t.Fatalf("%s: Close: %v", in, err)
		}
		if closes := orig.closes.Load(); closes != 1 {
			t.Fatalf("%s: the original body was closed %d times once the caller closed, want 1", in, closes)
		}
	})
}

var errChunkedBody = errors.New("fuzz: connection reset")

// chunkedBody delivers data in the sizes that sizes gives in turn (the low
// six bits; 0 returns nothing, at most twice in a row), with io.EOF in the
// same call as the last bytes when the size's top bit is set, and
// errChunkedBody instead of io.EOF when fail is set. It records closes and
// reads after a close.
type chunkedBody struct {
	data  []byte
	pos   int
	fail  bool
	sizes []byte
	i     int
	zeros int

	closes         atomic.Int32
	readAfterClose atomic.Bool
}

func (b *chunkedBody) end() error {
	if b.fail {
		return errChunkedBody
	}
	return io.EOF
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.closes.Load() > 0 {
		b.readAfterClose.Store(true)
	}
	if b.pos >= len(b.data) {
		return 0, b.end()
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, endWithData := len(p), false
	if len(b.sizes) > 0 {
		s := b.sizes[b.i%len(b.sizes)]
		b.i++
		endWithData = s&0x80 != 0
		if s&0x3f == 0 && b.zeros < 2 {
			b.zeros++
			return 0, nil
		}
		b.zeros = 0
		n = min(n, max(int(s&0x3f), 1))
	}
	n = copy(p[:n], b.data[b.pos:])
	b.pos += n
	if b.pos == len(b.data) && endWithData {
		return n, b.end()
	}
	return n, nil
}

func (b *chunkedBody) Close() error {
	b.closes.Add(1)
	return nil
}

func containsAny(b []byte, markers [][]byte) bool {
	for _, m := range markers {
		if bytes.Contains(b, m) {
			return true
		}
	}
	return false
}

func TestRateLimitCooldown(t *testing.T) {
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(429)
		io.WriteString(w, `{"error":{"type":"rate_limit_exceeded"}}`)
	})
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "p", BaseURL: primary.URL}, {Name: "b", BaseURL: backup.URL}}})
	for range 3 {
		if resp := mustGet(t, tr, primary.URL+"/v1/models"); readBody(t, resp) != "ok" {
			t.Fatal("not served by the backup")
		}
	}
	if primary.count() != 1 {
		t.Fatalf("primary got %d requests, want 1: a cooling upstream gets none", primary.count())
	}
	h := tr.Health()[0]
	if h.Cooldown < 25*time.Second || h.Cooldown > 30*time.Second || h.CooldownReason != CooldownRateLimited || h.Available {
		t.Fatalf("primary cooldown %v reason %q available %v, want about 30s rate_limited", h.Cooldown, h.CooldownReason, h.Available)
	}
	if h.State != "closed" || h.Requests.RateLimited != 1 {
		t.Fatalf("a 429 touched the breaker or was not counted: %+v", h)
	}
}

// A 429 cools its upstream down alike in every dialect: Azure's
// x-ms-retry-after-ms as OpenAI's retry-after-ms, Anthropic's exhausted
// window until its reset (whatever form the reset takes) as OpenAI's,
// through the Transport and a RateLimiter alike.
func TestRateLimitDialectsAlike(t *testing.T) {
	const want = 20 * time.Second
	anthropic := func(reset func(time.Time) string) func() []string {
		return func() []string {
			return []string{"Anthropic-Ratelimit-Tokens-Remaining", "0", "Anthropic-Ratelimit-Tokens-Reset", reset(time.Now().Add(want))}
		}
	}
	fixed := func(kv ...string) func() []string { return func() []string { return kv } }
	for _, tt := range []struct {
		name   string
		header func() []string
	}{
		{"openai retry-after-ms", fixed("Retry-After-Ms", "20000")},
		{"azure x-ms-retry-after-ms", fixed("X-Ms-Retry-After-Ms", "20000")},
		{"azure, all three", fixed("Retry-After", "20", "Retry-After-Ms", "20000", "X-Ms-Retry-After-Ms", "20000")},
		{"openai reset", fixed("X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "20s")},
		{"anthropic reset", anthropic(func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) })},
		{"anthropic reset, lower case", anthropic(func(t time.Time) string { return strings.ToLower(t.UTC().Format(time.RFC3339Nano)) })},
		{"anthropic reset, space for the T", anthropic(func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.999999999Z07:00") })},
		{"anthropic gateway reset, a duration", fixed("Anthropic-Ratelimit-Tokens-Remaining", "0", "Anthropic-Ratelimit-Tokens-Reset", "20s")},
	} {
		primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			kv := tt.header()
			for i := 0; i+1 < len(kv); i += 2 {
				w.Header().Set(kv[i], kv[i+1])
			}
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
		})
		backup := newUpstreamServer(t, 200, "ok")
		tr := newTestTransport(t, Config{Upstreams: []Upstream{{Name: "p", BaseURL: primary.URL}, {Name: "b", BaseURL: backup.URL}}})
		if resp := mustGet(t, tr, primary.URL+"/v1/messages"); readBody(t, resp) != "ok" {
			t.Fatalf("%s: not served by the backup", tt.name)
		}
		if cd := tr.Health()[0].Cooldown; cd <= want-5*time.Second || cd > want {
			t.Errorf("%s: the Transport cools down for %v, want %v", tt.name, cd, want)
		}

		next := http.DefaultTransport.(*http.Transport).Clone()
		t.Cleanup(next.CloseIdleConnections)
		l, err := NewRateLimiter(next, RateLimitConfig{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: l}).Get(primary.URL + "/v1/messages")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if left := l.Remaining(); left <= want-5*time.Second || left > want {
			t.Errorf("%s: the RateLimiter cools down for %v, want %v", tt.name, left, want)
		}
	}
}

// A 429 with no Retry-After at all still fails over, and cools the
// upstream for the default cooldown.
func TestRateLimitWithoutHeaderFailsOver(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 429, `{"error":{"message":"Rate limit exceeded"}}`, "X-Ratelimit-Reset", "1754667660000")
	n.status("b.test", 200, "ok")
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{{BaseURL: "http://a.test"}, {BaseURL: "http://b.test"}}})
	if resp := mustGet(t, tr, "http://a.test/x"); readBody(t, resp) != "ok" {
		t.Fatal("no failover on a 429 without Retry-After")
	}
	if cd := tr.Health()[0].Cooldown; cd <= 0 || cd > time.Second {
		t.Fatalf("cooldown %v, want the 1s default", cd)
	}
}

// A 429 whose body stalls after the headers does not hold up the failover:
// inspecting it is cut short.
func TestStalled429BodyDoesNotBlock(t *testing.T) {
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(429)
		io.WriteString(w, `{"error":`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	backup := newUpstreamServer(t, 200, "ok")
	tr := newTestTransport(t, Config{Upstreams: []Upstream{{BaseURL: primary.URL}, {BaseURL: backup.URL}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := tr.RoundTrip(httptestRequest("GET", primary.URL+"/v1", "").WithContext(ctx))
	if err != nil {
		t.Fatalf("stalled 429 body blocked the request: %v", err)
	}
	if got := readBody(t, resp); got != "ok" {
		t.Fatalf("body %q, want the backup's", got)
	}
}

// A DefaultCooldown longer than the MaxCooldown in effect is refused, by
// New and NewRateLimiter alike, whether MaxCooldown is set or left at its
// 60s default: before, DefaultCooldown: 2 * time.Minute alone was taken,
// and a 429 that says nothing cooled down for 60s, not the 2m configured.
func TestRateLimitDefaultCooldownOverDefaultMax(t *testing.T) {
	for _, rc := range []RateLimitConfig{
		{DefaultCooldown: 2 * time.Minute},
		{DefaultCooldown: 2 * time.Minute, MaxCooldown: time.Minute},
		{DefaultCooldown: defaultMaxCooldown + 1},
	} {
		var cerr *ConfigError
		_, err := New(Config{Upstreams: []Upstream{{BaseURL: "http://a.test"}}, RateLimit: rc})
		if !errors.As(err, &cerr) || cerr.Field != "RateLimit.DefaultCooldown" {
			t.Errorf("New with %+v: %v, want a ConfigError naming RateLimit.DefaultCooldown", rc, err)
		}
		if _, err := NewRateLimiter(nil, rc); !errors.As(err, &cerr) || cerr.Field != "RateLimit.DefaultCooldown" {
			t.Errorf("NewRateLimiter with %+v: %v, want a ConfigError naming RateLimit.DefaultCooldown", rc, err)
		}
	}
	for _, rc := range []RateLimitConfig{
		{DefaultCooldown: defaultMaxCooldown},
		{DefaultCooldown: 2 * time.Minute, MaxCooldown: 2 * time.Minute},
		{MaxCooldown: 500 * time.Millisecond}, // the default 1s is capped, as every cooldown is
	} {
		if _, err := NewRateLimiter(nil, rc); err != nil {
			t.Errorf("NewRateLimiter with %+v: %v", rc, err)
		}
	}
}

// A next that breaks the RoundTripper contract (no response, no error: a
// middleware that dropped a real server's answer) gets an error, not a nil
// dereference.
func TestRateLimiterNextWithoutResponseOrError(t *testing.T) {
	s := newUpstreamServer(t, 429, "slow down")
	next := droppingNext(t)
	l, err := NewRateLimiter(next, RateLimitConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if v := recover(); v != nil {
			t.Fatalf("RoundTrip panicked: %v", v)
		}
	}()
	resp, err := l.RoundTrip(httptestRequest("GET", s.URL+"/v1", ""))
	if resp != nil || !errors.Is(err, errNextNoResponse) {
		t.Fatalf("got %v, %v; want an error saying next returned nothing", resp, err)
	}
}
