package failover

import (
	"math/rand/v2"
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
	// Breaker.Cooldown or 30s, whichever is longer) after being open. Until it has shown it copes, [Weighted] gives it at most 10 %
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
// It must not modify cands or keep them after it returns; it may return a
// slice of its own, which the Transport only reads. It is called
// concurrently from many goroutines, so it must be safe for concurrent use,
// and should not allocate when dst has room for every candidate.
//
// A Router only orders: the Transport still passes over upstreams that
// cannot take the request (see [Candidate.Unavailable]). An Index out of
// range or given twice is ignored, and the upstreams left out are tried
// after the others, by Index.
//
// The Routers of this package put Demoted candidates after the others and
// Open ones last, keeping their own order within each group; a HalfOpen
// candidate keeps its place, so that it is probed.
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

// routed asks the Router for the order of a request for model at now,
// into buf when it has room. With after set (the picker's pick, already
// tried) it returns the others, in the order the picker gives them after
// its pick, then first among them when pick named it.
func (t *Transport) routed(buf []*upstream, model string, now time.Time, after, then *upstream) []*upstream {
	// The Router is an interface, so what it is given escapes: the
	// buffers come from a pool rather than from each request's heap.
	rb := routerBuffers.Get().(*routerBuffer)
	cands := rb.cands[:0]
	for i, u := range t.upstreams {
		cands = append(cands, t.candidate(i, u, model, now))
	}
	out := buf[:0]
	if cap(out) < len(cands) {
		out = make([]*upstream, 0, len(cands)) // past the caller's room: once, not by doubling
	}
	var order []int
	if after == nil {
		// What Order returns is the Router's, which it may keep: never
		// pooled, and read only through validOrder, which copies what it
		// mends.
		order = t.router.Order(rb.order[:0], cands)
		if t.picker == nil {
			order = validOrder(order, len(cands))
		}
	} else {
		next := -1
		if then != nil {
			next = then.index
		}
		order = t.orderRest(rb.order[:0], cands, after.index, next)
		rb.order = order[:0] // this package's, grown maybe
	}
	for _, i := range order {
		out = append(out, t.upstreams[i])
	}
	if cap(cands) <= maxPooledCandidates && cap(rb.order) <= maxPooledCandidates {
		clear(cands) // no Name or reason kept alive by the pool
		rb.cands = cands[:0]
		routerBuffers.Put(rb)
	}
	return out
}

// validOrder returns order, a Router's of your own for n upstreams, with
// every Index out of range or given before left out and every Index it
// lacks appended, ascending (see [Router]). A valid order is returned as
// it is; any other is copied, never written: the Router may keep its
// slice.
func validOrder(order []int, n int) []int {
	var small [1]uint64
	seen := small[:]
	if n > 64 {
		seen = make([]uint64, (n+63)/64)
	}
	valid := len(order) == n
	for _, i := range order {
		if i < 0 || i >= n || seen[i/64]&(1<<(i%64)) != 0 {
			valid = false
			break
		}
		seen[i/64] |= 1 << (i % 64)
	}
	if valid {
		return order
	}
	clear(seen)
	out := make([]int, 0, n)
	for _, i := range order {
		if i >= 0 && i < n && seen[i/64]&(1<<(i%64)) == 0 {
			seen[i/64] |= 1 << (i % 64)
			out = append(out, i)
		}
	}
	for i := range n {
		if seen[i/64]&(1<<(i%64)) == 0 {
			out = append(out, i)
		}
	}
	return out
}

// routerBuffer is what routed gives a Router: room for the candidates and
// for the order it returns.
type routerBuffer struct {
	cands []Candidate
	order []int
}

// maxPooledCandidates bounds the buffers routerBuffers keeps.
const maxPooledCandidates = 1024

var routerBuffers = sync.Pool{New: func() any { return &routerBuffer{cands: make([]Candidate, 0, 8), order: make([]int, 0, 8)} }}

// candidate is what a Router knows of u at now, for a request for model.
// An upstream the Transport would skip reads as Open, with the reason.
func (t *Transport) candidate(i int, u *upstream, model string, now time.Time) Candidate {
	f := u.recent.get(&u.window, now) // the router reads the recent figures
	c := Candidate{
		Index:       i,
		Name:        u.name,
		Weight:      u.cfg.Weight,
		Cost:        u.cfg.Cost,
		InFlight:    int(u.live.inflight.Load()),
		Latency:     u.latency.value(now),
		P50:         f.p50,
		SuccessRate: f.rate,
		State:       State(u.circuit.Status(now)),
		Recovering:  u.circuit.Recovering(now),
		Unavailable: t.admit(u, model, now, nil).reason,
		Demoted:     t.demotion(u, now),
	}
	c.RequestCost, c.InputTokens, c.OutputTokens = u.usage.averages()
	if c.Unavailable != "" {
		c.State, c.Recovering = Open, false
	}
	return c
}

// picker is the fast path of this package's Routers, and the only way the
// Transport asks more of a Router than Order. A Candidate takes a few
// hundred instructions to fill, so ordering every upstream for every
// request costs in proportion to their number; a picker instead names the
// upstream Order would put first (pick), reading only the upstreams it
// needs through a view, and orders the others by Order's keys (rest) only
// when its pick does not settle the request. A Router of your own, or a
// type that embeds one of these, gets every Candidate.
type picker interface {
	Router

	// pick returns the Index Order would put first, or -1 to let Order
	// decide from every Candidate; then, unless -1, is the Index Order
	// would put right after it where rest would not.
	pick(v view) (first, then int)

	// rest sorts the positions seg of cands as Order does after its pick.
	rest(seg []int, cands []Candidate)

	// snapshot takes what the picker keeps between requests, or nil.
	snapshot(v view) *routeSnapshot

	// self returns the receiver: a type that embeds a picker returns the
	// embedded one, not itself (see pickerOf).
	self() Router
}

// pickerOf returns r as a picker when it is one of this package's Routers
// itself, not a type that embeds one: that type's Order would go unasked.
func pickerOf(r Router) picker {
	if p, ok := r.(picker); ok && p.self() == r {
		return p
	}
	return nil
}

// view is what a picker reads of the upstreams for one request: admission
// and demotion by plan.go's decisions, and the figures its keys need.
type view struct {
	t     *Transport
	model string
	now   time.Time
}

// n is the number of upstreams.
func (v view) n() int { return len(v.t.upstreams) }

// usable reports whether upstream i is in the first group: admit takes the
// request and demotion does not put it off.
func (v view) usable(i int) bool {
	u := v.t.upstreams[i]
	return v.t.admit(u, v.model, v.now, nil).reason == "" && v.t.demotion(u, v.now) == ""
}

// recovering reports whether upstream i's circuit closed recently.
func (v view) recovering(i int) bool { return v.t.upstreams[i].circuit.Recovering(v.now) }

// latency is the part of upstream i's Candidate that latencyCost reads.
func (v view) latency(i int) Candidate {
	u := v.t.upstreams[i]
	return Candidate{InFlight: int(u.live.inflight.Load()), Latency: u.latency.value(v.now)}
}

// candidates appends every upstream's Candidate to dst.
func (v view) candidates(dst []Candidate) []Candidate {
	for i, u := range v.t.upstreams {
		dst = append(dst, v.t.candidate(i, u, v.model, v.now))
	}
	return dst
}

// byModel reports whether some upstream has Models: the first group then
// depends on the request's model.
func (v view) byModel() bool { return v.t.models }

// pickFirst is the picker's pick for a request for model at now, nil when
// it declines; then as pick's.
func (t *Transport) pickFirst(model string, now time.Time) (first, then *upstream) {
	i, j := t.picker.pick(view{t, model, now})
	if i < 0 {
		return nil, nil
	}
	if j >= 0 {
		then = t.upstreams[j]
	}
	return t.upstreams[i], then
}

// orderRest appends the Indexes of cands but skip's, in the order that the
// picker gives them after its pick. then, unless -1, is the Index that
// Order put right after skip: it goes first while it is in the best group
// of the rest, as Order would put it for the same Candidates.
func (t *Transport) orderRest(dst []int, cands []Candidate, skip, then int) []int {
	start := len(dst)
	for i := range cands {
		if cands[i].Index != skip {
			dst = append(dst, i)
		}
	}
	seg := dst[start:]
	t.picker.rest(seg, cands)
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
func (v view) snapshot() *routeSnapshot {
	t, now := v.t, v.now
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
	n := t.picker.snapshot(view{t: t, now: now})
	t.routes.snap.Store(n)
	return n
}

// weightCandidates returns the part of every upstream's Candidate that
// Weighted's snapshot reads.
func (v view) weightCandidates() []Candidate {
	cands := make([]Candidate, 0, v.n())
	for i, u := range v.t.upstreams {
		c := Candidate{Index: i, Weight: u.cfg.Weight, State: Open}
		if v.usable(i) {
			c.State, c.Recovering = Closed, u.circuit.Recovering(v.now)
		}
		cands = append(cands, c)
	}
	return cands
}

// scoreCandidates returns the part of every upstream's Candidate that
// Score's snapshot reads, and when the oldest of the recent figures read
// was computed: the snapshot must not outlive them by more than
// refreshEvery.
func (v view) scoreCandidates() ([]Candidate, mono.Time) {
	cands := make([]Candidate, 0, v.n())
	oldest := mono.Of(v.now)
	for i, u := range v.t.upstreams {
		f := u.recent.get(&u.window, v.now)
		oldest = min(oldest, f.of)
		c := Candidate{Index: i, Cost: u.cfg.Cost, P50: f.p50, SuccessRate: f.rate}
		c.RequestCost, c.InputTokens, c.OutputTokens = u.usage.averages()
		cands = append(cands, c)
	}
	return cands, oldest
}

// usageKey returns every upstream's usage averages, which move Score's
// scores, when some upstream has a price (any: with CachedInput or
// CacheWrite alone, RequestCost moves the score); nil otherwise.
func (v view) usageKey() []uint64 {
	priced := false
	for _, u := range v.t.upstreams {
		priced = priced || u.cfg.Cost != (Cost{})
	}
	if !priced {
		return nil
	}
	key := make([]uint64, 0, 3*v.n())
	for _, u := range v.t.upstreams {
		key = append(key, u.usage.avgCost.Load(), u.usage.avgInput.Load(), u.usage.avgOutput.Load())
	}
	return key
}

// usageMoved reports whether the usage averages moved since a snapshot
// whose time is not up.
func (v view) usageMoved() bool {
	s := v.t.routes.snap.Load()
	return s != nil && s.key != nil && mono.Of(v.now) < s.until && !v.t.sameUsage(s.key)
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
