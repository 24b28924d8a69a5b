package main

import (
	"errors"
	"fmt"
	"time"
)

// maxFleet bounds -fleet: each member is a Transport with connections of
// its own to every upstream (and with sharing on, to Redis), twice over.
const maxFleet = 100

// checkFleet checks -fleet and -redis against the other flags. A drill
// with -fleet runs two fleet runs of one policy: the comparison is sharing
// off against on, and hedging would only blur it.
func checkFleet(o options, policies []string) error {
	switch {
	case o.Fleet == 0:
		return errors.New("-redis needs -fleet N: it is where the sharing fleet keeps its state")
	case o.Fleet < 2 || o.Fleet > maxFleet:
		return fmt.Errorf("-fleet %d: want 2 to %d members per fleet", o.Fleet, maxFleet)
	case o.Hedge > 0:
		return errors.New("-fleet and -hedge do not combine: the fleets compare sharing off and on, unhedged")
	case len(policies) > 1:
		return fmt.Errorf("-fleet runs one routing policy, -router gave %d", len(policies))
	}
	return nil
}

// fleetResult is what a fleet run did as a fleet: how soon it stopped
// sending to the primary in the 503 burst, how often it probed it there,
// and how soon it came back to it after the faults.
type fleetResult struct {
	Members int  `json:"members"`
	Shared  bool `json:"shared"` // Config.Shared on Redis

	// Opened counts the members whose primary's circuit went from
	// closed to open in the 503 burst. FirstOpenS and AllOpenS are the
	// times from the burst's start to the first and to the last of
	// them; AllOpenS is null when some member's never did.
	Opened     int      `json:"opened"`
	FirstOpenS *float64 `json:"first_open_s"`
	AllOpenS   *float64 `json:"all_open_s"`

	// FailedBeforeStop counts the attempts sent to the primary from the
	// burst's start until the last member's circuit opened (until the
	// burst's end when some never did): 503s, every one.
	FailedBeforeStop int `json:"failed_before_stop"`

	// ProbesPerCooldown is the attempts sent to the primary from then to
	// the burst's end, per breaker cooldown (the primary's): the probes of
	// half-open circuits. Null when the circuits were not all open with at
	// least a tenth of a cooldown of the burst left.
	ProbesPerCooldown *float64 `json:"probes_per_cooldown"`

	// RecoveryS is the time from the end of the faults until every
	// member had sent an attempt to the primary that was answered with a
	// 2xx; null when Recovered, the members that had, is not all of them.
	RecoveryS *float64 `json:"recovery_s"`
	Recovered int      `json:"recovered"`

	// SharedErrors is failover_shared_errors_total summed over the
	// members: calls to Redis that failed. Null with sharing off.
	SharedErrors *uint64 `json:"shared_errors"`
}

// fleetFigures measures r, a fleet run, from each member's state changes
// (evs[i] are member i's) and the attempts of all.
func fleetFigures(r *run, evs [][]event, attempts []attempt, phases []phase, o options) *fleetResult {
	f := &fleetResult{Members: len(r.members), Shared: r.spec.shared != nil}
	if f.Shared {
		var n uint64
		for _, m := range r.members {
			n += m.metrics.GetOrCreateCounter("failover_shared_errors_total").Get()
		}
		f.SharedErrors = &n
	}
	primary := r.names[0]
	if b := phaseOf(phases, burst503); b >= 0 {
		burst := phases[b]
		// An attempt sent in the burst may fail a little after it.
		grace := o.attemptTimeout()
		first, last := time.Duration(-1), time.Duration(-1)
		for _, mevs := range evs {
			for _, e := range mevs {
				if e.upstream == primary && e.msg == "circuit open" && e.from == "closed" && e.at >= burst.start && e.at < burst.end+grace {
					f.Opened++
					if first < 0 || e.at < first {
						first = e.at
					}
					last = max(last, e.at)
					break
				}
			}
		}
		stop := burst.end
		if f.Opened > 0 {
			f.FirstOpenS = ptr(seconds(first - burst.start))
		}
		if f.Opened == len(r.members) {
			f.AllOpenS = ptr(seconds(last - burst.start))
			stop = min(last, burst.end)
		}
		probes := 0
		for _, a := range attempts {
			if a.upstream != 0 || a.at < burst.start || a.at >= burst.end {
				continue
			}
			if a.at <= stop {
				f.FailedBeforeStop++
			} else {
				probes++
			}
		}
		cooldown := o.primaryBreaker().Cooldown
		if left := burst.end - stop; f.AllOpenS != nil && left >= cooldown {
			f.ProbesPerCooldown = ptr(float64(probes) / (float64(left) / float64(cooldown)))
		}
	}
	_, faultEnd := faultWindow(phases)
	back := make([]time.Duration, len(r.members))
	for i := range back {
		back[i] = -1
	}
	for _, a := range attempts {
		if a.upstream == 0 && a.ok && a.at >= faultEnd && (back[a.member] < 0 || a.at < back[a.member]) {
			back[a.member] = a.at
		}
	}
	var latest time.Duration
	for _, at := range back {
		if at >= 0 {
			f.Recovered++
			latest = max(latest, at-faultEnd)
		}
	}
	if f.Recovered == len(r.members) {
		f.RecoveryS = ptr(seconds(latest))
	}
	return f
}
