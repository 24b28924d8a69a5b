package failover

import (
	"math/bits"
	"slices"
	"time"

	"github.com/failover-go/failover/internal/circuit"
	"github.com/failover-go/failover/internal/mono"
)

// Where a request may go, and why not: the one decision that the failover
// loop, the Routers' candidates, hedging, the last resort, Health, the
// metrics and the Trace all read. admit says whether an upstream takes a
// request now, demotion whether it is tried after the others, and a plan
// walks one round's upstreams in order with both verdicts.

// Reason says why an upstream takes no request now (see
// [UpstreamHealth.Unavailable] and [Candidate.Unavailable]), or why it is
// tried after the others (see [UpstreamHealth.Demoted] and
// [Candidate.Demoted]). The empty Reason means neither. Reasons name the
// failover_skipped_total series too.
type Reason string

// Why an upstream takes no request, in the order they are decided.
const (
	// ReasonModelNotServed: its Upstream.Models does not serve the
	// request's model, or its BaseURL has a {deployment} that the
	// request, naming no model, has nothing to fill with
	// (ErrModelNotServed). Only a request has a model: Health never
	// reports it.
	ReasonModelNotServed Reason = "model_not_served"
	// ReasonRateLimited: it cools down after a 429 (ErrRateLimited).
	ReasonRateLimited Reason = "rate_limited"
	// ReasonCircuitOpen: its circuit is open (ErrCircuitOpen).
	ReasonCircuitOpen Reason = "circuit_open"
	// ReasonProbing: its circuit is half-open and its one probe is in
	// flight (ErrCircuitOpen).
	ReasonProbing Reason = "probe_in_flight"
	// ReasonProbeElsewhere: its circuit is half-open and another process
	// of the fleet holds the probe ([Config.Shared]; ErrCircuitOpen).
	ReasonProbeElsewhere Reason = "probe_elsewhere"
	// ReasonShed: the request is sheddable ([WithSheddable]) and the
	// upstream's rate-limit headroom is short ([ShedConfig]; ErrShed).
	// Only a request is sheddable: Health never reports it.
	ReasonShed Reason = "shed"
)

// Why an upstream is tried after the others, in the order they are
// decided.
const (
	// ReasonFailing: its latest requests failed in a row (two, or one
	// when FailureThreshold is 2), and with the requests in flight there
	// it has as many as would open its circuit if they failed too
	// ([BreakerConfig]). Until one of them ends, a new request tries it
	// after the others: a failing upstream gets FailureThreshold
	// requests before its circuit opens, however many were in flight
	// when its fault began (or one more than were sent before its first
	// failure came back, when that is more).
	ReasonFailing Reason = "failing"
	// ReasonAuthFailing: its last answers were all 401 or 403: its key
	// looks revoked ([AuthConfig]).
	ReasonAuthFailing Reason = "auth_failing"
	// ReasonOutOfHeadroom: a success said a rate-limit window is
	// exhausted, and that window has not reset yet (for at most
	// RateLimit.MaxCooldown; a later success that reports the same
	// window above 0 lifts it).
	ReasonOutOfHeadroom Reason = "out_of_headroom"
	// ReasonDegraded: its recent latency or success rate is bad
	// ([DegradedConfig]).
	ReasonDegraded Reason = "degraded"
	// ReasonSuspect: it looks hung ([HangConfig]).
	ReasonSuspect Reason = "suspect"
)

// skipReasons are the Reasons a request skips an upstream for, as the
// skipped metrics count them.
var skipReasons = [...]Reason{ReasonRateLimited, ReasonModelNotServed, ReasonCircuitOpen, ReasonProbing, ReasonProbeElsewhere, ReasonShed}

// demoteReasons are the Reasons a request tries an upstream after others
// for, as the demoted metrics count them.
var demoteReasons = [...]Reason{ReasonFailing, ReasonAuthFailing, ReasonOutOfHeadroom, ReasonDegraded, ReasonSuspect}

// availability is the admission decision about one upstream at one
// instant.
type availability struct {
	reason Reason        // "" when the upstream takes the request
	wait   time.Duration // how long until it may, when known
	known  bool          // whether wait is known: a probe may end at any moment, a model is never served
}

// err is the error a request records for an upstream it skipped.
func (a availability) err() error {
	switch a.reason {
	case ReasonRateLimited:
		return ErrRateLimited
	case ReasonModelNotServed:
		return ErrModelNotServed
	case ReasonShed:
		return ErrShed
	}
	return ErrCircuitOpen
}

// admit is the one decision whether u takes a request for model ("" for
// any) at now, and if not, why and when it may again. With p set, it also
// takes the circuit's permit into *p; otherwise it only reads. Ordering,
// the Router's candidates, earliest, Health and the skipped metrics all
// ask it. A request's own list (WithUpstreams) is no input here: it
// chooses which upstreams are asked at all (see options.go).
func (t *Transport) admit(u *upstream, model string, now time.Time, p *circuit.Permit) availability {
	if !u.serves(model) {
		return availability{reason: ReasonModelNotServed} // whatever its state: nothing to wait for
	}
	if left := u.cooling(now); left > 0 { // with Keys, every key cools down
		a := availability{reason: ReasonRateLimited, wait: left, known: true}
		if v := u.circuit.Check(now); v.Refusal == circuit.Opened {
			a.wait = max(a.wait, v.Wait)
		}
		return a
	}
	var v circuit.Verdict
	if p != nil {
		*p, v = u.circuit.Allow(now)
	} else {
		v = u.circuit.Check(now)
	}
	switch v.Refusal {
	case circuit.Opened:
		return availability{reason: ReasonCircuitOpen, wait: v.Wait, known: true}
	case circuit.Probing:
		return availability{reason: ReasonProbing}
	case circuit.Elsewhere:
		return availability{reason: ReasonProbeElsewhere}
	}
	return availability{known: true}
}

// demotion is the one decision whether u is tried after the others at
// now, and why: its circuit is about to open, its key looks revoked or
// its rate-limit headroom is exhausted (with Keys, every key's), its
// recent figures are degraded, or it looks hung. Ordering, the Router's
// candidates and Health ask it.
func (t *Transport) demotion(u *upstream, now time.Time) Reason {
	switch {
	case u.failing():
		return ReasonFailing
	case t.authFailing(u, now):
		return ReasonAuthFailing
	case u.outOfHeadroom(now):
		return ReasonOutOfHeadroom
	case t.isDegraded(u, now):
		return ReasonDegraded
	case t.suspect(u, now):
		return ReasonSuspect
	}
	return ""
}

// lastResort picks the upstream a request for model goes to at now when
// admit refused every upstream of ups (those the request may use): the
// one whose circuit opened first among those admit refused for an open
// circuit; nil when there is none or the last resort is off. It reads
// admit's reasons; it decides nothing admit decides.
func (t *Transport) lastResort(ups []*upstream, model string, now time.Time) *upstream {
	if t.lastResortCfg.Off {
		return nil
	}
	var best *upstream
	var bestSince mono.Time
	for _, u := range ups {
		if t.admit(u, model, now, nil).reason != ReasonCircuitOpen {
			continue
		}
		if since := mono.Of(u.circuit.Snapshot(now).Since); best == nil || since < bestSince {
			best, bestSince = u, since
		}
	}
	return best
}

// earliest returns how long until the first of ups (the upstreams a
// request may use) can take a request for model, 0 when one can now, and
// whether that is known (a probe in flight may end at any moment).
func (t *Transport) earliest(ups []*upstream, model string, now time.Time) (time.Duration, bool) {
	best, known := time.Duration(0), false
	for _, u := range ups {
		a := t.admit(u, model, now, nil)
		if a.reason == "" {
			return 0, true
		}
		if a.known && (!known || a.wait < best) {
			best, known = a.wait, true
		}
	}
	return best, known
}

// maxDemotable is how many upstreams of a configured order can be put off
// as demoted: those past it are tried in their place.
const maxDemotable = 64

// step is one upstream of a plan and what the plan says of it.
type step struct {
	u       *upstream
	demoted Reason         // why it was demoted when it came up; "" when it was not
	av      availability   // admit's verdict: av.reason != "" means it is passed over
	p       circuit.Permit // its circuit's permit, when admitted
	k       *key           // the key it is sent with (pickKey); nil when u has no Keys
}

// A plan is one round of a request over the upstreams, decided as it
// goes: each next says which upstream comes next and whether it takes the
// request now. The order is the configured one (or the request's own,
// from WithUpstreams), demoted upstreams put off until the others have had
// their turn; or the Router's, whose pick is tried before it orders the
// rest, so that a request its pick serves reads no other upstream. An
// upstream that answered the request Unservable, or that a race of the
// round took, is never yielded again.
//
// A plan lives on the stack of the round that walks it and points into no
// stack: a Router's order is made in the heap. (Escape analysis does not
// tell a plan's fields apart: the upstreams it hands to a race would take
// a buffer of the round's to the heap with every request.)
type plan struct {
	t       *Transport
	model   string
	order   []*upstream // what is walked
	i       int         // the next of order
	demote  bool        // order is not a Router's: demoted upstreams go last
	shed    bool        // the request is sheddable: shedding is asked before admit
	demoted uint64      // bit i: order[i] was found demoted
	stage   uint8
	pick    *upstream   // the Router's pick, tried before it orders the rest
	then    *upstream   // the Router's second, first of the rest (see Transport.routed)
	refused []*upstream // answered the request Unservable
	taken   []*upstream // sent to, or passed over, by a race of the round

	// The key of a keyed upstream (Upstream.Keys) the request wants, by
	// name: a pinned or affine session's. With strictKey, only that key:
	// while it cools down its upstream is passed over.
	wantKey   string
	strictKey bool
}

// A plan's stages.
const (
	walking  = iota // order, then the demoted
	picking         // the Router's pick is next
	ordering        // the Router orders the rest, then walking
)

// plan starts p, the round's plan, at now; a plan made anew (pinLate)
// keeps nothing of what it was.
func (c *call) plan(p *plan, now time.Time) {
	*p = plan{t: c.t, model: c.admitting(), refused: c.refused, shed: c.shed()}
	switch {
	case c.pin != nil:
		// Where the state it references lives, and nowhere else
		// (PinConfig). (A slice of the Transport's: a plan points
		// into no stack.)
		p.order, p.demote = c.t.upstreams[c.pin.index:c.pin.index+1], true
	case c.ups != nil || c.t.router == nil:
		p.order, p.demote = c.usable(), true
	case len(c.refused) == 0 && c.t.picker != nil:
		if c.affineWell(p.model, now) {
			p.pick, p.stage = c.affine, picking // the session's upstream, while it is well (AffinityConfig)
			break
		}
		if pick, then := c.t.pickFirst(p.model, now); pick != nil {
			p.pick, p.then, p.stage = pick, then, picking
			break
		}
		fallthrough
	default:
		p.order = c.t.routed(nil, p.model, now, nil, nil)
		if c.t.picker == nil && c.affineWell(p.model, now) {
			// A balancing Router that is no picker (&Score{}): the
			// session's upstream goes first all the same. (The order
			// is the request's own.)
			if i := slices.Index(p.order, c.affine); i > 0 {
				copy(p.order[1:i+1], p.order[:i])
				p.order[0] = c.affine
			}
		}
	}
	switch {
	case c.pin != nil:
		p.wantKey, p.strictKey = c.pinKey, c.pinKey != "" // only the key that holds the state
	case c.affine != nil:
		p.wantKey = c.affineKey // the key whose requests the cache saw, while it is well
	}
}

// admitting is the model that admission reads for the request: its own,
// or noModel when it names none and was not addressed to an upstream
// with a {deployment}, which only the addressed one can fill without a
// model.
func (c *call) admitting() string {
	if c.model == "" && (c.addressed == nil || !c.addressed.deployed) {
		return noModel
	}
	return c.model
}

// next decides the round's next upstream at now and asks admit whether it
// takes the request, taking its circuit's permit when it does; for a
// sheddable request, shedding may pass it over first. It reports
// false when the round has no upstream left. Why a request went to the
// backup is decided here: the primary came first and was passed over (its
// step's av says why) or failed, or it was demoted (its step's demoted
// says why) and the backup went first.
func (p *plan) next(now time.Time, s *step) bool {
	u, demoted := p.upcoming(now)
	if u == nil {
		return false
	}
	s.u, s.demoted = u, demoted
	if p.shed && u.serves(p.model) {
		if s.av = p.t.shedding(u, now); s.av.reason != "" {
			return true // passed over before its circuit's permit is taken
		}
	}
	s.av = p.t.admit(u, p.model, now, &s.p) // (admit writes s.p)
	p.t.keyed(s, p.wantKey, p.strictKey, p.shed, now)
	return true
}

// upcoming is next without admission: the next upstream, nil when there
// is none, and why it was demoted.
func (p *plan) upcoming(now time.Time) (*upstream, Reason) {
	if p.stage == picking {
		p.stage = ordering
		if !p.excluded(p.pick) {
			return p.pick, "" // picked from the first group (see picker)
		}
	}
	p.ordered(now)
	for p.i < len(p.order) {
		i, u := p.i, p.order[p.i]
		p.i++
		switch {
		case p.excluded(u):
		case !p.demote:
			return u, p.t.demotion(u, now) // the Router placed it
		case i >= maxDemotable:
			return u, ""
		case p.t.demotion(u, now) != "":
			p.demoted |= 1 << i
		default:
			return u, ""
		}
	}
	for p.demoted != 0 {
		i := bits.TrailingZeros64(p.demoted)
		p.demoted &^= 1 << i
		if u := p.order[i]; !p.excluded(u) {
			return u, p.t.demotion(u, now)
		}
	}
	return nil, ""
}

// ordered has the Router order the rest, once its pick has had its turn.
func (p *plan) ordered(now time.Time) {
	if p.stage == ordering {
		p.order, p.i, p.stage = p.t.routed(nil, p.model, now, p.pick, p.then), 0, walking
	}
}

// A switchCost is what moving a request on from the upstream that just
// failed it costs (see plan.switching).
type switchCost uint8

const (
	switchFree   switchCost = iota // the next upstream serves the same model at no higher price, or the round is over and another takes the request
	switchCostly                   // it serves another model (Upstream.Models) or costs more (Upstream.Cost)
	switchNone                     // no other upstream takes the request now
)

// switching decides at now what moving the request on from u costs: the
// next upstream the plan would send it to, passing over those admit
// refuses as next does, against u. The plan stays where it was, but for
// the Router's order of the rest, made now if it was still to make, so
// that the upstream looked at is the one next yields. Whether a request
// retries u rather than move on is decided here (see RetryConfig).
func (p *plan) switching(u *upstream, now time.Time) switchCost {
	p.ordered(now)
	q := *p
	for {
		v, _ := q.upcoming(now)
		switch {
		case v == nil && p.others(u, now):
			return switchFree // tried this round: the caller's next request finds them
		case v == nil:
			return switchNone
		case v == u || p.t.admit(v, p.model, now, nil).reason != "":
		case !sameDeal(u, v, p.model):
			return switchCostly
		default:
			return switchFree
		}
	}
}

// others reports whether an upstream of the request but u takes it at
// now, tried in the round or not.
func (p *plan) others(u *upstream, now time.Time) bool {
	if v := p.pick; v != nil && v != u && !slices.Contains(p.refused, v) && p.t.admit(v, p.model, now, nil).reason == "" {
		return true
	}
	for _, v := range p.order {
		if v != u && !slices.Contains(p.refused, v) && p.t.admit(v, p.model, now, nil).reason == "" {
			return true
		}
	}
	return false
}

// sameDeal reports whether v serves a request for model as u does: the
// same model (Upstream.Models), at no higher price (Cost.Input+Output,
// zero counting as the cheapest, as Score reads it).
func sameDeal(u, v *upstream, model string) bool {
	if model != "" && model != noModel {
		mu, _ := u.models.lookup(model)
		mv, _ := v.models.lookup(model)
		if mu != mv {
			return false
		}
	}
	return v.cfg.Cost.total() <= u.cfg.Cost.total()
}

// readmits reports whether u, whose attempt at a request for model just
// failed, takes the request again after wait from now: admit's verdict,
// but for a cooldown that ends within wait (its own 429's, which the
// request waits out). A circuit the failure opened refuses it.
func (t *Transport) readmits(u *upstream, model string, now time.Time, wait time.Duration) bool {
	a := t.admit(u, model, now, nil)
	return a.reason == "" || a.reason == ReasonRateLimited && a.known && a.wait <= wait
}

// came reports whether the plan yielded u already (see upcoming).
func (p *plan) came(u *upstream) bool {
	if p.pick == u && p.stage != picking {
		return true
	}
	for i, v := range p.order[:p.i] {
		if v == u {
			return !p.demote || i >= maxDemotable || p.demoted&(1<<i) == 0
		}
	}
	return false
}

// excluded reports whether u is out of the round: it answered the request
// Unservable, or a race of the round took it.
func (p *plan) excluded(u *upstream) bool {
	return len(p.refused) > 0 && slices.Contains(p.refused, u) || len(p.taken) > 0 && slices.Contains(p.taken, u)
}

// admitted is the step of u at now for a request for model, when u is
// sent to out of a plan's turn (a hedge): admit's verdict, and the
// permit when it takes the request.
func (t *Transport) admitted(u *upstream, model string, now time.Time, s *step) {
	t.admittedKey(u, model, "", false, now, s)
}

// admittedKey is admitted with the key the request wants of u (see
// pickKey).
func (t *Transport) admittedKey(u *upstream, model, want string, strict bool, now time.Time, s *step) {
	*s = step{u: u}
	s.av = t.admit(u, model, now, &s.p)
	t.keyed(s, want, strict, false, now)
}

// keyed gives s, a step admit took, the key of its upstream it is sent
// with at now (pickKey), when it has Keys; shed says the request is
// sheddable. When none may go, the step is passed over after all, and its
// permit is handed back: as rate limited, for as long as want cools down
// when strict, else until the first key stops cooling; or, for a
// sheddable request with a key that does not cool down but is short of
// headroom, as shed, until the first key may take it.
func (t *Transport) keyed(s *step, want string, strict, shed bool, now time.Time) {
	u := s.u
	if s.k = nil; s.av.reason != "" || len(u.keys) == 0 {
		return
	}
	if s.k = t.pickKey(u, want, strict, shed, now); s.k != nil {
		return
	}
	ks := u.keys
	if k := u.key(want); strict && k != nil {
		ks = []*key{k}
	}
	av := availability{reason: ReasonRateLimited, wait: maxDuration, known: true}
	for _, k := range ks {
		left := k.cd.remaining(now)
		if left <= 0 { // (then shed, and short of headroom)
			left, av.reason = t.short(&k.headroom, mono.Of(now)).wait, ReasonShed
		}
		av.wait = min(av.wait, left)
	}
	u.circuit.Done(s.p, circuit.Neutral, now)
	s.p = circuit.Permit{}
	s.av = av
}

// pickKey is the one decision which of u's Keys a request sends with at
// now, once admit took u: want (a pinned or affine session's key, by
// name) unless it cools down, looks revoked or is out of headroom; with
// strict, want alone, unless it cools down. Otherwise the round-robin's
// next key that does not cool down, those neither revoked nor out of
// headroom first. For a sheddable request (shed), a key short of headroom
// (see Transport.shedding) is never picked, as one that cools down. It
// returns nil when none may go. A want that names no key of u asks for
// none.
func (t *Transport) pickKey(u *upstream, want string, strict, shed bool, now time.Time) *key {
	if k := u.key(want); k != nil {
		switch rank := t.keyRank(k, shed, now); {
		case strict && rank == keyCooling:
			return nil
		case strict, rank == keyGood:
			return k
		}
	}
	return t.chooseKey(u, 0, shed, now)
}

// nextKey is the key of u that a request goes to at once when the key it
// was just sent with answered 429 or 401 (see call.rekey): the
// round-robin's next that it has not tried (the bits of tried) and that
// does not cool down, as pickKey ranks them; nil when there is none, or
// when the request wants its key alone.
func (p *plan) nextKey(u *upstream, tried uint64, now time.Time) *key {
	if p.strictKey && u.key(p.wantKey) != nil {
		return nil
	}
	return p.t.chooseKey(u, tried, p.shed, now)
}

// chooseKey is the round-robin's next key of u at now that is not in tried
// and does not cool down, the best ranked; nil when there is none. The
// turns of the keys passed over go to the keys after the one chosen, not
// to it.
func (t *Transport) chooseKey(u *upstream, tried uint64, shed bool, now time.Time) *key {
	n := uint32(len(u.keys))
	start := (u.rr.Add(1) - 1) % n
	var best *key
	bestRank, at := keyCooling, uint32(0)
	for i := range n {
		k := u.keys[(start+i)%n]
		if k.bit&tried != 0 {
			continue
		}
		if rank := t.keyRank(k, shed, now); rank < bestRank {
			best, bestRank, at = k, rank, i
			if rank == keyGood {
				break
			}
		}
	}
	if at > 0 {
		u.rr.Add(at)
	}
	return best
}

// A key's rank, best first: how pickKey orders an upstream's Keys.
const (
	keyGood       = iota
	keyNoHeadroom // out of headroom
	keyRevoked    // looks revoked (AuthConfig)
	keyCooling    // cools down after a 429: never picked
)

// keyRank ranks k at now; for a sheddable request (shed), a key short of
// headroom ranks as one that cools down.
func (t *Transport) keyRank(k *key, shed bool, now time.Time) int {
	switch {
	case k.cd.remaining(now) > 0, shed && t.short(&k.headroom, mono.Of(now)).reason != "":
		return keyCooling
	case t.revoked(&k.auth, now):
		return keyRevoked
	case k.headroom.out(now):
		return keyNoHeadroom
	}
	return keyGood
}
