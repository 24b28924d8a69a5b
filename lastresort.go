package failover

// LastResortConfig sets what a request does when every upstream it may use
// refuses it because its circuit is open. Rather than fail at once with
// ErrCircuitOpen, it goes past the circuit of the one most likely to
// answer: the one whose circuit opened first. An upstream whose half-open
// probe is in flight, here or elsewhere in the fleet, is not a last
// resort: its verdict is on its way.
// Envoy's panic threshold does the like when too few hosts are healthy. A
// false trip (a starved client, a burst of errors that ended) then costs
// latency rather than every request, and an upstream that is back is found
// before its cooldown ends.
//
// The answer counts as an active probe's (see ProbeConfig): a success
// moves an open circuit to half-open, so that the next request probes it;
// a failure keeps it open. Upstreams cooling down after a 429 are never a
// last resort (they said when to come back), nor are those that do not
// serve the request's model. A request that may wait (RateLimit.MaxWait)
// waits instead, and the last resort never fails over: what it gets is the
// request's answer.
//
// A request sent [WithoutFailover] has no last resort, and one restricted
// by [WithUpstreams] only among its list.
//
// At most MaxInFlight last-resort requests are in flight at once, so that
// an upstream that is down for real is not flooded: past that bound, a
// request fails at once with ErrCircuitOpen, as without a last resort. The
// zero value is on.
type LastResortConfig struct {
	// Off turns the last resort off: a request that every circuit
	// refuses fails at once.
	Off bool

	// MaxInFlight bounds the last-resort requests in flight at once.
	// Zero means 4.
	MaxInFlight int
}

const defaultLastResortInFlight = 4

func (c LastResortConfig) validate() error {
	if c.MaxInFlight < 0 {
		return configError("LastResort.MaxInFlight", "must not be negative")
	}
	return nil
}

// takeLastResort takes one of the last resort's MaxInFlight places, if one
// is free.
func (t *Transport) takeLastResort() bool {
	for {
		n := t.lastResortInFlight.Load()
		if n >= int64(t.lastResortCfg.MaxInFlight) {
			return false
		}
		if t.lastResortInFlight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// lastResortDone gives a place back.
func (t *Transport) lastResortDone() { t.lastResortInFlight.Add(-1) }
