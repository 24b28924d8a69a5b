package failover

import (
	"math"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// windowSize is how many recent attempts an upstream's latency percentiles
// and success rate are computed from, at most.
const windowSize = 1024

// healthAge is how old an attempt may be and still count in Health's
// percentiles and success rate: an upstream that nobody tried for longer
// shows no figures rather than stale ones.
const healthAge = 5 * time.Minute

// window keeps an upstream's recent attempts in a fixed ring, lock-free:
// memory stays bounded whatever the traffic.
type window struct {
	next   atomic.Uint64
	ring   [windowSize]atomic.Int64 // latency<<5 | unknown<<4 | outcome<<1 | 1; 0 is empty
	at     [windowSize]atomic.Int64 // when, a mono.Time
	counts [len(outcomeNames)]atomic.Uint64
	last   atomic.Pointer[lastError]
}

type lastError struct {
	msg string
	at  time.Time
}

// add records an attempt's outcome and latency at now; a negative latency
// is unknown (the attempt was cut short). A canceled or unservable attempt
// says nothing of the upstream, so it is only counted.
func (w *window) add(o Outcome, d time.Duration, now mono.Time) {
	w.counts[o].Add(1)
	if o == Canceled || o == Unservable {
		return // says nothing of the upstream
	}
	i := (w.next.Add(1) - 1) % windowSize
	w.at[i].Store(int64(now))
	v := int64(max(d, 0))<<5 | int64(o)<<1 | 1
	if d < 0 {
		v = 1<<4 | int64(o)<<1 | 1 // an outcome whose latency is unknown
	}
	w.ring[i].Store(v)
}

// rate returns the attempts per second over the window's attempts made
// after since: their number over the time since the oldest of them (0
// with fewer than 2). The oldest is found by a binary search over the
// ring, which is in time order but for concurrent writers' jitter; when a
// writer lapped the ring meanwhile it searches again, and after rateTries
// scans (see docs/design.md).
func (w *window) rate(now, since time.Time) float64 {
	from, end := mono.Of(since), mono.Of(now)
	for range rateTries {
		next := w.next.Load()
		lo, hi := next-min(next, windowSize), next // the numbers the ring holds: [lo, hi)
		// The first number in [lo, hi) whose attempt is at from or later.
		first := lo + uint64(sort.Search(int(hi-lo), func(k int) bool {
			return mono.Time(w.at[(lo+uint64(k))%windowSize].Load()) >= from
		}))
		if hi-first < 2 {
			return 0
		}
		if testHookRate != nil {
			testHookRate()
		}
		oldest := mono.Time(w.at[first%windowSize].Load())
		if w.next.Load() > first+windowSize {
			continue // first's slot was claimed a ring later: read again
		}
		if end <= oldest {
			return 0
		}
		return float64(hi-first) / end.Sub(oldest).Seconds()
	}
	return w.scanRate(from, end)
}

// rateTries is how many times rate searches before it scans the ring: only
// a writer that laps the ring between two reads makes it search again.
const rateTries = 3

// testHookRate, when set, runs between rate's search and its read of the
// oldest attempt, for a test to write meanwhile.
var testHookRate func()

// scanRate is rate by a scan of every slot: slower, and whatever the
// writers do, each slot is an attempt (or empty) at the time it is read.
func (w *window) scanRate(from, end mono.Time) float64 {
	oldest, n := end, 0
	for i := range w.ring {
		if at := mono.Time(w.at[i].Load()); w.ring[i].Load() != 0 && at >= from {
			n++
			oldest = min(oldest, at)
		}
	}
	if n < 2 || end <= oldest {
		return 0
	}
	return float64(n) / end.Sub(oldest).Seconds()
}

// windowStats are the figures of the attempts in a window that are at
// most some age.
type windowStats struct {
	latencies []time.Duration // sorted; attempts cut short have none
	good, bad int             // served (success, rejected) and failed
	n         int             // attempts
}

// stats returns the figures of w's attempts made after since. An entry
// being written meanwhile may pair a new latency with an old time.
func (w *window) stats(since time.Time) windowStats {
	var s windowStats
	s.latencies = make([]time.Duration, 0, windowSize)
	from := mono.Of(since)
	for i := range w.ring {
		v := w.ring[i].Load()
		if v == 0 || mono.Time(w.at[i].Load()) < from {
			continue
		}
		s.n++
		if v&(1<<4) == 0 {
			s.latencies = append(s.latencies, time.Duration(v>>5))
		}
		switch Outcome(v >> 1 & 7) {
		case Success, Rejected:
			s.good++
		case Failed:
			s.bad++
		}
	}
	slices.Sort(s.latencies)
	return s
}

// successRate is served over served and failed; 1 when there are none.
func (s windowStats) successRate() float64 {
	if s.good+s.bad == 0 {
		return 1
	}
	return float64(s.good) / float64(s.good+s.bad)
}

func (s windowStats) percentile(q float64) time.Duration {
	if len(s.latencies) == 0 {
		return 0
	}
	return percentile(s.latencies, q)
}

// percentile returns the nearest-rank q-th percentile of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// refreshEvery is how often an upstream's recent figures are recomputed
// (a sort of at most 1024 latencies) for routing decisions.
const refreshEvery = 250 * time.Millisecond

// recent caches the figures of an upstream's attempts over one window of
// time, for the request path: read with atomic loads, recomputed by one
// request at most every refreshEvery. Each feature that judges recent
// figures (Degraded and the routers, Hang, Hedge) reads the recent of its
// own window; features with the same window share one.
type recent struct {
	span    time.Duration // how far back the figures reach
	at      atomic.Int64  // mono.Time of the last computation, from its start
	of      atomic.Int64  // mono.Time of the last computation, once its figures are stored
	p99     atomic.Int64  // time.Duration
	p95     atomic.Int64  // time.Duration
	p50     atomic.Int64  // time.Duration
	samples atomic.Int64  // latencies the percentiles are from
	n       atomic.Int64  // attempts
	rate    atomic.Uint64 // math.Float64bits of the success rate
}

// figures are an upstream's recent figures, as of one refresh.
type figures struct {
	p99, p95, p50 time.Duration
	samples       int // latencies known (attempts not cut short)
	n             int // attempts
	rate          float64

	// of is when they were computed, or before: they are at least that
	// new; zero when never. It is not recent.at, which a request stores
	// before it computes them: figures read meanwhile are those of the
	// computation before.
	of mono.Time
}

// get returns the figures over r's span of w at now, recomputing them when
// they are older than refreshEvery.
func (r *recent) get(w *window, now time.Time) figures {
	at, m := r.at.Load(), mono.Of(now)
	if (at == 0 || m.Sub(mono.Time(at)) >= refreshEvery) && r.at.CompareAndSwap(at, int64(m)) {
		s := w.stats(now.Add(-r.span))
		r.p99.Store(int64(s.percentile(0.99)))
		r.p95.Store(int64(s.percentile(0.95)))
		r.p50.Store(int64(s.percentile(0.50)))
		r.samples.Store(int64(len(s.latencies)))
		r.n.Store(int64(s.n))
		r.rate.Store(math.Float64bits(s.successRate()))
		r.of.Store(int64(m))
	}
	of := mono.Time(r.of.Load()) // before the figures: they are as new at least
	return figures{
		p99:     time.Duration(r.p99.Load()),
		p95:     time.Duration(r.p95.Load()),
		p50:     time.Duration(r.p50.Load()),
		samples: int(r.samples.Load()),
		n:       int(r.n.Load()),
		rate:    r.rateOrOne(),
		of:      of,
	}
}

func (r *recent) rateOrOne() float64 {
	if r.at.Load() == 0 {
		return 1 // never computed: no attempts, as successRate says
	}
	return math.Float64frombits(r.rate.Load())
}

// liveness tracks an upstream's requests in flight and the newest of them
// it answered, lock-free.
type liveness struct {
	inflight  atomic.Int32
	busySince atomic.Int64 // mono.Time when inflight last went from 0 to 1

	// answered is when the newest attempt that got an answer was sent
	// (a mono.Time). A late answer to an older request says nothing of
	// those sent after it.
	answered atomic.Int64
}

func (l *liveness) start(now mono.Time) {
	if l.inflight.Add(1) == 1 {
		l.busySince.Store(int64(now))
	}
}

// end closes an attempt sent at start; answered says whether the upstream
// answered it (a response, or an error of its own such as a refused
// connection) rather than the attempt timing out or the caller giving up.
func (l *liveness) end(start mono.Time, answered bool) {
	for answered {
		old := l.answered.Load()
		if int64(start) <= old || l.answered.CompareAndSwap(old, int64(start)) {
			break
		}
	}
	l.inflight.Add(-1)
}

// defaultEWMADecay is the decay time constant of a zero peakEWMA.
const defaultEWMADecay = 10 * time.Second

// peakEWMA is a peak-sensitive exponentially weighted moving average of an
// upstream's latency, Finagle's "peak EWMA", lock-free. A sample larger
// than the average replaces it at once; a smaller one d pulls it toward d
// by the time Δ since the previous sample:
//
//	v ← v·w + d·(1 − w),  w = exp(−Δ/decay)
//
// Read at now, the average is discounted by the time since the last
// sample, so an upstream nobody tries looks faster and is tried again. The
// value and the time share one atomic word (see docs/design.md). The zero
// value is ready to use, with a decay of 10s; it must not be copied after
// first use.
type peakEWMA struct {
	decay time.Duration // zero means defaultEWMADecay; set before first use
	state atomic.Uint64 // math.Float32bits(v)<<32 | milliseconds of the last sample
}

// newPeakEWMA returns a peakEWMA with the decay time constant decay (zero
// means 10s).
func newPeakEWMA(decay time.Duration) *peakEWMA {
	return &peakEWMA{decay: decay}
}

// ewmaSkew is how far before the last sample a sample may be timed and
// still count as simultaneous with it, in milliseconds.
const ewmaSkew = 60_000

// ewmaTick is the millisecond of t on the monotonic clock, modulo 2^32.
func ewmaTick(t time.Time) uint32 { return uint32(int64(mono.Of(t)) / int64(time.Millisecond)) }

// ewmaElapsed returns the milliseconds from tick last to tick now, and
// false when now is up to ewmaSkew before last.
func ewmaElapsed(last, now uint32) (uint32, bool) {
	d := now - last
	if d > math.MaxUint32-ewmaSkew {
		return 0, false
	}
	return d, true
}

// weight returns exp(−ms/decay).
func (e *peakEWMA) weight(ms uint32) float64 {
	decay := e.decay
	if decay <= 0 {
		decay = defaultEWMADecay
	}
	return math.Exp(-float64(ms) * float64(time.Millisecond) / float64(decay))
}

// observe adds the sample d, taken at now.
func (e *peakEWMA) observe(d time.Duration, now time.Time) {
	for {
		old := e.state.Load()
		v, last := float64(math.Float32frombits(uint32(old>>32))), uint32(old)
		x, tick := float64(max(d, 0)), ewmaTick(now)
		ms, inOrder := ewmaElapsed(last, tick)
		if !inOrder && v > 0 { // with no value yet, the stamp means nothing
			tick = last
		}
		if x < v {
			w := e.weight(ms)
			x = v*w + x*(1-w)
		}
		s := uint64(math.Float32bits(float32(x)))<<32 | uint64(tick)
		if s == old || e.state.CompareAndSwap(old, s) {
			return
		}
	}
}

// value returns the average as read at now: discounted by the time since
// the last sample. It is zero before the first sample.
func (e *peakEWMA) value(now time.Time) time.Duration {
	s := e.state.Load()
	v := float64(math.Float32frombits(uint32(s >> 32)))
	if v == 0 {
		return 0
	}
	if ms, ok := ewmaElapsed(uint32(s), ewmaTick(now)); ok {
		v *= e.weight(ms)
	}
	return time.Duration(math.Round(v))
}
