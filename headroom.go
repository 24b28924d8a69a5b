package failover

import (
	"errors"
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"sync"
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

// The rate-limit windows of every dialect, in the order of
// remainingHeaders. A demotion belongs to one of them.
const (
	winOpenAIRequests = iota
	winOpenAITokens
	winAnthropicRequests
	winAnthropicTokens
	winAnthropicInputTokens
	winAnthropicOutputTokens
	winXRateLimit
	winIETF
	numWindows
)

// headroomReader gathers the rate-limit windows of one response, of every
// dialect.
type headroomReader struct {
	now              time.Time
	requests, tokens int64 // smallest remaining of each kind; -1 when unknown
	exhausted        bool
	exhaustedReset   time.Time // latest reset of a window with 0 remaining
	earliest, latest time.Time // of every reset announced
	any              bool      // a usable value was seen

	// Each window's own report, for demotions: remaining (-1 when
	// unknown) and reset (zero when unknown).
	windows [numWindows]struct {
		remaining int64
		reset     time.Time
	}
}

func readHeadroom(h http.Header, now time.Time) headroomReader {
	r := headroomReader{now: now, requests: -1, tokens: -1}
	if !anyRateLimitHeader(h) {
		return r // nothing to read: most answers of most upstreams
	}
	r.openAI(h)
	r.anthropic(h)
	r.xRateLimit(h)
	r.ietf(h)
	return r
}

// anyRateLimitHeader reports whether h has a key that readHeadroom may
// read: each begins with one of these, in canonical form, as headerValue
// looks them up. One pass over the keys costs less than the sixteen
// lookups it spares an answer without them, and stops at the first key
// of an answer with them.
func anyRateLimitHeader(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, "X-Ratelimit-") || strings.HasPrefix(k, "Ratelimit-") || strings.HasPrefix(k, "Anthropic-Ratelimit-") {
			return true
		}
	}
	return false
}

func (r *headroomReader) headroom() Headroom {
	hr := Headroom{RemainingRequests: r.requests, RemainingTokens: r.tokens, Reset: r.earliest}
	if r.exhausted {
		hr.Reset = r.exhaustedReset
	}
	return hr
}

// window records rate-limit window w: its remaining (-1 when unknown) and
// its reset (zero when unknown). A reset at or before now is dropped, and
// one beyond now plus the largest Duration is brought back to it.
func (r *headroomReader) window(w int, tokens bool, remaining int64, reset time.Time) {
	r.windows[w].remaining = remaining
	if !reset.After(r.now) {
		reset = time.Time{}
	} else if far := r.now.Add(maxDuration); reset.After(far) {
		reset = far
	}
	r.windows[w].reset = reset
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
	r.window(winOpenAIRequests, false, parseRemaining(headerValue(h, "X-Ratelimit-Remaining-Requests")),
		r.after(parseResetDuration(headerValue(h, "X-Ratelimit-Reset-Requests"))))
	r.window(winOpenAITokens, true, parseRemaining(headerValue(h, "X-Ratelimit-Remaining-Tokens")),
		r.after(parseResetDuration(headerValue(h, "X-Ratelimit-Reset-Tokens"))))
}

// anthropicWindows are the windows of anthropic-ratelimit-*, and whether
// each counts tokens.
var anthropicWindows = [...]struct {
	w                int
	remaining, reset string
	tokens           bool
}{
	{winAnthropicRequests, "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset", false},
	{winAnthropicTokens, "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset", true},
	{winAnthropicInputTokens, "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset", true},
	{winAnthropicOutputTokens, "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset", true},
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
		r.window(w.w, w.tokens, parseRemaining(headerValue(h, w.remaining)), reset)
	}
}

// xRateLimit reads X-RateLimit-Remaining and X-RateLimit-Reset (OpenRouter
// and others), a window of requests.
func (r *headroomReader) xRateLimit(h http.Header) {
	r.window(winXRateLimit, false, parseRemaining(headerValue(h, "X-Ratelimit-Remaining")),
		parseResetNumber(headerValue(h, "X-Ratelimit-Reset"), r.now))
}

// ietf reads RateLimit-Remaining and RateLimit-Reset (the IETF draft), a
// window of requests.
func (r *headroomReader) ietf(h http.Header) {
	r.window(winIETF, false, parseRemaining(headerValue(h, "Ratelimit-Remaining")),
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
	at    atomic.Int64  // mono.Time of the last full parse
	sent  atomic.Uint64 // of the answer of the last full parse: its remainingHeaders (bit i: the i-th) and, above bit 32, its number of headers
	last  atomic.Pointer[Headroom]
	until atomic.Int64 // mono.Time: demoted until then, the latest of windows' until

	// mu serialises demotions; until is written with it held.
	mu      sync.Mutex
	windows [numWindows]struct {
		until    mono.Time // demoted until then by this window (0: not)
		reported mono.Time // the success this window last took a report from
	}
}

// remainingHeaders are where the dialects put their remaining counts, in
// the order of the windows (winOpenAIRequests...): a success with one of
// them at 0 is read at once; otherwise the headers of an upstream that is
// not demoted are read at most every headroomEvery. Between those reads,
// an answer with as many headers as the last one read is looked at only
// for the ones that one had (most upstreams send two or none), so that a
// healthy answer costs a lookup for each header its upstream sends, not
// for each a dialect might.
var remainingHeaders = []string{
	"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Remaining-Tokens",
	"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Tokens-Remaining",
	"Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Remaining",
	"X-Ratelimit-Remaining", "Ratelimit-Remaining",
}

const headroomEvery = 100 * time.Millisecond

// zeroRemaining reports whether a remaining header of h reads as 0, as
// parseRemaining reads it ("0", "00", "+0", "0, 5"), looking only at those
// that sent (see headroomState.sent) had when h has as many headers.
func zeroRemaining(h http.Header, sent uint64) bool {
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

// sentHeaders is headroomState.sent for h: the remainingHeaders it has
// (bit i: the i-th) and, above bit 32, its number of headers.
func sentHeaders(h http.Header) uint64 {
	var set uint64
	for i, k := range remainingHeaders {
		if _, ok := h[k]; ok {
			set |= 1 << i
		}
	}
	return set | uint64(min(len(h), math.MaxUint32))<<32
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

// noteHeadroom reads what a success at now says of u's headroom. A demotion
// (u goes behind the others) belongs to the window that reported 0
// remaining: x-ratelimit-remaining-tokens, anthropic-ratelimit-output-
// tokens-remaining and so on, each on its own. It lasts until that window
// resets, or for rate.DefaultCooldown when the provider does not say when,
// and never longer than rate.MaxCooldown from the report, as a cooldown is
// bounded. A later success that reports the same window above 0 lifts that
// window's demotion; one that says nothing of it (a report of requests
// left says nothing of tokens) leaves it. u is demoted while any window
// is. A report older than the one a window last took is dropped.
//
// The headers of an upstream that is not demoted are read at most every
// headroomEvery unless one reads 0; those of a demoted one, every time, so
// that a lift is seen at its first success. Between readings, an answer
// with as many headers as the last one read is looked at only for the
// remaining counts that one had: a 0 in another waits for the next
// reading.
//
// m is now on the monotonic clock (mono.Of(now), converted once by the
// attempt); rate is the Transport's, with its defaults.
func (u *upstream) noteHeadroom(h http.Header, now time.Time, m mono.Time, rate RateLimitConfig) {
	s := &u.headroom
	at := s.at.Load()
	if mono.Time(s.until.Load()) <= m && !zeroRemaining(h, s.sent.Load()) &&
		((at != 0 && m.Sub(mono.Time(at)) < headroomEvery) || !s.at.CompareAndSwap(at, int64(m))) {
		return
	}
	s.sent.Store(sentHeaders(h))
	r := readHeadroom(h, now)
	if !r.any {
		return
	}
	hr := r.headroom()
	s.last.Store(&hr)
	if !r.exhausted && mono.Time(s.until.Load()) <= m {
		return // nothing to demote, and no demotion left to lift
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var until mono.Time
	for i := range s.windows {
		w, rw := &s.windows[i], &r.windows[i]
		if m >= w.reported {
			switch {
			case rw.remaining == 0:
				// Reset is a wall-clock time (a provider's header):
				// what is kept is how long from now, on the
				// monotonic clock.
				left := rate.DefaultCooldown
				if !rw.reset.IsZero() {
					left = rw.reset.Sub(now)
				}
				w.until, w.reported = m.Add(min(left, rate.MaxCooldown)), m
			case rw.remaining > 0:
				w.until, w.reported = 0, m
			}
		}
		until = max(until, w.until)
	}
	s.until.Store(int64(until))
}

// outOfHeadroom reports whether a window u reported at 0 at a success still
// demotes u: it has not reset, no later success reported it above 0, and
// MaxCooldown has not passed.
func (u *upstream) outOfHeadroom(now time.Time) bool {
	until := mono.Time(u.headroom.until.Load())
	return until != 0 && mono.Of(now) < until
}
