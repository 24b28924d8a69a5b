package failover

import (
	"encoding/json"
	"slices"
	"sync/atomic"
	"time"
)

// windowSize is how many recent attempts an upstream's latency percentiles
// and success rate are computed from.
const windowSize = 1024

// window keeps an upstream's recent attempts in a fixed ring, lock-free:
// memory stays bounded whatever the traffic.
type window struct {
	next   atomic.Uint64
	ring   [windowSize]atomic.Int64 // latency<<4 | outcome<<1 | 1; 0 is empty
	counts [len(outcomeNames)]atomic.Uint64
	last   atomic.Pointer[lastError]
}

type lastError struct {
	msg string
	at  time.Time
}

func (w *window) add(o Outcome, d time.Duration) {
	w.counts[o].Add(1)
	if o == Canceled {
		return // says nothing of the upstream
	}
	i := w.next.Add(1) - 1
	w.ring[i%windowSize].Store(int64(max(d, 0))<<4 | int64(o)<<1 | 1)
}

// observe records one attempt at u in its window and metrics.
func (u *upstream) observe(o Outcome, d time.Duration) {
	u.window.add(o, d)
	u.m.requests[o].Inc()
	if o != Canceled {
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
	// latencies are computed from (at most 1024; canceled ones are left
	// out).
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
	lat := make([]time.Duration, 0, windowSize)
	var good, bad int
	for i := range w.ring {
		v := w.ring[i].Load()
		if v == 0 {
			continue
		}
		lat = append(lat, time.Duration(v>>4))
		switch Outcome(v >> 1 & 7) {
		case Success, Rejected:
			good++
		case Failed:
			bad++
		}
	}
	h.Window = len(lat)
	h.SuccessRate = 1
	if good+bad > 0 {
		h.SuccessRate = float64(good) / float64(good+bad)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		h.P50, h.P95, h.P99 = percentile(lat, 0.50), percentile(lat, 0.95), percentile(lat, 0.99)
	}
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
		h.Name, h.BaseURL, h.State, since, h.Available, h.OpenFor.Seconds(), h.Cooldown.Seconds(), h.CooldownReason,
		h.Trips, h.BreakerFailures, h.Requests, h.Window, h.SuccessRate,
		latency{h.P50.Seconds(), h.P95.Seconds(), h.P99.Seconds()},
		h.LastError, lastAt,
	})
}
