// Package ratelimit reads what LLM providers say of their rate limits: how
// long a 429 asks the client to wait (Retry-After and its variants, a
// retryDelay in the body), whether its body says the quota is gone, and
// the headroom a response's rate-limit headers report, in every dialect.
//
// It parses and nothing else: it keeps no state, reads no body and knows
// nothing of upstreams. The failover package holds the cooldowns and
// demotions that act on what it reads.
package ratelimit

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

const maxDuration = time.Duration(1<<63 - 1)

// RetryAfter returns how long a rate-limited response asks the client to
// wait, and whether it says so at all. It reads, in order:
//
//   - retry-after-ms and x-ms-retry-after-ms (OpenAI, Azure OpenAI), in
//     milliseconds: a decimal number, fractions and exponents allowed
//     ("250", "12.5", "1e3"), not "Inf", "NaN" or hexadecimal;
//   - Retry-After, in seconds or as an HTTP-date in any of the three forms
//     of RFC 9110 (relative to now).
//
// Negative, unparsable and absent values are ignored, and so is a date in
// the past. A wait too long for a Duration is the largest Duration. The
// result is not capped.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	for _, name := range [...]string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"} {
		if v := h.Get(name); v != "" {
			if ms, ok := parseDecimal(strings.TrimSpace(v)); ok && ms >= 0 {
				return durationOf(ms, time.Millisecond), true
			}
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil || (errors.Is(err, strconv.ErrRange) && digits(v)) {
		switch {
		case secs < 0:
			return 0, false
		case secs > int64(maxDuration/time.Second): // beyond int64 too
			return maxDuration, true
		}
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now), true
	}
	return 0, false
}

// durationOf returns x units, x >= 0 (+Inf included), as a Duration,
// saturating at the largest Duration: converting a float64 beyond the range
// of an int64 gives whatever the platform gives.
func durationOf(x float64, unit time.Duration) time.Duration {
	if v := x * float64(unit); v < 1<<63 {
		return time.Duration(v)
	}
	return maxDuration
}

// parseDecimal reads a decimal number as HTTP headers carry it: an optional
// sign, digits with an optional fraction, an optional exponent ("12",
// "-0.5", ".5", "1e3"); not the "Inf", "NaN", hexadecimal and underscores
// that strconv.ParseFloat also accepts. A number too large for a float64
// is ±Inf.
func parseDecimal(s string) (float64, bool) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	n := 0
	for ; i < len(s) && isDigit(s[i]); i++ {
		n++
	}
	if i < len(s) && s[i] == '.' {
		for i++; i < len(s) && isDigit(s[i]); i++ {
			n++
		}
	}
	if n == 0 {
		return 0, false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		start := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == start {
			return 0, false
		}
	}
	if i != len(s) {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) { // out of range: ±Inf, or 0
		return 0, false
	}
	return f, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// parseDuration reads a Go duration of at least 0 ("22s", "1m30.5s",
// "6ms") as time.ParseDuration does, except that one too long for a
// Duration is the largest Duration rather than an error.
func parseDuration(s string) (time.Duration, bool) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		if s != "" && s[0] != '-' && durationSyntax(strings.TrimPrefix(s, "+")) {
			// Written as a duration, yet refused: the only other
			// reason ParseDuration has is that the value does not fit.
			return maxDuration, true
		}
		return 0, false
	case d < 0:
		return 0, false
	}
	return d, true
}

// durationSyntax reports whether s, without its sign, is written as
// time.ParseDuration reads it: one or more numbers (digits, a fraction or
// both), each followed by a unit.
func durationSyntax(s string) bool {
	if s == "" {
		return false
	}
	for s != "" {
		i, n := 0, 0
		for ; i < len(s) && isDigit(s[i]); i++ {
			n++
		}
		if i < len(s) && s[i] == '.' {
			for i++; i < len(s) && isDigit(s[i]); i++ {
				n++
			}
		}
		j := i
		for i < len(s) && s[i] != '.' && !isDigit(s[i]) {
			i++
		}
		switch s[j:i] {
		case "ns", "us", "\u00b5s", "\u03bcs", "ms", "s", "m", "h":
		default:
			return false
		}
		if n == 0 {
			return false
		}
		s = s[i:]
	}
	return true
}

// digits reports whether s is a run of decimal digits, with an optional
// sign: an integer too large for int64 rather than garbage.
func digits(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
