package failover

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/mono"
	"github.com/failover-go/failover/internal/ratelimit"
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
// reset too far for a Duration from now (a duration or a Unix time beyond
// one) as now plus the largest Duration.
// ok reports whether any of these headers held a usable value; when it is
// false, hr is Headroom{-1, -1, time.Time{}}. Gemini says nothing of its
// headroom in headers (its 429 body carries a retryDelay).
func ParseHeadroom(h http.Header, now time.Time) (hr Headroom, ok bool) {
	r, ok := ratelimit.ParseHeadroom(h, now)
	return Headroom(r), ok
}

// headroomState is what an upstream last said of its rate-limit headroom.
type headroomState struct {
	at    atomic.Int64  // mono.Time of the last full parse
	sent  atomic.Uint64 // ratelimit.SentHeaders of the answer of the last full parse
	last  atomic.Pointer[headroomReport]
	until atomic.Int64 // mono.Time: demoted until then, the latest of windows' until

	// mu serialises demotions; until is written with it held.
	mu      sync.Mutex
	windows [ratelimit.NumWindows]struct {
		until    mono.Time // demoted until then by this window (0: not)
		reported mono.Time // the success this window last took a report from
	}
}

// headroomReport is what the last full parse of an upstream's headers
// said: its Headroom, and the lowest share of its limit a window had left
// (see ratelimit.Report.Share), believed until shareUntil.
type headroomReport struct {
	Headroom
	share      float64   // from 0 to 1
	shareUntil mono.Time // the window's reset, or DefaultCooldown on when it announced none; 0: no window said its limit
}

// shareAt returns the lowest share of its limit a window of r had left,
// and until when it holds, if it still does at m.
func (r *headroomReport) shareAt(m mono.Time) (share float64, until mono.Time, ok bool) {
	if r == nil || r.shareUntil <= m {
		return 0, 0, false
	}
	return r.share, r.shareUntil, true
}

// headroomEvery is how often the headers of an upstream that is not
// demoted are read in full. Between those readings an answer is looked at
// only for a remaining count of 0 (see ratelimit.ZeroRemaining).
const headroomEvery = 100 * time.Millisecond

// note reads what a success at now says of the headroom of an upstream,
// or of one of its Keys. A window that reports 0 remaining demotes it
// until it resets (for at most rate.MaxCooldown, rate.DefaultCooldown
// when the provider does not say when), and a later report of the same
// window above 0 lifts it. A full reading also keeps the lowest share of
// its limit a window has left, for shedding (shed.go), until that window
// resets. Headers are read in full at most every headroomEvery while it
// is not demoted; between readings only a remaining count of 0 is looked
// for. m is now on the monotonic clock.
func (s *headroomState) note(h http.Header, now time.Time, m mono.Time, rate RateLimitConfig) {
	at := s.at.Load()
	if mono.Time(s.until.Load()) <= m && !ratelimit.ZeroRemaining(h, s.sent.Load()) &&
		((at != 0 && m.Sub(mono.Time(at)) < headroomEvery) || !s.at.CompareAndSwap(at, int64(m))) {
		return
	}
	s.sent.Store(ratelimit.SentHeaders(h))
	r := ratelimit.Read(h, now)
	if !r.Any {
		return
	}
	hr := &headroomReport{Headroom: Headroom(r.Headroom())}
	if share, reset, ok := r.Share(); ok {
		left := rate.DefaultCooldown
		if !reset.IsZero() {
			left = reset.Sub(now)
		}
		hr.share, hr.shareUntil = share, m.Add(min(left, rate.MaxCooldown))
	}
	s.last.Store(hr)
	if !r.Exhausted && mono.Time(s.until.Load()) <= m {
		return // nothing to demote, and no demotion left to lift
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var until mono.Time
	for i := range s.windows {
		w, rw := &s.windows[i], &r.Windows[i]
		if m >= w.reported {
			switch {
			case rw.Remaining == 0:
				// Reset is a wall-clock time (a provider's header):
				// what is kept is how long from now, on the
				// monotonic clock.
				left := rate.DefaultCooldown
				if !rw.Reset.IsZero() {
					left = rw.Reset.Sub(now)
				}
				w.until, w.reported = m.Add(min(left, rate.MaxCooldown)), m
			case rw.Remaining > 0:
				w.until, w.reported = 0, m
			}
		}
		until = max(until, w.until)
	}
	s.until.Store(int64(until))
}

// outOfHeadroom reports whether a window u reported at 0 at a success still
// demotes u: it has not reset, no later success reported it above 0, and
// MaxCooldown has not passed. With Upstream.Keys, it reports whether every
// key is out of headroom.
func (u *upstream) outOfHeadroom(now time.Time) bool {
	if len(u.keys) == 0 {
		return u.headroom.out(now)
	}
	for _, k := range u.keys {
		if !k.headroom.out(now) {
			return false
		}
	}
	return true
}

// out reports whether a window reported at 0 still demotes at now.
func (s *headroomState) out(now time.Time) bool {
	until := mono.Time(s.until.Load())
	return until != 0 && mono.Of(now) < until
}
