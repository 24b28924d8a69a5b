package failover

import (
	"sync/atomic"
	"time"
)

// HangConfig sets when an upstream is suspected of hanging: it accepts
// requests and answers none. A hung upstream costs every request a whole
// AttemptTimeout before failover, and its breaker learns only after
// FailureThreshold of them timed out; by then many requests wait on it.
// Instead, once at least MinInFlight requests are in flight there and none
// has answered for Multiple times its recent p99 (never less than Floor),
// while nothing else from it answered in that time, new requests try it
// only after every other upstream. The first answer from it clears the
// suspicion; requests that time out count as failures as usual.
type HangConfig struct {
	// Off turns hang detection off.
	Off bool

	// MinInFlight is how many requests must be waiting on the upstream.
	// Zero means 3.
	MinInFlight int

	// Multiple of the upstream's recent p99 that a wait must exceed.
	// Zero means 2.
	Multiple float64

	// Floor is the shortest wait that can raise suspicion, whatever the
	// p99. Zero means 100ms.
	Floor time.Duration
}

func (c HangConfig) withDefaults() HangConfig {
	if c.MinInFlight == 0 {
		c.MinInFlight = 3
	}
	if c.Multiple == 0 {
		c.Multiple = 2
	}
	if c.Floor == 0 {
		c.Floor = 100 * time.Millisecond
	}
	return c
}

func (c HangConfig) validate() error {
	switch {
	case c.MinInFlight < 0:
		return configError("Hang.MinInFlight", "must not be negative")
	case c.Multiple < 0 || c.Multiple != c.Multiple:
		return configError("Hang.Multiple", "must not be negative")
	case c.Floor < 0:
		return configError("Hang.Floor", "must not be negative")
	}
	return nil
}

// liveness tracks an upstream's requests in flight and its last answer,
// lock-free.
type liveness struct {
	inflight   atomic.Int32
	busySince  atomic.Int64 // unix ns when inflight last went from 0 to 1
	lastAnswer atomic.Int64 // unix ns of the last attempt that got an answer
}

func (l *liveness) start(now time.Time) {
	if l.inflight.Add(1) == 1 {
		l.busySince.Store(now.UnixNano())
	}
}

// end closes an attempt; answered says whether the upstream answered it (a
// response, or an error of its own such as a refused connection), as
// opposed to the attempt timing out or the caller giving up.
func (l *liveness) end(now time.Time, answered bool) {
	if answered {
		l.lastAnswer.Store(now.UnixNano())
	}
	l.inflight.Add(-1)
}

// suspect reports whether u looks hung at now. It reads the recent p99,
// refreshing it only when enough requests wait to matter.
func (u *upstream) suspect(now time.Time, c HangConfig, d DegradedConfig) bool {
	if c.Off || int(u.live.inflight.Load()) < c.MinInFlight {
		return false
	}
	u.refresh(now, d)
	quiet := now.UnixNano() - max(u.live.busySince.Load(), u.live.lastAnswer.Load())
	return quiet > int64(u.hangLimit(c))
}

// silent reports whether u has answered nothing since start, longer ago
// than the hang limit: an attempt started then and still unanswered looks
// hung even when it is the only one in flight. Only an upstream with
// enough recent latencies (Degraded.MinSamples) is judged: without its
// p99, a slow upstream and a hung one look alike.
func (u *upstream) silent(start, now time.Time, c HangConfig, d DegradedConfig) bool {
	if c.Off || u.live.lastAnswer.Load() >= start.UnixNano() {
		return false
	}
	u.refresh(now, d)
	if int(u.recent.samples.Load()) < d.MinSamples {
		return false
	}
	return now.Sub(start) > u.hangLimit(c)
}

// hangLimit is how long u may stay silent before it looks hung: Multiple
// times its recent p99, never less than Floor. The caller refreshed the
// recent figures.
func (u *upstream) hangLimit(c HangConfig) time.Duration {
	return max(c.Floor, time.Duration(c.Multiple*float64(u.recent.p99.Load())))
}
