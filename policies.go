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
// Router. It keeps no state.
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
// proportion to their Weight (zero meaning 1), by nginx's smooth weighted
// round robin: with weights 5, 1, 1 the first seven requests go to a, a,
// b, a, c, a, a, in proportion over each cycle and never in bursts.
//
// Only the candidates of the best group take part; the rest follow by
// descending weight, then Index. A Recovering candidate gets at most 10 %
// of the picks until it has recovered. Through a Transport, an upstream
// that becomes available again rejoins the round robin within 250 ms.
//
// The zero value is ready to use. A Weighted holds the round robin's
// state, which all requests share under a brief lock; it must not be
// copied after first use.
type Weighted struct {
	mu      sync.Mutex
	current []float64 // by Index
}

// maxWeight is the largest weight Weighted counts, so that sums of
// weights and current weights stay finite (Inf−Inf would make them NaN).
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
// power of two choices over a peak-sensitive EWMA. A slow upstream gets
// less traffic but is not cut off: its Latency decays while it gets none,
// so it is tried again. A candidate with no Latency yet costs 0, so that a
// new upstream is tried, but more than any other once it has requests in
// flight and no answer yet.
//
// Only the candidates of the best group are drawn; the rest follow by
// ascending cost, then Index. A Recovering pick goes first for only 10 %
// of the requests. The zero value is ready to use; it keeps no state.
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
// largest among the candidates. Once answers have reported usage
// (Config.MeterUsage), cost is the observed RequestCost, or for a
// candidate without one its Cost at the others' mean tokens, so that a
// model that needs more tokens ranks as dearer; until then it is
// Cost.Input+Cost.Output. An Open candidate scores −1. A Recovering
// candidate that scores best goes first for only 10 % of the requests.
// Score keeps no state; through a Transport, scores are at most 250 ms old.
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

// pick runs one round-robin step over the snapshot's first group and
// returns the Index picked, once admit and demotion still put it there;
// one that is not is left out until the next snapshot. It returns -1 when
// none is left, or an upstream has Models (docs/design.md).
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
			// Recovering since the snapshot, which did not cap its
			// weight: left out until the next snapshot caps it.
			s.stale.Store(true)
		}
		for k, i := range rank { // undo the step
			if !anyOut || !s.out[k].Load() {
				cur[i] -= weight[k]
			}
		}
		if !s.recovering[pick] && slices.Contains(s.recovering, true) {
			// The Recovering caps were computed from more weight
			// than is left: take the snapshot again.
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

// pick draws two distinct upstreams of the first group, each by drawing
// from all until one is in it, and returns the Index of the cheaper (the
// first drawn on a tie); a recovering pick goes second (then) unless it
// wins its 10 %. It returns -1 when a draw finds none within
// twoChoiceTries, and Order decides: each pair stays as likely as there.
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
	// Recovering: first for a tenth of the requests, else second after
	// the cheapest of its group that is not (spareRecovering).
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
		// Usage moved the scores since the snapshot: Order ranks this
		// request, which is cheaper than a new snapshot per answer.
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
