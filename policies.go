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
	Priority{}.rest(seg, cands)
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
	pick := w.step(cands, best, limit, maxIndex)
	start := len(dst)
	dst = appendPositions(dst, len(cands))
	seg := dst[start:]
	w.rest(seg, cands)
	moveToFront(seg, slices.Index(seg, pick))
	toIndexes(seg, cands)
	return dst
}

// step runs one step of smooth weighted round robin over the candidates of
// group g and returns the position of the one picked.
func (w *Weighted) step(cands []Candidate, g int, limit float64, maxIndex int) int {
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
	LeastLatency{}.rest(seg, cands)
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
	start := len(dst)
	dst = appendPositions(dst, len(cands))
	seg := dst[start:]
	s.rest(seg, cands)
	spareRecovering(seg, cands)
	toIndexes(seg, cands)
	return dst
}

// pick returns the first upstream in the first group, -1 when there is
// none.
func (Priority) pick(v view) (int, int) {
	for i := range v.n() {
		if v.usable(i) {
			return i, -1
		}
	}
	return -1, -1
}

func (Priority) snapshot(view) *routeSnapshot { return nil }
func (r Priority) self() Router               { return r }

// rest sorts the positions seg of cands by group, then Index.
func (Priority) rest(seg []int, cands []Candidate) {
	slices.SortFunc(seg, func(a, b int) int {
		ca, cb := &cands[a], &cands[b]
		return cmp.Or(cmp.Compare(routeGroup(ca), routeGroup(cb)), cmp.Compare(ca.Index, cb.Index), cmp.Compare(a, b))
	})
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

// pick runs one step of smooth weighted round robin over the snapshot's
// first group and returns the Index picked, once admit and demotion say
// it is in the first group now. One that is not is left out until the
// next snapshot and the step is run again without it. It returns -1 when
// the snapshot's first group is empty or all left out, or an upstream
// has Models (whose first group depends on the request's model).
func (w *Weighted) pick(v view) (int, int) {
	if v.byModel() {
		return -1, -1
	}
	s := v.snapshot()
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := v.n(); len(w.current) < n {
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
			return -1, -1
		}
		i := rank[pick]
		if v.usable(i) {
			if s.recovering[pick] || !v.recovering(i) {
				cur[i] -= total
				return i, -1
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

// snapshot is the first group, its weights and which of it is
// recovering, as the round robin steps over them between snapshots.
func (w *Weighted) snapshot(v view) *routeSnapshot {
	n := &routeSnapshot{until: mono.Of(v.now).Add(refreshEvery)}
	n.rank, n.weight, n.recovering = w.members(v.weightCandidates())
	n.out = make([]atomic.Bool, len(n.rank))
	return n
}

func (w *Weighted) self() Router { return w }

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

// pick draws two distinct upstreams of the first group at random, each
// by drawing from all of them until admit and demotion say one is in the
// first group (a uniform draw from the first group, as Order's), and
// returns the Index of the cheaper (the first drawn on a tie). When the
// pick is recovering it orders every candidate, as Order does, and when
// another goes first it returns the pick as then, which Order puts
// second, where the rest by cost would not. It returns -1 when either
// draw finds none within twoChoiceTries: Order, drawing again, then
// decides, which keeps each pair as likely as in Order (the chance to
// decline is the same for every first draw).
func (LeastLatency) pick(v view) (first, then int) {
	n := v.n()
	if n == 1 {
		if v.usable(0) {
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
			if v.usable(i) {
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
	ci, cj := v.latency(i), v.latency(j)
	if compareLatencyCost(&cj, &ci) < 0 {
		i = j
	}
	if !v.recovering(i) {
		return i, -1
	}
	// Recovering: it goes first only for a tenth of the requests, else
	// the cheapest of its group that is not (spareRecovering), and it
	// second.
	rb := routerBuffers.Get().(*routerBuffer)
	cands := v.candidates(rb.cands[:0])
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

func (LeastLatency) snapshot(view) *routeSnapshot { return nil }
func (r LeastLatency) self() Router               { return r }

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

// pick returns the first upstream of the snapshot's ranking that admit
// and demotion put in the first group; when it is recovering, the next
// such that is not goes first for all but recoveringShare of the requests
// (spareRecovering). It returns -1 when the first group is empty.
func (s Score) pick(v view) (int, int) {
	if v.usageMoved() {
		// Usage moved the prices' scores since the snapshot: Order
		// ranks this request from every Candidate, as it would have,
		// rather than each metered answer taking the snapshot again
		// (which costs a request more than Order does). The snapshot
		// is taken again when its time is up.
		return -1, -1
	}
	held := -1 // the best, recovering
	for _, i := range v.snapshot().rank {
		if !v.usable(i) {
			continue
		}
		switch {
		case !v.recovering(i):
			if held >= 0 && rand.Float64() < recoveringShare {
				return held, -1
			}
			return i, -1
		case held < 0:
			held = i
		}
	}
	return held, -1
}

// snapshot ranks the upstreams by score, the usage key read before the
// averages: a change in between takes the snapshot again.
func (s Score) snapshot(v view) *routeSnapshot {
	n := &routeSnapshot{until: mono.Of(v.now).Add(refreshEvery), key: v.usageKey()}
	cands, oldest := v.scoreCandidates()
	n.until = min(n.until, oldest.Add(refreshEvery))
	n.rank = s.rank(cands)
	return n
}

func (s Score) self() Router { return s }

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
