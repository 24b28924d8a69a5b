package failover

import (
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// Cost is what an upstream charges, in any currency as long as every
// upstream uses the same one. [Score] prefers the cheaper upstreams.
type Cost struct {
	// Input and Output are the prices of a million input and of a
	// million output tokens. Zero means unknown or free: the upstream
	// counts as the cheapest. New refuses a price that is negative, not
	// finite or above 1e100, here and in the fields below.
	Input, Output float64

	// CachedInput and CacheWrite are the prices of a million input
	// tokens read from and written to the provider's prompt cache
	// (Tokens.Cached and Tokens.CacheWrite), where the provider prices
	// them apart: OpenAI charges a cached read a half or a tenth of
	// Input, Anthropic a tenth for a read and 1.25 times Input for a
	// five-minute write. Zero means priced as Input. Score's configured
	// price (before any answer reported its usage) uses Input alone.
	CachedInput, CacheWrite float64
}

// total returns Input+Output, negative prices counting as zero.
func (c Cost) total() float64 {
	return max(c.Input, 0) + max(c.Output, 0)
}

// Candidate is what a [Router] knows of one upstream when it orders a
// request. The Transport fills one per upstream for each request.
type Candidate struct {
	// Index is the upstream's position in Config.Upstreams: what Order
	// returns. Indexes are distinct and not negative.
	Index int

	// Name is the upstream's Name. The routers of this package ignore
	// it; a Router of your own may key on it.
	Name string

	// Weight is the upstream's share of the traffic under [Weighted],
	// relative to the others' (Upstream.Weight). Zero, and anything but
	// a positive finite number, means 1; more than 1e300 counts as 1e300,
	// so that the weights' sums stay finite.
	Weight float64

	// Cost is the upstream's price (Upstream.Cost), for [Score].
	Cost Cost

	// RequestCost is a moving average of what the upstream's answers
	// cost, each answer weighing a tenth: their reported usage priced at
	// Cost (see [Usage]). InputTokens and OutputTokens are the same
	// averages of their tokens. All three are zero until an answer of the
	// upstream has reported its usage (Config.MeterUsage).
	RequestCost               float64
	InputTokens, OutputTokens float64

	// InFlight is the number of attempts sent to the upstream whose
	// response headers or error have not arrived yet: the span that
	// Latency measures.
	InFlight int

	// Latency is a peak-sensitive moving average of the upstream's recent
	// latencies to response headers, decayed toward zero while none
	// arrive (Finagle's peak EWMA). Zero means none yet.
	Latency time.Duration

	// P50 is the median latency to response headers over the upstream's
	// recent window of attempts (UpstreamHealth.P50). Zero means none yet.
	P50 time.Duration

	// SuccessRate is the fraction, from 0 to 1, of the recent window's
	// attempts that the upstream served, as UpstreamHealth.SuccessRate:
	// 1 when there are none yet.
	SuccessRate float64

	// State is the upstream's circuit as Health reports it: HalfOpen
	// when the next request may probe it. It is Open whenever the
	// Transport would not send the request there (Unavailable is set):
	// while the circuit refuses requests, while a probe is in flight here
	// or another process of the fleet holds it, while the upstream cools
	// down after a 429, and when it does not serve the request's model.
	// The routers leave Open candidates out of their picks, so that a
	// pick is an upstream the Transport sends to.
	State State

	// Unavailable says why the Transport would not send the request
	// there ("" when it would): the same decision the request then
	// makes, and Health reports.
	Unavailable Reason

	// Recovering reports that the circuit closed recently (within its
	// Cooldown) after being open. Until it has shown it copes, [Weighted] gives it at most 10 %
	// of the picks, and [LeastLatency] and [Score] put it first for a
	// tenth of the requests they otherwise would: a little traffic, never
	// a flood. [Priority] ignores it.
	Recovering bool

	// Demoted says why the Transport would try the upstream after the
	// others ("" when it would not): its circuit is about to open
	// (ReasonFailing), its key looks revoked (ReasonAuthFailing,
	// Config.Auth), it is out of rate-limit headroom
	// (ReasonOutOfHeadroom), its recent latency or success rate is bad
	// (ReasonDegraded, Config.Degraded), or it looks hung (ReasonSuspect,
	// Config.Hang). Its circuit may still be closed.
	Demoted Reason
}

// Router orders the upstreams for one request.
//
// Order appends to dst the Index of every candidate, each exactly once, in
// the order the Transport should try them, and returns the extended slice.
// It must not modify cands or keep them after it returns. The Transport
// calls it once per request, concurrently from many goroutines, so it must
// be safe for concurrent use and should not allocate when dst has room for
// every candidate.
//
// A Router only orders. The Transport still skips upstreams whose circuit
// is open or already probing, and those cooling down after a 429, and falls
// back through the rest in the order returned. An Index that Order
// returns out of range, or again, is ignored, and the upstreams it leaves
// out are tried after the others, by Index: a Router of your own that
// breaks the contract can neither panic the request, send it twice to one
// upstream in a round, nor leave it without an upstream to fail over to.
//
// The Routers of this package order Demoted candidates after the others
// and Open ones last, keeping their own order within each of the three
// groups. A HalfOpen candidate keeps its place: the circuit closes only
// after a request probes it, and one ordered last would go unprobed for as
// long as the others serve.
//
// For the Routers of this package (not a type that embeds one) the
// Transport fills no Candidates for a request that their first pick
// settles: each finds its pick by reading only the upstreams it needs,
// with the same admission and demotion decisions, so that a request costs
// the same with 1 upstream or 64. When the pick does not settle the
// request, the Transport fills every Candidate then, after that attempt,
// and tries the others in the order Order gives them after its pick. What
// else differs is said on each Router.
type Router interface {
	Order(dst []int, cands []Candidate) []int
}

// Groups of candidates, tried in this order.
const (
	groupUsable = iota
	groupDegraded
	groupOpen
)

func routeGroup(c *Candidate) int {
	switch {
	case c.State == Open:
		return groupOpen
	case c.Demoted != "":
		return groupDegraded
	}
	return groupUsable
}

// recoveringShare is the most of the traffic that a Recovering candidate
// gets where it would get more.
const recoveringShare = 0.1

// appendPositions appends 0, 1, ..., n-1 to dst. The routers sort these
// positions in cands, then turn them into Indexes with toIndexes.
func appendPositions(dst []int, n int) []int {
	for i := range n {
		dst = append(dst, i)
	}
	return dst
}

func toIndexes(seg []int, cands []Candidate) {
	for i, p := range seg {
		seg[i] = cands[p].Index
	}
}

// bestGroup returns the first group that has a candidate, and how many
// candidates it has.
func bestGroup(cands []Candidate) (g, n int) {
	g = groupOpen + 1
	for i := range cands {
		switch cg := routeGroup(&cands[i]); {
		case cg < g:
			g, n = cg, 1
		case cg == g:
			n++
		}
	}
	return g, n
}

// moveToFront moves seg[i] to the front, shifting seg[:i] back by one.
func moveToFront(seg []int, i int) {
	p := seg[i]
	copy(seg[1:i+1], seg[:i])
	seg[0] = p
}

// spareRecovering keeps a Recovering candidate first in seg only for
// recoveringShare of the requests: otherwise the first candidate of its
// group after it that is not recovering goes first.
func spareRecovering(seg []int, cands []Candidate) {
	if len(seg) < 2 || !cands[seg[0]].Recovering {
		return
	}
	g := routeGroup(&cands[seg[0]])
	for i := 1; i < len(seg); i++ {
		c := &cands[seg[i]]
		if routeGroup(c) != g {
			return
		}
		if !c.Recovering {
			if rand.Float64() >= recoveringShare {
				moveToFront(seg, i)
			}
			return
		}
	}
}

// The fast path of this package's Routers.
//
// A Candidate takes a few hundred instructions to fill (the recent
// figures, the peak EWMA, the circuit, admit and demotion), so ordering
// every upstream for every request costs in proportion to their number.
// For the four Routers of this package the Transport asks instead for the
// upstream that Order would put first (firstRouted), which each finds by
// reading only the upstreams it needs; admit and demotion decide, as for
// Order, whether one is in the first group. Only when that upstream does
// not settle the request are the others ordered, from every Candidate as
// they are then (routed), by the same keys as Order (rest). A Router of
// your own, or a type that embeds one of these, gets every Candidate.

// usableNow reports whether u is in the first group for a request for
// model at now (groupUsable): admit takes the request and demotion does
// not defer it.
func (t *Transport) usableNow(u *upstream, model string, now time.Time) bool {
	return t.admit(u, model, now, nil).reason == "" && t.demotion(u, now) == ""
}

// firstRouted returns the upstream that the Router, one of this
// package's, puts first for a request for model at now, or nil when it is
// another Router or declines: then routed orders every candidate. It
// returns as then the upstream that Order put right after first, where
// that is not the rest's own order (LeastLatency's recovering pick that
// another went before), else nil: orderRest puts it first.
func (t *Transport) firstRouted(model string, now time.Time) (first, then *upstream) {
	i, j := -1, -1
	switch r := t.router.(type) {
	case Priority:
		i = r.first(t, model, now)
	case *Weighted:
		i = r.first(t, model, now)
	case LeastLatency:
		i, j = r.first(t, model, now)
	case Score:
		i = r.first(t, model, now)
	}
	if i < 0 {
		return nil, nil
	}
	if j >= 0 {
		then = t.upstreams[j]
	}
	return t.upstreams[i], then
}

// orderRest appends the Indexes of cands but skip's, in the order that
// Order gives them after its first pick (one of this package's Routers).
// then, unless -1, is the Index that Order put right after skip
// (firstRouted's): it goes first while it is in the best group of the
// rest, as Order would put it for the same Candidates.
func (t *Transport) orderRest(dst []int, cands []Candidate, skip, then int) []int {
	start := len(dst)
	for i := range cands {
		if cands[i].Index != skip {
			dst = append(dst, i)
		}
	}
	seg := dst[start:]
	switch r := t.router.(type) {
	case Priority:
		r.rest(seg, cands)
	case *Weighted:
		r.rest(seg, cands)
	case LeastLatency:
		r.rest(seg, cands)
	case Score:
		r.rest(seg, cands)
	}
	if then >= 0 {
		for k, p := range seg {
			if cands[p].Index == then {
				if routeGroup(&cands[p]) == routeGroup(&cands[seg[0]]) {
					moveToFront(seg, k)
				}
				break
			}
		}
	}
	toIndexes(seg, cands)
	return dst
}

// routeCache is what the Transport keeps for Score and Weighted between
// requests: a snapshot of the upstreams, taken again at most every
// refreshEvery by one request.
type routeCache struct {
	snap       atomic.Pointer[routeSnapshot]
	refreshing atomic.Bool
}

// routeSnapshot is what Score and Weighted knew of the upstreams at one
// instant. It is never written after it is stored, but for out.
type routeSnapshot struct {
	until mono.Time // when it is to be taken again

	// Score, where some upstream has a Cost: every upstream's usage
	// averages (as math.Float64bits) when its ranking was computed, which
	// each request compares (sameUsage).
	key []uint64

	// Score: every Index, the best score first (ties by Index), the
	// score computed as if no circuit were open. Weighted: the Indexes
	// of the upstreams in the first group, ascending.
	rank []int

	// Weighted: the weights of rank's upstreams, capped for those that
	// are recovering, which of them were recovering, and which of them a
	// pick found out of the first group since.
	weight     []float64
	recovering []bool
	out        []atomic.Bool
	outs       atomic.Int32 // how many of out are set

	// Weighted: a pick found an upstream recovering that was not when
	// the snapshot was taken (a half-open circuit closed by its probe),
	// whose weight here is not capped, or found one out of the first
	// group while another is recovering, whose cap here is a share of
	// the weights of more upstreams than now take part: the next request
	// takes the snapshot again.
	stale atomic.Bool
}

// snapshot returns the router's snapshot, taken again once its time is
// up: Weighted's after refreshEvery, Score's when the oldest of the
// recent figures it ranked by is that old (as a Candidate's would then be
// computed again), and Score's at once when an upstream's usage averages
// changed, where some upstream has a Cost (without one, usage does not
// move a score). Another request may be taking the next one: then the
// last one is returned, unless its usage changed.
func (t *Transport) snapshot(now time.Time) *routeSnapshot {
	s, m := t.routes.snap.Load(), mono.Of(now)
	current := s != nil && !s.stale.Load() && (s.key == nil || t.sameUsage(s.key))
	if current && m < s.until {
		return s
	}
	if !t.routes.refreshing.CompareAndSwap(false, true) {
		if current {
			return s
		}
		// Another request takes a snapshot: take this one's own.
	} else {
		defer t.routes.refreshing.Store(false)
	}
	n := &routeSnapshot{until: m.Add(refreshEvery)}
	rb := routerBuffers.Get().(*routerBuffer)
	cands := rb.cands[:0]
	switch r := t.router.(type) {
	case *Weighted:
		// Only what members reads.
		for i, u := range t.upstreams {
			c := Candidate{Index: i, Weight: u.cfg.Weight, State: Open}
			if t.usableNow(u, "", now) {
				c.State, c.Recovering = Closed, u.circuit.Recovering(now)
			}
			cands = append(cands, c)
		}
		n.rank, n.weight, n.recovering = r.members(cands)
		n.out = make([]atomic.Bool, len(n.rank))
	case Score:
		// The usage key before the averages are read: a change in
		// between takes the snapshot again, rather than going unseen.
		// Any price counts: with CachedInput or CacheWrite alone, the
		// answers' cost (RequestCost) moves the score.
		priced := false
		for _, u := range t.upstreams {
			priced = priced || u.cfg.Cost != (Cost{})
		}
		if priced {
			n.key = make([]uint64, 0, 3*len(t.upstreams))
			for _, u := range t.upstreams {
				n.key = append(n.key, u.usage.avgCost.Load(), u.usage.avgInput.Load(), u.usage.avgOutput.Load())
			}
		}
		// Only what rank reads. The figures' own time, not the recent's
		// (stored when a request starts computing them again): figures
		// read meanwhile are older, and the snapshot must not outlive
		// them by more than refreshEvery.
		for i, u := range t.upstreams {
			f := u.recent.get(&u.window, now)
			n.until = min(n.until, f.of.Add(refreshEvery))
			c := Candidate{Index: i, Cost: u.cfg.Cost, P50: f.p50, SuccessRate: f.rate}
			c.RequestCost, c.InputTokens, c.OutputTokens = u.usage.averages()
			cands = append(cands, c)
		}
		n.rank = r.rank(cands)
	}
	t.routes.snap.Store(n)
	if cap(cands) <= maxPooledCandidates {
		clear(cands)
		rb.cands = cands[:0]
		routerBuffers.Put(rb)
	}
	return n
}

// sameUsage reports whether key holds every upstream's usage averages as
// they are now (see routeSnapshot).
func (t *Transport) sameUsage(key []uint64) bool {
	ups := t.upstreams
	if len(key) != 3*len(ups) {
		return false
	}
	for i, u := range ups {
		k, s := key[3*i:3*i+3:3*i+3], &u.usage
		if k[0] != s.avgCost.Load() || k[1] != s.avgInput.Load() || k[2] != s.avgOutput.Load() {
			return false
		}
	}
	return true
}
