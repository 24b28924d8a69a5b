package ratelimit

import (
	"bytes"
	"time"
)

// QuotaPeek is how much of a 429's body [Inspect429] needs to tell an
// exhausted quota from a passing rate limit.
const QuotaPeek = 4 << 10

// QuotaMarkers are strings that, found in a 429's body, say waiting will
// not help: OpenAI's insufficient_quota and spend-limit codes, Anthropic's
// credit balance, Gemini's per-day quotas. They are never written.
var QuotaMarkers = [][]byte{
	[]byte("insufficient_quota"),
	[]byte("billing_hard_limit_reached"),
	[]byte("credit_balance_exhausted"),
	[]byte("spend_limit_exceeded"), // organization_, project_
	[]byte("credit balance is too low"),
	[]byte("PerDay"), // Gemini: GenerateRequestsPerDayPerProjectPerModel...
}

// Inspect429 reads the first bytes of a 429's body (QuotaPeek of them are
// enough) and reports whether they say the quota is exhausted, and any
// retryDelay they carry (Gemini puts it in the body). Every marker in
// body counts, after a JSON value as well as in it.
func Inspect429(body []byte) (quota bool, delay time.Duration, ok bool) {
	for _, m := range QuotaMarkers {
		if bytes.Contains(body, m) {
			quota = true
			break
		}
	}
	delay, ok = retryDelay(body)
	return quota, delay, ok
}

// retryDelay finds Gemini's "retryDelay": "22s" in a body. The body is
// searched, not parsed: no nesting or size of JSON can make this recurse.
// A delay too long for a Duration (a protobuf Duration reaches 10,000
// years) is the largest Duration.
func retryDelay(body []byte) (time.Duration, bool) {
	i := bytes.Index(body, []byte(`"retryDelay"`))
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(body[i+len(`"retryDelay"`):], " \t\r\n")
	rest, ok := bytes.CutPrefix(rest, []byte(":"))
	if !ok {
		return 0, false
	}
	rest = bytes.TrimLeft(rest, " \t\r\n")
	rest, ok = bytes.CutPrefix(rest, []byte(`"`))
	if !ok {
		return 0, false
	}
	end := bytes.IndexByte(rest, '"')
	if end < 0 || end > 32 {
		return 0, false
	}
	return parseDuration(string(rest[:end]))
}
