package ratelimit

import (
	"errors"
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Headroom is what a provider's rate-limit headers say is left before it
// answers 429, as [ParseHeadroom] reads it: the fields of
// failover.Headroom, which converts from it. Unknown counts are -1, and
// an unknown Reset is zero.
type Headroom struct {
	RemainingRequests, RemainingTokens int64
	Reset                              time.Time
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
//     output-tokens}-{remaining,reset}, resets as RFC 3339 times (the T
//     and Z in either case, or a space for the T), or as gateways give
//     them, a duration read as OpenAI's and a number as
//     X-RateLimit-Reset is;
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
// reset too far for a Duration from now as now plus the largest Duration.
// ok reports whether any of these headers held a usable value; when it is
// false, hr is Headroom{-1, -1, time.Time{}}.
func ParseHeadroom(h http.Header, now time.Time) (hr Headroom, ok bool) {
	r := Read(h, now)
	return r.Headroom(), r.Any
}

// RetryHint returns how long a 429 that carries no Retry-After should wait,
// from the rate-limit headers ParseHeadroom reads: until the exhausted
// window resets (the latest of them when several report 0 remaining) or,
// when no window reports 0 remaining or none of those announces its reset,
// until the latest reset announced. ok is false when no reset in the future
// is announced.
func RetryHint(h http.Header, now time.Time) (time.Duration, bool) {
	r := Read(h, now)
	at := r.exhaustedReset
	if at.IsZero() {
		at = r.latest
	}
	if at.IsZero() {
		return 0, false
	}
	return at.Sub(now), true
}

// The rate-limit windows of every dialect, in the order of
// remainingHeaders.
const (
	winOpenAIRequests = iota
	winOpenAITokens
	winAnthropicRequests
	winAnthropicTokens
	winAnthropicInputTokens
	winAnthropicOutputTokens
	winXRateLimit
	winIETF

	// NumWindows is the number of rate-limit windows of every dialect
	// that a Report tells apart.
	NumWindows
)

// Report is what the rate-limit headers of one response say, of every
// dialect: each window on its own, and the [Headroom] they add up to.
type Report struct {
	now              time.Time
	requests, tokens int64 // smallest remaining of each kind; -1 when unknown

	// Exhausted reports whether a window reported 0 remaining.
	Exhausted bool

	exhaustedReset   time.Time // latest reset of a window with 0 remaining
	earliest, latest time.Time // of every reset announced

	// Any reports whether a header held a usable value.
	Any bool

	// Windows are each window's own report, in a fixed order: a window
	// of one response is Windows[i] of any other.
	Windows [NumWindows]Window
}

// Window is one rate-limit window's report.
type Window struct {
	Remaining int64     // -1 when unknown
	Limit     int64     // the window's size; -1 when unknown, as before Read
	Reset     time.Time // zero when unknown or at or before now
}

// Read reads the rate-limit headers of h at now, as [ParseHeadroom]
// documents, window by window.
func Read(h http.Header, now time.Time) Report {
	r := Report{now: now, requests: -1, tokens: -1}
	for i := range r.Windows {
		r.Windows[i].Limit = -1
	}
	if !anyRateLimitHeader(h) {
		return r // nothing to read: most answers of most upstreams
	}
	r.openAI(h)
	r.anthropic(h)
	r.xRateLimit(h)
	r.ietf(h)
	return r
}

// anyRateLimitHeader reports whether h has a key that Read may read: each
// begins with one of these, in canonical form, as headerValue looks them
// up. One pass over the keys costs less than the sixteen lookups it spares
// an answer without them.
func anyRateLimitHeader(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, "X-Ratelimit-") || strings.HasPrefix(k, "Ratelimit-") || strings.HasPrefix(k, "Anthropic-Ratelimit-") {
			return true
		}
	}
	return false
}

// Headroom returns what the windows of r add up to: the smallest remaining
// of each kind, and the reset of the exhausted windows (the latest) or, if
// none is exhausted, the earliest reset.
func (r *Report) Headroom() Headroom {
	hr := Headroom{RemainingRequests: r.requests, RemainingTokens: r.tokens, Reset: r.earliest}
	if r.Exhausted {
		hr.Reset = r.exhaustedReset
	}
	return hr
}

// Share returns the smallest share of its limit that a window of r has
// left (remaining/limit, at most 1), of the windows that report both a
// remaining count and a limit above 0, with that window's reset (zero when
// unknown). ok is false when no window reports both.
func (r *Report) Share() (share float64, reset time.Time, ok bool) {
	for _, w := range r.Windows {
		if w.Remaining < 0 || w.Limit <= 0 {
			continue
		}
		s := min(float64(w.Remaining)/float64(w.Limit), 1)
		if !ok || s < share {
			share, reset, ok = s, w.Reset, true
		}
	}
	return share, reset, ok
}

// limit records the limit of window w, as the header value v gives it.
func (r *Report) limit(w int, v string) {
	v, _, _ = strings.Cut(v, ";") // the IETF draft's "100;w=60"
	r.Windows[w].Limit = parseRemaining(strings.TrimSpace(v))
}

// window records rate-limit window w: its remaining (-1 when unknown) and
// its reset (zero when unknown). A reset at or before now is dropped, and
// one beyond now plus the largest Duration is brought back to it.
func (r *Report) window(w int, tokens bool, remaining int64, reset time.Time) {
	r.Windows[w].Remaining = remaining
	if !reset.After(r.now) {
		reset = time.Time{}
	} else if far := r.now.Add(maxDuration); reset.After(far) {
		reset = far
	}
	r.Windows[w].Reset = reset
	if remaining < 0 && reset.IsZero() {
		return
	}
	r.Any = true
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
		r.Exhausted = true
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
func (r *Report) openAI(h http.Header) {
	r.window(winOpenAIRequests, false, parseRemaining(headerValue(h, "X-Ratelimit-Remaining-Requests")),
		r.after(parseResetDuration(headerValue(h, "X-Ratelimit-Reset-Requests"))))
	r.window(winOpenAITokens, true, parseRemaining(headerValue(h, "X-Ratelimit-Remaining-Tokens")),
		r.after(parseResetDuration(headerValue(h, "X-Ratelimit-Reset-Tokens"))))
	r.limit(winOpenAIRequests, headerValue(h, "X-Ratelimit-Limit-Requests"))
	r.limit(winOpenAITokens, headerValue(h, "X-Ratelimit-Limit-Tokens"))
}

// anthropicWindows are the windows of anthropic-ratelimit-*, and whether
// each counts tokens.
var anthropicWindows = [...]struct {
	w                       int
	remaining, reset, limit string
	tokens                  bool
}{
	{winAnthropicRequests, "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset", "Anthropic-Ratelimit-Requests-Limit", false},
	{winAnthropicTokens, "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset", "Anthropic-Ratelimit-Tokens-Limit", true},
	{winAnthropicInputTokens, "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset", "Anthropic-Ratelimit-Input-Tokens-Limit", true},
	{winAnthropicOutputTokens, "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset", "Anthropic-Ratelimit-Output-Tokens-Limit", true},
}

// anthropic reads anthropic-ratelimit-*-{remaining,reset,limit} (see
// resetTime).
func (r *Report) anthropic(h http.Header) {
	for _, w := range anthropicWindows {
		r.window(w.w, w.tokens, parseRemaining(headerValue(h, w.remaining)), r.resetTime(headerValue(h, w.reset)))
		r.limit(w.w, headerValue(h, w.limit))
	}
}

// resetTime reads an Anthropic reset: an RFC 3339 time, with the T and Z
// in either case and the T or a space between date and time, as RFC 3339
// (section 5.6) allows. Gateways that speak Anthropic's API may give it as
// the other dialects do: a duration with a unit is read as OpenAI's reset
// is, and a number as X-RateLimit-Reset is. Anything else is the zero
// Time.
func (r *Report) resetTime(v string) time.Time {
	if v == "" {
		return time.Time{}
	}
	if t, ok := parseRFC3339(v); ok {
		return t
	}
	if c := v[len(v)-1]; !isDigit(c) && c != '.' {
		return r.after(parseResetDuration(v))
	}
	return parseResetNumber(v, r.now)
}

// parseRFC3339 reads an RFC 3339 time as time.RFC3339 does, and also with
// a lower-case t or z or a space for the t.
func parseRFC3339(v string) (time.Time, bool) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, true
	}
	const maxLen = 64 // far more than a date, a time to the nanosecond and an offset
	if len(v) < len("2006-01-02T15:04:05Z") || len(v) > maxLen {
		return time.Time{}, false
	}
	var b [maxLen]byte
	n := copy(b[:], v)
	switch b[10] {
	case 't', ' ':
		b[10] = 'T'
	}
	if b[n-1] == 'z' {
		b[n-1] = 'Z'
	}
	t, err := time.Parse(time.RFC3339, string(b[:n]))
	return t, err == nil
}

// xRateLimit reads X-RateLimit-{Remaining,Reset,Limit} (OpenRouter and
// others), a window of requests.
func (r *Report) xRateLimit(h http.Header) {
	r.window(winXRateLimit, false, parseRemaining(headerValue(h, "X-Ratelimit-Remaining")),
		parseResetNumber(headerValue(h, "X-Ratelimit-Reset"), r.now))
	r.limit(winXRateLimit, headerValue(h, "X-Ratelimit-Limit"))
}

// ietf reads RateLimit-{Remaining,Reset,Limit} (the IETF draft), a window
// of requests. Of a Limit with a policy ("100, 100;w=60"), the first
// number counts.
func (r *Report) ietf(h http.Header) {
	r.window(winIETF, false, parseRemaining(headerValue(h, "Ratelimit-Remaining")),
		parseResetNumber(headerValue(h, "Ratelimit-Reset"), r.now))
	r.limit(winIETF, headerValue(h, "Ratelimit-Limit"))
}

// after returns now+d, or the zero Time when ok is false.
func (r *Report) after(d time.Duration, ok bool) time.Time {
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

// remainingHeaders are where the dialects put their remaining counts, in
// the order of the windows (winOpenAIRequests...).
var remainingHeaders = []string{
	"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Remaining-Tokens",
	"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Tokens-Remaining",
	"Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Remaining",
	"X-Ratelimit-Remaining", "Ratelimit-Remaining",
}

// SentHeaders returns which remaining counts h has (bit i: the header of
// window i) and, above bit 32, its number of headers: what [ZeroRemaining]
// takes to look at an answer like h for only the counts h had.
func SentHeaders(h http.Header) uint64 {
	var set uint64
	for i, k := range remainingHeaders {
		if _, ok := h[k]; ok {
			set |= 1 << i
		}
	}
	return set | uint64(min(len(h), math.MaxUint32))<<32
}

// ZeroRemaining reports whether a remaining count of h reads as 0, as
// ParseHeadroom reads it ("0", "00", "+0", "0, 5"). When h has as many
// headers as the answer that sent (see [SentHeaders]) describes, it looks
// only at the counts that one had, so that a healthy answer costs a lookup
// for each count its upstream sends, not for each a dialect might.
func ZeroRemaining(h http.Header, sent uint64) bool {
	set := uint32(1<<len(remainingHeaders) - 1)
	if int(sent>>32) == len(h) {
		set = uint32(sent)
	}
	for ; set != 0; set &= set - 1 {
		if v := h[remainingHeaders[bits.TrailingZeros32(set)]]; len(v) > 0 && isZero(v[0]) {
			return true
		}
	}
	return false
}

// isZero reports whether the first value of a header, up to any comma and
// without surrounding spaces, is a count of 0.
func isZero(v string) bool {
	switch { // the common answers first: "0", and a count that begins otherwise
	case v == "0":
		return true
	case v == "" || '1' <= v[0] && v[0] <= '9':
		return false
	}
	v, _, _ = strings.Cut(v, ",")
	v = strings.TrimSpace(v)
	if v != "" && (v[0] == '+' || v[0] == '-') {
		v = v[1:]
	}
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] != '0' {
			return false
		}
	}
	return true
}
