package failover

import (
	"encoding/json"
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// windowSize is how many recent attempts an upstream's latency percentiles
// and success rate are computed from, at most.
const windowSize = 1024

// healthAge is how old an attempt may be and still count in Health's
// percentiles and success rate: an upstream that nobody tried for longer
// shows no figures rather than stale ones.
const healthAge = 5 * time.Minute

// window keeps an upstream's recent attempts in a fixed ring, lock-free:
// memory stays bounded whatever the traffic.
type window struct {
	next   atomic.Uint64
	ring   [windowSize]atomic.Int64 // latency<<5 | unknown<<4 | outcome<<1 | 1; 0 is empty
	at     [windowSize]atomic.Int64 // when, in unix nanoseconds
	counts [len(outcomeNames)]atomic.Uint64
	last   atomic.Pointer[lastError]
}

type lastError struct {
	msg string
	at  time.Time
}

func (w *window) add(o Outcome, d time.Duration, now time.Time) {
	w.counts[o].Add(1)
	if o == Canceled {
		return // says nothing of the upstream
	}
	i := (w.next.Add(1) - 1) % windowSize
	w.at[i].Store(now.UnixNano())
	v := int64(max(d, 0))<<5 | int64(o)<<1 | 1
	if d < 0 {
		v = 1<<4 | int64(o)<<1 | 1 // an outcome whose latency is unknown
	}
	w.ring[i].Store(v)
}

// rate returns the attempts per second over the window's attempts that are
// at most some age: their number over the time since the oldest of them
// (0 with fewer than 2).
func (w *window) rate(now, since time.Time) float64 {
	from, oldest, n := since.UnixNano(), now.UnixNano(), 0
	for i := range w.ring {
		if at := w.at[i].Load(); w.ring[i].Load() != 0 && at >= from {
			n++
			oldest = min(oldest, at)
		}
	}
	if n < 2 || now.UnixNano() <= oldest {
		return 0
	}
	return float64(n) / now.Sub(time.Unix(0, oldest)).Seconds()
}

// windowStats are the figures of the attempts in a window that are at
// most some age.
type windowStats struct {
	latencies []time.Duration // sorted; attempts cut short have none
	good, bad int             // served (success, rejected) and failed
	n         int             // attempts
}

// stats returns the figures of w's attempts made after since. (An entry
// being written while this reads may pair a new latency with an old time:
// one sample in a thousand, for a moment.)
func (w *window) stats(since time.Time) windowStats {
	var s windowStats
	s.latencies = make([]time.Duration, 0, windowSize)
	from := since.UnixNano()
	for i := range w.ring {
		v := w.ring[i].Load()
		if v == 0 || w.at[i].Load() < from {
			continue
		}
		s.n++
		if v&(1<<4) == 0 {
			s.latencies = append(s.latencies, time.Duration(v>>5))
		}
		switch Outcome(v >> 1 & 7) {
		case Success, Rejected:
			s.good++
		case Failed:
			s.bad++
		}
	}
	slices.Sort(s.latencies)
	return s
}

// successRate is served over served and failed; 1 when there are none.
func (s windowStats) successRate() float64 {
	if s.good+s.bad == 0 {
		return 1
	}
	return float64(s.good) / float64(s.good+s.bad)
}

func (s windowStats) percentile(q float64) time.Duration {
	if len(s.latencies) == 0 {
		return 0
	}
	return percentile(s.latencies, q)
}

// observe records one attempt at u in its window and metrics.
// observe records an attempt's outcome and latency; a negative latency is
// unknown (the attempt was cut short) and counts in no percentile.
func (u *upstream) observe(o Outcome, d time.Duration, now time.Time) {
	u.window.add(o, d, now)
	u.m.requests[o].Inc()
	if o != Canceled && d >= 0 {
		u.m.duration.Update(d.Seconds())
	}
}

func (u *upstream) setLastError(msg string, at time.Time) {
	u.window.last.Store(&lastError{msg: msg, at: at})
}

// Counts are an upstream's attempts by outcome since the Transport was
// made, and the requests that skipped it.
type Counts struct {
	Success     uint64 `json:"success"`
	Rejected    uint64 `json:"rejected"`
	AuthFailed  uint64 `json:"auth_failed"`
	RateLimited uint64 `json:"rate_limited"`
	Failed      uint64 `json:"failed"`
	Canceled    uint64 `json:"canceled"`
}

// Total returns the number of attempts.
func (c Counts) Total() uint64 {
	return c.Success + c.Rejected + c.AuthFailed + c.RateLimited + c.Failed + c.Canceled
}

// UpstreamHealth is a snapshot of one upstream, as [Transport.Health]
// returns it. It holds no secret: BaseURL is scheme, host and path, and
// LastError is scrubbed of every configured credential. It encodes to JSON
// with durations in seconds.
type UpstreamHealth struct {
	Name    string
	BaseURL string

	// State is the circuit's state: "closed", "open" or "half-open" (an
	// open circuit whose cooldown is over reads half-open: the next
	// request probes).
	State string

	// StateSince is when the circuit last changed state; zero when it
	// has been closed since the Transport was made.
	StateSince time.Time

	// Available says whether a request would be sent here now: the
	// circuit lets it through and the upstream is not cooling down.
	Available bool

	// Degraded says the upstream is slow or failing often (see
	// DegradedConfig), and Suspect that it looks hung (see HangConfig):
	// either way it is tried after the others. InFlight is how many
	// attempts wait on it now.
	Degraded bool
	Suspect  bool
	InFlight int

	// Headroom is what the upstream last said of its rate limits (nil
	// when it never did), and OutOfHeadroom whether a window it reported
	// at 0 has not reset yet, which puts it behind the others.
	Headroom      *Headroom
	OutOfHeadroom bool

	// OpenFor is how long the circuit stays open before its next probe.
	OpenFor time.Duration

	// Cooldown is how long the upstream still cools down after a 429,
	// and CooldownReason why ("rate_limited", "quota_exhausted").
	Cooldown       time.Duration
	CooldownReason CooldownReason

	// Trips counts how often the circuit opened from closed.
	Trips uint64

	// BreakerFailures is the number of failures the breaker counts in
	// its current window (consecutive failures by default).
	BreakerFailures uint

	// Requests counts attempts by outcome since the Transport was made.
	Requests Counts

	// Window is the number of recent attempts that SuccessRate and the
	// latencies are computed from: at most the last 1024, none older
	// than 5 minutes, canceled ones left out.
	Window int

	// SuccessRate is the fraction of the window's attempts that the
	// upstream served (success or the caller's own 4xx) among those and
	// failures; 401s and 429s count for neither. It is 1 when there are
	// none.
	SuccessRate float64

	// P50, P95 and P99 are percentiles of the window's latencies, to
	// response headers.
	P50, P95, P99 time.Duration

	// LastError describes the last failed attempt ("HTTP 503 Service
	// Unavailable", "dial tcp ...: connection refused"), and LastErrorAt
	// when it happened; zero when none failed.
	LastError   string
	LastErrorAt time.Time
}

func (u *upstream) health(now time.Time) UpstreamHealth {
	h := UpstreamHealth{
		Name:            u.name,
		BaseURL:         u.baseURL,
		State:           u.breaker.status().String(),
		OpenFor:         u.breaker.remaining(),
		Cooldown:        u.cd.remaining(now),
		Trips:           u.breaker.trips.Load(),
		BreakerFailures: u.breaker.cb.Metrics().Failures(),
	}
	if ns := u.breaker.since.Load(); ns != 0 {
		h.StateSince = time.Unix(0, ns)
	}
	h.Degraded = u.recent.degraded.Load()
	if hr := u.headroom.last.Load(); hr != nil {
		c := *hr
		h.Headroom = &c
	}
	h.OutOfHeadroom = u.outOfHeadroom(now)
	h.InFlight = int(u.live.inflight.Load())
	h.Available = h.Cooldown == 0 && (h.State == "closed" || (h.State == "half-open" && !u.breaker.probeInFlight(now)))
	if h.Cooldown > 0 {
		if r := u.cd.reason.Load(); r != nil {
			h.CooldownReason = *r
		}
	}
	w := &u.window
	h.Requests = Counts{
		Success:     w.counts[Success].Load(),
		Rejected:    w.counts[Rejected].Load(),
		AuthFailed:  w.counts[AuthFailed].Load(),
		RateLimited: w.counts[RateLimited].Load(),
		Failed:      w.counts[Failed].Load(),
		Canceled:    w.counts[Canceled].Load(),
	}
	ws := w.stats(now.Add(-healthAge))
	h.Window = ws.n
	h.SuccessRate = ws.successRate()
	h.P50, h.P95, h.P99 = ws.percentile(0.50), ws.percentile(0.95), ws.percentile(0.99)
	if le := w.last.Load(); le != nil {
		h.LastError, h.LastErrorAt = le.msg, le.at
	}
	return h
}

// percentile returns the nearest-rank q-th percentile of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// MarshalJSON encodes h with snake_case keys and durations in seconds.
func (h UpstreamHealth) MarshalJSON() ([]byte, error) {
	type latency struct {
		P50 float64 `json:"p50"`
		P95 float64 `json:"p95"`
		P99 float64 `json:"p99"`
	}
	var lastAt, since *time.Time
	if !h.LastErrorAt.IsZero() {
		lastAt = &h.LastErrorAt
	}
	if !h.StateSince.IsZero() {
		since = &h.StateSince
	}
	return json.Marshal(struct {
		Name            string         `json:"name"`
		BaseURL         string         `json:"base_url"`
		State           string         `json:"state"`
		StateSince      *time.Time     `json:"state_since,omitempty"`
		Available       bool           `json:"available"`
		Degraded        bool           `json:"degraded"`
		Suspect         bool           `json:"suspect"`
		InFlight        int            `json:"in_flight"`
		Headroom        *headroomJSON  `json:"headroom,omitempty"`
		OutOfHeadroom   bool           `json:"out_of_headroom"`
		OpenFor         float64        `json:"open_for_seconds"`
		Cooldown        float64        `json:"cooldown_seconds"`
		CooldownReason  CooldownReason `json:"cooldown_reason,omitempty"`
		Trips           uint64         `json:"trips"`
		BreakerFailures uint           `json:"breaker_failures"`
		Requests        Counts         `json:"requests"`
		Window          int            `json:"window"`
		SuccessRate     float64        `json:"success_rate"`
		Latency         latency        `json:"latency_seconds"`
		LastError       string         `json:"last_error,omitempty"`
		LastErrorAt     *time.Time     `json:"last_error_at,omitempty"`
	}{
		h.Name, h.BaseURL, h.State, since, h.Available, h.Degraded, h.Suspect, h.InFlight, h.Headroom.json(), h.OutOfHeadroom, h.OpenFor.Seconds(), h.Cooldown.Seconds(), h.CooldownReason,
		h.Trips, h.BreakerFailures, h.Requests, h.Window, h.SuccessRate,
		latency{h.P50.Seconds(), h.P95.Seconds(), h.P99.Seconds()},
		h.LastError, lastAt,
	})
}

// DegradedConfig sets when an upstream is degraded: slow or failing often,
// though not enough to open its circuit. A degraded upstream is tried after
// the healthy ones (its circuit stays closed) and comes back by itself when
// its figures recover; Health and the metrics report it. The zero value
// never degrades an upstream.
type DegradedConfig struct {
	// Latency degrades an upstream whose recent p99 exceeds it. Zero
	// means latency never degrades.
	Latency time.Duration

	// SuccessRate degrades an upstream whose recent success rate is
	// below it (0 < rate <= 1). Zero means it never does.
	SuccessRate float64

	// Window is how far back "recent" reaches. Zero means 30s.
	Window time.Duration

	// MinSamples is the fewest recent attempts to judge from. Zero
	// means 20.
	MinSamples int
}

func (c DegradedConfig) enabled() bool { return c.Latency > 0 || c.SuccessRate > 0 }

func (c DegradedConfig) withDefaults() DegradedConfig {
	if c.Window == 0 {
		c.Window = 30 * time.Second
	}
	if c.MinSamples == 0 {
		c.MinSamples = 20
	}
	return c
}

func (c DegradedConfig) validate() error {
	switch {
	case c.Latency < 0:
		return configError("Degraded.Latency", "must not be negative")
	case c.SuccessRate < 0 || c.SuccessRate > 1 || c.SuccessRate != c.SuccessRate:
		return configError("Degraded.SuccessRate", "must be within [0, 1]")
	case c.Window < 0:
		return configError("Degraded.Window", "must not be negative")
	case c.MinSamples < 0:
		return configError("Degraded.MinSamples", "must not be negative")
	}
	return nil
}

// refreshEvery is how often an upstream's recent figures are recomputed
// (a sort of at most 1024 latencies) for routing decisions.
const refreshEvery = 250 * time.Millisecond

// recent caches an upstream's recent figures for the request path: read
// with atomic loads, recomputed by one request at most every refreshEvery.
type recent struct {
	at       atomic.Int64 // unix ns of the last computation
	p99      atomic.Int64 // time.Duration
	p95      atomic.Int64 // time.Duration
	p50      atomic.Int64 // time.Duration
	samples  atomic.Int64 // answers the figures are from
	rate     atomic.Uint64
	degraded atomic.Bool
}

// refresh recomputes u's recent figures if they are older than
// refreshEvery.
func (u *upstream) refresh(now time.Time, c DegradedConfig) {
	at := u.recent.at.Load()
	if now.UnixNano()-at < int64(refreshEvery) || !u.recent.at.CompareAndSwap(at, now.UnixNano()) {
		return
	}
	s := u.window.stats(now.Add(-c.Window))
	p99 := s.percentile(0.99)
	rate := s.successRate()
	u.recent.p99.Store(int64(p99))
	u.recent.p95.Store(int64(s.percentile(0.95)))
	u.recent.p50.Store(int64(s.percentile(0.50)))
	u.recent.samples.Store(int64(len(s.latencies))) // for percentiles: latencies known
	u.recent.rate.Store(math.Float64bits(rate))
	enough := s.n >= c.MinSamples
	u.recent.degraded.Store(enough && ((c.Latency > 0 && p99 > c.Latency) || (c.SuccessRate > 0 && rate < c.SuccessRate)))
}

type headroomJSON struct {
	RemainingRequests *int64     `json:"remaining_requests,omitempty"`
	RemainingTokens   *int64     `json:"remaining_tokens,omitempty"`
	Reset             *time.Time `json:"reset,omitempty"`
}

func (h *Headroom) json() *headroomJSON {
	if h == nil {
		return nil
	}
	var j headroomJSON
	if h.RemainingRequests >= 0 {
		j.RemainingRequests = &h.RemainingRequests
	}
	if h.RemainingTokens >= 0 {
		j.RemainingTokens = &h.RemainingTokens
	}
	if !h.Reset.IsZero() {
		j.Reset = &h.Reset
	}
	return &j
}
