package failover

import (
	"bufio"
	"encoding/json"
	"fmt"
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
	"github.com/failover-go/failover/internal/ratelimit"
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

// BenchmarkNoteHeadroom is the cost of a success's headers to its
// upstream's headroom: a full reading (every headroomEvery), one between
// readings, and a full reading of an answer without rate-limit headers.
func BenchmarkNoteHeadroom(b *testing.B) {
	openAI := http.Header{
		"X-Ratelimit-Limit-Requests":     {"10000"},
		"X-Ratelimit-Limit-Tokens":       {"50000000"},
		"X-Ratelimit-Remaining-Requests": {"9999"},
		"X-Ratelimit-Remaining-Tokens":   {"49999992"},
		"X-Ratelimit-Reset-Requests":     {"6ms"},
		"X-Ratelimit-Reset-Tokens":       {"0s"},
		"Content-Type":                   {"application/json"},
	}
	none := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req_1"}, "Server": {"cloudflare"}}
	rate := RateLimitConfig{}.withDefaults()
	for _, bb := range []struct {
		name string
		h    http.Header
		step time.Duration
	}{
		{"full", openAI, headroomEvery},
		{"between", openAI, 0},
		{"none", none, headroomEvery},
	} {
		b.Run(bb.name, func(b *testing.B) {
			u := &upstream{}
			now := time.Now()
			noteHeadroomAt(u, bb.h, now, rate)
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(bb.step)
				noteHeadroomAt(u, bb.h, now, rate)
			}
		})
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

// FuzzHeadroom: ParseHeadroom and RetryHint on arbitrary header blocks
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
		d, hintOK := ratelimit.RetryHint(h, now)
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
			t.Fatalf("%s: RetryHint = %v, true; ParseHeadroom = %+v, %v", in(), d, hr, ok)
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
		// RetryHint waits for the exhausted window's reset; with none
		// exhausted, for the latest reset, which is not before the
		// earliest (Headroom.Reset). A wait too long for a Duration is
		// capped, so it says nothing of the instant.
		switch {
		case hr.Reset.IsZero() && !hr.Exhausted() && hintOK:
			t.Fatalf("%s: RetryHint = %v, true; no reset announced (%+v)", in(), d, hr)
		case !hr.Reset.IsZero() && !hintOK:
			t.Fatalf("%s: RetryHint not ok; ParseHeadroom = %+v", in(), hr)
		case hr.Reset.IsZero() || d == maxDuration:
		case hr.Exhausted() && !now.Add(d).Equal(hr.Reset):
			t.Fatalf("%s: RetryHint = %v, the exhausted window resets at %s", in(), d, hr.Reset)
		case !hr.Exhausted() && now.Add(d).Before(hr.Reset):
			t.Fatalf("%s: RetryHint = %v, before the earliest reset %s", in(), d, hr.Reset)
		}

		// Nothing else counts: not unrelated headers, not a second call.
		h2 := h.Clone()
		h2.Set("Retry-After", "7")
		h2.Set("X-Ratelimit-Limit-Requests", "0")
		h2.Set("Anthropic-Ratelimit-Tokens-Limit", "0")
		h2.Set("Date", "Sun, 06 Nov 1994 08:49:37 GMT")
		hr2, ok2 := ParseHeadroom(h2, now)
		d2, hintOK2 := ratelimit.RetryHint(h2, now)
		if hr2 != hr || ok2 != ok || d2 != d || hintOK2 != hintOK {
			t.Fatalf("%s: with unrelated headers ParseHeadroom = %+v, %v and RetryHint = %v, %v; without %+v, %v and %v, %v",
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

// Anthropic's anthropic-ratelimit-* headers and Azure's demote an upstream
// as OpenAI's do, whatever form their reset takes: until the exhausted
// window resets (DefaultCooldown when no reset is announced), read at once
// between full readings when the upstream sent that count before, and
// lifted by the window's next report above 0.
func TestHeadroomDialectsAlike(t *testing.T) {
	rate := RateLimitConfig{}.withDefaults()
	start := time.Now().Truncate(time.Second) // RFC 3339 resets are often in whole seconds
	anthropic := func(remaining int, reset string) string {
		return fmt.Sprintf("anthropic-ratelimit-tokens-remaining: %d\nanthropic-ratelimit-tokens-reset: %s", remaining, reset)
	}
	in20 := start.Add(20 * time.Second)
	later := start.Add(time.Hour).Format(time.RFC3339)
	for _, tt := range []struct {
		name     string
		ok, zero string // a success's headers with the window above 0, and at 0
		want     time.Duration
	}{
		{"openai", "x-ratelimit-remaining-tokens: 900\nx-ratelimit-reset-tokens: 1s", "x-ratelimit-remaining-tokens: 0\nx-ratelimit-reset-tokens: 20s", 20 * time.Second},
		{"azure, no reset", "x-ratelimit-remaining-tokens: 900\nx-ratelimit-remaining-requests: 9", "x-ratelimit-remaining-tokens: 0\nx-ratelimit-remaining-requests: 9", time.Second},
		{"anthropic", anthropic(900, later), anthropic(0, in20.Format(time.RFC3339)), 20 * time.Second},
		{"anthropic, fraction", anthropic(900, later), anthropic(0, in20.Add(500*time.Millisecond).Format(time.RFC3339Nano)), 20500 * time.Millisecond},
		{"anthropic, lower case", anthropic(900, later), anthropic(0, strings.ToLower(in20.Format(time.RFC3339))), 20 * time.Second},
		{"anthropic, space for the T", anthropic(900, later), anthropic(0, in20.Format("2006-01-02 15:04:05Z07:00")), 20 * time.Second},
		{"anthropic gateway, a duration", anthropic(900, "59s"), anthropic(0, "20s"), 20 * time.Second},
		{"anthropic, no reset", "anthropic-ratelimit-tokens-remaining: 900", "anthropic-ratelimit-tokens-remaining: 0", time.Second},
	} {
		check := func(how string, u *upstream) {
			t.Helper()
			got := mono.Time(u.headroom.until.Load()).Sub(mono.Of(start))
			if got != tt.want || !u.outOfHeadroom(start.Add(tt.want-1)) || u.outOfHeadroom(start.Add(tt.want)) {
				t.Errorf("%s, %s: demoted for %v, want %v", tt.name, how, got, tt.want)
			}
		}
		u := &upstream{}
		noteHeadroomAt(u, wireHeader(t, tt.zero), start, rate)
		check("a full reading", u)

		u = &upstream{}
		noteHeadroomAt(u, wireHeader(t, tt.ok), start.Add(-time.Millisecond), rate)
		noteHeadroomAt(u, wireHeader(t, tt.zero), start, rate)
		check("between full readings", u)
		noteHeadroomAt(u, wireHeader(t, tt.ok), start.Add(time.Millisecond), rate)
		if u.outOfHeadroom(start.Add(time.Millisecond)) {
			t.Errorf("%s: a report above 0 did not lift the demotion", tt.name)
		}
	}
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

// noteHeadroomAt is u.headroom.note at now, converted as an attempt does.
func noteHeadroomAt(u *upstream, h http.Header, now time.Time, rate RateLimitConfig) {
	u.headroom.note(h, now, mono.Of(now), rate)
}
