package failover

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/mono"
	"github.com/failover-go/failover/internal/ratelimit"
)

// RateLimitConfig says how long an upstream cools down after a 429. While an
// upstream cools down it gets no request.
type RateLimitConfig struct {
	// DefaultCooldown is the cooldown after a 429 that says nothing usable
	// about when to come back, and how long a success that reports a
	// rate-limit window at 0 without its reset demotes its upstream. Zero
	// means 1s.
	DefaultCooldown time.Duration

	// MaxCooldown caps every cooldown that a provider asks for (here or,
	// through Config.Shared, of another member) and every headroom
	// demotion, and an open circuit taken from Config.Shared (or the
	// circuit's Cooldown, if longer), each counted from when this process
	// first adopted it; it is the cooldown after a 429 whose body says
	// the quota or spend limit is exhausted (waiting a few seconds does not
	// help then). Zero means 60s.
	MaxCooldown time.Duration

	// MaxWait is how long a request may wait when every upstream is open or
	// cooling down, for the first of them to come back. It never waits past
	// the request's deadline. Zero means no waiting: the request fails at
	// once with an error that says when to come back.
	MaxWait time.Duration
}

// Defaults of RateLimitConfig.
const (
	defaultCooldown    = time.Second
	defaultMaxCooldown = 60 * time.Second
)

func (c RateLimitConfig) withDefaults() RateLimitConfig {
	if c.DefaultCooldown == 0 {
		c.DefaultCooldown = defaultCooldown
	}
	if c.MaxCooldown == 0 {
		c.MaxCooldown = defaultMaxCooldown
	}
	return c
}

func (c RateLimitConfig) validate() error {
	switch {
	case c.DefaultCooldown < 0:
		return configError("RateLimit.DefaultCooldown", "must not be negative")
	case c.MaxCooldown < 0:
		return configError("RateLimit.MaxCooldown", "must not be negative")
	case c.MaxWait < 0:
		return configError("RateLimit.MaxWait", "must not be negative")
	case c.DefaultCooldown > cmp.Or(c.MaxCooldown, defaultMaxCooldown):
		return configError("RateLimit.DefaultCooldown", "must not exceed RateLimit.MaxCooldown (60s when zero)")
	}
	return nil
}

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
// the past, which says more of the clocks than of the provider. A wait too
// long for a Duration is the largest Duration. The result is not capped;
// the Transport caps it at [RateLimitConfig.MaxCooldown].
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	return ratelimit.RetryAfter(h, now)
}

const maxDuration = time.Duration(1<<63 - 1)

// inspect429 reads at most ratelimit.QuotaPeek bytes of a 429's body,
// reports whether they say the quota is exhausted and any retryDelay they
// carry (see ratelimit.Inspect429), and gives the response its body back
// whole.
func inspect429(resp *http.Response) (quota bool, delay time.Duration, ok bool) {
	if resp.Body == nil || resp.Body == http.NoBody {
		return false, 0, false
	}
	// A body that stalls is judged by what arrived in drainTimeout, and
	// handed on whole (see peek).
	buf, body := peek(resp.Body, ratelimit.QuotaPeek, drainTimeout, nil)
	resp.Body = body
	return ratelimit.Inspect429(buf)
}

// CooldownReason says why an upstream cools down.
type CooldownReason string

// Reasons for a cooldown, as Health and the metrics name them.
const (
	CooldownRateLimited    CooldownReason = "rate_limited"    // a 429
	CooldownQuotaExhausted CooldownReason = "quota_exhausted" // a 429 whose body says the quota is gone, or a 402
)

// cooldown is the rate-limit state of one upstream: a deadline that only
// moves later. The zero value is not cooling down.
type cooldown struct {
	until  atomic.Int64 // a mono.Time; 0 when never set
	reason atomic.Pointer[CooldownReason]
}

// remaining returns how long the upstream still cools down at now.
func (c *cooldown) remaining(now time.Time) time.Duration {
	u := mono.Time(c.until.Load())
	if u == 0 {
		return 0
	}
	return u.Until(mono.Of(now))
}

// extend makes the upstream cool down until at least now+d. It never
// shortens a cooldown. It reports whether the upstream was not cooling down
// before (a new cooldown started).
func (c *cooldown) extend(now time.Time, d time.Duration, reason CooldownReason) (started bool) {
	m := mono.Of(now)
	until := m.Add(d)
	for {
		old := mono.Time(c.until.Load())
		if old >= until {
			return false
		}
		if c.until.CompareAndSwap(int64(old), int64(until)) {
			c.reason.Store(&reason)
			return old <= m
		}
	}
}

// clear ends any cooldown.
func (c *cooldown) clear() { c.until.Store(0) }

// coolDown starts or extends u's cooldown after a 429 answered at now, or
// k's, when the request was sent with k, one of u's Keys: the fleet
// shares only the upstreams' (Config.Shared).
func (t *Transport) coolDown(u *upstream, k *key, resp *http.Response, now time.Time) {
	d, reason := t.rate.DefaultCooldown, CooldownRateLimited
	if resp != nil {
		d, reason = t.rate.cooldownFor(resp, now)
	}
	if k != nil {
		if k.cd.extend(now, d, reason) {
			k.cooldowns.Inc()
			t.log(slog.LevelWarn, "key cooling down", u, slog.String("key", k.name), slog.Duration("cooldown", d), slog.String("reason", string(reason)))
		}
		return
	}
	before := u.cd.until.Load()
	if u.cd.extend(now, d, reason) {
		u.m.cooldowns[reason].Inc()
		t.log(slog.LevelWarn, "upstream cooling down", u, slog.Duration("cooldown", d), slog.String("reason", string(reason)))
	}
	if t.fleet != nil && u.cd.until.Load() != before {
		t.fleet.cooled(u, d, reason)
	}
}

// cooldownFor returns how long an upstream that answered resp (a 429) cools
// down, and why. It may replace resp.Body (see inspect429).
func (c RateLimitConfig) cooldownFor(resp *http.Response, now time.Time) (time.Duration, CooldownReason) {
	quota, bodyDelay, bodyOK := inspect429(resp)
	if quota || resp.StatusCode == http.StatusPaymentRequired {
		return c.MaxCooldown, CooldownQuotaExhausted
	}
	d, ok := RetryAfter(resp.Header, now)
	if !ok {
		d, ok = bodyDelay, bodyOK
	}
	if !ok {
		d, ok = ratelimit.RetryHint(resp.Header, now)
	}
	if !ok {
		d = c.DefaultCooldown
	}
	return min(d, c.MaxCooldown), CooldownRateLimited
}

// RateLimiter is an http.RoundTripper that stops sending to its next
// RoundTripper while a 429 cooldown runs, the cooldown layer of [Transport]
// on its own. Put it around the transport of one upstream: it does not tell
// hosts apart.
//
// While it cools down, RoundTrip sends nothing and returns an error that
// matches [ErrRateLimited] and says how long is left ([RetryAfterError]).
// Every response, the 429 included, is returned as the next RoundTripper
// gave it (a 429's body is read up to 4 KiB to detect an exhausted quota and
// handed back whole), and so is every error; a next that returns neither
// (breaking the RoundTripper contract) gets an error.
//
// A RateLimiter is safe for concurrent use by multiple goroutines.
type RateLimiter struct {
	next http.RoundTripper
	cfg  RateLimitConfig
	cd   cooldown
}

// NewRateLimiter returns a RateLimiter in front of next (http.DefaultTransport
// when nil). It returns an error naming the field of a config that can never
// work.
func NewRateLimiter(next http.RoundTripper, cfg RateLimitConfig) (*RateLimiter, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if nilValue(next) {
		return nil, fmt.Errorf("failover: NewRateLimiter: next is a nil %T: leave it nil for http.DefaultTransport", next)
	}
	if next == nil {
		next = http.DefaultTransport
	}
	return &RateLimiter{next: next, cfg: cfg.withDefaults()}, nil
}

// RoundTrip implements http.RoundTripper.
func (l *RateLimiter) RoundTrip(req *http.Request) (*http.Response, error) {
	if left := l.cd.remaining(time.Now()); left > 0 {
		closeBody(req)
		return nil, &unavailableError{err: ErrRateLimited, retryAfter: left}
	}
	resp, err := l.next.RoundTrip(req)
	if resp == nil && err == nil {
		return nil, errNextNoResponse // a next that breaks the RoundTripper contract
	}
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		now := time.Now()
		d, reason := l.cfg.cooldownFor(resp, now)
		l.cd.extend(now, d, reason)
	}
	return resp, err
}

// Remaining returns how long the RateLimiter still cools down.
func (l *RateLimiter) Remaining() time.Duration { return l.cd.remaining(time.Now()) }
