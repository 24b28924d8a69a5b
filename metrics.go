package failover

import (
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// latencyBuckets are the upper bounds, in seconds, of the request duration
// histogram: from a fast cache hit to a long completion.
var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// upstreamMetrics are the metric handles of one upstream, resolved once in
// New so that the request path only increments.
type upstreamMetrics struct {
	requests   [len(outcomeNames)]*metrics.Counter
	duration   *metrics.PrometheusHistogram
	trips      *metrics.Counter
	heldBack   *metrics.Counter            // attempt timeouts not counted: every upstream was timing out
	lastResort *metrics.Counter            // requests sent past the circuit (LastResortConfig)
	skipped    map[Reason]*metrics.Counter // by skipReasons
	cooldowns  map[CooldownReason]*metrics.Counter
	failovers  sync.Map // *upstream failed over to → *metrics.Counter, made on first use
	probes     [len(outcomeNames)]*metrics.Counter
}

// initMetrics registers the Transport's metrics:
//
//	failover_requests_total{upstream,outcome}       attempts by outcome
//	failover_request_duration_seconds{upstream}     time to response headers
//	failover_skipped_total{upstream,reason}         requests that skipped it, by Reason ("rate_limited", "circuit_open", "probe_in_flight", ...)
//	failover_breaker_state{upstream}                0 closed, 1 open, 2 half-open
//	failover_breaker_trips_total{upstream}          closed-to-open transitions
//	failover_timeouts_held_back_total{upstream}     attempt timeouts not counted: every upstream was timing out at once
//	failover_last_resort_total{upstream}            requests sent past an open circuit, every other being refused (LastResortConfig)
//	failover_cooldown_seconds{upstream}             cooldown left
//	failover_cooldowns_total{upstream,reason}       cooldowns started
//	failover_failovers_total{from,to}               attempts that moved on (a pair appears at its first)
//	failover_probes_total{upstream,outcome}         active probes (ProbeConfig)
//	failover_headroom_requests{upstream}            remaining requests the provider last reported (-1: unknown)
//	failover_headroom_tokens{upstream}              remaining tokens the provider last reported (-1: unknown)
//	failover_in_flight{upstream}                    attempts waiting on it
//	failover_degraded{upstream}                     1 when degraded (DegradedConfig)
//	failover_suspect{upstream}                      1 when suspected of hanging (HangConfig)
//	failover_unrouted_requests_total                requests addressed to no upstream
//
// With Config.Hedge:
//
//	failover_hedges_total                           hedges sent
//	failover_hedge_wins_total                       hedges whose answer was returned
//	failover_hedges_denied_total                    hedges the budget refused
//
// With Config.Shared:
//
//	failover_shared_up                              1 while the shared state answers
//	failover_shared_errors_total                    failed calls to the shared state
//	failover_shared_dropped_total                   events dropped: the queue to it was full
//	failover_shared_events_total{direction}         events published ("out") and received ("in")
//	failover_shared_applied_total                   fleet events that changed this process's state
func (t *Transport) initMetrics() {
	s := t.metrics
	t.unrouted = s.GetOrCreateCounter("failover_unrouted_requests_total")
	for _, u := range t.upstreams {
		l := `upstream="` + labelValue(u.name) + `"`
		for o := range u.m.requests {
			u.m.requests[o] = s.GetOrCreateCounter(`failover_requests_total{` + l + `,outcome="` + Outcome(o).String() + `"}`)
		}
		for o := range u.m.probes {
			u.m.probes[o] = s.GetOrCreateCounter(`failover_probes_total{` + l + `,outcome="` + Outcome(o).String() + `"}`)
		}
		u.m.duration = s.GetOrCreatePrometheusHistogramExt(`failover_request_duration_seconds{`+l+`}`, latencyBuckets)
		u.m.trips = s.GetOrCreateCounter(`failover_breaker_trips_total{` + l + `}`)
		u.m.heldBack = s.GetOrCreateCounter(`failover_timeouts_held_back_total{` + l + `}`)
		u.m.lastResort = s.GetOrCreateCounter(`failover_last_resort_total{` + l + `}`)
		u.m.skipped = map[Reason]*metrics.Counter{}
		for _, r := range skipReasons {
			u.m.skipped[r] = s.GetOrCreateCounter(`failover_skipped_total{` + l + `,reason="` + string(r) + `"}`)
		}
		u.m.cooldowns = map[CooldownReason]*metrics.Counter{}
		for _, r := range []CooldownReason{CooldownRateLimited, CooldownQuotaExhausted} {
			u.m.cooldowns[r] = s.GetOrCreateCounter(`failover_cooldowns_total{` + l + `,reason="` + string(r) + `"}`)
		}
		s.GetOrCreateGauge(`failover_breaker_state{`+l+`}`, func() float64 { return float64(u.circuit.Status(time.Now())) })
		cd := &u.cd
		s.GetOrCreateGauge(`failover_cooldown_seconds{`+l+`}`, func() float64 { return cd.remaining(time.Now()).Seconds() })
		s.GetOrCreateGauge(`failover_headroom_requests{`+l+`}`, func() float64 { return headroomMetric(u, false) })
		s.GetOrCreateGauge(`failover_headroom_tokens{`+l+`}`, func() float64 { return headroomMetric(u, true) })
		s.GetOrCreateGauge(`failover_in_flight{`+l+`}`, func() float64 { return float64(u.live.inflight.Load()) })
		s.GetOrCreateGauge(`failover_degraded{`+l+`}`, func() float64 { return boolMetric(t.isDegraded(u, time.Now())) })
		s.GetOrCreateGauge(`failover_suspect{`+l+`}`, func() float64 { return boolMetric(t.suspect(u, time.Now())) })

	}
}

// countFailover counts an attempt that moved on from one upstream to
// another. The pair's series is made on first use: n upstreams would
// otherwise register n·(n-1) series up front.
func (t *Transport) countFailover(from, to *upstream) {
	if c, ok := from.m.failovers.Load(to); ok {
		c.(*metrics.Counter).Inc()
		return
	}
	c := t.metrics.GetOrCreateCounter(`failover_failovers_total{from="` + labelValue(from.name) + `",to="` + labelValue(to.name) + `"}`)
	from.m.failovers.Store(to, c)
	c.Inc()
}

// labelValue escapes s for a Prometheus label value.
func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

func boolMetric(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func headroomMetric(u *upstream, tokens bool) float64 {
	hr := u.headroom.last.Load()
	switch {
	case hr == nil:
		return -1
	case tokens:
		return float64(hr.RemainingTokens)
	}
	return float64(hr.RemainingRequests)
}
