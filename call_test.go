package failover

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// With Retries, the caller still gets the provider's answer when no
// upstream comes back in time, and that answer survives the wait whole.
func TestRetriesKeepTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, `{"error":"a overloaded"}`)
		n.status("b.test", 503, `{"error":"b overloaded"}`)
		tr := newTestTransport(t, twoUpstreams(n, Config{Retries: 1,
			Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: 2 * time.Minute}}))
		start := time.Now()
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/x", ""))
		if err != nil {
			t.Fatalf("got %v after %v, want the last 503", err, time.Since(start))
		}
		if got := readBody(t, resp); resp.StatusCode != 503 || got != `{"error":"b overloaded"}` {
			t.Fatalf("got %d %q", resp.StatusCode, got)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("waited %v for circuits that stay open for 2m", waited)
		}
	})
}

func TestMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var busy atomic.Bool
		busy.Store(true)
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if busy.Load() {
				return respond(429, "busy", "Retry-After", "2"), nil
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 429, "busy", "Retry-After", "4")
		tr := newTestTransport(t, twoUpstreams(n, Config{RateLimit: RateLimitConfig{MaxWait: 3 * time.Second}}))
		get(t, tr, "http://a.test/") // both cool down now
		busy.Store(false)
		start := time.Now()
		code, err := get(t, tr, "http://a.test/")
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v; want a's 200 once its cooldown ended", code, err)
		}
		if waited := time.Since(start); waited != 2*time.Second {
			t.Fatalf("waited %v, want 2s", waited)
		}

		// Beyond MaxWait: no waiting, an error that says when.
		busy.Store(true)
		tr = newTestTransport(t, twoUpstreams(n, Config{RateLimit: RateLimitConfig{MaxWait: time.Second}}))
		get(t, tr, "http://a.test/")
		start = time.Now()
		_, err = get(t, tr, "http://a.test/")
		var ra RetryAfterError
		if !errors.Is(err, ErrRateLimited) || !errors.As(err, &ra) || ra.RetryAfter() != 2*time.Second || time.Since(start) != 0 {
			t.Fatalf("err = %v after %v; want ErrRateLimited at once with RetryAfter 2s", err, time.Since(start))
		}

		// Never past the request's deadline.
		tr = newTestTransport(t, twoUpstreams(n, Config{RateLimit: RateLimitConfig{MaxWait: time.Minute}}))
		get(t, tr, "http://a.test/")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start = time.Now()
		_, err = tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
		if !errors.Is(err, ErrRateLimited) || time.Since(start) != 0 {
			t.Fatalf("err = %v after %v; want ErrRateLimited at once: the cooldown outlasts the deadline", err, time.Since(start))
		}
	})
}

func TestRetryRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var calls atomic.Int32
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if calls.Add(1) <= 2 {
				return respond(503, "down"), nil
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 502, "bad gateway")
		tr := newTestTransport(t, twoUpstreams(n, Config{Retries: 2, RetryWaitMin: time.Second, RetryWaitMax: 10 * time.Second}))
		start := time.Now()
		code, err := get(t, tr, "http://a.test/")
		if err != nil || code != 200 {
			t.Fatalf("got %d, %v; want 200 in the third round", code, err)
		}
		// Rounds wait 1s then 2s (go-retryablehttp's DefaultBackoff).
		if waited := time.Since(start); waited != 3*time.Second {
			t.Fatalf("waited %v, want 3s", waited)
		}
		if n.count("b.test") != 2 {
			t.Fatalf("b got %d requests, want one per failed round", n.count("b.test"))
		}

		// A deadline shorter than the backoff ends the request with the
		// last answer instead of waiting.
		calls.Store(0)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start = time.Now()
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
		if err != nil || resp.StatusCode != 502 || time.Since(start) != 0 {
			t.Fatalf("got %v, %v after %v; want b's 502 at once", resp, err, time.Since(start))
		}
		resp.Body.Close()
	})
}
