package failover

import (
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// AuthConfig sets when an upstream whose key looks revoked is tried after
// the others. A 401 or 403 never counts toward the breaker: the key is
// wrong, the upstream is not down, and the next upstream, with its own
// key, is tried. But a key that answers 401 to every request would cost
// each request a round trip to it first. Once an upstream's last Threshold
// answers were all 401 or 403 ([AuthFailed]), it is tried after the others
// ([ReasonAuthFailing]) until it answers anything else, or for at most For
// after its latest one: then the next request tries it in its place again,
// and one more 401 demotes it for another For. A request still reaches it
// when every other upstream fails. Health shows the demotion; the circuit
// stays closed.
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
// [AuthConfig]): demotion asks it.
func (t *Transport) authFailing(u *upstream, now time.Time) bool {
	c := t.auth
	return !c.Off && int(u.auth.fails.Load()) >= c.Threshold && mono.Of(now) < mono.Time(u.auth.until.Load())
}

// noteAuth records what an attempt at u ended with at now: an answer o
// (answered: a response came) counts a 401 or 403 in a row, or ends the
// row. An attempt without an answer (a network error, a timeout, the
// caller's cancellation) says nothing of the key. A well key costs one
// atomic load.
func (t *Transport) noteAuth(u *upstream, o Outcome, answered bool, now mono.Time) {
	switch {
	case t.auth.Off || !answered || o == Canceled:
	case o == AuthFailed:
		n := u.auth.fails.Add(1)
		if n > 1<<30 {
			u.auth.fails.Store(1 << 30)
		}
		if int(n) >= t.auth.Threshold {
			u.auth.until.Store(int64(now.Add(t.auth.For)))
		}
	case u.auth.fails.Load() != 0:
		u.auth.fails.Store(0)
		u.auth.until.Store(0)
	}
}
