package ratelimit

import (
	"strings"
	"testing"
	"time"
)

func TestInspect429(t *testing.T) {
	for _, tt := range []struct {
		name  string
		body  string
		quota bool
		delay time.Duration // of a retryDelay; 0 when none is ok
	}{
		{"rate limit", `{"error":{"type":"rate_limit_exceeded"}}`, false, 0},
		{"openai quota", `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`, true, 0},
		{"spend limit", `{"error":{"code":"organization_spend_limit_exceeded"}}`, true, 0},
		{"anthropic credit", `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low"}}`, true, 0},
		{"gemini retryDelay", `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay": "22s"}]}}`, false, 22 * time.Second},
		{"gemini per day", `{"error":{"status":"RESOURCE_EXHAUSTED","details":[{"violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},{"retryDelay":"22s"}]}}`, true, 22 * time.Second},
		{"marker after the JSON value", `{"error":{}} insufficient_quota`, true, 0},
		{"retryDelay beyond a Duration", `{"error":{"details":[{"retryDelay":"315576000000s"}]}}`, false, maxDuration},
		{"negative retryDelay", `{"retryDelay":"-22s"}`, false, 0},
		{"retryDelay not a string", `{"retryDelay":22}`, false, 0},
		{"retryDelay too long", `{"retryDelay":"` + strings.Repeat("1", 40) + `s"}`, false, 0},
		{"deep body, early delay", `{"retryDelay":"7s","x":` + strings.Repeat("[", QuotaPeek), false, 7 * time.Second},
		{"empty", ``, false, 0},
	} {
		quota, delay, ok := Inspect429([]byte(tt.body))
		if quota != tt.quota || delay != tt.delay || ok != (tt.delay != 0) {
			t.Errorf("%s: Inspect429 = %v, %v, %v; want %v, %v, %v", tt.name, quota, delay, ok, tt.quota, tt.delay, tt.delay != 0)
		}
	}
}

func BenchmarkInspect429(b *testing.B) {
	body := []byte(`{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay": "22s"}]}}`)
	b.ReportAllocs()
	for b.Loop() {
		Inspect429(body)
	}
}
