package failover

import (
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// AuthConfig sets when an upstream whose key looks revoked is tried after
// the others, so that a key answering 401 to everything does not cost each
// request a round trip first. Once its last Threshold answers were all 401
// or 403 ([AuthFailed]), it is tried after the others ([ReasonAuthFailing])
// until it answers anything else, or for at most For after the latest;
// then one more 401 demotes it again. It is still tried when every other
// upstream fails, and its circuit stays closed: a 401 or 403 never counts
// toward the breaker.
type AuthConfig struct {
	// Off turns the demotion off: every request tries the upstream in
	// its place, whatever its key answered.
	Off bool

	// Threshold is how many 401 or 403 answers in a row demote the
	// upstream. Zero means 3.
	Threshold int

	// For is how long the demotion lasts after the latest of them, at
	// most. Zero means 1m.
	For time.Duration
}

// Defaults of AuthConfig.
const (
	defaultAuthThreshold = 3
	defaultAuthFor       = time.Minute
)

func (c AuthConfig) withDefaults() AuthConfig {
	if c.Threshold == 0 {
		c.Threshold = defaultAuthThreshold
	}
	if c.For == 0 {
		c.For = defaultAuthFor
	}
	return c
}

func (c AuthConfig) validate() error {
	switch {
	case c.Threshold < 0:
		return configError("Auth.Threshold", "must not be negative")
	case c.For < 0:
		return configError("Auth.For", "must not be negative")
	}
	return nil
}

// authState is what an upstream's answers said of its key, lock-free.
type authState struct {
	fails atomic.Int32 // 401 and 403 answers in a row, at most 1<<30
	until atomic.Int64 // when the demotion ends (a mono.Time), once fails reached the threshold
}

// authFailing reports whether u's key looks revoked at now (see
// [AuthConfig]), or with Upstream.Keys, every one of its keys: demotion
// asks it.
func (t *Transport) authFailing(u *upstream, now time.Time) bool {
	if len(u.keys) == 0 {
		return t.revoked(&u.auth, now)
	}
	for _, k := range u.keys {
		if !t.revoked(&k.auth, now) {
			return false
		}
	}
	return true
}

// revoked reports whether the key whose answers s counts looks revoked at
// now.
func (t *Transport) revoked(s *authState, now time.Time) bool {
	c := t.auth
	return !c.Off && int(s.fails.Load()) >= c.Threshold && mono.Of(now) < mono.Time(s.until.Load())
}

// noteAuth records in s, the state of the key an attempt was sent with
// (its upstream's or one of its Keys), what the attempt ended with at
// now: an answer o (answered: a response came) counts a 401 or 403 in a
// row, or ends the row. An attempt without an answer says nothing of the
// key.
func (t *Transport) noteAuth(s *authState, o Outcome, answered bool, now mono.Time) {
	switch {
	case t.auth.Off || !answered || o == Canceled:
	case o == AuthFailed:
		n := s.fails.Add(1)
		if n > 1<<30 {
			s.fails.Store(1 << 30)
		}
		if int(n) >= t.auth.Threshold {
			s.until.Store(int64(now.Add(t.auth.For)))
		}
	case s.fails.Load() != 0:
		s.fails.Store(0)
		s.until.Store(0)
	}
}
