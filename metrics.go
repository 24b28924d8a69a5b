package failover

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/VictoriaMetrics/metrics"
)

// latencyBuckets are the upper bounds, in seconds, of the attempt duration
// histogram: from a fast cache hit to a long completion.
var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// A family is one metric family that the Transport registers: a row of
// [families].
type family struct {
	name   string
	typ    string   // Prometheus type: "counter", "gauge" or "histogram"
	labels []string // label names, in the order series takes their values
	help   string   // the # HELP text: one line, no backslash
}

// familyID names a row of [families].
type familyID int

// The metric families, in the order of docs/observability.md's list.
const (
	famRequests familyID = iota
	famRequestDuration
	famFirstByte
	famTokens
	famCost
	famUsageUnreported
	famAttempts
	famAttemptDuration
	famSkipped
	famDemoted
	famBreakerState
	famBreakerTrips
	famHeldBack
	famStalls
	famContinued
	famLastResort
	famCooldown
	famCooldowns
	famKeyAttempts
	famKeyCooldowns
	famKeyCooldown
	famFailovers
	famRetries
	famRetriesDenied
	famProbes
	famHeadroomRequests
	famHeadroomTokens
	famInFlight
	famDegraded
	famSuspect
	famUnrouted
	famHedges
	famHedgeWins
	famHedgesDenied
	famSharedUp
	famSharedErrors
	famSharedDropped
	famSharedEvents
	famSharedApplied
	famAffinity
	famPinned
	famPinsLearned
	numFamilies
)

// families is every metric family the Transport registers, and the only
// list of them: registrations name their series through
// [familyID.series], [Transport.WritePrometheus] writes each family's
// # HELP and # TYPE lines from its row, and docs/observability.md's list of
// metrics is made from it (TestDocsMetrics fails until
// "go test -run TestDocsMetrics -update-docs" has rewritten it).
// Adding a family is a const, a row and its registration.
var families = [numFamilies]family{
	famRequests:         {"failover_requests_total", "counter", []string{"upstream", "outcome"}, "Requests as their callers saw them, by outcome (answered, failed_over, hedged, failed, unavailable, canceled) and the upstream whose answer the caller got (empty when the caller got an error)."},
	famRequestDuration:  {"failover_request_duration_seconds", "histogram", []string{"outcome"}, "Time from a request's first attempt to the answer's headers or the error the caller got, failovers and waits included, by outcome."},
	famFirstByte:        {"failover_stream_first_byte_seconds", "histogram", []string{"upstream"}, "Time from a streamed request's (text/event-stream) first attempt to the first byte of the answer's body that the caller read, by the upstream that answered."},
	famTokens:           {"failover_tokens_total", "counter", []string{"upstream", "model", "kind"}, "Tokens that the answers of the upstream reported using (Config.MeterUsage), by model (at most 64 per upstream, then other) and kind: input, output, and the parts of input read from (cached) and written to (cache_write) the prompt cache."},
	famCost:             {"failover_cost_total", "counter", []string{"upstream", "model"}, "Cost of the answers of the upstream, their input and output tokens priced at its Upstream.Cost, by model as in failover_tokens_total."},
	famUsageUnreported:  {"failover_usage_unreported_total", "counter", []string{"upstream"}, "Streamed answers of the upstream (text/event-stream) read to their end without reporting their usage, such as OpenAI streams without stream_options.include_usage."},
	famAttempts:         {"failover_attempts_total", "counter", []string{"upstream", "outcome"}, "Attempts sent to the upstream, by outcome (success, rejected, auth_failed, rate_limited, failed, canceled, unservable); a request makes one attempt or more."},
	famAttemptDuration:  {"failover_attempt_duration_seconds", "histogram", []string{"upstream"}, "Time from the start of an attempt at the upstream to its response headers or its failure; canceled attempts are not observed."},
	famSkipped:          {"failover_skipped_total", "counter", []string{"upstream", "reason"}, "Requests that did not try the upstream, by reason (rate_limited, model_not_served, circuit_open, probe_in_flight, probe_elsewhere, shed)."},
	famDemoted:          {"failover_demoted_total", "counter", []string{"upstream", "reason"}, "Attempts sent to the upstream while it was demoted, tried after the upstreams that were not, by why (failing, auth_failing, out_of_headroom, degraded, suspect)."},
	famBreakerState:     {"failover_breaker_state", "gauge", []string{"upstream"}, "State of the upstream's circuit: 0 closed, 1 open, 2 half-open."},
	famBreakerTrips:     {"failover_breaker_trips_total", "counter", []string{"upstream"}, "Times the upstream's circuit opened from closed."},
	famStalls:           {"failover_stream_stalls_total", "counter", []string{"upstream"}, "Streams ended because their upstream went silent past Timeouts.Idle after their content began."},
	famContinued:        {"failover_stream_continuations_total", "counter", []string{"upstream", "result"}, "Streams from the upstream that broke after their content began, by whether another upstream continued them (Config.Continue)."},
	famHeldBack:         {"failover_timeouts_held_back_total", "counter", []string{"upstream"}, "Attempt timeouts not counted against the upstream's circuit: every upstream was timing out at once, or the round trip returned late."},
	famLastResort:       {"failover_last_resort_total", "counter", []string{"upstream"}, "Requests sent to the upstream past its open circuit, every other upstream refusing them (LastResortConfig)."},
	famCooldown:         {"failover_cooldown_seconds", "gauge", []string{"upstream"}, "Seconds left of the upstream's cooldown after a 429; 0 when it is not cooling down."},
	famCooldowns:        {"failover_cooldowns_total", "counter", []string{"upstream", "reason"}, "Cooldowns of the upstream started, by reason (rate_limited, quota_exhausted)."},
	famKeyAttempts:      {"failover_key_attempts_total", "counter", []string{"upstream", "key"}, "Attempts sent to the upstream with one of its keys (Upstream.Keys), by the key's name."},
	famKeyCooldowns:     {"failover_key_cooldowns_total", "counter", []string{"upstream", "key"}, "Cooldowns of one of the upstream's keys (Upstream.Keys) started after a 429, by the key's name."},
	famKeyCooldown:      {"failover_key_cooldown_seconds", "gauge", []string{"upstream", "key"}, "Seconds left of the cooldown of one of the upstream's keys (Upstream.Keys) after a 429; 0 when it is not cooling down."},
	famFailovers:        {"failover_failovers_total", "counter", []string{"from", "to"}, "Attempts that moved on from one upstream to another; a pair's series appears at its first."},
	famRetries:          {"failover_retries_total", "counter", []string{"upstream"}, "Attempts sent again to the upstream that had just failed the request, rather than on to the next (Config.Retry)."},
	famRetriesDenied:    {"failover_retries_denied_total", "counter", nil, "Retries not made because the retry budget was spent: an attempt again at the same upstream, or a round of Config.Retries (Config.Retry)."},
	famProbes:           {"failover_probes_total", "counter", []string{"upstream", "outcome"}, "Active health probes of the upstream (ProbeConfig), by outcome."},
	famHeadroomRequests: {"failover_headroom_requests", "gauge", []string{"upstream"}, "Requests the upstream last reported left in its rate limit; -1 when unknown."},
	famHeadroomTokens:   {"failover_headroom_tokens", "gauge", []string{"upstream"}, "Tokens the upstream last reported left in its rate limit; -1 when unknown."},
	famInFlight:         {"failover_in_flight", "gauge", []string{"upstream"}, "Attempts waiting on the upstream now."},
	famDegraded:         {"failover_degraded", "gauge", []string{"upstream"}, "1 while the upstream is degraded (DegradedConfig), else 0."},
	famSuspect:          {"failover_suspect", "gauge", []string{"upstream"}, "1 while the upstream is suspected of hanging (HangConfig), else 0."},
	famUnrouted:         {"failover_unrouted_requests_total", "counter", nil, "Requests whose URL lies under no upstream's BaseURL."},
	famHedges:           {"failover_hedges_total", "counter", nil, "Hedges sent (Config.Hedge)."},
	famHedgeWins:        {"failover_hedge_wins_total", "counter", nil, "Hedges whose answer was the one returned (Config.Hedge)."},
	famHedgesDenied:     {"failover_hedges_denied_total", "counter", nil, "Hedges not sent because the hedge budget was spent (Config.Hedge)."},
	famSharedUp:         {"failover_shared_up", "gauge", nil, "1 while the shared state answers (Config.Shared), else 0."},
	famSharedErrors:     {"failover_shared_errors_total", "counter", nil, "Calls to the shared state that failed (Config.Shared)."},
	famSharedDropped:    {"failover_shared_dropped_total", "counter", nil, "Events not published because the queue to the shared state was full (Config.Shared)."},
	famSharedEvents:     {"failover_shared_events_total", "counter", []string{"direction"}, "Events published to the fleet (direction out) and received from it (in) (Config.Shared)."},
	famSharedApplied:    {"failover_shared_applied_total", "counter", nil, "Events of the fleet that changed this process's state (Config.Shared)."},
	famPinned:           {"failover_pinned_requests_total", "counter", []string{"result"}, "Requests that referenced state a provider holds (Config.Pinning), by result: sent to the upstream that holds it, or refused there at once (not failed over)."},
	famPinsLearned:      {"failover_pins_learned_total", "counter", nil, "References to state learned from the answers that created it, here or from the fleet (Config.Pinning)."},
	famAffinity:         {"failover_affinity_sessions_total", "counter", []string{"result"}, "Requests of a session answered (Config.Affinity), by result: new (the session had no upstream), kept (answered by its upstream) or moved (answered by another, which holds the session from then on)."},
}

// series returns the name of the family's series with the given label
// values, one per label of its row, in that order. It panics when their
// number is not the row's: a registration that disagrees with the table.
func (id familyID) series(values ...string) string {
	f := &families[id]
	if len(values) != len(f.labels) {
		panic("failover: " + f.name + " has labels " + strings.Join(f.labels, ",") + ", given " + strings.Join(values, ","))
	}
	if len(values) == 0 {
		return f.name
	}
	var b strings.Builder
	b.WriteString(f.name)
	for i, l := range f.labels {
		if i == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(l)
		b.WriteString(`="`)
		b.WriteString(labelValue(values[i]))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// exposition is what [Transport.WritePrometheus] needs of [families],
// made once: each family's # HELP and # TYPE lines, and the family of
// each name a sample line or a comment of the Set may start with (a
// histogram's name and its _bucket, _sum and _count).
var exposition = func() (e struct {
	meta   [numFamilies][]byte
	byName map[string]familyID
}) {
	e.byName = map[string]familyID{}
	for id, f := range families {
		e.meta[id] = []byte("# HELP " + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.typ + "\n")
		e.byName[f.name] = familyID(id)
		if f.typ == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				e.byName[f.name+s] = familyID(id)
			}
		}
	}
	return e
}()

// WritePrometheus writes the Transport's metrics in the Prometheus text
// format, for a /metrics handler:
//
//	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
//		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
//		t.WritePrometheus(w)
//	})
//
// Each family is written with its # HELP and # TYPE lines once it has a
// series. Series of [Config.Metrics] that are not the Transport's are
// written as the Set writes them. For a prometheus/client_golang registry,
// the integration module's Example_clientGolang has a Collector that
// parses this output; for OpenTelemetry, see package
// github.com/failover-go/failover/otel.
func (t *Transport) WritePrometheus(w io.Writer) {
	var b bytes.Buffer
	t.metrics.WritePrometheus(&b)
	writeExposition(w, b.Bytes())
}

// writeExposition writes out, a Set's exposition, to w with the # HELP and
// # TYPE lines of each of [families] before the family's first sample
// line. The Set's own metadata lines for those families (with
// metrics.ExposeMetadata on) are dropped in favour of these.
func writeExposition(w io.Writer, out []byte) {
	var written [numFamilies]bool
	var prev []byte // the name of the last sample line
	done := 0       // out[:done] is written
	for at, next := 0, 0; at < len(out); at = next {
		line := out[at:]
		if n := bytes.IndexByte(line, '\n'); n >= 0 {
			line = line[:n]
		}
		next = at + len(line) + 1
		switch {
		case len(line) > 0 && line[0] == '#':
			if _, ours := exposition.byName[string(commentName(line))]; ours {
				w.Write(out[done:at])
				done = min(next, len(out))
			}
		case sameName(line, prev):
		default:
			prev = line[:metricNameEnd(line)]
			if id, ours := exposition.byName[string(prev)]; ours && !written[id] {
				written[id] = true
				w.Write(out[done:at])
				done = at
				w.Write(exposition.meta[id])
			}
		}
	}
	w.Write(out[done:])
}

// commentName returns the metric name of a "# HELP name ..." or
// "# TYPE name ..." line, or nil for another comment.
func commentName(line []byte) []byte {
	rest, ok := bytes.CutPrefix(line, []byte("# HELP "))
	if !ok {
		if rest, ok = bytes.CutPrefix(line, []byte("# TYPE ")); !ok {
			return nil
		}
	}
	if n := bytes.IndexByte(rest, ' '); n >= 0 {
		rest = rest[:n]
	}
	return rest
}

// sameName reports whether the sample line starts with the metric name
// name, as most lines start with the name of the line before.
func sameName(line, name []byte) bool {
	return len(name) > 0 && len(line) > len(name) && (line[len(name)] == '{' || line[len(name)] == ' ') && bytes.Equal(line[:len(name)], name)
}

// metricNameEnd returns the length of the metric name that line starts
// with: up to its labels or its value.
func metricNameEnd(line []byte) int {
	for i, c := range line {
		if c == '{' || c == ' ' {
			return i
		}
	}
	return len(line)
}

// upstreamMetrics are the metric handles of one upstream, resolved once in
// New so that the request path only increments.
type upstreamMetrics struct {
	attempts [len(outcomeNames)]*metrics.Counter
	duration *metrics.PrometheusHistogram // attempt time to response headers
	trips    *metrics.Counter
	heldBack *metrics.Counter // attempt timeouts not counted: every upstream was timing out
	stalls   *metrics.Counter // streams that stalled after their content began

	// Its streams that broke after their content began (continue.go):
	// continued by another upstream, or not.
	continued, notContinued *metrics.Counter
	lastResort              *metrics.Counter            // requests sent past the circuit (LastResortConfig)
	retries                 *metrics.Counter            // attempts sent again to it (RetryConfig)
	skipped                 map[Reason]*metrics.Counter // by skipReasons
	demoted                 map[Reason]*metrics.Counter // by demoteReasons
	cooldowns               map[CooldownReason]*metrics.Counter
	failovers               sync.Map // *upstream failed over to → *metrics.Counter, made on first use
	probes                  [len(outcomeNames)]*metrics.Counter

	// Requests this upstream answered, by the outcome of the request
	// (answered, failed_over, hedged, failed), and its streams' time to
	// first byte.
	requests  [reqFailed + 1]*metrics.Counter
	firstByte lazyHistogram
}

// lazyHistogram is a histogram series made on its first observation: a
// histogram writes a line per bucket to every scrape, and some are never
// observed (the first byte of an upstream that never streams).
type lazyHistogram struct {
	h    atomic.Pointer[metrics.PrometheusHistogram]
	set  *metrics.Set
	name string
}

func (l *lazyHistogram) init(s *metrics.Set, name string) { l.set, l.name = s, name }

// update observes v, making the series first if need be.
func (l *lazyHistogram) update(v float64) {
	h := l.h.Load()
	if h == nil {
		h = l.set.GetOrCreatePrometheusHistogramExt(l.name, latencyBuckets) // the Set's own lock makes one
		l.h.Store(h)
	}
	h.Update(v)
}

// requestMetrics are the Transport's caller-level handles: requests the
// caller got no upstream's answer for, and durations by outcome.
type requestMetrics struct {
	none     [len(requestOutcomes)]*metrics.Counter // by request outcome, upstream=""
	duration [len(requestOutcomes)]lazyHistogram
}

// count records a request's end: its outcome o, the upstream that
// answered (nil when none) and how long it took.
func (m *requestMetrics) count(u *upstream, o requestOutcome, d time.Duration) {
	if u != nil && o <= reqFailed {
		u.m.requests[o].Inc()
	} else {
		m.none[o].Inc()
	}
	m.duration[o].update(d.Seconds())
}

// initMetrics registers the Transport's metrics of every upstream,
// failover_unrouted_requests_total and failover_retries_denied_total; [families] says what each is. Those of
// Config.Hedge and Config.Shared are registered by newHedger and newFleet,
// and failover_failovers_total's by countFailover.
func (t *Transport) initMetrics() {
	s := t.metrics
	wt := weak.Make(t)
	t.unrouted = s.GetOrCreateCounter(famUnrouted.series())
	t.retry.budget.denied = s.GetOrCreateCounter(famRetriesDenied.series())
	if p := t.pins; p != nil {
		p.followed = s.GetOrCreateCounter(famPinned.series("sent"))
		p.refused = s.GetOrCreateCounter(famPinned.series("refused"))
		p.learnedN = s.GetOrCreateCounter(famPinsLearned.series())
	}
	if af := t.affinity; af != nil {
		af.started = s.GetOrCreateCounter(famAffinity.series("new"))
		af.kept = s.GetOrCreateCounter(famAffinity.series("kept"))
		af.moved = s.GetOrCreateCounter(famAffinity.series("moved"))
	}
	for o, name := range requestOutcomes {
		if requestOutcome(o) != reqAnswered && requestOutcome(o) != reqFailedOver && requestOutcome(o) != reqHedged {
			t.reqs.none[o] = s.GetOrCreateCounter(famRequests.series("", string(name)))
		}
		t.reqs.duration[o].init(s, famRequestDuration.series(string(name)))
	}
	for _, u := range t.upstreams {
		for o := range u.m.requests {
			u.m.requests[o] = s.GetOrCreateCounter(famRequests.series(u.name, string(requestOutcomes[o])))
		}
		u.m.firstByte.init(s, famFirstByte.series(u.name))
		for o := range u.m.attempts {
			u.m.attempts[o] = s.GetOrCreateCounter(famAttempts.series(u.name, Outcome(o).String()))
		}
		for o := range u.m.probes {
			u.m.probes[o] = s.GetOrCreateCounter(famProbes.series(u.name, Outcome(o).String()))
		}
		u.m.duration = s.GetOrCreatePrometheusHistogramExt(famAttemptDuration.series(u.name), latencyBuckets)
		u.m.trips = s.GetOrCreateCounter(famBreakerTrips.series(u.name))
		u.m.heldBack = s.GetOrCreateCounter(famHeldBack.series(u.name))
		u.m.stalls = s.GetOrCreateCounter(famStalls.series(u.name))
		if t.cont.On {
			u.m.continued = s.GetOrCreateCounter(famContinued.series(u.name, "continued"))
			u.m.notContinued = s.GetOrCreateCounter(famContinued.series(u.name, "not_continued"))
		}
		u.m.lastResort = s.GetOrCreateCounter(famLastResort.series(u.name))
		u.m.retries = s.GetOrCreateCounter(famRetries.series(u.name))
		u.m.skipped = map[Reason]*metrics.Counter{}
		for _, r := range skipReasons {
			u.m.skipped[r] = s.GetOrCreateCounter(famSkipped.series(u.name, string(r)))
		}
		u.m.demoted = map[Reason]*metrics.Counter{}
		for _, r := range demoteReasons {
			u.m.demoted[r] = s.GetOrCreateCounter(famDemoted.series(u.name, string(r)))
		}
		u.m.cooldowns = map[CooldownReason]*metrics.Counter{}
		for _, r := range []CooldownReason{CooldownRateLimited, CooldownQuotaExhausted} {
			u.m.cooldowns[r] = s.GetOrCreateCounter(famCooldowns.series(u.name, string(r)))
		}
		initKeyMetrics(s, u)
		s.GetOrCreateGauge(famBreakerState.series(u.name), func() float64 { return float64(u.circuit.Status(time.Now())) })
		cd := &u.cd
		s.GetOrCreateGauge(famCooldown.series(u.name), func() float64 { return cd.remaining(time.Now()).Seconds() })
		s.GetOrCreateGauge(famHeadroomRequests.series(u.name), func() float64 { return headroomMetric(u, false) })
		s.GetOrCreateGauge(famHeadroomTokens.series(u.name), func() float64 { return headroomMetric(u, true) })
		s.GetOrCreateGauge(famInFlight.series(u.name), func() float64 { return float64(u.live.inflight.Load()) })
		// The Set may outlive t (Config.Metrics): it holds t weakly.
		s.GetOrCreateGauge(famDegraded.series(u.name), func() float64 {
			t := wt.Value()
			return boolMetric(t != nil && t.isDegraded(u, time.Now()))
		})
		s.GetOrCreateGauge(famSuspect.series(u.name), func() float64 {
			t := wt.Value()
			return boolMetric(t != nil && t.suspect(u, time.Now()))
		})
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
	c := t.metrics.GetOrCreateCounter(famFailovers.series(from.name, to.name))
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
