package failover

import (
	"encoding/json"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// Counts are an upstream's attempts by outcome since the Transport was
// made.
type Counts struct {
	Success     uint64 `json:"success"`
	Rejected    uint64 `json:"rejected"`
	AuthFailed  uint64 `json:"auth_failed"`
	RateLimited uint64 `json:"rate_limited"`
	Failed      uint64 `json:"failed"`
	Canceled    uint64 `json:"canceled"`
	Unservable  uint64 `json:"unservable"`
}

// Total returns the number of attempts.
func (c Counts) Total() uint64 {
	return c.Success + c.Rejected + c.AuthFailed + c.RateLimited + c.Failed + c.Canceled + c.Unservable
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

	// Available says whether a request would be sent here now, and
	// Unavailable, when it would not, why: cooling down after a 429, its
	// circuit open, its half-open probe in flight here or held by another
	// process of the fleet. It is the same decision a request makes.
	Available   bool
	Unavailable Reason

	// Demoted says why the upstream is tried after the others ("" when
	// it is not), the same decision a request's order makes. Degraded
	// says it is slow or failing often (see DegradedConfig), and Suspect
	// that it looks hung (see HangConfig). InFlight is how many attempts
	// wait on it now.
	Demoted  Reason
	Degraded bool
	Suspect  bool
	InFlight int

	// Headroom is what the upstream last said of its rate limits (nil
	// when it never did), and OutOfHeadroom whether a window it reported
	// at 0 has not reset yet, which puts it behind the others.
	// HeadroomShare is the lowest share of its limit a window had left
	// at that report (remaining/limit, from 0 to 1), which sheddable
	// requests read ([ShedConfig]); -1 when no window said its limit, or
	// that window has reset since.
	Headroom      *Headroom
	OutOfHeadroom bool
	HeadroomShare float64

	// OpenFor is how long the circuit stays open before its next probe,
	// and OpenTime how long it opened for the last time it opened (0 when
	// never): the open time in effect, which grows while the upstream
	// keeps failing (see [BreakerConfig]).
	OpenFor  time.Duration
	OpenTime time.Duration

	// Cooldown is how long the upstream still cools down after a 429,
	// and CooldownReason why ("rate_limited", "quota_exhausted"). With
	// Upstream.Keys, it cools down while every key does, until the
	// first stops.
	Cooldown       time.Duration
	CooldownReason CooldownReason

	// Keys are the upstream's keys (Upstream.Keys), in the configured
	// order, each with its own cooldown, revocation and headroom; nil
	// when it has none.
	Keys []KeyHealth

	// Trips counts how often the circuit opened from closed.
	Trips uint64

	// BreakerFailures is the number of failures the breaker counts in
	// its current window (consecutive failures by default).
	BreakerFailures uint

	// Breaker and Timeouts are the upstream's policy in effect: its
	// Upstream.Breaker over Config.Breaker, and its Upstream.Timeouts over
	// Config.Timeouts, with the defaults filled in (a zero timeout: no
	// bound).
	Breaker  BreakerConfig
	Timeouts Timeouts

	// AttemptTimeout is Timeouts.Headers.
	//
	// Deprecated: read Timeouts.
	AttemptTimeout time.Duration

	// Requests counts attempts by outcome since the Transport was made.
	Requests Counts

	// Window is the number of recent attempts that SuccessRate and the
	// latencies are computed from: at most the last 1024, none older
	// than 5 minutes, canceled and unservable ones left out.
	Window int

	// SuccessRate is the fraction of the window's attempts that the
	// upstream served (success or the caller's own 4xx) among those and
	// failures; 401s, 429s and unservable answers count for neither. It
	// is 1 when there are none.
	SuccessRate float64

	// P50, P95 and P99 are percentiles of the window's latencies, to
	// response headers.
	P50, P95, P99 time.Duration

	// LastError describes the last failed attempt ("HTTP 503 Service
	// Unavailable", "dial tcp ...: connection refused"), and LastErrorAt
	// when it happened; zero when none failed.
	LastError   string
	LastErrorAt time.Time

	// Usage is the tokens and cost of the upstream's metered answers
	// (Config.MeterUsage) since the Transport was made.
	Usage UsageTotals

	// Problems are the misconfigurations found in the upstream, each
	// said once to the Logger as well: its BaseURL is another's, it
	// refused a request without credentials of its own (known only
	// under a Config.Base that is nil or a plain *http.Transport, see
	// [ErrNoCredentials]), its Models maps no model that failed
	// requests asked for. Of those models, counted in a bounded table
	// that keeps the often skipped over callers' one-off names, the 8
	// most skipped are listed, most first, each ending in how many
	// requests it skipped ("(skipped 1,234 requests)"; "at least" when
	// the model entered the table late).
	Problems []string
}

// Health returns a snapshot of every upstream, in the configured order.
func (t *Transport) Health() []UpstreamHealth {
	now := time.Now()
	out := make([]UpstreamHealth, len(t.upstreams))
	for i, u := range t.upstreams {
		out[i] = t.health(u, now)
	}
	return out
}

// health is u's snapshot at now.
func (t *Transport) health(u *upstream, now time.Time) UpstreamHealth {
	cs := u.circuit.Snapshot(now)
	av := t.admit(u, "", now, nil)
	h := UpstreamHealth{
		Name:            u.name,
		BaseURL:         u.baseURL,
		State:           State(cs.State).String(),
		StateSince:      cs.Since,
		Available:       av.reason == "",
		Unavailable:     av.reason,
		Demoted:         t.demotion(u, now),
		OpenFor:         cs.OpenFor,
		OpenTime:        cs.OpenTime,
		Cooldown:        u.cooling(now),
		Trips:           cs.Trips,
		BreakerFailures: cs.Failures,
		OutOfHeadroom:   u.outOfHeadroom(now),
		InFlight:        int(u.live.inflight.Load()),
		Degraded:        t.isDegraded(u, now),
		Suspect:         t.suspect(u, now),
		Breaker:         u.breaker,
		Timeouts:        u.timeouts,
		AttemptTimeout:  u.timeout,
	}
	h.HeadroomShare = -1
	if hr := u.headroom.last.Load(); hr != nil {
		c := hr.Headroom
		h.Headroom = &c
		if share, _, ok := hr.shareAt(mono.Of(now)); ok {
			h.HeadroomShare = share
		}
	}
	if h.Cooldown > 0 {
		h.CooldownReason = u.coolingReason(now)
	}
	h.Keys = t.keysHealth(u, now)
	w := &u.window
	h.Requests = Counts{
		Success:     w.counts[Success].Load(),
		Rejected:    w.counts[Rejected].Load(),
		AuthFailed:  w.counts[AuthFailed].Load(),
		RateLimited: w.counts[RateLimited].Load(),
		Failed:      w.counts[Failed].Load(),
		Canceled:    w.counts[Canceled].Load(),
		Unservable:  w.counts[Unservable].Load(),
	}
	ws := w.stats(now.Add(-healthAge))
	h.Window = ws.n
	h.SuccessRate = ws.successRate()
	h.P50, h.P95, h.P99 = ws.percentile(0.50), ws.percentile(0.95), ws.percentile(0.99)
	if le := w.last.Load(); le != nil {
		h.LastError, h.LastErrorAt = le.msg, le.at
	}
	h.Usage = u.usage.snapshot()
	h.Problems = t.problems.of(u.index)
	return h
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
		Unavailable     Reason         `json:"unavailable,omitempty"`
		Demoted         Reason         `json:"demoted,omitempty"`
		Degraded        bool           `json:"degraded"`
		Suspect         bool           `json:"suspect"`
		InFlight        int            `json:"in_flight"`
		Headroom        *headroomJSON  `json:"headroom,omitempty"`
		OutOfHeadroom   bool           `json:"out_of_headroom"`
		HeadroomShare   *float64       `json:"headroom_share,omitempty"`
		OpenFor         float64        `json:"open_for_seconds"`
		OpenTime        float64        `json:"open_time_seconds"`
		Cooldown        float64        `json:"cooldown_seconds"`
		CooldownReason  CooldownReason `json:"cooldown_reason,omitempty"`
		Keys            []keyJSON      `json:"keys,omitempty"`
		Trips           uint64         `json:"trips"`
		BreakerFailures uint           `json:"breaker_failures"`
		Breaker         breakerJSON    `json:"breaker"`
		Timeouts        timeoutsJSON   `json:"timeouts"`
		Requests        Counts         `json:"requests"`
		Window          int            `json:"window"`
		SuccessRate     float64        `json:"success_rate"`
		Latency         latency        `json:"latency_seconds"`
		LastError       string         `json:"last_error,omitempty"`
		LastErrorAt     *time.Time     `json:"last_error_at,omitempty"`
		Usage           usageJSON      `json:"usage"`
		Problems        []string       `json:"problems,omitempty"`
	}{
		h.Name, h.BaseURL, h.State, since, h.Available, h.Unavailable, h.Demoted, h.Degraded, h.Suspect, h.InFlight, h.Headroom.json(), h.OutOfHeadroom, h.headroomShare(), h.OpenFor.Seconds(), h.OpenTime.Seconds(), h.Cooldown.Seconds(), h.CooldownReason,
		keysJSON(h.Keys), h.Trips, h.BreakerFailures, h.Breaker.json(), h.Timeouts.json(), h.Requests, h.Window, h.SuccessRate,
		latency{h.P50.Seconds(), h.P95.Seconds(), h.P99.Seconds()},
		h.LastError, lastAt,
		h.Usage.json(), h.Problems,
	})
}

// headroomShare is HeadroomShare for Health's JSON: nil when unknown.
func (h *UpstreamHealth) headroomShare() *float64 {
	if h.HeadroomShare < 0 {
		return nil
	}
	return &h.HeadroomShare
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

// timeoutsJSON is a Timeouts in effect as Health's JSON shows it, in
// seconds; 0 is no bound. (It replaces attempt_timeout_seconds, which was
// its Headers.)
type timeoutsJSON struct {
	Headers      float64 `json:"headers_seconds"`
	FirstContent float64 `json:"first_content_seconds"`
	Idle         float64 `json:"idle_seconds"`
	Attempt      float64 `json:"attempt_seconds"`
}

func (c Timeouts) json() timeoutsJSON {
	return timeoutsJSON{c.Headers.Seconds(), c.FirstContent.Seconds(), c.Idle.Seconds(), c.Attempt.Seconds()}
}
