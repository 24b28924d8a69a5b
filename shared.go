package failover

import (
	"context"
	"time"
)

// Shared is state that the Transports of a fleet (the processes of one
// service, each with its own Transport) share, so that the fleet learns
// once that an upstream is down, not once per process. Package
// [github.com/failover-go/failover/redisshared] implements it on Redis.
//
// What is shared, per upstream name:
//
//   - that a circuit opened, and for how long: every process opens its own
//     for the time left;
//   - that an upstream cools down after a 429, and for how long, under the
//     same extend-only rule as in one process;
//   - which process sends the half-open probe: one per cooldown in the
//     whole fleet, the one that holds the probe's lease, and its verdict,
//     which closes or reopens the circuit everywhere;
//   - the failures of a closed circuit, and each member's request rate
//     (stored, refreshed every SharedSync), so that a fleet that fails
//     together trips after about FailureThreshold failures in all rather
//     than FailureThreshold per process. From two periods after it
//     starts (when it knows the members' rates), a process whose own last
//     attempt failed opens its circuit
//     when the fleet's last FailureThreshold failures came within the
//     time the whole fleet takes to send 2×FailureThreshold requests:
//     about as dense as FailureThreshold consecutive failures of the
//     fleet's merged stream of requests, with room for the jitter of a
//     loaded machine. Stray background errors rarely are, whatever the
//     fleet's size: at 0.5 % errors, a stray error completes such a run
//     of 5 about once in 4 million.
//
// Members may disagree on an upstream's policy (Upstream.Breaker); they
// do not fight over it. A circuit that opens somewhere opens everywhere for
// the time its member has left, whatever the others' Cooldown says, and an
// open circuit's time only lengthens, here as in the store: a member never
// closes or shortens another's. The probe's lease lasts the prober's
// Cooldown; its verdict closes every circuit, or reopens every circuit for
// the prober's Cooldown. While it probes, no Open from the fleet (its own
// read back from the store, another member's late) holds the prober's
// circuit open again: the probe's verdict decides. Each member judges the
// fleet's failures by its own FailureThreshold, so the member with the
// lowest trips the fleet first.
// A rate limit's cooldown is shared too, and each member caps what it
// adopts at its own RateLimitConfig.MaxCooldown.
//
// Nothing secret is shared: upstream names, durations and request rates
// only. Upstreams are matched by [Upstream.Name], so every process must
// name them alike; an upstream without a Name is named after its host,
// which is then shared too.
//
// The fleet's failures count under the consecutive-failure rule only; with
// BreakerConfig.FailureRate, each process judges its own failures.
//
// The Transport calls Shared only from goroutines of its own, never from a
// request: a slow or unreachable store adds no latency to requests and
// fails none. While it is unreachable, each Transport runs on its own
// state, and it shares again when the store comes back. An upstream whose
// cooldown is over is probed by one process: the others skip it, as they
// skip an upstream whose probe is in flight, until the verdict; so does the
// one process until it has the lease, which it asks for in the background.
// Each call is bounded by Config.SharedSync (at least 1s) through its
// context: a store must honour the context's deadline (redisshared does,
// see its New). Transport.Close cancels the context, and waits for the
// call no longer than its deadline and a second (see Transport.Close). A
// call that panics counts as a call that failed.
//
// Durations are relative (how long from now), so that processes need not
// agree on the time of day.
type Shared interface {
	// Publish records e in the store and tells the other members.
	// Publishing an Open or Cooling event never shortens what the store
	// holds. Closed clears the upstream's open state and probe lease and
	// records, for For, that the fleet closed the circuit; Open clears
	// that record. Reset does what Closed does and clears the cooldown
	// too. Failure is told, not stored; Rate is stored, not told.
	Publish(ctx context.Context, e SharedEvent) error

	// Load returns what the store holds for the named upstreams: an
	// Open event for each open circuit, a Closed event for each circuit
	// the fleet closed within its For, a Cooling event for each
	// cooldown, with For the time left, and a Rate event for each member
	// whose rate has not expired. An upstream it returns nothing for is
	// none of these, or the store lost its state.
	Load(ctx context.Context, upstreams []string) ([]SharedEvent, error)

	// Subscribe calls deliver with each event that members publish,
	// its own included, until ctx is done or the subscription fails. It
	// returns the error that ended it; the Transport subscribes again.
	Subscribe(ctx context.Context, deliver func(SharedEvent)) error

	// AcquireProbe takes the lease on the half-open probe of upstream for
	// ttl, for member, unless another member holds it. It reports
	// whether member holds it.
	AcquireProbe(ctx context.Context, upstream, member string, ttl time.Duration) (bool, error)
}

// SharedKind is what a [SharedEvent] says.
type SharedKind uint8

// The kinds of [SharedEvent].
const (
	// SharedOpen: the upstream's circuit opened, for For.
	SharedOpen SharedKind = iota + 1
	// SharedClosed: a probe found the upstream well; its circuit is
	// closed for everyone.
	SharedClosed
	// SharedCooling: the upstream rate-limited a request; it cools down
	// for For.
	SharedCooling
	// SharedFailure: an attempt failed while the circuit was closed.
	// It is only published, never stored.
	SharedFailure
	// SharedReset: an operator closed the circuit and ended the cooldown
	// (Transport.Reset); it clears both for everyone.
	SharedReset
	// SharedRate: a member's recent requests per second to the upstream
	// (Rate), good for For. It is stored, not told: Load returns one per
	// member, so that each member knows the fleet's rate.
	SharedRate
)

// String returns "open", "closed" or "cooling".
func (k SharedKind) String() string {
	switch k {
	case SharedOpen:
		return "open"
	case SharedClosed:
		return "closed"
	case SharedCooling:
		return "cooling"
	case SharedFailure:
		return "failure"
	case SharedReset:
		return "reset"
	case SharedRate:
		return "rate"
	}
	return "unknown"
}

// SharedEvent is one fact about an upstream, as members of a fleet share
// it.
type SharedEvent struct {
	Upstream string         // Upstream.Name
	Kind     SharedKind     //
	For      time.Duration  // Open, Cooling: how long from now
	Reason   CooldownReason // Cooling: why
	Rate     float64        // Failure, Rate: the member's recent requests per second to the upstream
	At       time.Time      // Failure: when it happened, by its member's clock
	Member   string         // the member that published it

	at time.Time // when it happened, for At and For
}
