package failover

// LastResortConfig sets what a request does when every upstream it may use
// refuses it for an open circuit. Rather than fail at once with
// ErrCircuitOpen, it goes past the circuit of the upstream whose circuit
// opened first, the likeliest to answer, as Envoy's panic threshold does:
// a false trip then costs latency rather than every request, and an
// upstream that is back is found before its cooldown ends. The answer is
// the request's (the last resort never fails over) and counts as an active
// probe's ([ProbeConfig]).
//
// Upstreams cooling down after a 429, not serving the model, or whose
// half-open probe is in flight are never a last resort, and a request that
// may wait (RateLimit.MaxWait) waits instead. [WithoutFailover] has none,
// and [WithUpstreams] keeps it to the list. The zero value is on.
type LastResortConfig struct {
	// Off turns the last resort off: a request that every circuit
	// refuses fails at once.
	Off bool

	// MaxInFlight bounds the last-resort requests in flight at once, so
	// that an upstream down for real is not flooded; past it a request
	// fails with ErrCircuitOpen. Zero means 4.
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
