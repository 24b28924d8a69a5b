package failover

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

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
