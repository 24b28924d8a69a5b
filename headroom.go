package failover

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// Headroom is what a provider's rate-limit headers say is left before it
// answers 429, as [ParseHeadroom] reads it. Unknown counts are -1, so a
// Headroom that knows nothing is Headroom{-1, -1, time.Time{}}, not the
// zero Headroom (which reports none left).
type Headroom struct {
	// RemainingRequests and RemainingTokens are the requests and tokens
	// left in the provider's current windows; -1 means the provider did not
	// say. Where a provider reports several windows of one kind
	// (Anthropic's tokens, input tokens and output tokens) the smallest
	// remaining counts.
	RemainingRequests, RemainingTokens int64

	// Reset is when the exhausted window resets (the latest of them when
	// several are exhausted) or, if none is exhausted, when the earliest
	// announced window resets. It is zero when unknown: not announced, or
	// announced in the past, which says more of the clocks than of the
	// provider. A reset further from now than the largest Duration (about
	// 292 years) is read as that far.
	Reset time.Time
}

// Exhausted reports whether the provider said that no requests or no tokens
// are left: a reported remaining of 0.
func (h Headroom) Exhausted() bool {
	return h.RemainingRequests == 0 || h.RemainingTokens == 0
}

// ParseHeadroom reads the rate-limit headers of a response in every dialect
// it knows:
//
//   - OpenAI and the APIs that copy it: x-ratelimit-remaining-requests and
//     x-ratelimit-remaining-tokens, with x-ratelimit-reset-requests and
//     x-ratelimit-reset-tokens as durations from now ("6ms", "0s",
//     "6m0s", "1m30.5s"; a leading "2d" and a bare number of seconds are
//     read too);
//   - Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,
//     output-tokens}-{remaining,reset}, resets as RFC 3339 times;
//   - OpenRouter and many others: X-RateLimit-Remaining (requests) and
//     X-RateLimit-Reset as a Unix time in milliseconds (a number above
//     1e11) or seconds (above 1e9), or else as seconds from now;
//   - the IETF draft: RateLimit-Remaining (requests) and RateLimit-Reset in
//     seconds from now (read as X-RateLimit-Reset is).
//
// Of a header given twice, or as a comma-separated list, the first value
// counts. Numbers are decimal ("Inf", "NaN" and hexadecimal are not).
// Negative and unparsable values are ignored, and so is a reset at or
// before now. A count too large for an int64 is read as the largest, and a
// reset too far for a Duration from now (a duration or a Unix time beyond
// one) as now plus the largest Duration.
// ok reports whether any of these headers held a usable value; when it is
// false, hr is Headroom{-1, -1, time.Time{}}. Gemini says nothing of its
// headroom in headers (its 429 body carries a retryDelay).
func ParseHeadroom(h http.Header, now time.Time) (hr Headroom, ok bool) {
	r := readHeadroom(h, now)
	return r.headroom(), r.any
}

// retryHint returns how long a 429 that carries no Retry-After should wait,
// from the rate-limit headers ParseHeadroom reads: until the exhausted
// window resets (the latest of them when several report 0 remaining) or,
// when no window reports 0 remaining or none of those announces its reset,
// until the latest reset announced. ok is false when no reset in the future
// is announced.
func retryHint(h http.Header, now time.Time) (time.Duration, bool) {
	r := readHeadroom(h, now)
	at := r.exhaustedReset
	if at.IsZero() {
		at = r.latest
	}
	if at.IsZero() {
		return 0, false
	}
	return at.Sub(now), true
}

// headroomReader gathers the rate-limit windows of one response, of every
// dialect.
type headroomReader struct {
	now              time.Time
	requests, tokens int64 // smallest remaining of each kind; -1 when unknown
	exhausted        bool
	exhaustedReset   time.Time // latest reset of a window with 0 remaining
	earliest, latest time.Time // of every reset announced
	any              bool      // a usable value was seen
}

func readHeadroom(h http.Header, now time.Time) headroomReader {
	r := headroomReader{now: now, requests: -1, tokens: -1}
	if len(h) == 0 {
		return r
	}
	r.openAI(h)
	r.anthropic(h)
	r.xRateLimit(h)
	r.ietf(h)
	return r
}

func (r *headroomReader) headroom() Headroom {
	hr := Headroom{RemainingRequests: r.requests, RemainingTokens: r.tokens, Reset: r.earliest}
	if r.exhausted {
		hr.Reset = r.exhaustedReset
	}
	return hr
}

// window records one rate-limit window: its remaining (-1 when unknown) and
// its reset (zero when unknown). A reset at or before now is dropped, and
// one beyond now plus the largest Duration is brought back to it.
func (r *headroomReader) window(tokens bool, remaining int64, reset time.Time) {
	if !reset.After(r.now) {
		reset = time.Time{}
	} else if far := r.now.Add(maxDuration); reset.After(far) {
		reset = far
	}
	if remaining < 0 && reset.IsZero() {
		return
	}
	r.any = true
	if remaining >= 0 {
		p := &r.requests
		if tokens {
			p = &r.tokens
		}
		if *p < 0 || remaining < *p {
			*p = remaining
		}
	}
	if remaining == 0 {
		r.exhausted = true
		if reset.After(r.exhaustedReset) {
			r.exhaustedReset = reset
		}
	}
	if reset.IsZero() {
		return
	}
	if r.earliest.IsZero() || reset.Before(r.earliest) {
		r.earliest = reset
	}
	if reset.After(r.latest) {
		r.latest = reset
	}
}

// openAI reads x-ratelimit-{remaining,reset}-{requests,tokens}, resets as
// durations from now.
func (r *headroomReader) openAI(h http.Header) {
	r.window(false, parseRemaining(headerValue(h, "X-Ratelimit-Remaining-Requests")),
		r.after(parseResetDuration(headerValue(h, "X-Ratelimit-Reset-Requests"))))
	r.window(true, parseRemaining(headerValue(h, "X-Ratelimit-Remaining-Tokens")),
		r.after(parseResetDuration(headerValue(h, "X-Ratelimit-Reset-Tokens"))))
}

// anthropicWindows are the windows of anthropic-ratelimit-*, and whether
// each counts tokens.
var anthropicWindows = [...]struct {
	remaining, reset string
	tokens           bool
}{
	{"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset", false},
	{"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset", true},
	{"Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset", true},
	{"Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset", true},
}

// anthropic reads anthropic-ratelimit-*-{remaining,reset}, resets as RFC
// 3339 times.
func (r *headroomReader) anthropic(h http.Header) {
	for _, w := range anthropicWindows {
		var reset time.Time
		if v := headerValue(h, w.reset); v != "" {
			if t, err := time.Parse(time.RFC3339, v); err == nil {
				reset = t
			}
		}
		r.window(w.tokens, parseRemaining(headerValue(h, w.remaining)), reset)
	}
}

// xRateLimit reads X-RateLimit-Remaining and X-RateLimit-Reset (OpenRouter
// and others), a window of requests.
func (r *headroomReader) xRateLimit(h http.Header) {
	r.window(false, parseRemaining(headerValue(h, "X-Ratelimit-Remaining")),
		parseResetNumber(headerValue(h, "X-Ratelimit-Reset"), r.now))
}

// ietf reads RateLimit-Remaining and RateLimit-Reset (the IETF draft), a
// window of requests.
func (r *headroomReader) ietf(h http.Header) {
	r.window(false, parseRemaining(headerValue(h, "Ratelimit-Remaining")),
		parseResetNumber(headerValue(h, "Ratelimit-Reset"), r.now))
}

// after returns now+d, or the zero Time when ok is false.
func (r *headroomReader) after(d time.Duration, ok bool) time.Time {
	if !ok {
		return time.Time{}
	}
	return r.now.Add(d)
}

// headerValue returns the first value of the header name (given in
// canonical form), up to any comma, without surrounding spaces.
func headerValue(h http.Header, name string) string {
	v := h[name]
	if len(v) == 0 {
		return ""
	}
	s, _, _ := strings.Cut(v[0], ",")
	return strings.TrimSpace(s)
}

// parseRemaining reads a count of what is left: a whole number >= 0, or -1.
// A count too large for an int64 is read as the largest.
func parseRemaining(v string) int64 {
	if v == "" {
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil && n != math.MaxInt64 { // ParseInt returns MaxInt64 for a count out of range
		return -1
	}
	if n < 0 {
		return -1
	}
	return n
}

// parseResetDuration reads OpenAI's reset: a Go duration ("6ms", "0s",
// "6m0s", "1m30.5s"), with a leading number of days ("1d2h") allowed, or a
// bare decimal number of seconds. Negative and unparsable values are not
// ok; one too long for a Duration is the largest Duration.
func parseResetDuration(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if c := v[len(v)-1]; isDigit(c) || c == '.' { // no unit: seconds
		secs, ok := parseDecimal(v)
		if !ok || secs < 0 {
			return 0, false
		}
		return durationOf(secs, time.Second), true
	}
	var days time.Duration
	if i := strings.IndexByte(v, 'd'); i > 0 {
		n, err := strconv.ParseUint(v[:i], 10, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, false
		}
		days, v = maxDuration, v[i+1:]
		if n <= uint64(maxDuration/(24*time.Hour)) {
			days = time.Duration(n) * 24 * time.Hour
		}
		if v == "" {
			return days, true
		}
	}
	d, ok := parseDuration(v)
	if !ok {
		return 0, false
	}
	return days + min(d, maxDuration-days), true
}

// parseResetNumber reads X-RateLimit-Reset: a Unix time in milliseconds (a
// number above 1e11) or seconds (above 1e9), or else seconds from now, a
// decimal number. It returns the zero Time for a negative or unparsable
// value, and the last Unix millisecond for a number beyond them.
func parseResetNumber(v string, now time.Time) time.Time {
	n, ok := parseDecimal(v)
	if !ok || n < 0 {
		return time.Time{}
	}
	switch {
	case n >= 1<<63: // past any int64 of milliseconds, +Inf included
		return time.UnixMilli(math.MaxInt64)
	case n > 1e11: // Unix milliseconds
		return time.UnixMilli(int64(n))
	case n > 1e9: // Unix seconds
		sec, frac := math.Modf(n)
		return time.Unix(int64(sec), int64(frac*1e9))
	default: // seconds from now
		return now.Add(time.Duration(n * float64(time.Second)))
	}
}

// headroomState is what an upstream last said of its rate-limit headroom.
type headroomState struct {
	at    atomic.Int64 // mono.Time of the last full parse
	last  atomic.Pointer[Headroom]
	until atomic.Int64 // mono.Time: demoted until then (a window at 0)
}

// remainingHeaders are where the dialects put their remaining counts: a
// success with one of them at 0 is read at once; otherwise the headers are
// read at most every headroomEvery.
var remainingHeaders = []string{
	"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Remaining-Tokens",
	"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Tokens-Remaining",
	"Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Remaining",
	"X-Ratelimit-Remaining", "Ratelimit-Remaining",
}

const headroomEvery = 100 * time.Millisecond

func zeroRemaining(h http.Header) bool {
	for _, k := range remainingHeaders {
		if v := h[k]; len(v) > 0 && strings.TrimSpace(v[0]) == "0" {
			return true
		}
	}
	return false
}

// noteHeadroom reads what a success says of u's headroom. When a window is
// exhausted, u goes behind the others until that window resets (or, when
// the provider does not say when, for fallback).
func (u *upstream) noteHeadroom(h http.Header, now time.Time, fallback time.Duration) {
	at, m := u.headroom.at.Load(), mono.Of(now)
	zero := zeroRemaining(h)
	if !zero && ((at != 0 && m.Sub(mono.Time(at)) < headroomEvery) || !u.headroom.at.CompareAndSwap(at, int64(m))) {
		return
	}
	hr, ok := ParseHeadroom(h, now)
	if !ok {
		return
	}
	u.headroom.last.Store(&hr)
	if hr.Exhausted() {
		// Reset is a wall-clock time (a provider's header): what is
		// kept is how long from now, on the monotonic clock.
		left := fallback
		if !hr.Reset.IsZero() {
			left = hr.Reset.Sub(now)
		}
		u.headroom.until.Store(int64(m.Add(left)))
	}
}

// outOfHeadroom reports whether u said at its last success that a window
// is exhausted, and that window has not reset yet.
func (u *upstream) outOfHeadroom(now time.Time) bool {
	until := mono.Time(u.headroom.until.Load())
	return until != 0 && mono.Of(now) < until
}
