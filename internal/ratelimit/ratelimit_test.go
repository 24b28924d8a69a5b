package ratelimit

import (
	"fmt"
	"math"
	"math/big"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
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
		// A wait in milliseconds too long for a Duration saturates, as
		// one in seconds does (the old code ignored it, and the next
		// header or the default cooldown decided).
		{"huge ms", http.Header{"Retry-After-Ms": {"1e300"}, "Retry-After": {"3"}}, maxDuration, true},
		{"ms beyond a Duration", http.Header{"X-Ms-Retry-After-Ms": {"9223372036855"}}, maxDuration, true},
		{"ms beyond a float64", http.Header{"Retry-After-Ms": {"1e400"}}, maxDuration, true},
		{"ms that fit", http.Header{"Retry-After-Ms": {"1e12"}}, 1e12 * time.Millisecond, true},
		{"ms exponent", http.Header{"Retry-After-Ms": {"2.5e3"}}, 2500 * time.Millisecond, true},
		{"ms underflow", http.Header{"Retry-After-Ms": {"1e-400"}}, 0, true},
		{"negative zero ms", http.Header{"Retry-After-Ms": {"-0"}}, 0, true},
		// Not decimal numbers, though strconv.ParseFloat reads them (the
		// old code took 0x1p4 for 16 ms).
		{"Inf ms", http.Header{"Retry-After-Ms": {"+Inf"}, "Retry-After": {"3"}}, 3 * time.Second, true},
		{"NaN ms", http.Header{"Retry-After-Ms": {"NaN"}}, 0, false},
		{"hexadecimal ms", http.Header{"Retry-After-Ms": {"0x1p4"}, "Retry-After": {"3"}}, 3 * time.Second, true},
		{"far future date", http.Header{"Retry-After": {"Fri, 31 Dec 9999 23:59:59 GMT"}}, maxDuration, true},
		{"year 1", http.Header{"Retry-After": {"Mon, 01 Jan 0001 00:00:00 GMT"}}, 0, false},
		{"absent", http.Header{}, 0, false},
	}
	for _, tt := range tests {
		got, ok := RetryAfter(tt.header, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: RetryAfter = %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

// parseDuration reads what time.ParseDuration reads, and saturates where
// it would fail for a value too long for a Duration.
func TestParseDuration(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"22s", 22 * time.Second, true},
		{"1m30.5s", 90500 * time.Millisecond, true},
		{"+1.5h", 90 * time.Minute, true},
		{"0", 0, true},
		{"-0s", 0, true},
		{"2562047h47m16.854775807s", maxDuration, true},
		{"2562047h47m16.854775808s", maxDuration, true},
		{"315576000000s", maxDuration, true},
		{"99999999999999999999999ns", maxDuration, true},
		{"1.5µs", 1500 * time.Nanosecond, true},
		{"1.5μs", 1500 * time.Nanosecond, true},
		{"-1s", 0, false},
		{"-315576000000s", 0, false},
		{"1", 0, false},
		{"1d", 0, false},
		{".s", 0, false},
		{"99999999999999999999", 0, false},
		{"99999999999999999999x", 0, false},
		{"Infs", 0, false},
		{"", 0, false},
		{"+", 0, false},
		{"1s2", 0, false},
	} {
		got, ok := parseDuration(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseDuration(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzParseDuration: parseDuration agrees with an exact reading of
// time.ParseDuration's grammar: it refuses what is not a duration and
// what is negative, reads the rest to within the nanoseconds that
// ParseDuration's float arithmetic loses, and gives the largest Duration for
// a value beyond it.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"22s", "1m30.5s", "0", "-0s", "+1.5h", "2562047h47m16.854775807s", "2562047h47m16.854775808s",
		"315576000000s", "99999999999999999999999ns", "1.5µs", "-1s", "1", ".s", "5.s", "Infs", "1s2", "9223372036.854775807s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 100 {
			return
		}
		got, ok := parseDuration(s)
		want, n, valid := durationOracle(s)
		max := new(big.Rat).SetInt64(int64(maxDuration))
		// ParseDuration truncates each number's fraction through a
		// float64: a few nanoseconds each, and a 1e-15 part of the value.
		tol := new(big.Rat).Abs(want)
		tol.Mul(tol, big.NewRat(1, 1e15)).Add(tol, big.NewRat(int64(2*n+1), 1))
		lo, hi := new(big.Rat).Sub(want, tol), new(big.Rat).Add(want, tol)
		switch {
		case !valid:
			if ok {
				t.Fatalf("parseDuration(%q) = %v, true; not a duration", s, got)
			}
		case hi.Sign() < 0:
			if ok {
				t.Fatalf("parseDuration(%q) = %v, true; %s ns is negative", s, got, want.FloatString(3))
			}
		case lo.Cmp(max) > 0:
			if !ok || got != maxDuration {
				t.Fatalf("parseDuration(%q) = %v, %v; want the largest Duration for %s ns", s, got, ok, want.FloatString(3))
			}
		case lo.Sign() >= 0 && hi.Cmp(max) <= 0:
			g := new(big.Rat).SetInt64(int64(got))
			if !ok || g.Cmp(lo) < 0 || g.Cmp(hi) > 0 {
				t.Fatalf("parseDuration(%q) = %v, %v; want %s ns", s, got, ok, want.FloatString(3))
			}
		}
		if ok && got < 0 {
			t.Fatalf("parseDuration(%q) = %v, true: negative", s, got)
		}
	})
}

// durationOracle reads s by time.ParseDuration's grammar,
// [-+]?([0-9]*(\.[0-9]*)?unit)+ with a digit in each number, or "0", to
// an exact number of nanoseconds, and says how many numbers it had.
func durationOracle(s string) (ns *big.Rat, numbers int, ok bool) {
	ns = new(big.Rat)
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg, s = s[0] == '-', s[1:]
	}
	if s == "0" {
		return ns, 1, true
	}
	if s == "" {
		return ns, 0, false
	}
	units := map[string]int64{"ns": 1, "us": 1e3, "\u00b5s": 1e3, "\u03bcs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}
	for s != "" {
		m := durationNumber.FindStringSubmatch(s)
		if m == nil || m[1] == "" && m[2] == "" {
			return ns, numbers, false
		}
		unit, known := units[m[3]]
		if !known {
			return ns, numbers, false
		}
		v, _ := new(big.Rat).SetString("0" + m[1] + "." + m[2] + "0") // "5." and ".5" too
		ns.Add(ns, v.Mul(v, new(big.Rat).SetInt64(unit)))
		numbers++
		s = s[len(m[0]):]
	}
	if neg {
		ns.Neg(ns)
	}
	return ns, numbers, true
}

var durationNumber = regexp.MustCompile(`^([0-9]*)(?:\.([0-9]*))?([^0-9.]*)`)

// RetryAfter on arbitrary Retry-After, retry-after-ms and x-ms-retry-after-ms
// values never panics, never says ok with a negative duration, gives a whole
// number N >= 0 of seconds as exactly N s (capped at the largest Duration),
// lets a valid millisecond value win over seconds, and reads nothing but the
// headers and now.
func FuzzRetryAfter(f *testing.F) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).Unix()
	for _, s := range [][3]string{
		{"20", "", ""},
		{" 7 ", "", ""},
		{"-5", "", ""},
		{"+5", "", ""},
		{"-0", "", ""},
		{"9223372037", "", ""},
		{"99999999999999999", "", ""},
		{"Sun, 29 Nov 2026 12:00:30 GMT", "", ""},
		{"Sunday, 29-Nov-26 12:00:45 GMT", "", ""},
		{"Sun Nov 29 12:01:00 2026", "", ""},
		{"Sun, 29 Nov 2026 11:00:00 GMT", "", ""},
		{"tomorrow", "", ""},
		{"20", "1500", ""},
		{"3", "soon", "250"},
		{"", "1e300", ""},
		{"", "NaN", "-1"},
		{"", "1e400", ""},
		{"", "9223372036855", ""},
		{"", "1e-400", ""},
		{"5", "-0", "7"},
		{"3", "+Inf", ""},
		{"3", "0x1p4", "1_0"},
		{"Fri, 31 Dec 9999 23:59:59 GMT", "", ""},
	} {
		f.Add(s[0], s[1], s[2], now)
	}
	f.Fuzz(func(t *testing.T, ra, ms, xms string, nowSec int64) {
		now := fuzzNow(nowSec)
		h := http.Header{}
		h.Set("Retry-After", ra)
		h.Set("Retry-After-Ms", ms)
		h.Set("X-Ms-Retry-After-Ms", xms)
		before := h.Clone()
		in := fmt.Sprintf("Retry-After: %q, retry-after-ms: %q, x-ms-retry-after-ms: %q, now %s", ra, ms, xms, now.Format(time.RFC3339))

		got, ok := RetryAfter(h, now)
		if ok && got < 0 {
			t.Fatalf("%s: RetryAfter = %v, true: a negative wait", in, got)
		}
		if !reflect.DeepEqual(h, before) {
			t.Fatalf("%s: RetryAfter changed the header to %q", in, h)
		}
		want, wantOK, from, when := retryAfterOracle(h, now)
		if got != want || ok != wantOK {
			t.Fatalf("%s: RetryAfter = %v, %v; want %v, %v (from the %s)", in, got, ok, want, wantOK, from)
		}

		// Nothing but those headers counts: not other headers, not a
		// spelling net/http never delivers, not a second call.
		h2 := h.Clone()
		h2.Set("Date", "Sun, 06 Nov 1994 08:49:37 GMT")
		h2.Set("X-Ratelimit-Reset", "5")
		h2["retry-after"] = []string{"1"}
		if got2, ok2 := RetryAfter(h2, now); got2 != got || ok2 != ok {
			t.Fatalf("%s: RetryAfter = %v, %v; with unrelated headers %v, %v", in, got, ok, got2, ok2)
		}
		// A number does not depend on now; a date is an instant.
		switch from {
		case "milliseconds", "seconds":
			later := now.Add(1000*time.Hour + 1500*time.Millisecond)
			if got2, ok2 := RetryAfter(h, later); got2 != got || ok2 != ok {
				t.Fatalf("%s: RetryAfter = %v, %v at now, %v, %v later", in, got, ok, got2, ok2)
			}
		case "date":
			if ok && got != maxDuration && !now.Add(got).Equal(when) {
				t.Fatalf("%s: RetryAfter = %v, but now + that is %s, not %s", in, got, now.Add(got), when)
			}
		}
	})
}

// fuzzNow maps any int64 onto a Unix time in years 1 to 9999, the years an
// HTTP-date can name.
func fuzzNow(sec int64) time.Time {
	const lo, hi = -62135596800, 253402300799 // 0001-01-01T00:00:00Z, 9999-12-31T23:59:59Z
	if sec < lo || sec > hi {
		const span = hi - lo + 1
		sec = lo + (sec%span+span)%span
	}
	return time.Unix(sec, 0).UTC()
}

// retryAfterOracle is what RetryAfter documents: the first of the
// millisecond headers holding a non-negative decimal number, as a Duration
// (capped); else Retry-After as whole seconds (capped) or as an HTTP-date
// after now. from says which form decided.
func retryAfterOracle(h http.Header, now time.Time) (d time.Duration, ok bool, from string, when time.Time) {
	for _, name := range []string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"} {
		v := strings.TrimSpace(h.Get(name))
		if !decimalNumber.MatchString(v) {
			continue // not a number of milliseconds: the next header decides
		}
		ms, _ := strconv.ParseFloat(v, 64) // ±Inf beyond a float64
		if ms < 0 {
			continue
		}
		if ns := ms * float64(time.Millisecond); ns < math.Exp2(63) {
			return time.Duration(ns), true, "milliseconds", when
		}
		return maxDuration, true, "milliseconds", when
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false, "absence", when
	}
	if neg, digits, isInt := decimalInteger(v); isInt {
		digits = strings.TrimLeft(digits, "0")
		switch {
		case neg && digits != "":
			return 0, false, "seconds", when // negative: ignored
		case len(digits) > 19:
			return maxDuration, true, "seconds", when
		}
		n, _ := strconv.ParseUint("0"+digits, 10, 64)
		if n > uint64(maxDuration/time.Second) {
			return maxDuration, true, "seconds", when
		}
		return time.Duration(n) * time.Second, true, "seconds", when
	}
	if t, err := http.ParseTime(v); err == nil {
		if t.After(now) {
			return t.Sub(now), true, "date", t
		}
		return 0, false, "date", t // in the past: ignored
	}
	return 0, false, "garbage", when
}

// decimalNumber is a decimal number as headers carry it.
var decimalNumber = regexp.MustCompile(`^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$`)

// decimalInteger reports whether s is an optionally signed run of ASCII
// digits, and splits it.
func decimalInteger(s string) (neg bool, digits string, ok bool) {
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	if s == "" {
		return false, "", false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false, "", false
		}
	}
	return neg, s, true
}

func BenchmarkRetryAfter(b *testing.B) {
	h := http.Header{"Retry-After": {"20"}, "Content-Type": {"application/json"}}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		RetryAfter(h, now)
	}
}
