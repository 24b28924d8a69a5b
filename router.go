package failover

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
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

// Priority is the [Router] that tries the upstreams in the configured
// order (by Index), the default. It ignores Recovering: the first upstream
// gets all its traffic back as soon as its circuit closes, as without a
// Router.
//
// Priority keeps no state and takes no lock. Order does not allocate when
// dst has room. Through a Transport, the first upstream of the first
// group is found by asking each in turn whether it is in that group.
type Priority struct{}

// Order implements [Router].
func (Priority) Order(dst []int, cands []Candidate) []int {
	// The common case: all usable, in the configured order already.
	inOrder := true
	for i := range cands {
		if routeGroup(&cands[i]) != groupUsable || i > 0 && cands[i].Index <= cands[i-1].Index {
			inOrder = false
			break
		}
	}
	if inOrder {
		for i := range cands {
			dst = append(dst, cands[i].Index)
		}
		return dst
	}
	start := len(dst)
	dst = appendPositions(dst, len(cands))
	seg := dst[start:]
	slices.SortFunc(seg, func(a, b int) int {
		ca, cb := &cands[a], &cands[b]
		if c := cmp.Compare(routeGroup(ca), routeGroup(cb)); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(ca.Index, cb.Index), cmp.Compare(a, b))
	})
	toIndexes(seg, cands)
	return dst
}

// Weighted is the [Router] that spreads requests over the upstreams in
// proportion to their Weight (zero meaning 1), by smooth weighted round
// robin, nginx's algorithm: on each request every candidate's current
// weight grows by its weight, the candidate with the largest current
// weight goes first, and its current weight drops by the sum of the
// weights. With weights 5, 1, 1 the first seven requests go to a, a, b, a,
// c, a, a: exactly in proportion over each cycle, and never in bursts.
//
// Only the candidates of the best group take part (neither degraded nor
// open when there are such, then degraded ones); the rest of the order
// after the pick is by descending weight, then Index. A Recovering
// candidate's weight is capped at a ninth of the others' total, so that it
// gets at most 10 % of the picks until it has recovered: a little traffic,
// never a flood.
//
// The current weights are state shared by all requests: each Order holds
// a mutex for the round-robin step, one pass over the candidates (tens of
// nanoseconds), so concurrent requests queue on it briefly; the rest of
// the ordering runs outside it. The zero value is ready to use. A Weighted
// must not be copied after first use. Order allocates only when dst lacks
// room, or when an Index larger than any before shows up.
//
// Through a Transport, the round-robin step runs over a snapshot of the
// first group (its upstreams, their weights, the Recovering caps), taken
// again at most every 250 ms by one request, and holds the mutex for one
// pass over those upstreams (an addition and a comparison each) and the
// admission, demotion and Recovering check of the pick: no Candidate is
// filled, no lock or atomic taken per upstream. The pick is sent only
// once that check puts it in the first group now; one that is not is left
// out of the snapshot, its step undone, and the step runs again without
// it. So a
// circuit that opens, a 429's cooldown or a probe in flight are seen by
// the next request that would pick the upstream, which never goes there,
// but an upstream that comes back (its cooldown over, its circuit
// half-open or closed, no longer demoted) takes part in the round robin
// again only from the next snapshot, up to 250 ms later, and until then a
// Recovering cap is the snapshot's (lower than Order's, the others' weight
// having grown since). A pick that has become recovering since the
// snapshot (a half-open circuit that its probe closed), whose weight there
// is not capped, is left out likewise, and the next request takes the
// snapshot again, capping it; so does the request after a pick found out
// of the first group while another upstream is recovering, whose cap,
// computed from the weights of upstreams that no longer take part, would
// give it more than its 10 %. When the snapshot's first group is
// empty or all left out, and whenever an upstream has Models (whose first
// group depends on the request's model), every Candidate is filled and
// Order decides, as before.
type Weighted struct {
	mu      sync.Mutex
	current []float64 // by Index
}

// maxWeight is the largest weight Weighted counts: the sum of any number
// of them that a Transport could route over, and the round robin's
// current weights, stay finite (past it, Inf-Inf made NaN of them, which
// stuck the round robin on one upstream).
const maxWeight = 1e300

// swrrWeight returns c's weight, capped at limit when it is recovering.
func swrrWeight(c *Candidate, limit float64) float64 {
	w := c.Weight
	if !(w > 0) || math.IsInf(w, 1) {
		w = 1
	}
	w = min(w, maxWeight)
	if c.Recovering {
		w = min(w, limit)
	}
	return w
}

// Order implements [Router].
func (w *Weighted) Order(dst []int, cands []Candidate) []int {
	if len(cands) == 0 {
		return dst
	}
	best, _ := bestGroup(cands)
	limit := recoveringLimit(cands, best)
	maxIndex := 0
	for i := range cands {
		maxIndex = max(maxIndex, cands[i].Index)
	}
	pick := w.pick(cands, best, limit, maxIndex)

	start := len(dst)
	dst = appendPositions(dst, len(cands))
	seg := dst[start:]
	slices.SortFunc(seg, func(a, b int) int {
		switch {
		case a == b:
			return 0
		case a == pick:
			return -1
		case b == pick:
			return 1
		}
		ca, cb := &cands[a], &cands[b]
		if c := cmp.Compare(routeGroup(ca), routeGroup(cb)); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(swrrWeight(cb, limit), swrrWeight(ca, limit)), cmp.Compare(ca.Index, cb.Index), cmp.Compare(a, b))
	})
	toIndexes(seg, cands)
	return dst
}

// pick runs one step of smooth weighted round robin over the candidates of
// group g and returns the position of the one picked.
func (w *Weighted) pick(cands []Candidate, g int, limit float64, maxIndex int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.current) <= maxIndex {
		w.current = append(w.current, make([]float64, maxIndex+1-len(w.current))...)
	}
	pick, total := -1, 0.0
	for i := range cands {
		c := &cands[i]
		if routeGroup(c) != g {
			continue
		}
		cw := swrrWeight(c, limit)
		w.current[c.Index] += cw
		total += cw
		if pick < 0 || w.current[c.Index] > w.current[cands[pick].Index] {
			pick = i
		}
	}
	w.current[cands[pick].Index] -= total
	return pick
}

// LeastLatency is the [Router] that sends each request to the better of two
// candidates drawn at random, by the cost Latency × (InFlight+1): Finagle's
// power of two choices over a peak-sensitive EWMA. A slow upstream gets less
// traffic but is not cut off: it still wins when the faster ones have
// enough requests in flight, and its Latency decays toward zero while it
// gets none, so it is tried again.
//
// A candidate with no Latency yet costs 0, the best, so that a new upstream
// is tried; once it has requests in flight and still no answer it costs
// more than any other (Finagle's penalty, ties broken by InFlight), so that
// a burst of requests does not all land on an upstream that has never
// answered.
//
// Only the candidates of the best group are drawn (neither degraded nor
// open when there are such, then degraded ones); the rest of the order
// after the pick is by ascending cost, then Index. A Recovering pick goes
// first only for 10 % of the requests; the others go to the cheapest
// candidate of its group that is not recovering, and then to the pick.
//
// LeastLatency keeps no state and takes no lock: it draws from
// math/rand/v2's global generator. Order does not allocate when dst has
// room. The zero value is ready to use.
//
// Through a Transport, each of the two is drawn from all the upstreams
// again until the admission and demotion decisions put it in the first
// group, at most 4 times: a uniform draw from the first group, as Order's.
// When a draw finds none, every Candidate is filled and Order decides
// afresh, which leaves every pair as likely as in Order. Only the two
// drawn upstreams' latencies and requests in flight are read, and every
// Candidate only when the pick is recovering.
type LeastLatency struct{}

// latencyCost returns c's cost; +Inf is Finagle's penalty for a candidate
// that has requests in flight but no latency yet.
func latencyCost(c *Candidate) float64 {
	n := max(c.InFlight, 0)
	if c.Latency <= 0 {
		if n > 0 {
			return math.Inf(1)
		}
		return 0
	}
	return float64(c.Latency) * float64(n+1)
}

func compareLatencyCost(ca, cb *Candidate) int {
	return cmp.Or(cmp.Compare(latencyCost(ca), latencyCost(cb)), cmp.Compare(ca.InFlight, cb.InFlight))
}

// Order implements [Router].
func (LeastLatency) Order(dst []int, cands []Candidate) []int {
	start := len(dst)
	dst = appendPositions(dst, len(cands))
	seg := dst[start:]
	slices.SortFunc(seg, func(a, b int) int {
		ca, cb := &cands[a], &cands[b]
		if c := cmp.Compare(routeGroup(ca), routeGroup(cb)); c != 0 {
			return c
		}
		return cmp.Or(compareLatencyCost(ca, cb), cmp.Compare(ca.Index, cb.Index), cmp.Compare(a, b))
	})
	// The best group is sorted first: draw two of it, and move the
	// cheaper to the front. A tie goes to the first drawn, so that equal
	// candidates share the traffic.
	if _, n := bestGroup(cands); n > 1 {
		i, j := rand.IntN(n), rand.IntN(n-1)
		if j >= i {
			j++
		}
		if j < i && compareLatencyCost(&cands[seg[j]], &cands[seg[i]]) < 0 {
			i = j
		}
		moveToFront(seg, i)
	}
	spareRecovering(seg, cands)
	toIndexes(seg, cands)
	return dst
}

// Score is the [Router] that orders the upstreams by a composite score,
// the highest first (ties by Index):
//
//	score = Latency × max(0, 1 − P50/Baseline)
//	      + Success × SuccessRate
//	      + Cost × (1 − cost/maxCost)
//
// where cost is what a request costs at the candidate and maxCost the
// largest such cost among the candidates (the cost term is the whole
// weight Cost when every cost is zero). Once answers have reported their
// usage (Config.MeterUsage), cost is the candidate's observed RequestCost,
// and for a candidate that has observed none yet its Cost priced at the
// mean InputTokens and OutputTokens of those that have: what a request
// costs, not only the price, so that a model that needs more tokens for
// the same requests ranks as dearer. Until then, cost is the candidate's
// Cost.Input+Cost.Output. An Open candidate scores −1. With the default
// weights a free upstream that answers instantly and never fails scores 1;
// one with a P50 of 500 ms, a 99 % success rate and the highest price
// scores 0.4 × 0.75 + 0.4 × 0.99 = 0.696.
//
// A Recovering candidate that scores best goes first only for 10 % of the
// requests; the others go to the best candidate of its group that is not
// recovering.
//
// Score keeps no state. Order computes the scores while it sorts, and does
// not allocate when dst has room. The zero value weighs latency 40 %,
// success rate 40 % and cost 20 %, against a 2 s baseline.
//
// Through a Transport, the upstreams are ranked by score in a snapshot,
// and a request goes to the best ranked that the admission and demotion
// decisions put in the first group, asked in turn. The snapshot is taken
// again once the oldest recent figures it read are 250 ms old (when a
// Candidate's would be computed again). When some upstream has a Cost
// and an upstream's usage averages changed since the snapshot (each
// request compares them: three loads an upstream), the request is ordered
// from every Candidate, as by Order, until the snapshot's time is up: with
// metered answers moving the averages on every request, Score then costs
// what it did before the snapshot, in proportion to the upstreams. Recent
// figures that Health or
// Degraded compute in between are seen from the next snapshot: never
// older than a Candidate's may be, but not always the latest.
type Score struct {
	// Latency, Success and Cost weigh the three terms. When all three
	// are zero they are 0.4, 0.4 and 0.2.
	Latency, Success, Cost float64

	// Baseline is the P50 at which the latency term falls to zero. Zero
	// means 2s.
	Baseline time.Duration
}

// Defaults of Score.
const (
	defaultScoreLatency  = 0.4
	defaultScoreSuccess  = 0.4
	defaultScoreCost     = 0.2
	defaultScoreBaseline = 2 * time.Second
)

func (s Score) withDefaults() Score {
	if s.Latency == 0 && s.Success == 0 && s.Cost == 0 {
		s.Latency, s.Success, s.Cost = defaultScoreLatency, defaultScoreSuccess, defaultScoreCost
	}
	if s.Baseline <= 0 {
		s.Baseline = defaultScoreBaseline
	}
	return s
}

// score returns c's score, for s with its defaults, c's cost (see
// costBasis) and the candidates' largest cost maxCost.
func (s Score) score(c *Candidate, cost, maxCost float64) float64 {
	if c.State == Open {
		return -1
	}
	latency := max(0, 1-float64(max(c.P50, 0))/float64(s.Baseline))
	success := c.SuccessRate
	switch {
	case !(success >= 0): // negative or NaN
		success = 0
	case success > 1:
		success = 1
	}
	cheap := 1.0
	if maxCost > 0 {
		cheap = 1 - cost/maxCost
	}
	return s.Latency*latency + s.Success*success + s.Cost*cheap
}

// costBasis is what Score compares the candidates' costs by: the price,
// or once usage has been observed, the cost of a request.
type costBasis struct {
	observed      int     // candidates whose answers reported usage
	input, output float64 // their mean tokens per answer
}

func newCostBasis(cands []Candidate) costBasis {
	var b costBasis
	for i := range cands {
		if c := &cands[i]; observedUsage(c) {
			b.observed++
			b.input += c.InputTokens
			b.output += c.OutputTokens
		}
	}
	if b.observed > 0 {
		b.input /= float64(b.observed)
		b.output /= float64(b.observed)
	}
	return b
}

// observedUsage reports whether c's answers have reported usage.
func observedUsage(c *Candidate) bool {
	return c.InputTokens > 0 && !math.IsInf(c.InputTokens, 1) || c.OutputTokens > 0 && !math.IsInf(c.OutputTokens, 1)
}

// cost is what Score takes c's cost for: its price until some candidate
// observed usage; then its RequestCost, or its price at the others' mean
// tokens per answer when it observed none.
func (b costBasis) cost(c *Candidate) float64 {
	switch {
	case b.observed == 0:
		return c.Cost.total()
	case observedUsage(c):
		if !(c.RequestCost > 0) || math.IsInf(c.RequestCost, 1) {
			return 0
		}
		return c.RequestCost
	}
	return (b.input*max(c.Cost.Input, 0) + b.output*max(c.Cost.Output, 0)) / 1e6
}

// Order implements [Router].
func (s Score) Order(dst []int, cands []Candidate) []int {
	s = s.withDefaults()
	basis := newCostBasis(cands)
	var maxCost float64
	for i := range cands {
		maxCost = max(maxCost, basis.cost(&cands[i]))
	}
	start := len(dst)
	dst = appendPositions(dst, len(cands))
	seg := dst[start:]
	slices.SortFunc(seg, func(a, b int) int {
		ca, cb := &cands[a], &cands[b]
		if c := cmp.Compare(routeGroup(ca), routeGroup(cb)); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(s.score(cb, basis.cost(cb), maxCost), s.score(ca, basis.cost(ca), maxCost)), cmp.Compare(ca.Index, cb.Index), cmp.Compare(a, b))
	})
	spareRecovering(seg, cands)
	toIndexes(seg, cands)
	return dst
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

// first returns the first upstream in the first group, -1 when there is
// none.
func (Priority) first(t *Transport, model string, now time.Time) int {
	for i, u := range t.upstreams {
		if t.usableNow(u, model, now) {
			return i
		}
	}
	return -1
}

// rest sorts the positions seg of cands by group, then Index.
func (Priority) rest(seg []int, cands []Candidate) {
	slices.SortFunc(seg, func(a, b int) int {
		ca, cb := &cands[a], &cands[b]
		return cmp.Or(cmp.Compare(routeGroup(ca), routeGroup(cb)), cmp.Compare(ca.Index, cb.Index), cmp.Compare(a, b))
	})
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

// recoveringLimit is the cap of a Recovering candidate's weight in group
// g: share/(1-share) of the others' weight gives one recovering candidate
// that share; no cap when there are no others.
func recoveringLimit(cands []Candidate, g int) float64 {
	var others float64
	for i := range cands {
		if c := &cands[i]; routeGroup(c) == g && !c.Recovering {
			others += swrrWeight(c, 0)
		}
	}
	if others > 0 {
		return others * recoveringShare / (1 - recoveringShare)
	}
	return math.Inf(1)
}

// members returns the Indexes of the candidates of the first group, their
// weights (swrrWeight) and which are recovering, for Weighted's snapshot:
// none when the first group is empty.
func (w *Weighted) members(cands []Candidate) ([]int, []float64, []bool) {
	limit := recoveringLimit(cands, groupUsable)
	var idx []int
	var weight []float64
	var recovering []bool
	for i := range cands {
		if c := &cands[i]; routeGroup(c) == groupUsable {
			idx = append(idx, c.Index)
			weight = append(weight, swrrWeight(c, limit))
			recovering = append(recovering, c.Recovering)
		}
	}
	return idx, weight, recovering
}

// first runs one step of smooth weighted round robin over the snapshot's
// first group and returns the Index picked, once admit and demotion say
// it is in the first group now. One that is not is left out until the
// next snapshot and the step is run again without it. It returns -1 when
// the snapshot's first group is empty or all left out, or an upstream
// has Models (whose first group depends on the request's model).
func (w *Weighted) first(t *Transport, model string, now time.Time) int {
	if t.models {
		return -1
	}
	s := t.snapshot(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(t.upstreams); len(w.current) < n {
		w.current = append(w.current, make([]float64, n-len(w.current))...)
	}
	cur, rank, weight := w.current, s.rank, s.weight[:len(s.rank)]
	for {
		pick, total, most := -1, 0.0, 0.0
		anyOut := s.outs.Load() > 0
		for k, i := range rank {
			if anyOut && s.out[k].Load() {
				continue
			}
			c := cur[i] + weight[k]
			cur[i] = c
			total += weight[k]
			if pick < 0 || c > most {
				pick, most = k, c
			}
		}
		if pick < 0 {
			return -1
		}
		i := rank[pick]
		u := t.upstreams[i]
		if t.usableNow(u, model, now) {
			if s.recovering[pick] || !u.circuit.Recovering(now) {
				cur[i] -= total
				return i
			}
			// Recovering since the snapshot, which gave it its whole
			// weight: left out like one out of the first group, until
			// the snapshot, taken again by the next request, caps it.
			s.stale.Store(true)
		}
		for k, i := range rank { // undo the step
			if !anyOut || !s.out[k].Load() {
				cur[i] -= weight[k]
			}
		}
		if !s.recovering[pick] && slices.Contains(s.recovering, true) {
			// The others' weight that the Recovering caps were
			// computed from is less now: the next request takes the
			// snapshot again, capping them as Order would.
			s.stale.Store(true)
		}
		s.out[pick].Store(true)
		s.outs.Add(1)
	}
}

// rest sorts the positions seg of cands by group, then by descending
// weight (capped as in Order), then Index.
func (w *Weighted) rest(seg []int, cands []Candidate) {
	best, _ := bestGroup(cands)
	limit := recoveringLimit(cands, best)
	slices.SortFunc(seg, func(a, b int) int {
		ca, cb := &cands[a], &cands[b]
		if c := cmp.Compare(routeGroup(ca), routeGroup(cb)); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(swrrWeight(cb, limit), swrrWeight(ca, limit)), cmp.Compare(ca.Index, cb.Index), cmp.Compare(a, b))
	})
}

// twoChoiceTries bounds the draws LeastLatency.first makes for each of its
// two candidates before it declines.
const twoChoiceTries = 4

// first draws two distinct upstreams of the first group at random, each
// by drawing from all of them until admit and demotion say one is in the
// first group (a uniform draw from the first group, as Order's), and
// returns the Index of the cheaper (the first drawn on a tie). When the
// pick is recovering it orders every candidate, as Order does, and when
// another goes first it returns the pick as then, which Order puts
// second, where the rest by cost would not. It returns -1 when either
// draw finds none within twoChoiceTries: Order, drawing again, then
// decides, which keeps each pair as likely as in Order (the chance to
// decline is the same for every first draw).
func (LeastLatency) first(t *Transport, model string, now time.Time) (first, then int) {
	n := len(t.upstreams)
	if n == 1 {
		if t.usableNow(t.upstreams[0], model, now) {
			return 0, -1
		}
		return -1, -1
	}
	draw := func(not int) int { // not: the first drawn, or -1
		for range twoChoiceTries {
			var i int
			if not < 0 {
				i = rand.IntN(n)
			} else if i = rand.IntN(n - 1); i >= not {
				i++
			}
			if t.usableNow(t.upstreams[i], model, now) {
				return i
			}
		}
		return -1
	}
	i := draw(-1)
	if i < 0 {
		return -1, -1
	}
	j := draw(i)
	if j < 0 {
		return -1, -1
	}
	ci, cj := latencyCandidate(t.upstreams[i], now), latencyCandidate(t.upstreams[j], now)
	if compareLatencyCost(&cj, &ci) < 0 {
		i = j
	}
	if !t.upstreams[i].circuit.Recovering(now) {
		return i, -1
	}
	// Recovering: it goes first only for a tenth of the requests, else
	// the cheapest of its group that is not (spareRecovering), and it
	// second.
	rb := routerBuffers.Get().(*routerBuffer)
	cands := rb.cands[:0]
	for k, u := range t.upstreams {
		cands = append(cands, t.candidate(k, u, model, now))
	}
	seg := appendPositions(rb.order[:0], n)
	LeastLatency{}.rest(seg, cands)
	moveToFront(seg, slices.Index(seg, i))
	spareRecovering(seg, cands)
	first, then = cands[seg[0]].Index, -1
	if first != i {
		then = i
	}
	if cap(cands) <= maxPooledCandidates {
		clear(cands)
		rb.cands, rb.order = cands[:0], seg[:0]
		routerBuffers.Put(rb)
	}
	return first, then
}

// latencyCandidate is the part of u's Candidate that latencyCost reads.
func latencyCandidate(u *upstream, now time.Time) Candidate {
	return Candidate{InFlight: int(u.live.inflight.Load()), Latency: u.latency.value(now)}
}

// rest sorts the positions seg of cands by group, then by ascending cost
// (latencyCost), then Index.
func (LeastLatency) rest(seg []int, cands []Candidate) {
	slices.SortFunc(seg, func(a, b int) int {
		ca, cb := &cands[a], &cands[b]
		if c := cmp.Compare(routeGroup(ca), routeGroup(cb)); c != 0 {
			return c
		}
		return cmp.Or(compareLatencyCost(ca, cb), cmp.Compare(ca.Index, cb.Index), cmp.Compare(a, b))
	})
}

// rank returns the Indexes of cands by descending score, ties by Index,
// each scored as if its circuit were not open: Score's snapshot. Which
// upstreams are open is decided for each request.
func (s Score) rank(cands []Candidate) []int {
	s = s.withDefaults()
	basis := newCostBasis(cands)
	var maxCost float64
	score := make([]float64, len(cands))
	for i := range cands {
		maxCost = max(maxCost, basis.cost(&cands[i]))
	}
	for i := range cands {
		c := cands[i]
		c.State = Closed
		score[i] = s.score(&c, basis.cost(&c), maxCost)
	}
	seg := appendPositions(nil, len(cands))
	slices.SortFunc(seg, func(a, b int) int {
		return cmp.Or(cmp.Compare(score[b], score[a]), cmp.Compare(cands[a].Index, cands[b].Index))
	})
	toIndexes(seg, cands)
	return seg
}

// first returns the first upstream of the snapshot's ranking that admit
// and demotion put in the first group; when it is recovering, the next
// such that is not goes first for all but recoveringShare of the requests
// (spareRecovering). It returns -1 when the first group is empty.
func (s Score) first(t *Transport, model string, now time.Time) int {
	if snap := t.routes.snap.Load(); snap != nil && snap.key != nil && mono.Of(now) < snap.until && !t.sameUsage(snap.key) {
		// Usage moved the prices' scores since the snapshot: Order
		// ranks this request from every Candidate, as it would have,
		// rather than each metered answer taking the snapshot again
		// (which costs a request more than Order does). The snapshot
		// is taken again when its time is up.
		return -1
	}
	held := -1 // the best, recovering
	for _, i := range t.snapshot(now).rank {
		u := t.upstreams[i]
		if !t.usableNow(u, model, now) {
			continue
		}
		switch {
		case !u.circuit.Recovering(now):
			if held >= 0 && rand.Float64() < recoveringShare {
				return held
			}
			return i
		case held < 0:
			held = i
		}
	}
	return held
}

// rest sorts the positions seg of cands by group, then by descending
// score, then Index.
func (s Score) rest(seg []int, cands []Candidate) {
	s = s.withDefaults()
	basis := newCostBasis(cands)
	var maxCost float64
	for i := range cands {
		maxCost = max(maxCost, basis.cost(&cands[i]))
	}
	slices.SortFunc(seg, func(a, b int) int {
		ca, cb := &cands[a], &cands[b]
		if c := cmp.Compare(routeGroup(ca), routeGroup(cb)); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(s.score(cb, basis.cost(cb), maxCost), s.score(ca, basis.cost(ca), maxCost)), cmp.Compare(ca.Index, cb.Index), cmp.Compare(a, b))
	})
}
