package ratelimit

import (
	"bufio"
	"math"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"testing"
	"time"
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
// RetryHint read from it at now.
type headroomCase struct {
	name   string
	now    time.Time
	header string
	want   Headroom
	ok     bool
	hint   time.Duration // 0 when RetryHint is not ok
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
	hint, hintOK := RetryHint(h, tt.now)
	if hint != tt.hint || hintOK != (tt.hint != 0) {
		t.Errorf("%s: RetryHint = %v, %v; want %v, %v", tt.name, hint, hintOK, tt.hint, tt.hint != 0)
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
		// is unknown, and RetryHint falls back on the latest reset.
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
		// RFC 3339 allows a lower-case t and z, and a space for the t
		// (section 5.6); time.RFC3339 takes neither.
		{"lower-case t and z", now, "anthropic-ratelimit-tokens-remaining: 0\nanthropic-ratelimit-tokens-reset: " +
			strings.ToLower(now.Add(20*time.Second).Format(time.RFC3339)),
			Headroom{-1, 0, now.Add(20 * time.Second)}, true, 20 * time.Second},
		{"space for the t", now, "anthropic-ratelimit-requests-remaining: 0\nanthropic-ratelimit-requests-reset: " +
			now.Add(2500*time.Millisecond).Format("2006-01-02 15:04:05.000Z07:00"),
			Headroom{0, -1, now.Add(2500 * time.Millisecond)}, true, 2500 * time.Millisecond},
		{"nine digits of fraction, offset -00:00", now, "anthropic-ratelimit-output-tokens-remaining: 0\nanthropic-ratelimit-output-tokens-reset: " +
			strings.Replace(now.Add(time.Second+time.Nanosecond).Format(time.RFC3339Nano), "Z", "-00:00", 1),
			Headroom{-1, 0, now.Add(time.Second + time.Nanosecond)}, true, time.Second + time.Nanosecond},
		// Gateways that speak Anthropic's API give its resets as OpenAI's
		// and X-RateLimit-Reset's forms: they are read as those are.
		{"a duration", now, "anthropic-ratelimit-input-tokens-remaining: 0\nanthropic-ratelimit-input-tokens-reset: 1m30.5s",
			Headroom{-1, 0, now.Add(90500 * time.Millisecond)}, true, 90500 * time.Millisecond},
		{"Unix seconds", now, "anthropic-ratelimit-requests-remaining: 0\nanthropic-ratelimit-requests-reset: " + strconv.FormatInt(now.Add(40*time.Second).Unix(), 10),
			Headroom{0, -1, now.Add(40 * time.Second)}, true, 40 * time.Second},
		{"seconds from now", now, "anthropic-ratelimit-tokens-remaining: 0\nanthropic-ratelimit-tokens-reset: 12",
			Headroom{-1, 0, now.Add(12 * time.Second)}, true, 12 * time.Second},
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
// wire gives: each alone is read (Read looks up nothing when no key
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

// ZeroRemaining reads a count of 0 as ParseHeadroom does, in every header
// of a remaining count when h has another number of headers than the
// answer SentHeaders described, and only in those that answer had when h
// has as many.
func TestZeroRemaining(t *testing.T) {
	for _, v := range []string{"0", "00", "+0", "-0", " 0 ", "0, 5", "0,5"} {
		h := http.Header{"X-Ratelimit-Remaining": {v}}
		if got, want := ZeroRemaining(h, 0), Read(h, openAIDate).Exhausted; got != true || want != true {
			t.Errorf("%q: ZeroRemaining = %v, Read's Exhausted = %v; want true, true", v, got, want)
		}
	}
	for _, v := range []string{"", "1", "10", "01", "-", "+", "0x0", "zero", "5, 0"} {
		h := http.Header{"Ratelimit-Remaining": {v}}
		if got, want := ZeroRemaining(h, 0), Read(h, openAIDate).Exhausted; got || want {
			t.Errorf("%q: ZeroRemaining = %v, Read's Exhausted = %v; want false, false", v, got, want)
		}
	}

	sent := SentHeaders(http.Header{"X-Ratelimit-Remaining-Requests": {"9"}, "Server": {"x"}})
	for _, tt := range []struct {
		name string
		h    http.Header
		want bool
	}{
		{"a 0 in a header sent before", http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "Server": {"x"}}, true},
		{"a 0 in a header not sent before", http.Header{"Anthropic-Ratelimit-Tokens-Remaining": {"0"}, "Server": {"x"}}, false},
		{"a 0 among another number of headers", http.Header{"Anthropic-Ratelimit-Tokens-Remaining": {"0"}}, true},
	} {
		if got := ZeroRemaining(tt.h, sent); got != tt.want {
			t.Errorf("%s: ZeroRemaining = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestReportShare(t *testing.T) {
	now := openAIDate
	for _, tt := range []struct {
		name   string
		header string
		share  float64
		reset  time.Duration // from now; 0 for none
		ok     bool
	}{
		{"openai requests lowest", "x-ratelimit-limit-requests: 500\nx-ratelimit-remaining-requests: 50\nx-ratelimit-reset-requests: 6s\nx-ratelimit-limit-tokens: 1000\nx-ratelimit-remaining-tokens: 900\nx-ratelimit-reset-tokens: 1s", 0.1, 6 * time.Second, true},
		{"openai tokens lowest", "x-ratelimit-limit-requests: 500\nx-ratelimit-remaining-requests: 499\nx-ratelimit-limit-tokens: 1000\nx-ratelimit-remaining-tokens: 20\nx-ratelimit-reset-tokens: 2s", 0.02, 2 * time.Second, true},
		{"anthropic output tokens", "anthropic-ratelimit-requests-limit: 50\nanthropic-ratelimit-requests-remaining: 49\nanthropic-ratelimit-output-tokens-limit: 8000\nanthropic-ratelimit-output-tokens-remaining: 400\nanthropic-ratelimit-output-tokens-reset: 2025-08-20T11:56:54Z", 0.05, time.Minute, true},
		{"x-ratelimit", "X-RateLimit-Limit: 20\nX-RateLimit-Remaining: 5\nX-RateLimit-Reset: 30", 0.25, 30 * time.Second, true},
		{"ietf with a policy", "RateLimit-Limit: 100, 100;w=60\nRateLimit-Remaining: 10\nRateLimit-Reset: 50", 0.1, 50 * time.Second, true},
		{"ietf policy alone", "RateLimit-Limit: 100;w=60\nRateLimit-Remaining: 100", 1, 0, true},
		{"more left than the limit", "X-RateLimit-Limit: 10\nX-RateLimit-Remaining: 20", 1, 0, true},
		{"no limit", "x-ratelimit-remaining-requests: 1", 0, 0, false},
		{"limit of 0", "x-ratelimit-limit-requests: 0\nx-ratelimit-remaining-requests: 0", 0, 0, false},
		{"limit without remaining", "x-ratelimit-limit-requests: 100", 0, 0, false},
		{"bad limit", "x-ratelimit-limit-requests: lots\nx-ratelimit-remaining-requests: 1", 0, 0, false},
		{"none", "", 0, 0, false},
	} {
		r := Read(wireHeader(t, tt.header), now)
		share, reset, ok := r.Share()
		var wantReset time.Time
		if tt.reset != 0 {
			wantReset = now.Add(tt.reset)
		}
		if share != tt.share || !reset.Equal(wantReset) || ok != tt.ok {
			t.Errorf("%s: Share = %v, %v, %v; want %v, %v, %v", tt.name, share, reset, ok, tt.share, wantReset, tt.ok)
		}
	}
}
