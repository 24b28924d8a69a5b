package failover

import (
	"bufio"
	"encoding/json"
	"math"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/internal/clocktest"
	"github.com/failover-go/failover/internal/mono"
)

// wireHeader parses header lines as they come off the wire ("name: value",
// one a line, any case), as net/http would deliver them.
func wireHeader(t *testing.T, lines string) http.Header {
	t.Helper()
	lines = strings.TrimSpace(lines)
	if lines == "" {
		return http.Header{}
	}
	r := textproto.NewReader(bufio.NewReader(strings.NewReader(lines + "\r\n\r\n")))
	h, err := r.ReadMIMEHeader()
	if err != nil {
		t.Fatalf("header %q: %v", lines, err)
	}
	return http.Header(h)
}

// Times of the recordings the cases come from (their Date headers).
var (
	openAIDate     = time.Date(2025, 8, 20, 11, 55, 54, 0, time.UTC)
	openRouterDate = time.Date(2025, 8, 8, 15, 40, 34, 0, time.UTC)
	anthropicDate  = time.Date(2025, 8, 18, 12, 42, 58, 0, time.UTC)
)

// headroomCase is the header of one response and what ParseHeadroom and
// retryHint read from it at now.
type headroomCase struct {
	name   string
	now    time.Time
	header string
	want   Headroom
	ok     bool
	hint   time.Duration // 0 when retryHint is not ok
}

func checkHeadroom(t *testing.T, tt headroomCase) {
	t.Helper()
	h := wireHeader(t, tt.header)
	before := h.Clone()
	got, ok := ParseHeadroom(h, tt.now)
	if got.RemainingRequests != tt.want.RemainingRequests || got.RemainingTokens != tt.want.RemainingTokens ||
		!got.Reset.Equal(tt.want.Reset) || ok != tt.ok {
		t.Errorf("%s: ParseHeadroom = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
	}
	hint, hintOK := retryHint(h, tt.now)
	if hint != tt.hint || hintOK != (tt.hint != 0) {
		t.Errorf("%s: retryHint = %v, %v; want %v, %v", tt.name, hint, hintOK, tt.hint, tt.hint != 0)
	}
	if !headersEqual(h, before) {
		t.Errorf("%s: the header changed to %q", tt.name, h)
	}
}

func headersEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || strings.Join(v, "\x00") != strings.Join(w, "\x00") || len(v) != len(w) {
			return false
		}
	}
	return true
}

// unknown is the Headroom of a response that says nothing.
var unknown = Headroom{RemainingRequests: -1, RemainingTokens: -1}

func TestParseHeadroomOpenAI(t *testing.T) {
	now := openAIDate
	for _, tt := range []headroomCase{
		// llms_openai_internal_openaiclient_testdata_TestClient_CreateChatCompletion.httprr
		// (as on the HTTP/2 wire, lower case).
		{"recorded chat completion", now, `
x-ratelimit-limit-requests: 10000
x-ratelimit-limit-tokens: 50000000
x-ratelimit-remaining-requests: 9999
x-ratelimit-remaining-tokens: 49999992
x-ratelimit-reset-requests: 6ms
x-ratelimit-reset-tokens: 0s`,
			Headroom{9999, 49999992, now.Add(6 * time.Millisecond)}, true, 6 * time.Millisecond},
		// llms_openai_testdata_TestMultiContentImage.httprr: the input
		// images window is not one of requests or tokens.
		{"recorded image request", now, `
X-Ratelimit-Limit-Input-Images: 250000
X-Ratelimit-Limit-Requests: 10000
X-Ratelimit-Limit-Tokens: 30000000
X-Ratelimit-Remaining-Input-Images: 249999
X-Ratelimit-Remaining-Requests: 9999
X-Ratelimit-Remaining-Tokens: 29999225
X-Ratelimit-Reset-Input-Images: 0s
X-Ratelimit-Reset-Requests: 6ms
X-Ratelimit-Reset-Tokens: 1ms`,
			Headroom{9999, 29999225, now.Add(time.Millisecond)}, true, 6 * time.Millisecond},
		{"tokens exhausted", now, `
x-ratelimit-remaining-requests: 59
x-ratelimit-remaining-tokens: 0
x-ratelimit-reset-requests: 20ms
x-ratelimit-reset-tokens: 1m30.5s`,
			Headroom{59, 0, now.Add(90500 * time.Millisecond)}, true, 90500 * time.Millisecond},
		{"requests exhausted", now, `
x-ratelimit-remaining-requests: 0
x-ratelimit-remaining-tokens: 149000
x-ratelimit-reset-requests: 6m0s
x-ratelimit-reset-tokens: 12ms`,
			Headroom{0, 149000, now.Add(6 * time.Minute)}, true, 6 * time.Minute},
		{"fractional seconds", now, "x-ratelimit-remaining-requests: 1\nx-ratelimit-reset-requests: 7.66s",
			Headroom{1, -1, now.Add(7660 * time.Millisecond)}, true, 7660 * time.Millisecond},
		{"bare seconds", now, "x-ratelimit-reset-requests: 2",
			Headroom{-1, -1, now.Add(2 * time.Second)}, true, 2 * time.Second},
		{"days", now, "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 1d2h3m",
			Headroom{0, -1, now.Add(26*time.Hour + 3*time.Minute)}, true, 26*time.Hour + 3*time.Minute},
		{"whole days", now, "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 2d",
			Headroom{0, -1, now.Add(48 * time.Hour)}, true, 48 * time.Hour},
		{"reset now is no reset", now, "x-ratelimit-remaining-tokens: 0\nx-ratelimit-reset-tokens: 0s",
			Headroom{-1, 0, time.Time{}}, true, 0},
		// A window that is exhausted but says nothing of its reset: Reset
		// is unknown, and retryHint falls back on the latest reset.
		{"exhausted, reset unknown", now, "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-tokens: 1s",
			Headroom{0, -1, time.Time{}}, true, time.Second},
		{"negative", now, "x-ratelimit-remaining-requests: -1\nx-ratelimit-reset-requests: -1s",
			unknown, false, 0},
		{"garbage", now, "x-ratelimit-remaining-requests: lots\nx-ratelimit-reset-requests: soon\nx-ratelimit-reset-tokens: 1x",
			unknown, false, 0},
		{"NaN and Inf", now, "x-ratelimit-reset-requests: NaN\nx-ratelimit-reset-tokens: +Inf",
			unknown, false, 0},
		// A reset too far for a Duration is as far as one goes: the
		// window is announced, not unknown (the old code ignored these,
		// and a 429 then cooled down for the default 1s).
		{"duration overflow", now, "x-ratelimit-reset-requests: 9999999h\nx-ratelimit-reset-tokens: 200000d",
			Headroom{-1, -1, now.Add(maxDuration)}, true, maxDuration},
		{"days overflow", now, "x-ratelimit-reset-requests: 106751d9999h",
			Headroom{-1, -1, now.Add(maxDuration)}, true, maxDuration},
		{"days beyond a uint64", now, "x-ratelimit-remaining-tokens: 0\nx-ratelimit-reset-tokens: 99999999999999999999d1s",
			Headroom{-1, 0, now.Add(maxDuration)}, true, maxDuration},
		{"seconds overflow", now, "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 1e300",
			Headroom{0, -1, now.Add(maxDuration)}, true, maxDuration},
		{"seconds beyond a float64", now, "x-ratelimit-reset-requests: 1e400",
			Headroom{-1, -1, now.Add(maxDuration)}, true, maxDuration},
		{"hexadecimal seconds", now, "x-ratelimit-reset-requests: 0x1p4", unknown, false, 0},
		{"days, then garbage", now, "x-ratelimit-reset-requests: 200000dsoon", unknown, false, 0},
		{"huge count", now, "x-ratelimit-remaining-tokens: 99999999999999999999",
			Headroom{-1, math.MaxInt64, time.Time{}}, true, 0},
		{"first of a list", now, "x-ratelimit-remaining-requests: 0, 5\nx-ratelimit-reset-requests: 3s, 1s",
			Headroom{0, -1, now.Add(3 * time.Second)}, true, 3 * time.Second},
		{"first of two headers", now, "x-ratelimit-remaining-requests: 4\nx-ratelimit-remaining-requests: 0",
			Headroom{4, -1, time.Time{}}, true, 0},
		{"spaces", now, "x-ratelimit-remaining-requests:   7  \nx-ratelimit-reset-requests:  1s ",
			Headroom{7, -1, now.Add(time.Second)}, true, time.Second},
	} {
		checkHeadroom(t, tt)
	}
}

func TestParseHeadroomAnthropic(t *testing.T) {
	// No recording carries anthropic-ratelimit-* (the Anthropic ones were
	// recorded without them); these are the shapes Anthropic documents,
	// at the time of llms_anthropic_..._TestClient_CreateMessage.httprr.
	now := anthropicDate
	at := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339) }
	for _, tt := range []headroomCase{
		{"all windows", now, `
anthropic-ratelimit-requests-limit: 50
anthropic-ratelimit-requests-remaining: 49
anthropic-ratelimit-requests-reset: ` + at(2*time.Second) + `
anthropic-ratelimit-tokens-limit: 40000
anthropic-ratelimit-tokens-remaining: 39000
anthropic-ratelimit-tokens-reset: ` + at(3*time.Second) + `
anthropic-ratelimit-input-tokens-limit: 30000
anthropic-ratelimit-input-tokens-remaining: 29500
anthropic-ratelimit-input-tokens-reset: ` + at(3*time.Second) + `
anthropic-ratelimit-output-tokens-limit: 8000
anthropic-ratelimit-output-tokens-remaining: 7000
anthropic-ratelimit-output-tokens-reset: ` + at(9*time.Second),
			Headroom{49, 7000, now.Add(2 * time.Second)}, true, 9 * time.Second},
		{"output tokens exhausted", now, `
anthropic-ratelimit-requests-remaining: 49
anthropic-ratelimit-requests-reset: ` + at(2*time.Second) + `
anthropic-ratelimit-output-tokens-remaining: 0
anthropic-ratelimit-output-tokens-reset: ` + at(40*time.Second) + `
anthropic-ratelimit-input-tokens-remaining: 20000
anthropic-ratelimit-input-tokens-reset: ` + at(50*time.Second),
			Headroom{49, 0, now.Add(40 * time.Second)}, true, 40 * time.Second},
		{"two windows exhausted: the later reset", now, `
anthropic-ratelimit-requests-remaining: 0
anthropic-ratelimit-requests-reset: ` + at(5*time.Second) + `
anthropic-ratelimit-tokens-remaining: 0
anthropic-ratelimit-tokens-reset: ` + at(15*time.Second) + `
anthropic-ratelimit-output-tokens-remaining: 10
anthropic-ratelimit-output-tokens-reset: ` + at(60*time.Second),
			Headroom{0, 0, now.Add(15 * time.Second)}, true, 15 * time.Second},
		{"fractional seconds and offset", now,
			"anthropic-ratelimit-requests-remaining: 0\nanthropic-ratelimit-requests-reset: " +
				now.Add(1500*time.Millisecond).In(time.FixedZone("", 2*3600)).Format(time.RFC3339Nano),
			Headroom{0, -1, now.Add(1500 * time.Millisecond)}, true, 1500 * time.Millisecond},
		{"reset in the past", now, "anthropic-ratelimit-tokens-remaining: 0\nanthropic-ratelimit-tokens-reset: " + at(-time.Minute),
			Headroom{-1, 0, time.Time{}}, true, 0},
		{"not RFC 3339", now, "anthropic-ratelimit-tokens-reset: " + now.Add(time.Minute).Format(http.TimeFormat),
			unknown, false, 0},
		{"year 9999", now, "anthropic-ratelimit-tokens-remaining: 0\nanthropic-ratelimit-tokens-reset: 9999-12-31T23:59:59Z",
			Headroom{-1, 0, now.Add(maxDuration)}, true, maxDuration},
		{"year 1", now, "anthropic-ratelimit-tokens-remaining: 0\nanthropic-ratelimit-tokens-reset: 0001-01-01T00:00:00Z",
			Headroom{-1, 0, time.Time{}}, true, 0},
	} {
		checkHeadroom(t, tt)
	}
}

func TestParseHeadroomXRateLimit(t *testing.T) {
	now := openRouterDate
	reset := time.Date(2025, 8, 8, 15, 41, 0, 0, time.UTC) // 1754667660000
	for _, tt := range []headroomCase{
		// The 429 of llms_openai_testdata_TestOpenRouterStreaming.httprr: no
		// Retry-After, a reset in Unix milliseconds 26 s after its Date.
		{"recorded OpenRouter 429", now, `
x-ratelimit-limit: 1
x-ratelimit-remaining: 0
x-ratelimit-reset: 1754667660000`,
			Headroom{0, -1, reset}, true, 26 * time.Second},
		// The same a day later, as from a skewed clock: the reset is past.
		{"recorded OpenRouter 429, a day later", now.Add(24 * time.Hour), `
x-ratelimit-limit: 1
x-ratelimit-remaining: 0
x-ratelimit-reset: 1754667660000`,
			Headroom{0, -1, time.Time{}}, true, 0},
		{"unix seconds", now, "X-RateLimit-Remaining: 3\nX-RateLimit-Reset: 1754667660",
			Headroom{3, -1, reset}, true, 26 * time.Second},
		{"fractional unix seconds", now, "X-RateLimit-Reset: 1754667660.25",
			Headroom{-1, -1, reset.Add(250 * time.Millisecond)}, true, 26250 * time.Millisecond},
		{"seconds from now", now, "X-RateLimit-Remaining: 0\nX-RateLimit-Reset: 12",
			Headroom{0, -1, now.Add(12 * time.Second)}, true, 12 * time.Second},
		{"fractional seconds from now", now, "X-RateLimit-Reset: 0.5",
			Headroom{-1, -1, now.Add(500 * time.Millisecond)}, true, 500 * time.Millisecond},
		{"zero seconds from now", now, "X-RateLimit-Remaining: 0\nX-RateLimit-Reset: 0",
			Headroom{0, -1, time.Time{}}, true, 0},
		{"negative", now, "X-RateLimit-Remaining: -1\nX-RateLimit-Reset: -12", unknown, false, 0},
		// A Unix time beyond a Duration from now is that far: the old
		// code ignored 1e19, and kept 1e15 (the year 33658), which
		// Health's JSON cannot encode.
		{"too large for milliseconds", now, "X-RateLimit-Reset: 1e19", Headroom{-1, -1, now.Add(maxDuration)}, true, maxDuration},
		{"beyond the year 9999", now, "X-RateLimit-Remaining: 0\nX-RateLimit-Reset: 1e15", Headroom{0, -1, now.Add(maxDuration)}, true, maxDuration},
		{"beyond a float64", now, "X-RateLimit-Reset: 1e400", Headroom{-1, -1, now.Add(maxDuration)}, true, maxDuration},
		{"Inf", now, "X-RateLimit-Reset: Inf", unknown, false, 0},
		{"NaN", now, "X-RateLimit-Reset: NaN", unknown, false, 0},
		{"hexadecimal", now, "X-RateLimit-Reset: 0x1p4", unknown, false, 0},
		{"zero as 00", now, "X-RateLimit-Remaining: 00", Headroom{0, -1, time.Time{}}, true, 0},
		{"date is not a reset", now, "X-RateLimit-Reset: " + now.Add(time.Minute).Format(http.TimeFormat), unknown, false, 0},
	} {
		checkHeadroom(t, tt)
	}
}

func TestParseHeadroomIETF(t *testing.T) {
	now := openAIDate
	for _, tt := range []headroomCase{
		{"draft headers", now, "RateLimit-Limit: 100\nRateLimit-Remaining: 0\nRateLimit-Reset: 30",
			Headroom{0, -1, now.Add(30 * time.Second)}, true, 30 * time.Second},
		{"remaining only", now, "RateLimit-Remaining: 42", Headroom{42, -1, time.Time{}}, true, 0},
		{"garbage", now, "RateLimit-Remaining: many\nRateLimit-Reset: later", unknown, false, 0},
	} {
		checkHeadroom(t, tt)
	}
}

func TestParseHeadroomMixed(t *testing.T) {
	now := openAIDate
	for _, tt := range []headroomCase{
		{"no header", now, "", unknown, false, 0},
		{"only Retry-After and unrelated headers", now, "Retry-After: 20\nX-Ratelimit-Limit-Requests: 10000\nContent-Type: application/json",
			unknown, false, 0},
		// Requests: the smallest of OpenAI's and the generic window; the
		// exhausted window decides the reset, not the earlier one.
		{"dialects together", now, `
x-ratelimit-remaining-requests: 10
x-ratelimit-reset-requests: 1s
x-ratelimit-remaining: 0
x-ratelimit-reset: 20
ratelimit-remaining: 5
ratelimit-reset: 40`,
			Headroom{0, -1, now.Add(20 * time.Second)}, true, 20 * time.Second},
		{"none exhausted: earliest, hint latest", now, `
x-ratelimit-remaining-tokens: 10
x-ratelimit-reset-tokens: 1s
anthropic-ratelimit-tokens-remaining: 20
anthropic-ratelimit-tokens-reset: ` + now.Add(7*time.Second).Format(time.RFC3339),
			Headroom{-1, 10, now.Add(time.Second)}, true, 7 * time.Second},
	} {
		checkHeadroom(t, tt)
	}
}

// TestParseHeadroomEachHeaderAlone sends each header ParseHeadroom reads
// as the only rate-limit header among unrelated ones, in the spelling the
// wire gives: each alone is read (readHeadroom looks up nothing when no key
// has a rate-limit prefix, so a name outside those prefixes would be lost
// here).
func TestParseHeadroomEachHeaderAlone(t *testing.T) {
	now := openAIDate
	reset := now.Add(30 * time.Second).Format(time.RFC3339)
	for _, line := range []string{
		"x-ratelimit-remaining-requests: 7", "x-ratelimit-reset-requests: 30s",
		"x-ratelimit-remaining-tokens: 7", "x-ratelimit-reset-tokens: 30s",
		"anthropic-ratelimit-requests-remaining: 7", "anthropic-ratelimit-requests-reset: " + reset,
		"anthropic-ratelimit-tokens-remaining: 7", "anthropic-ratelimit-tokens-reset: " + reset,
		"anthropic-ratelimit-input-tokens-remaining: 7", "anthropic-ratelimit-input-tokens-reset: " + reset,
		"anthropic-ratelimit-output-tokens-remaining: 7", "anthropic-ratelimit-output-tokens-reset: " + reset,
		"x-ratelimit-remaining: 7", "x-ratelimit-reset: 30",
		"ratelimit-remaining: 7", "ratelimit-reset: 30",
	} {
		h := wireHeader(t, "content-type: application/json\nx-request-id: req_1\n"+line+"\nserver: cloudflare")
		hr, ok := ParseHeadroom(h, now)
		if !ok {
			t.Errorf("%q among unrelated headers: ParseHeadroom found nothing", line)
			continue
		}
		if hr.RemainingRequests != 7 && hr.RemainingTokens != 7 && !hr.Reset.Equal(now.Add(30*time.Second)) {
			t.Errorf("%q: got %+v, want a remaining of 7 or a reset at +30s", line, hr)
		}
	}
}

func TestHeadroomExhausted(t *testing.T) {
	for _, tt := range []struct {
		h    Headroom
		want bool
	}{
		{unknown, false},
		{Headroom{0, -1, time.Time{}}, true},
		{Headroom{-1, 0, time.Time{}}, true},
		{Headroom{5, 0, time.Time{}}, true},
		{Headroom{1, 1, time.Time{}}, false},
	} {
		if got := tt.h.Exhausted(); got != tt.want {
			t.Errorf("%+v.Exhausted() = %v, want %v", tt.h, got, tt.want)
		}
	}
}

func BenchmarkParseHeadroom(b *testing.B) {
	h := http.Header{
		"X-Ratelimit-Limit-Requests":     {"10000"},
		"X-Ratelimit-Limit-Tokens":       {"50000000"},
		"X-Ratelimit-Remaining-Requests": {"9999"},
		"X-Ratelimit-Remaining-Tokens":   {"49999992"},
		"X-Ratelimit-Reset-Requests":     {"6ms"},
		"X-Ratelimit-Reset-Tokens":       {"0s"},
		"Content-Type":                   {"application/json"},
	}
	now := openAIDate
	b.ReportAllocs()
	for b.Loop() {
		ParseHeadroom(h, now)
	}
}

// An exhausted window demotes its upstream until the window resets, on the
// monotonic clock: a wall-clock step does not end it early or prolong it.
func TestHeadroomWallClockStep(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour} {
		start := time.Now()
		at := func(d time.Duration) time.Time { return clocktest.StepWall(start.Add(d), step) }
		u := &upstream{}
		noteHeadroomAt(u, http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"20s"}}, start, RateLimitConfig{}.withDefaults())
		if !u.outOfHeadroom(at(19 * time.Second)) {
			t.Errorf("step %v: headroom back 19s into a 20s reset", step)
		}
		if u.outOfHeadroom(at(20 * time.Second)) {
			t.Errorf("step %v: still out of headroom when the window reset", step)
		}
	}
}

// A demotion lasts until its window resets, or DefaultCooldown when the
// reset is not announced, and never longer than MaxCooldown, as a cooldown
// is bounded. The old code had no cap: a window that resets in the year
// 9999 (or in 9999999h, or at Unix millisecond 1e15) demoted its upstream
// for centuries, and a reset beyond a Duration was ignored for the 1s
// default.
func TestHeadroomDemotionCapped(t *testing.T) {
	start := time.Now()
	for _, tt := range []struct {
		name   string
		header string
		rate   RateLimitConfig
		want   time.Duration
	}{
		{"reset in 20s", "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 20s", RateLimitConfig{}, 20 * time.Second},
		{"reset in 6m", "x-ratelimit-remaining-tokens: 0\nx-ratelimit-reset-tokens: 6m0s", RateLimitConfig{}, time.Minute},
		{"reset in 6m, MaxCooldown 1h", "x-ratelimit-remaining-tokens: 0\nx-ratelimit-reset-tokens: 6m0s", RateLimitConfig{MaxCooldown: time.Hour}, 6 * time.Minute},
		{"MaxCooldown 10s", "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 20s", RateLimitConfig{MaxCooldown: 10 * time.Second}, 10 * time.Second},
		{"year 9999", "anthropic-ratelimit-tokens-remaining: 0\nanthropic-ratelimit-tokens-reset: 9999-12-31T23:59:59Z", RateLimitConfig{}, time.Minute},
		{"beyond a Duration", "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 9999999h", RateLimitConfig{}, time.Minute},
		{"Unix milliseconds in the year 33658", "x-ratelimit-remaining: 0\nx-ratelimit-reset: 1e15", RateLimitConfig{}, time.Minute},
		{"no reset", "x-ratelimit-remaining-requests: 0", RateLimitConfig{}, time.Second},
		{"no reset, DefaultCooldown 5s", "ratelimit-remaining: 0", RateLimitConfig{DefaultCooldown: 5 * time.Second}, 5 * time.Second},
		{"reset in the past", "anthropic-ratelimit-requests-remaining: 0\nanthropic-ratelimit-requests-reset: 2001-01-01T00:00:00Z", RateLimitConfig{}, time.Second},
	} {
		u := &upstream{}
		noteHeadroomAt(u, wireHeader(t, tt.header), start, tt.rate.withDefaults())
		got := mono.Time(u.headroom.until.Load()).Sub(mono.Of(start))
		if got != tt.want || !u.outOfHeadroom(start.Add(tt.want-1)) || u.outOfHeadroom(start.Add(tt.want)) {
			t.Errorf("%s: demoted for %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A demotion belongs to the window that reported 0. A later success that
// reports that window above 0 lifts it, at once, even within headroomEvery
// of the last reading; one that says nothing of that window (requests
// left say nothing of tokens, input tokens nothing of output tokens, one
// dialect nothing of another) leaves it; of two windows at 0, lifting one
// leaves the other. A report older than one a window took is dropped. The
// old code never lifted a demotion before its reset.
func TestHeadroomDemotionLifted(t *testing.T) {
	type report struct {
		at     time.Duration // after the start
		header string
	}
	const (
		req0  = "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 20s"
		req5  = "x-ratelimit-remaining-requests: 5\nx-ratelimit-reset-requests: 1s"
		tok0  = "x-ratelimit-remaining-requests: 10\nx-ratelimit-remaining-tokens: 0\nx-ratelimit-reset-tokens: 20s"
		tok9  = "x-ratelimit-remaining-tokens: 9000"
		both0 = "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 5s\nx-ratelimit-remaining-tokens: 0\nx-ratelimit-reset-tokens: 20s"
		out0  = "anthropic-ratelimit-output-tokens-remaining: 0\nanthropic-ratelimit-output-tokens-reset: 2099-01-01T00:00:00Z\nanthropic-ratelimit-input-tokens-remaining: 20000"
		in19k = "anthropic-ratelimit-input-tokens-remaining: 19000\nanthropic-ratelimit-requests-remaining: 40"
	)
	ms := time.Millisecond
	for _, tt := range []struct {
		name     string
		reports  []report
		demoted  []time.Duration // after the start, u is demoted at these
		restored []time.Duration // and not at these
	}{
		{"requests lift requests", []report{{0, req0}, {time.Second, req5}},
			nil, []time.Duration{time.Second, 2 * time.Second}},
		{"requests say nothing of tokens", []report{{0, tok0}, {time.Second, req5}},
			[]time.Duration{time.Second, 20*time.Second - ms}, []time.Duration{20 * time.Second}},
		{"tokens lift tokens", []report{{0, tok0}, {time.Second, req5}, {2 * time.Second, tok9}},
			nil, []time.Duration{2 * time.Second}},
		{"input tokens say nothing of output tokens", []report{{0, out0}, {time.Second, in19k}},
			[]time.Duration{time.Second, time.Minute - ms}, []time.Duration{time.Minute}},
		{"output tokens lift output tokens", []report{{0, out0}, {time.Second, in19k}, {30 * time.Second, "anthropic-ratelimit-output-tokens-remaining: 500"}},
			nil, []time.Duration{30 * time.Second}},
		{"one dialect says nothing of another", []report{{0, req0}, {time.Second, "x-ratelimit-remaining: 7\nratelimit-remaining: 7"}},
			[]time.Duration{time.Second}, nil},
		{"of two windows at 0, lifting one leaves the other", []report{{0, both0}, {time.Second, req5}},
			[]time.Duration{time.Second, 10 * time.Second}, []time.Duration{20 * time.Second}},
		{"a lift within headroomEvery of the last reading", []report{
			{0, "x-ratelimit-remaining-requests: 9\nx-ratelimit-remaining-tokens: 9000"},
			{10 * ms, req0},
			{20 * ms, req5},
		}, nil, []time.Duration{20 * ms}},
		{"a success that says nothing", []report{{0, req0}, {time.Second, "content-type: application/json"}},
			[]time.Duration{time.Second}, []time.Duration{20 * time.Second}},
		{"a reset without a remaining", []report{{0, req0}, {time.Second, "x-ratelimit-reset-requests: 2s"}},
			[]time.Duration{5 * time.Second}, []time.Duration{20 * time.Second}},
		{"a later 0 replaces the reset", []report{{0, req0}, {time.Second, "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 2s"}},
			[]time.Duration{3*time.Second - ms}, []time.Duration{3 * time.Second}},
		{"an older 0 after a lift", []report{{time.Second, req0}, {3 * time.Second, req5}, {2 * time.Second, req0}},
			nil, []time.Duration{3 * time.Second}},
		{"an older lift after a 0", []report{{time.Second, req0}, {500 * ms, req5}},
			[]time.Duration{2 * time.Second}, []time.Duration{21 * time.Second}},
	} {
		start := time.Now()
		u := &upstream{}
		rate := RateLimitConfig{}.withDefaults()
		for _, r := range tt.reports {
			noteHeadroomAt(u, wireHeader(t, r.header), start.Add(r.at), rate)
		}
		for _, d := range tt.demoted {
			if !u.outOfHeadroom(start.Add(d)) {
				t.Errorf("%s: not demoted %v after the start", tt.name, d)
			}
		}
		for _, d := range tt.restored {
			if u.outOfHeadroom(start.Add(d)) {
				t.Errorf("%s: still demoted %v after the start", tt.name, d)
			}
		}
	}
}

// Between full readings (headroomEvery apart), an answer with as many
// headers as the last one read is looked at only for the remaining counts
// that one had: a 0 in one of those is read at once, a 0 in another waits
// for the next reading; an answer with another number of headers is read
// for all.
func TestHeadroomReadsWhatItSent(t *testing.T) {
	const (
		req9   = "x-ratelimit-remaining-requests: 9\nx-request-id: 1\nserver: x"
		req0   = "x-ratelimit-remaining-requests: 0\nx-ratelimit-reset-requests: 20s\nserver: x"
		tok0   = "x-ratelimit-remaining-requests: 9\nanthropic-ratelimit-tokens-remaining: 0\nanthropic-ratelimit-tokens-reset: 2099-01-01T00:00:00Z"
		tok0NR = "x-ratelimit-remaining-requests: 9\nanthropic-ratelimit-tokens-remaining: 0"
	)
	rate := RateLimitConfig{}.withDefaults()
	start := time.Now()
	at := func(d time.Duration) time.Time { return start.Add(d) }
	for _, tc := range []struct {
		name   string
		second string
		read   bool // the second answer, 1 ms after the first, is read
	}{
		{"a 0 in a header sent before", req0, true},
		{"a 0 in a header not sent before", tok0, false},
		{"a 0 among another number of headers", tok0NR, true},
	} {
		u := &upstream{}
		noteHeadroomAt(u, wireHeader(t, req9), at(0), rate)
		noteHeadroomAt(u, wireHeader(t, tc.second), at(time.Millisecond), rate)
		if got := u.outOfHeadroom(at(time.Millisecond)); got != tc.read {
			t.Errorf("%s: demoted %v, want %v", tc.name, got, tc.read)
		}
		noteHeadroomAt(u, wireHeader(t, tc.second), at(headroomEvery), rate)
		if !u.outOfHeadroom(at(headroomEvery)) {
			t.Errorf("%s: the next reading did not read the 0", tc.name)
		}
	}
}

// End to end: an upstream demoted by a window at 0 that serves again while
// the others fail, and reports the window above 0, is first again for the
// next request (the old code kept it last for the hour of its reset). A
// window whose reset is at Unix millisecond 1e15, the year 33658, demotes
// for MaxCooldown, and Health's JSON encodes its reset (the old code kept
// the year, which encoding/json refuses).
func TestHeadroomDemotionOnTheWire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var left atomic.Int64
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			return respond(200, "a", "X-Ratelimit-Remaining-Requests", itoa(left.Load()), "X-Ratelimit-Reset-Requests", "1h"), nil
		})
		var bDown atomic.Bool
		n.handle("b.test", func(*http.Request) (*http.Response, error) {
			if bDown.Load() {
				return respond(503, "down"), nil
			}
			return respond(200, "b"), nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		first := func() string {
			t.Helper()
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", ""))
			if err != nil {
				t.Fatal(err)
			}
			return readBody(t, resp)
		}
		if got := first(); got != "a" || !tr.Health()[0].OutOfHeadroom {
			t.Fatalf("got %q; a not demoted after 0 left: %+v", got, tr.Health()[0])
		}
		if got := first(); got != "b" {
			t.Fatalf("got %q from the demoted upstream", got)
		}
		bDown.Store(true)
		left.Store(50)
		if got := first(); got != "a" {
			t.Fatalf("got %q; want a, with b down", got)
		}
		bDown.Store(false)
		if got := first(); got != "a" || tr.Health()[0].OutOfHeadroom {
			t.Fatalf("got %q, out of headroom %v: a reported 50 left and is still demoted", got, tr.Health()[0].OutOfHeadroom)
		}

		// A header a did not send before is read at the next full
		// reading, headroomEvery after the last.
		n.status("a.test", 200, "a", "X-Ratelimit-Remaining", "0", "X-Ratelimit-Reset", "1e15")
		time.Sleep(headroomEvery)
		first()
		h := tr.Health()[0]
		if !h.OutOfHeadroom {
			t.Fatalf("a not demoted by a window at 0: %+v", h)
		}
		if _, err := json.Marshal(h); err != nil {
			t.Errorf("Health's JSON: %v", err)
		}
		time.Sleep(time.Minute - time.Millisecond)
		if !tr.Health()[0].OutOfHeadroom {
			t.Error("the demotion ended before MaxCooldown")
		}
		time.Sleep(time.Millisecond)
		if tr.Health()[0].OutOfHeadroom {
			t.Error("demoted past MaxCooldown")
		}
	})
}

// FuzzHeadroom: ParseHeadroom and retryHint on arbitrary header blocks
// ("Name: value" lines, any dialect, garbage included) at an arbitrary now
// never panic, never change the header, say ok exactly when they report
// something, report no reset at or before now, agree with each other, and
// read what the 429 path needs.
func FuzzHeadroom(f *testing.F) {
	f.Fuzz(func(t *testing.T, block string, sec int64, nsec uint32) {
		if len(block) > 4<<10 {
			return
		}
		now := headroomFuzzNow(sec, nsec)
		h := http.Header{}
		for _, line := range strings.Split(block, "\n") {
			if name, value, ok := strings.Cut(line, ":"); ok {
				h.Add(strings.TrimSpace(name), value)
			}
		}
		before := h.Clone()

		hr, ok := ParseHeadroom(h, now)
		d, hintOK := retryHint(h, now)
		if !headersEqual(h, before) {
			t.Fatalf("the header changed from %q to %q", before, h)
		}
		in := func() string {
			return "at " + now.Format(time.RFC3339Nano) + " of " + strings.ReplaceAll(block, "\n", " | ")
		}
		switch {
		case hr.RemainingRequests < -1 || hr.RemainingTokens < -1:
			t.Fatalf("%s: ParseHeadroom = %+v: a remaining below -1", in(), hr)
		case !hr.Reset.IsZero() && !hr.Reset.After(now):
			t.Fatalf("%s: ParseHeadroom = %+v: a reset not after now", in(), hr)
		case ok != (hr != unknown):
			t.Fatalf("%s: ParseHeadroom = %+v, %v: ok says otherwise", in(), hr, ok)
		case hintOK && (d <= 0 || !ok):
			t.Fatalf("%s: retryHint = %v, true; ParseHeadroom = %+v, %v", in(), d, hr, ok)
		case hr.Reset.After(now.Add(maxDuration)):
			t.Fatalf("%s: ParseHeadroom = %+v: a reset beyond now plus the largest Duration", in(), hr)
		}
		// A success with these headers demotes its upstream exactly when
		// a window is exhausted, for at most MaxCooldown (on the monotonic
		// clock, which saturates centuries from now).
		if now.Sub(time.Now()).Abs() < 100*365*24*time.Hour {
			u := &upstream{}
			rate := RateLimitConfig{}.withDefaults()
			noteHeadroomAt(u, h, now, rate)
			if got := u.outOfHeadroom(now); got != hr.Exhausted() {
				t.Fatalf("%s: demoted %v, exhausted %v (%+v)", in(), got, hr.Exhausted(), hr)
			}
			if left := mono.Time(u.headroom.until.Load()).Sub(mono.Of(now)); hr.Exhausted() && left > rate.MaxCooldown {
				t.Fatalf("%s: demoted for %v, beyond MaxCooldown", in(), left)
			}
		}
		// retryHint waits for the exhausted window's reset; with none
		// exhausted, for the latest reset, which is not before the
		// earliest (Headroom.Reset). A wait too long for a Duration is
		// capped, so it says nothing of the instant.
		switch {
		case hr.Reset.IsZero() && !hr.Exhausted() && hintOK:
			t.Fatalf("%s: retryHint = %v, true; no reset announced (%+v)", in(), d, hr)
		case !hr.Reset.IsZero() && !hintOK:
			t.Fatalf("%s: retryHint not ok; ParseHeadroom = %+v", in(), hr)
		case hr.Reset.IsZero() || d == maxDuration:
		case hr.Exhausted() && !now.Add(d).Equal(hr.Reset):
			t.Fatalf("%s: retryHint = %v, the exhausted window resets at %s", in(), d, hr.Reset)
		case !hr.Exhausted() && now.Add(d).Before(hr.Reset):
			t.Fatalf("%s: retryHint = %v, before the earliest reset %s", in(), d, hr.Reset)
		}

		// Nothing else counts: not unrelated headers, not a second call.
		h2 := h.Clone()
		h2.Set("Retry-After", "7")
		h2.Set("X-Ratelimit-Limit-Requests", "0")
		h2.Set("Anthropic-Ratelimit-Tokens-Limit", "0")
		h2.Set("Date", "Sun, 06 Nov 1994 08:49:37 GMT")
		hr2, ok2 := ParseHeadroom(h2, now)
		d2, hintOK2 := retryHint(h2, now)
		if hr2 != hr || ok2 != ok || d2 != d || hintOK2 != hintOK {
			t.Fatalf("%s: with unrelated headers ParseHeadroom = %+v, %v and retryHint = %v, %v; without %+v, %v and %v, %v",
				in(), hr2, ok2, d2, hintOK2, hr, ok, d, hintOK)
		}
	})
}

// headroomFuzzNow maps any sec and nsec onto a time in years 1970 to 9999,
// with nanoseconds.
func headroomFuzzNow(sec int64, nsec uint32) time.Time {
	const hi = 253402300799 // 9999-12-31T23:59:59Z
	if sec < 0 || sec > hi {
		sec = (sec%hi + hi) % hi
	}
	return time.Unix(sec, int64(nsec%1e9)).UTC()
}

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

// noteHeadroomAt is u.noteHeadroom at now, converted as an attempt does.
func noteHeadroomAt(u *upstream, h http.Header, now time.Time, rate RateLimitConfig) {
	u.noteHeadroom(h, now, mono.Of(now), rate)
}
