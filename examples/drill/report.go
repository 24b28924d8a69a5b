package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/failover-go/failover"
)

// report is what the drill measured; -json writes it as it is. Times are
// in seconds of the drill (divide by timescale for provider scale).
type report struct {
	DurationS        float64 `json:"duration_s"`
	RPS              float64 `json:"rps"`
	Timescale        float64 `json:"timescale"`
	CallerTimeoutS   float64 `json:"caller_timeout_s"`
	AttemptTimeoutS  float64 `json:"attempt_timeout_s"`
	BreakerCooldownS float64 `json:"breaker_cooldown_s"`
	HangMultiple     float64 `json:"hang_multiple"`           // failover.HangConfig.Multiple
	HangFloorS       float64 `json:"hang_floor_s"`            // failover.HangConfig.Floor
	HedgeDelayS      float64 `json:"hedge_delay_s,omitempty"` // the hedged run's delay; 0 without one
	BreakerThreshold int     `json:"breaker_threshold"`       // failover.BreakerConfig.FailureThreshold

	// The primary's own breaker (its Upstream.Breaker) in the failover
	// runs, where the backups have Config.Breaker's above.
	PrimaryBreakerThreshold int     `json:"primary_breaker_threshold"`
	PrimaryBreakerCooldownS float64 `json:"primary_breaker_cooldown_s"`

	// With -fleet: the members of each fleet run, the Redis of the
	// sharing one (its host:port), whether the drill started it, and the
	// sharing members' Config.SharedSync.
	Fleet        int     `json:"fleet,omitempty"`
	Redis        string  `json:"redis,omitempty"`
	RedisStarted bool    `json:"redis_started,omitempty"`
	SharedSyncS  float64 `json:"shared_sync_s,omitempty"`

	// Hogs is -hogs: the CPU hogs that ran beside the drill, each a
	// child process spinning on one thread. CPUs is what the machine has
	// (runtime.NumCPU), GOMAXPROCS what the drill used.
	Hogs       int `json:"hogs"`
	CPUs       int `json:"cpus"`
	GOMAXPROCS int `json:"gomaxprocs"`

	// Lag is the drill's own scheduling lag, and whether it was too
	// large for the figures to mean much; see lagReport.
	Lag *lagReport `json:"lag"`

	Upstreams []upstreamInfo `json:"upstreams"`
	Phases    []phaseInfo    `json:"phases"`
	Runs      []runReport    `json:"runs"` // "plain", then each failover run

	// Plot is the absolute path of the picture -plot drew; "" without one.
	Plot string `json:"plot,omitempty"`
}

type upstreamInfo struct {
	Name    string  `json:"name"`
	Kind    string  `json:"kind"`              // the field's profile, or "real"
	P50S    float64 `json:"p50_s,omitempty"`   // scaled
	P99S    float64 `json:"p99_s,omitempty"`   // scaled
	Success float64 `json:"success,omitempty"` // background success rate
}

type phaseInfo struct {
	Name   string  `json:"name"`
	Fault  bool    `json:"fault"`
	StartS float64 `json:"start_s"`
	EndS   float64 `json:"end_s"`
}

type runReport struct {
	Name      string  `json:"name"`             // "plain", "failover", "failover (score)", "failover (priority+hedge)", "fleet, sharing on"
	Router    string  `json:"router,omitempty"` // the failover run's routing policy
	Requests  int     `json:"requests"`
	Successes int     `json:"successes"`
	Retention float64 `json:"retention"` // successes / requests

	// Latency is end to end, over every request, failed ones included.
	Latency struct {
		P50 float64 `json:"p50"`
		P95 float64 `json:"p95"`
		P99 float64 `json:"p99"`
	} `json:"latency_s"`

	// The breaker's figures, for the primary; null in the plain run, and
	// DetectionS or RecoveryS when it did not happen within the drill (or
	// the circuit never opened). In a fleet run, detection is the first
	// member's, recovery the last member's (null unless every member
	// whose circuit opened had it closed), trips the sum of the members'.
	DetectionS *float64 `json:"detection_s"` // first fault's start to the circuit opening
	RecoveryS  *float64 `json:"recovery_s"`  // last fault's end to the circuit closing
	Trips      *int     `json:"trips"`       // closed-to-open, every upstream
	FalseTrips *int     `json:"false_trips"` // trips of a backup, or of the primary outside the faults

	// Breakers are each upstream's policy in effect (as its Health
	// says, of the first member) and its trips (every member's); null
	// in the plain run.
	Breakers []breakerReport `json:"breakers,omitempty"`

	// Fleet is what a fleet run did as a fleet; null in other runs.
	Fleet *fleetResult `json:"fleet,omitempty"`

	// Hedges are the Transport's hedging figures; null when the run does
	// not hedge.
	Hedges *hedgeCounts `json:"hedges"`

	PerUpstream []upstreamCount `json:"requests_per_upstream"` // attempts sent to each
	Phases      []phaseResult   `json:"phases"`
	HangPhase   hangResult      `json:"hang_phase"`

	// Events are the Transport's circuit state changes, as its
	// OnStateChange reported them; in a fleet run, every member's.
	Events []eventReport `json:"events,omitempty"`

	// Health is the Transport's Health() at the end of the run; none in
	// a fleet run.
	Health []failover.UpstreamHealth `json:"health,omitempty"`
}

// breakerReport is one upstream's breaker in a failover run.
type breakerReport struct {
	Name             string  `json:"name"`
	FailureThreshold uint    `json:"failure_threshold"`
	CooldownS        float64 `json:"cooldown_s"`
	Trips            int     `json:"trips"` // closed to open
}

type eventReport struct {
	AtS      float64 `json:"at_s"`
	Member   *int    `json:"member,omitempty"` // in a fleet run, the member's index
	Upstream string  `json:"upstream"`
	Event    string  `json:"event"`          // "circuit open", "circuit half-open", "circuit closed"
	From     string  `json:"from,omitempty"` // the circuit's state before
}

// hedgeCounts are a Transport's hedging metrics at the end of its run.
type hedgeCounts struct {
	Sent   uint64 `json:"sent"`   // failover_hedges_total
	Won    uint64 `json:"won"`    // failover_hedge_wins_total: the hedge answered first
	Denied uint64 `json:"denied"` // failover_hedges_denied_total: over the budget, not sent
}

// hangResult is what the hang phase did to a run: how many requests went
// to the hung primary, and what the caller's tail looked like meanwhile.
type hangResult struct {
	// CircuitAtStart is the primary's circuit when the hang began:
	// "closed" means the hang met hang detection, not an open breaker.
	// Empty in the plain run; in a fleet run whose members differ, how
	// many were in each state: "closed 7, open 3".
	CircuitAtStart string `json:"circuit_at_start,omitempty"`

	// PrimaryAttempts counts the attempts sent to the primary that
	// started in the hang phase: each waited until AttemptTimeout, or
	// until a hedge or the caller gave up.
	PrimaryAttempts int `json:"primary_attempts"`

	// BeforeOpen counts those that started before the primary's circuit
	// first opened in the hang (see phaseResult.BeforeOpen): the requests
	// that went into the hang before the Transport left it, hang
	// detection's figure; the rest are the half-open probes and what they
	// let through. Nil in the plain run.
	BeforeOpen *int `json:"primary_before_open,omitempty"`

	// P99S is the caller's p99 over the requests due in the hang phase,
	// WarmUpP99S the same over the warm-up, when all was well.
	P99S       float64 `json:"p99_s"`
	WarmUpP99S float64 `json:"warmup_p99_s"`
}

type upstreamCount struct {
	Name     string `json:"name"`
	Attempts int    `json:"attempts"`

	// What the answers the callers got from the upstream reported using,
	// and cost at its price (Health's Usage, summed over a fleet's
	// members); none in the plain run, which has no Transport.
	Answers uint64  `json:"answers,omitempty"` // answers whose usage was read
	Tokens  int64   `json:"tokens,omitempty"`  // input and output
	Spend   float64 `json:"spend"`             // dollars
}

type phaseResult struct {
	Name            string  `json:"name"`
	Requests        int     `json:"requests"`
	Successes       int     `json:"successes"`
	SuccessRate     float64 `json:"success_rate"`     // what the caller saw
	P50S            float64 `json:"p50_s"`            // end to end, every request
	P99S            float64 `json:"p99_s"`            // end to end, every request
	PrimaryAttempts int     `json:"primary_attempts"` // attempts sent to the primary

	// BeforeOpen counts the attempts sent to the primary in a fault
	// phase before its circuit first opened in it (all of them when it
	// never did), summed over a fleet's members, each up to its own
	// circuit's opening: the requests the fault cost before the breaker
	// acted. Nil in the plain run, in healthy phases and in the 429
	// storm, whose answers open no circuit.
	BeforeOpen *int `json:"primary_before_open,omitempty"`
}

func seconds(d time.Duration) float64 { return d.Seconds() }

func buildReport(o options, phases []phase, runs []*run) *report {
	rep := &report{
		DurationS:        seconds(o.Duration),
		RPS:              o.RPS,
		Timescale:        o.Timescale,
		CallerTimeoutS:   seconds(o.scaled(callerTimeout)),
		AttemptTimeoutS:  seconds(o.attemptTimeout()),
		BreakerCooldownS: seconds(o.scaled(breakerCooldown)),
		HangMultiple:     hangMultiple,
		HangFloorS:       seconds(o.hangConfig().Floor),
		BreakerThreshold: breakerThreshold,
		Hogs:             o.Hogs,
		CPUs:             runtime.NumCPU(),
		GOMAXPROCS:       runtime.GOMAXPROCS(0),

		PrimaryBreakerThreshold: primaryThreshold,
		PrimaryBreakerCooldownS: seconds(o.primaryBreaker().Cooldown),
	}
	if o.Hedge > 0 {
		rep.HedgeDelayS = seconds(o.scaled(o.Hedge))
	}
	for _, r := range runs {
		if sh := r.spec.shared; sh != nil {
			rep.Fleet = r.spec.fleet
			rep.Redis, rep.RedisStarted = sh.redis.opts.Addr, sh.redis.started()
			rep.SharedSyncS = seconds(sh.sync)
		}
	}
	for i, name := range runs[1].names {
		ui := upstreamInfo{Name: name, Kind: "real"}
		if i == 0 || len(o.Upstreams) == 0 {
			p := profiles[i]
			ui = upstreamInfo{Name: name, Kind: p.kind, P50S: seconds(o.scaled(p.p50)), P99S: seconds(o.scaled(p.p99)), Success: p.success}
		}
		rep.Upstreams = append(rep.Upstreams, ui)
	}
	for _, p := range phases {
		rep.Phases = append(rep.Phases, phaseInfo{Name: p.name, Fault: p.fault != healthy, StartS: seconds(p.start), EndS: seconds(p.end)})
	}
	for _, r := range runs {
		rep.Runs = append(rep.Runs, r.report(o, phases))
	}
	return rep
}

func (r *run) report(o options, phases []phase) runReport {
	records, attempts := r.snapshot()
	rr := runReport{Name: r.name, Router: r.spec.policy, Requests: len(records)}
	lat := make([]time.Duration, 0, len(records))
	for _, rec := range records {
		if rec.ok {
			rr.Successes++
		}
		lat = append(lat, rec.latency)
	}
	rr.Retention = ratio(rr.Successes, rr.Requests)
	slices.Sort(lat)
	rr.Latency.P50 = seconds(percentile(lat, 0.50))
	rr.Latency.P95 = seconds(percentile(lat, 0.95))
	rr.Latency.P99 = seconds(percentile(lat, 0.99))

	counts := make([]int, len(r.names))
	for _, a := range attempts {
		counts[a.upstream]++
	}
	for i, name := range r.names {
		rr.PerUpstream = append(rr.PerUpstream, upstreamCount{Name: name, Attempts: counts[i]})
	}

	for _, p := range phases {
		pr := phaseResult{Name: p.name}
		var plat []time.Duration
		for _, rec := range records {
			if rec.start >= p.start && rec.start < p.end {
				pr.Requests++
				if rec.ok {
					pr.Successes++
				}
				plat = append(plat, rec.latency)
			}
		}
		slices.Sort(plat)
		pr.P50S, pr.P99S = seconds(percentile(plat, 0.50)), seconds(percentile(plat, 0.99))
		for _, a := range attempts {
			if a.upstream == 0 && a.at >= p.start && a.at < p.end {
				pr.PrimaryAttempts++
			}
		}
		pr.SuccessRate = ratio(pr.Successes, pr.Requests)
		rr.Phases = append(rr.Phases, pr)
	}
	if h := phaseOf(phases, hang); h >= 0 {
		rr.HangPhase = hangResult{PrimaryAttempts: rr.Phases[h].PrimaryAttempts, P99S: rr.Phases[h].P99S, WarmUpP99S: rr.Phases[0].P99S}
	}

	if r.transport() == nil {
		return rr
	}
	for i, p := range phases {
		if p.fault == healthy || p.fault == storm429 { // a 429 opens no circuit
			continue
		}
		n := 0
		for mi, m := range r.members {
			n += beforeOpen(attempts, m.events.events(), mi, r.names[0], p)
		}
		rr.Phases[i].BeforeOpen = &n
		if p.fault == hang {
			rr.HangPhase.BeforeOpen = &n
		}
	}
	for _, m := range r.members {
		for i, h := range m.ft.Health() {
			pu := &rr.PerUpstream[i]
			pu.Answers += h.Usage.Answers
			pu.Tokens += h.Usage.Input + h.Usage.Output
			pu.Spend += h.Usage.Cost
		}
	}
	fleet := r.spec.fleet > 0
	if !fleet {
		rr.Health = r.transport().Health()
	}
	// Each member's changes, and the breaker's figures summed up over
	// them: the first detection, the last recovery.
	evs := make([][]event, len(r.members))
	det, rec := time.Duration(-1), time.Duration(-1)
	recovered := true
	trips, falseTrips := 0, 0
	states := map[string]int{}
	h := phaseOf(phases, hang)
	for i, m := range r.members {
		evs[i] = m.events.events()
		d, rc, t, ft := breakerFigures(evs[i], r.names[0], phases, o.attemptTimeout())
		trips, falseTrips = trips+t, falseTrips+ft
		if d >= 0 && (det < 0 || d < det) {
			det = d
		}
		if rc >= 0 {
			rec = max(rec, rc)
		} else if d >= 0 {
			recovered = false
		}
		if h >= 0 {
			states[stateAt(evs[i], r.names[0], phases[h].start)]++
		}
	}
	if det >= 0 {
		rr.DetectionS = ptr(seconds(det))
	}
	if rec >= 0 && recovered {
		rr.RecoveryS = ptr(seconds(rec))
	}
	rr.Trips, rr.FalseTrips = &trips, &falseTrips
	rr.Breakers = breakers(r.transport().Health(), evs)
	if h >= 0 {
		rr.HangPhase.CircuitAtStart = countStates(states)
	}
	for i := range evs {
		for _, e := range evs[i] {
			er := eventReport{AtS: seconds(e.at), Upstream: e.upstream, Event: e.msg, From: e.from}
			if fleet {
				er.Member = ptr(i)
			}
			rr.Events = append(rr.Events, er)
		}
	}
	slices.SortStableFunc(rr.Events, func(a, b eventReport) int { return cmp.Compare(a.AtS, b.AtS) })
	if fleet {
		rr.Fleet = fleetFigures(r, evs, attempts, phases, o)
	}
	if r.spec.hedge {
		set := r.members[0].metrics
		rr.Hedges = &hedgeCounts{
			Sent:   set.GetOrCreateCounter("failover_hedges_total").Get(),
			Won:    set.GetOrCreateCounter("failover_hedge_wins_total").Get(),
			Denied: set.GetOrCreateCounter("failover_hedges_denied_total").Get(),
		}
	}
	return rr
}

// breakers returns each upstream's breaker as health shows its policy,
// with its trips in the state changes of every member (evs).
func breakers(health []failover.UpstreamHealth, evs [][]event) []breakerReport {
	var out []breakerReport
	for _, h := range health {
		b := breakerReport{Name: h.Name, FailureThreshold: h.Breaker.FailureThreshold, CooldownS: seconds(h.Breaker.Cooldown)}
		for _, mevs := range evs {
			for _, e := range mevs {
				if e.upstream == h.Name && e.msg == "circuit open" && e.from == "closed" {
					b.Trips++
				}
			}
		}
		out = append(out, b)
	}
	return out
}

// countStates returns the one state that every member's circuit was in,
// or how many were in each: "closed 7, open 3".
func countStates(states map[string]int) string {
	if len(states) == 1 {
		for s := range states {
			return s
		}
	}
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(states)) {
		parts = append(parts, fmt.Sprintf("%s %d", s, states[s]))
	}
	return strings.Join(parts, ", ")
}

// stateAt returns the state of upstream's circuit at offset at, from the
// state changes evs in the order they happened.
func stateAt(evs []event, upstream string, at time.Duration) string {
	state := "closed"
	for _, e := range evs {
		if e.at >= at {
			break
		}
		if to, ok := strings.CutPrefix(e.msg, "circuit "); ok && e.upstream == upstream {
			state = to
		}
	}
	return state
}

// breakerFigures reads the Transport's state changes: detection (the first
// fault's start to the primary's circuit opening), recovery (the last
// fault's end to its closing), and trips, false ones being a backup's, or
// the primary's outside the faults (grace covers attempts that were sent
// during a fault and failed after it). Negative means it did not happen.
func breakerFigures(evs []event, primary string, phases []phase, grace time.Duration) (detection, recovery time.Duration, trips, falseTrips int) {
	faultStart, faultEnd := faultWindow(phases)
	detection, recovery = -1, -1
	state := "closed" // the primary's, as of the events read so far
	atEnd := ""       // its state when the last fault ended
	for _, e := range evs {
		to, isCircuit := strings.CutPrefix(e.msg, "circuit ")
		if !isCircuit {
			continue
		}
		if e.upstream == primary && atEnd == "" && e.at >= faultEnd {
			atEnd = state
		}
		if to == "open" && e.from == "closed" {
			trips++
			if e.upstream != primary || e.at < faultStart || e.at > faultEnd+grace {
				falseTrips++
			}
		}
		if e.upstream != primary {
			continue
		}
		state = to
		if to == "open" && detection < 0 && e.at >= faultStart {
			detection = e.at - faultStart
		}
		if to == "closed" && recovery < 0 && e.at >= faultEnd {
			recovery = e.at - faultEnd
		}
	}
	if atEnd == "" {
		atEnd = state
	}
	if atEnd == "closed" && detection >= 0 {
		recovery = 0 // closed again before the faults ended
	}
	return detection, recovery, trips, falseTrips
}

// beforeOpen counts member's attempts at the primary (upstream 0) that
// started in phase p before the primary's circuit first opened in it, by
// the member's state changes evs.
func beforeOpen(attempts []attempt, evs []event, member int, primary string, p phase) int {
	open := p.end
	for _, e := range evs {
		if e.upstream == primary && e.msg == "circuit open" && e.at >= p.start && e.at < p.end {
			open = e.at
			break
		}
	}
	n := 0
	for _, a := range attempts {
		if a.member == member && a.upstream == 0 && a.at >= p.start && a.at < open {
			n++
		}
	}
	return n
}

func ptr[T any](v T) *T { return &v }

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// percentile returns the nearest-rank q-th percentile of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// writeTable writes the side-by-side table, a column per run, and the
// prose around it, in lines of at most lineWidth columns (the runs'
// columns in blocks when they do not fit side by side); it ends with the
// summary and the picture's path.
func writeTable(out io.Writer, rep *report) error {
	plain, fos := rep.Runs[0], rep.Runs[1:]
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	var b strings.Builder
	together := "both runs at once"
	if len(rep.Runs) > 2 {
		together = fmt.Sprintf("all %d runs at once", len(rep.Runs))
	}
	var head strings.Builder
	fmt.Fprintf(&head, "Outage drill: %g req/s per run for %s, %s, timescale %g (1 s here is %s at provider scale)\n",
		rep.RPS, sec(rep.DurationS), together, rep.Timescale, fmtDur(sec(1/rep.Timescale)))
	var faults []string
	for _, p := range rep.Phases {
		if p.Fault {
			faults = append(faults, fmt.Sprintf("%s %.1f-%.1f s", p.Name, p.StartS, p.EndS))
		}
	}
	fmt.Fprintf(&head, "Faults on the primary: %s, then recovery.\n", strings.Join(faults, ", "))
	var ups []string
	for _, u := range rep.Upstreams {
		if u.Kind == "real" {
			ups = append(ups, u.Name+" (real)")
		} else {
			ups = append(ups, fmt.Sprintf("%s %s/%s %.2f %%", u.Name, fmtDur(sec(u.P50S)), fmtDur(sec(u.P99S)), 100*u.Success))
		}
	}
	fmt.Fprintf(&head, "Upstreams (p50/p99, success): %s.\n", strings.Join(ups, ", "))
	fmt.Fprintf(&head, "Caller: http.Client with Timeout %s. Failover: AttemptTimeout %s, breaker cooldown %s after %d failures (the primary's own: %s after %d), hang suspected after %g p99 (at least %s) unanswered.",
		fmtDur(sec(rep.CallerTimeoutS)), fmtDur(sec(rep.AttemptTimeoutS)), fmtDur(sec(rep.BreakerCooldownS)), rep.BreakerThreshold,
		fmtDur(sec(rep.PrimaryBreakerCooldownS)), rep.PrimaryBreakerThreshold, rep.HangMultiple, fmtDur(sec(rep.HangFloorS)))
	if rep.HedgeDelayS > 0 {
		fmt.Fprintf(&head, " Hedged run: hedge after %s.", fmtDur(sec(rep.HedgeDelayS)))
	}
	if rep.Fleet > 0 {
		where := "Redis at " + rep.Redis
		if rep.RedisStarted {
			where = "a redis-server the drill started on " + rep.Redis
		}
		fmt.Fprintf(&head, "\nFleets: %d members per fleet run, each a Transport with connections and state of its own, as a process has; they send in turn, each every %s. "+
			"A member's circuit opens after %d consecutive failures of its own; sharing on (Config.Shared through %s, SharedSync %s), after about %d of the fleet's.",
			rep.Fleet, fmtDur(sec(float64(rep.Fleet)/rep.RPS)), rep.PrimaryBreakerThreshold, where, fmtDur(sec(rep.SharedSyncS)), rep.PrimaryBreakerThreshold)
	}
	head.WriteString("\n")
	writeLag(&head, rep)
	wrap(&b, strings.TrimSuffix(head.String(), "\n"), lineWidth)
	b.WriteString("\n")

	var g grid
	// row adds a row: its name, plain's cell, then each failover run's.
	row := func(name, plainCell string, cell func(r runReport) string) {
		cells := []string{name, plainCell}
		for _, r := range fos {
			cells = append(cells, cell(r))
		}
		g = append(g, cells)
	}
	optSec := func(s *float64, missing string) string {
		if s == nil {
			return missing
		}
		return fmtDur(sec(*s))
	}
	row("", "plain client", func(r runReport) string { return r.Name })
	row("detection (fault start to open)", "no breaker", func(r runReport) string { return optSec(r.DetectionS, "not detected") })
	row("false trips", "no breaker", func(r runReport) string {
		if r.FalseTrips == nil {
			return "n/a"
		}
		return fmt.Sprintf("%d (of %d trips)", *r.FalseTrips, *r.Trips)
	})
	row("recovery (fault end to closed)", "no breaker", func(r runReport) string {
		if r.DetectionS == nil {
			return "never opened"
		}
		return optSec(r.RecoveryS, "not within the run")
	})
	row("trips per upstream (its breaker)", "", func(runReport) string { return "" })
	for i, br := range fos[0].Breakers {
		name := fmt.Sprintf("  %s (%d failures, open %s)", br.Name, br.FailureThreshold, fmtDur(sec(br.CooldownS)))
		row(name, "no breaker", func(r runReport) string { return fmt.Sprint(r.Breakers[i].Trips) })
	}
	retention := func(r runReport) string {
		return fmt.Sprintf("%s (%d of %d)", pct2(r.Retention), r.Successes, r.Requests)
	}
	row("throughput retention", retention(plain), retention)
	row("latency p50", fmtDur(sec(plain.Latency.P50)), func(r runReport) string { return fmtDur(sec(r.Latency.P50)) })
	row("latency p95", fmtDur(sec(plain.Latency.P95)), func(r runReport) string { return fmtDur(sec(r.Latency.P95)) })
	row("latency p99", fmtDur(sec(plain.Latency.P99)), func(r runReport) string { return fmtDur(sec(r.Latency.P99)) })
	if rep.HedgeDelayS > 0 {
		row("hedges sent / won / denied", "-", func(r runReport) string {
			if r.Hedges == nil {
				return "off"
			}
			return fmt.Sprintf("%d / %d / %d", r.Hedges.Sent, r.Hedges.Won, r.Hedges.Denied)
		})
	}
	if rep.Fleet > 0 {
		writeFleetRows(row, rep)
	}
	row("requests per upstream", "", func(runReport) string { return "" })
	for i, u := range fos[0].PerUpstream {
		a := "-"
		if i < len(plain.PerUpstream) {
			a = fmt.Sprint(plain.PerUpstream[i].Attempts)
		}
		row("  "+u.Name, a, func(r runReport) string { return fmt.Sprint(r.PerUpstream[i].Attempts) })
	}
	row("spend per upstream (Upstream.Cost)", "", func(runReport) string { return "" })
	for i, u := range fos[0].PerUpstream {
		row("  "+u.Name, "-", func(r runReport) string { return fmtSpend(r.PerUpstream[i]) })
	}
	row("  total", "-", func(r runReport) string {
		var sum upstreamCount
		for _, u := range r.PerUpstream {
			sum.Answers, sum.Tokens, sum.Spend = sum.Answers+u.Answers, sum.Tokens+u.Tokens, sum.Spend+u.Spend
		}
		return fmtSpend(sum)
	})
	for _, p := range rep.Phases {
		if p.Name != "hang" {
			continue
		}
		row(fmt.Sprintf("hang phase (%.1f-%.1f s)", p.StartS, p.EndS), "", func(runReport) string { return "" })
		row("  primary's circuit at its start", "no breaker", func(r runReport) string { return r.HangPhase.CircuitAtStart })
		sent := func(r runReport) string { return fmt.Sprint(r.HangPhase.PrimaryAttempts) }
		row("  requests sent to the primary", sent(plain), sent)
		before := func(r runReport) string {
			if r.HangPhase.BeforeOpen == nil {
				return "-"
			}
			return fmt.Sprint(*r.HangPhase.BeforeOpen)
		}
		row("    before its circuit opened", before(plain), before)
		p99 := func(r runReport) string { return fmtDur(sec(r.HangPhase.P99S)) }
		row("  latency p99", p99(plain), p99)
		warm := func(r runReport) string { return fmtDur(sec(r.HangPhase.WarmUpP99S)) }
		row("  latency p99 in warm-up", warm(plain), warm)
	}
	row("what the caller saw (success)", "", func(runReport) string { return "" })
	for i, p := range rep.Phases {
		pct := func(r runReport) string { return pct1(r.Phases[i].SuccessRate) }
		row("  "+p.Name, pct(plain), pct)
	}
	row("sent to the primary (before open)", "", func(runReport) string { return "" })
	for i, p := range rep.Phases {
		if !p.Fault {
			continue
		}
		sent := func(r runReport) string {
			cell := fmt.Sprint(r.Phases[i].PrimaryAttempts)
			if b := r.Phases[i].BeforeOpen; b != nil {
				cell += fmt.Sprintf(" (%d)", *b)
			}
			return cell
		}
		row("  "+p.Name, sent(plain), sent)
	}
	g.write(&b, lineWidth)

	ts := rep.Timescale
	var foot strings.Builder
	fmt.Fprintf(&foot, "\nLatency is end to end over every request, failed ones included; streams are read to [DONE].\n")
	var prices []string
	for i, u := range rep.Upstreams {
		if u.Kind != "real" && i < len(profiles) {
			prices = append(prices, fmt.Sprintf("%s %g/%g", u.Name, profiles[i].cost.Input, profiles[i].cost.Output))
		}
	}
	if len(prices) > 0 {
		fmt.Fprintf(&foot, "Spend is the usage the answers reported (%d+%d tokens each, streams asking for stream_options.include_usage), at $ per million input/output tokens: %s.\n",
			promptTokens, completionTokens, strings.Join(prices, ", "))
	}
	p99s := []string{"plain " + fmtDur(sec(plain.Latency.P99/ts))}
	for _, r := range fos {
		p99s = append(p99s, r.Name+" "+fmtDur(sec(r.Latency.P99/ts)))
	}
	fmt.Fprintf(&foot, "p99 at provider scale (divided by the timescale): %s; the field's gateway reported 14.2 s without a breaker, 890 ms with one.\n",
		strings.Join(p99s, ", "))
	fmt.Fprintf(&foot, "\n%s\n", summary(rep))
	if rep.Plot != "" {
		fmt.Fprintf(&foot, "Picture: %s (-plot FILE.png or .svg to move it, -plot off for none)", rep.Plot)
	} else {
		foot.WriteString("No picture (-plot FILE.png or .svg draws one).")
	}
	wrap(&b, foot.String(), lineWidth)
	_, err := io.WriteString(out, b.String())
	return err
}

// summary says in plain words what the drill showed, from its figures:
// the share of requests answered with failover and without, and for how
// long the primary failed.
func summary(rep *report) string {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	answered := func(r runReport, words string) string {
		return fmt.Sprintf("%s%s (%d of %d, p99 %s)", pct1(r.Retention), words, r.Successes, r.Requests, fmtDur(sec(r.Latency.P99)))
	}
	var with []string
	for i, r := range rep.Runs[1:] {
		name := r.Name
		if fleet, sharing, ok := strings.Cut(name, ", "); ok {
			name = fleet + " (" + sharing + ")"
		}
		words := ""
		if i == 0 {
			words = " of requests were answered"
		}
		with = append(with, fmt.Sprintf("with %s, %s", name, answered(r, words)))
	}
	var down float64
	for _, p := range rep.Phases {
		if p.Fault {
			down += p.EndS - p.StartS
		}
	}
	return fmt.Sprintf("In short: %s; without failover, %s. The primary failed for %.1f s of the %.4g s.",
		strings.Join(with, "; "), answered(rep.Runs[0], ""), down, rep.DurationS)
}

// writeLag writes the machine's lines: the hogs, the drill's scheduling
// lag, and the warning when it was starved.
func writeLag(b *strings.Builder, rep *report) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	hogs := "no CPU hogs"
	switch rep.Hogs {
	case 0:
	case 1:
		hogs = "1 CPU hog (a child process spinning)"
	default:
		hogs = fmt.Sprintf("%d CPU hogs (child processes spinning)", rep.Hogs)
	}
	fmt.Fprintf(b, "Machine: %d CPUs, GOMAXPROCS %d, %s.\n", rep.CPUs, rep.GOMAXPROCS, hogs)
	l := rep.Lag
	if l == nil {
		return
	}
	fmt.Fprintf(b, "Scheduling lag (how late a %s sleep woke, %d times): p50 %s, p99 %s, worst %s; %s later than %s, %s in all (%s of the time), %d of them later than %s.",
		fmtDur(sec(l.IntervalS)), l.Samples, fmtDur(sec(l.P50S)), fmtDur(sec(l.P99S)), fmtDur(sec(l.MaxS)),
		plural(l.Stalls, "stall"), fmtDur(sec(l.StallS)), fmtDur(sec(l.StalledS)), pct1(l.StalledShare), l.LongStalls, fmtDur(sec(l.LongStallS)))
	if l.SchedP50S != nil && l.SchedP99S != nil {
		fmt.Fprintf(b, " Goroutines runnable before running: p50 %s, p99 %s.", fmtDur(sec(*l.SchedP50S)), fmtDur(sec(*l.SchedP99S)))
	}
	var phases []string
	for _, p := range l.Phases {
		phases = append(phases, fmt.Sprintf("%s %s/%s/%d/%d", p.Name, fmtDur(sec(p.P99S)), fmtDur(sec(p.MaxS)), p.Stalls, p.LongStalls))
	}
	fmt.Fprintf(b, "\nScheduling lag by phase (p99/worst/stalls/long ones): %s.\n", strings.Join(phases, ", "))
	if l.Starved {
		fmt.Fprintf(b, "WARNING: %s\n", l.Warning)
	}
}

// writeFleetRows writes the fleet figures with row, "n/a" in a column
// that is not a fleet's.
func writeFleetRows(row func(name, plainCell string, cell func(r runReport) string), rep *report) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	fleet := func(cell func(f *fleetResult) string) func(r runReport) string {
		return func(r runReport) string {
			if r.Fleet == nil {
				return "n/a"
			}
			return cell(r.Fleet)
		}
	}
	burst := "503 burst"
	for _, p := range rep.Phases {
		if p.Name == burst {
			burst = fmt.Sprintf("503 burst (%.1f-%.1f s)", p.StartS, p.EndS)
		}
	}
	row(fmt.Sprintf("fleet in the %s", burst), "", func(runReport) string { return "" })
	row("  503s on the primary until all open", "-", fleet(func(f *fleetResult) string { return fmt.Sprint(f.FailedBeforeStop) }))
	row("  circuits open after (first / last)", "no breaker", fleet(func(f *fleetResult) string {
		if f.FirstOpenS == nil {
			return "none opened"
		}
		last := fmt.Sprintf("%d of %d opened", f.Opened, f.Members)
		if f.AllOpenS != nil {
			last = fmtDur(sec(*f.AllOpenS))
		}
		return fmtDur(sec(*f.FirstOpenS)) + " / " + last
	}))
	row("  then probes per breaker cooldown", "-", fleet(func(f *fleetResult) string {
		if f.ProbesPerCooldown == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f", *f.ProbesPerCooldown)
	}))
	row("fleet after the faults", "", func(runReport) string { return "" })
	row("  until all are back on the primary", "-", fleet(func(f *fleetResult) string {
		if f.RecoveryS == nil {
			return fmt.Sprintf("%d of %d within the run", f.Recovered, f.Members)
		}
		return fmtDur(sec(*f.RecoveryS))
	}))
	row("  Redis errors (shared_errors_total)", "-", fleet(func(f *fleetResult) string {
		if f.SharedErrors == nil {
			return "no Redis"
		}
		return fmt.Sprint(*f.SharedErrors)
	}))
}

// plural returns "1 stall", "2 stalls".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// fmtSpend formats an upstream's spend: "$0.1813 (2901 answers)", or "-"
// when none of its answers reported usage.
func fmtSpend(u upstreamCount) string {
	if u.Answers == 0 {
		return "-"
	}
	if u.Spend >= 0.01 {
		return fmt.Sprintf("$%.4f (%d answers)", u.Spend, u.Answers)
	}
	return fmt.Sprintf("$%.6f (%d answers)", u.Spend, u.Answers)
}

func pct1(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }
func pct2(f float64) string { return fmt.Sprintf("%.2f %%", 100*f) }

// fmtDur formats d for a reader: 12 ms, 1.4 ms, 1.52 s.
func fmtDur(d time.Duration) string {
	switch {
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return d.Round(time.Second).String()
}
