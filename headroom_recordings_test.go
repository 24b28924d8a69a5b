package failover_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/failover-go/failover"
)

// headroomHeaders are the rate-limit headers ParseHeadroom reads.
var headroomHeaders = []string{
	"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
	"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
	"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset",
	"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset",
	"Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset",
	"Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset",
	"X-Ratelimit-Remaining", "X-Ratelimit-Reset",
	"Ratelimit-Remaining", "Ratelimit-Reset",
}

// Every recorded response, read at its own Date: the headroom of each one
// that reports it, OpenAI's counts as sent, and the one exhausted window,
// OpenRouter's 429, with the reset it announced.
func TestRecordedHeadroom(t *testing.T) {
	exchanges, _ := loadRecordings(t)
	reporting, exhausted := 0, 0
	for _, ex := range exchanges {
		h := ex.resp.Header
		now, err := http.ParseTime(h.Get("Date"))
		if err != nil {
			t.Errorf("%s: Date %q: %v", ex.name, h.Get("Date"), err)
			continue
		}
		hr, ok := failover.ParseHeadroom(h, now)
		reports := false
		for _, name := range headroomHeaders {
			reports = reports || h.Get(name) != ""
		}
		if ok != reports {
			t.Errorf("%s: ParseHeadroom = %+v, %v; the response has rate-limit headers: %v", ex.name, hr, ok, reports)
		}
		if !ok {
			continue
		}
		reporting++
		for _, c := range []struct {
			name string
			got  int64
		}{
			{"X-Ratelimit-Remaining-Requests", hr.RemainingRequests},
			{"X-Ratelimit-Remaining-Tokens", hr.RemainingTokens},
		} {
			if v := h.Get(c.name); v != "" {
				if want, _ := strconv.ParseInt(v, 10, 64); c.got != want {
					t.Errorf("%s: %s: %s, read as %d", ex.name, c.name, v, c.got)
				}
			}
		}
		if !hr.Reset.IsZero() && !hr.Reset.After(now) {
			t.Errorf("%s: Reset %s is not after the Date %s", ex.name, hr.Reset, now)
		}
		if hr.Exhausted() {
			exhausted++
			want := time.Date(2025, 8, 8, 15, 41, 0, 0, time.UTC) // X-Ratelimit-Reset: 1754667660000
			if ex.resp.StatusCode != http.StatusTooManyRequests || !hr.Reset.Equal(want) {
				t.Errorf("%s: %d, exhausted headroom %+v; want a 429 that resets at %s", ex.name, ex.resp.StatusCode, hr, want)
			}
		}
	}
	if reporting < 20 || exhausted != 1 {
		t.Errorf("%d responses report their headroom, %d of them exhausted; want at least 20 and 1", reporting, exhausted)
	}
}
