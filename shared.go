package failover

import (
	"context"
	"time"
)

// Shared is state that the Transports of a fleet (the processes of one
// service) share, so that the fleet learns once that an upstream is down,
// not once per process: open circuits, 429 cooldowns, which process sends
// the half-open probe and its verdict, and the failures and request rates
// of closed circuits, so that a fleet failing together trips after about
// FailureThreshold failures in all (under the consecutive-failure rule
// only). Package [github.com/failover-go/failover/redisshared] implements
// it on Redis.
//
// Upstreams are matched by [Upstream.Name], so every process must name
// them alike. Nothing secret is shared: names, durations and request
// rates. Durations are relative, so that clocks need not agree.
//
// The Transport calls Shared only from goroutines of its own, never from a
// request: a slow or unreachable store adds no latency, and while it is
// down each process runs on its own state. Each call's context has a
// deadline of Config.SharedSync (at least 1s), which an implementation
// must honour. A call that panics counts as one that failed.
//
// What the store says is bounded, however often it says it. A member
// holds a cooldown or an open circuit it adopts for at most its
// [RateLimitConfig.MaxCooldown] (an open circuit: or its
// [BreakerConfig.MaxCooldown], if longer) counted from its first adoption,
// through every repetition that comes within SharedSync (at least 1s) of
// the end said last, however it moves that end; only a lapse, or a 429 or
// trip of the member's own, starts the count anew. A lease the store
// refuses holds the member's probe back for at most its Cooldown or 30s,
// whichever is longer.
// Durations that are not positive, unknown upstreams, kinds and reasons,
// and rates that are not positive numbers are ignored. From Close on,
// nothing the store returns or delivers is adopted.
type Shared interface {
	// Publish records e in the store and tells the other members.
	// Publishing an Open or Cooling event never shortens what the store
	// holds. Closed clears the upstream's open state and probe lease and
	// records, for For, that the fleet closed the circuit; Open clears
	// that record. Reset does what Closed does and clears the cooldown
	// too. Failure and Pin are told, not stored; Rate is stored, not
	// told.
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
	// deliver may be called from several goroutines at once; after
	// Close it does nothing.
	Subscribe(ctx context.Context, deliver func(SharedEvent)) error

	// AcquireProbe takes the lease on the half-open probe of upstream for
	// ttl, for member, unless another member holds it; a member that
	// holds it already holds it for ttl from now. It reports whether
	// member holds it.
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
	// SharedPin: state a request may reference (Ref, such as a
	// response's ID) lives at the upstream, for For ([PinConfig]). It
	// is told, not stored: a member that joins later learns only what
	// is told from then on.
	SharedPin
)

// String returns the kind's name: "open", "closed", "cooling", "failure",
// "reset", "rate" or "pin".
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
	case SharedPin:
		return "pin"
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
	Ref      string         // Pin: the reference to the state
	Key      string         // Pin: the name of the upstream's key that holds it (Upstream.Keys); "": any

	at time.Time // when it happened, for At and For
}
