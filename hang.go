package failover

import (
	"cmp"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// HangConfig sets when an upstream is suspected of hanging: it accepts
// requests and answers none. A hung upstream would cost every request a
// whole attempt timeout ([Timeouts]) before its breaker learns. Instead, once at least
// MinInFlight requests wait there and it has answered none sent to it for
// Multiple times its recent p99 (never less than Floor), new requests try
// it after every other upstream ([ReasonSuspect]). An answer to a request
// sent since clears the suspicion; timeouts count as failures as usual.
type HangConfig struct {
	// Off turns hang detection off.
	Off bool

	// MinInFlight is how many requests must be waiting on the upstream.
	// Zero means 3.
	MinInFlight int

	// Multiple of the upstream's recent p99 that a wait must exceed.
	// Zero means 1.
	Multiple float64

	// Floor is the shortest wait that can raise suspicion, whatever the
	// p99. Zero means 100ms.
	Floor time.Duration

	// Window is how far back the recent p99 reaches. Zero means 30s.
	Window time.Duration

	// MinSamples is the fewest recent latencies that make the p99 known
	// enough to judge a lone attempt silent (a hedged attempt canceled
	// after the hang limit, see HedgeConfig). Zero means 20.
	MinSamples int
}

func (c HangConfig) withDefaults() HangConfig {
	if c.MinInFlight == 0 {
		c.MinInFlight = 3
	}
	if c.Multiple == 0 {
		c.Multiple = 1
	}
	if c.Floor == 0 {
		c.Floor = 100 * time.Millisecond
	}
	if c.Window == 0 {
		c.Window = defaultRecentWindow
	}
	if c.MinSamples == 0 {
		c.MinSamples = defaultMinSamples
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
	case c.Window < 0:
		return configError("Hang.Window", "must not be negative")
	case c.MinSamples < 0:
		return configError("Hang.MinSamples", "must not be negative")
	}
	return nil
}

// suspect reports whether u looks hung at now. It reads the recent p99,
// refreshing it only when enough requests wait to matter.
func (t *Transport) suspect(u *upstream, now time.Time) bool {
	c := t.hang
	if c.Off {
		return false
	}
	need := c.MinInFlight
	if f := u.circuit.Streak(); f > 0 {
		// A failing upstream takes no more requests than its threshold
		// has room for (ReasonFailing): as many waiting are as many as
		// can.
		need = min(need, max(u.circuit.Threshold()-f, 1))
	}
	if int(u.live.inflight.Load()) < need {
		return false
	}
	f := u.hangRecent.get(&u.window, now)
	quiet := mono.Of(now).Sub(max(mono.Time(u.live.busySince.Load()), mono.Time(u.live.answered.Load())))
	return quiet > c.limit(f)
}

// silent reports whether a, which ended before any answer, had waited on
// an upstream that answered nothing sent since a began, longer than that
// upstream's normal time: the hang limit, from its recent p99. Without
// Hang.MinSamples recent latencies, slow and hung look alike: a stream's
// attempt is then judged by Headers, the bound on a stream's headers,
// and one not streamed, which may take minutes, not at all. The request
// is read for its kind only when that is needed.
func (t *Transport) silent(a *attempt) bool {
	u := a.u
	if t.hang.Off || mono.Time(u.live.answered.Load()) >= mono.Of(a.start) {
		return false
	}
	waited := a.end.Sub(a.start)
	if f := u.hangRecent.get(&u.window, a.end); f.samples >= t.hang.MinSamples {
		return waited > t.hang.limit(f)
	}
	return waited > cmp.Or(u.timeouts.Headers, defaultHeadersTimeout) && (a.streamed || streamed(a.out, t.maxBody))
}

// limit is how long an upstream with the recent figures f may stay silent
// before it looks hung: Multiple times its p99, never less than Floor.
func (c HangConfig) limit(f figures) time.Duration {
	return max(c.Floor, mulDuration(c.Multiple, f.p99))
}

// mulDuration returns x·d, saturating at the largest Duration.
func mulDuration(x float64, d time.Duration) time.Duration {
	v := x * float64(d)
	if v >= float64(maxDuration) || v != v {
		return maxDuration
	}
	return time.Duration(v)
}
