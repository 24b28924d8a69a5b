package main

import (
	"fmt"
	"math"
	rtmetrics "runtime/metrics"
	"slices"
	"strings"
	"sync"
	"time"
)

// lagInterval is how long the lag probe sleeps between wake-ups.
const lagInterval = 2 * time.Millisecond

// Against the AttemptTimeout, the drill's scheduling lag makes its
// figures the machine's rather than the Transport's. An attempt's deadline
// is a timer, and an answer that came in time but was read late is a
// timeout to the Transport, counted against the upstream's circuit, while
// the plain caller, whose timeout is ten times as long, does not notice.
// So the drill calls its machine starved when the probe's p99 is above
// stallShare of the AttemptTimeout (a lag that lasts), or when any
// wake-up came later than longStallShare of it: a stall that long times
// out the attempts in flight whose answers take the rest, on every
// upstream at once, and a few of them in a row open circuits. In some 40
// drills on a shared 2-CPU machine (AttemptTimeout 138 ms), quiet, beside
// CPU hogs or other jobs, none whose worst wake-up was under 70 ms had a
// false trip; about half of those with a worst of 70 to 210 ms had one or
// two, losing up to 6 % of their requests (stalls of 110 and 115 ms in the
// 429 storm opened both backups' circuits, the p99 being 6 ms); every one
// with a worst of 290 ms or more had false trips, and lost 5 to 86 %. The
// warning says the figures may be the machine's, not that they are.
const (
	stallShare     = 0.25 // a stall: a wake-up later than this of the AttemptTimeout
	longStallShare = 0.5  // a long one: later than this of it
)

// schedLatencies is the runtime/metrics histogram of the time goroutines
// wait runnable before they run: the Go scheduler's share of the lag.
const schedLatencies = "/sched/latencies:seconds"

// lagSample is one wake-up of the lag probe: when it was due, since the
// drill began, and how late it came.
type lagSample struct {
	at, late time.Duration
}

// lagProbe measures how late the drill's process gets to run: a goroutine
// sleeps lagInterval in a loop and records how much later than asked each
// wake-up came. The lateness is what any of the drill's timers and reads
// waits for a CPU beyond what it asked, whether other processes hold the
// CPUs (the OS run queue) or other goroutines do (the Go scheduler's);
// the runtime's /sched/latencies:seconds, read at the start and the end,
// tells the second apart.
type lagProbe struct {
	start  time.Time
	done   chan struct{}
	ended  chan struct{}
	once   sync.Once
	sched0 *rtmetrics.Float64Histogram // at the start; nil when the runtime has no such metric

	mu      sync.Mutex
	samples []lagSample
	sched   *rtmetrics.Float64Histogram // the change from sched0 to the end; set by stop
}

// startLag starts a probe; offsets are since start. Call stop when done.
func startLag(start time.Time) *lagProbe {
	p := &lagProbe{start: start, done: make(chan struct{}), ended: make(chan struct{}), sched0: readSched()}
	go p.loop()
	return p
}

func (p *lagProbe) loop() {
	defer close(p.ended)
	t := time.NewTimer(lagInterval)
	defer t.Stop()
	for {
		asked := time.Now()
		t.Reset(lagInterval)
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		// Not the time the channel carries, which is when the timer
		// fired: when this goroutine got to run.
		s := lagSample{at: asked.Sub(p.start), late: max(0, time.Since(asked)-lagInterval)}
		p.mu.Lock()
		p.samples = append(p.samples, s)
		p.mu.Unlock()
	}
}

// stop ends the probe and reads the scheduler's histogram once more; it
// does so once, later calls only wait for the first.
func (p *lagProbe) stop() { p.once.Do(p.end) }

func (p *lagProbe) end() {
	close(p.done)
	<-p.ended
	if p.sched0 == nil {
		return
	}
	end := readSched()
	if end == nil || len(end.Counts) != len(p.sched0.Counts) {
		return
	}
	d := &rtmetrics.Float64Histogram{Buckets: end.Buckets, Counts: make([]uint64, len(end.Counts))}
	for i := range end.Counts {
		d.Counts[i] = end.Counts[i] - p.sched0.Counts[i]
	}
	p.mu.Lock()
	p.sched = d
	p.mu.Unlock()
}

// recent returns the p99 and the worst of the lag over the wake-ups due
// in the last window before at, and how many there were.
func (p *lagProbe) recent(at, window time.Duration) (p99, worst time.Duration, n int) {
	var late []time.Duration
	p.mu.Lock()
	for i := len(p.samples) - 1; i >= 0 && p.samples[i].at >= at-window; i-- {
		late = append(late, p.samples[i].late)
	}
	p.mu.Unlock()
	slices.Sort(late)
	if len(late) == 0 {
		return 0, 0, 0
	}
	return percentile(late, 0.99), late[len(late)-1], len(late)
}

// readSched returns the runtime's scheduling latency histogram, or nil.
func readSched() *rtmetrics.Float64Histogram {
	s := []rtmetrics.Sample{{Name: schedLatencies}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return nil
	}
	h := s[0].Value.Float64Histogram()
	return &rtmetrics.Float64Histogram{Buckets: h.Buckets, Counts: slices.Clone(h.Counts)}
}

// lagReport is the drill's own scheduling lag; -json writes it as it is.
// Times in seconds.
type lagReport struct {
	IntervalS float64 `json:"interval_s"` // the probe's sleep
	Samples   int     `json:"samples"`    // its wake-ups
	P50S      float64 `json:"p50_s"`      // how late they came
	P99S      float64 `json:"p99_s"`
	MaxS      float64 `json:"max_s"`

	// A stall is a wake-up later than StallS, a quarter of the
	// AttemptTimeout. StalledS is how late the stalls came, in all, and
	// StalledShare that over the probe's time: a percentile counts a
	// stall of a second once, this counts it for its second.
	StallS       float64 `json:"stall_s"`
	Stalls       int     `json:"stalls"`
	StalledS     float64 `json:"stalled_s"`
	StalledShare float64 `json:"stalled_share"`

	// LongStalls counts the wake-ups later than LongStallS, half the
	// AttemptTimeout: each timed out the attempts in flight whose
	// answers took the other half.
	LongStallS float64 `json:"long_stall_s"`
	LongStalls int     `json:"long_stalls"`

	// SchedP50S and SchedP99S are the runtime's /sched/latencies:seconds
	// over the drill, the time goroutines waited runnable (bucket upper
	// bounds); null when the runtime has no such metric.
	SchedP50S *float64 `json:"sched_p50_s"`
	SchedP99S *float64 `json:"sched_p99_s"`

	// Phases are the lag in each phase of the script, in its order.
	Phases []lagPhase `json:"phases"`

	// Starved says that the lag was too large against the AttemptTimeout
	// for the figures to mean much: a p99 above StallS, or a long stall.
	// Warning says why, and what it means; "" when not starved.
	Starved bool   `json:"starved"`
	Warning string `json:"warning,omitempty"`
}

type lagPhase struct {
	Name       string  `json:"name"`
	P99S       float64 `json:"p99_s"`
	MaxS       float64 `json:"max_s"`
	Stalls     int     `json:"stalls"`
	LongStalls int     `json:"long_stalls"`
}

// report sums the probe up against the drill's AttemptTimeout.
func (p *lagProbe) report(o options, phases []phase) *lagReport {
	p.mu.Lock()
	samples := slices.Clone(p.samples)
	sched := p.sched
	p.mu.Unlock()
	timeout := o.attemptTimeout()
	stall, long := time.Duration(float64(timeout)*stallShare), time.Duration(float64(timeout)*longStallShare)
	rep := &lagReport{IntervalS: seconds(lagInterval), Samples: len(samples), StallS: seconds(stall), LongStallS: seconds(long)}

	all := make([]time.Duration, 0, len(samples))
	byPhase := make([][]time.Duration, len(phases))
	var stalled, probed time.Duration
	for _, s := range samples {
		all = append(all, s.late)
		i := phaseAt(phases, s.at)
		byPhase[i] = append(byPhase[i], s.late)
		probed += lagInterval + s.late
		if s.late > stall {
			rep.Stalls++
			stalled += s.late
		}
		rep.LongStalls += b2i(s.late > long)
	}
	slices.Sort(all)
	p99, worst := percentile(all, 0.99), percentile(all, 1)
	rep.P50S, rep.P99S, rep.MaxS = seconds(percentile(all, 0.50)), seconds(p99), seconds(worst)
	rep.StalledS = seconds(stalled)
	if probed > 0 {
		rep.StalledShare = float64(stalled) / float64(probed)
	}
	for i, ph := range phases {
		l := byPhase[i]
		slices.Sort(l)
		lp := lagPhase{Name: ph.name, P99S: seconds(percentile(l, 0.99)), MaxS: seconds(percentile(l, 1))}
		for _, late := range l {
			lp.Stalls += b2i(late > stall)
			lp.LongStalls += b2i(late > long)
		}
		rep.Phases = append(rep.Phases, lp)
	}
	if sched != nil {
		if q, ok := histQuantile(sched, 0.50); ok {
			rep.SchedP50S = &q
		}
		if q, ok := histQuantile(sched, 0.99); ok {
			rep.SchedP99S = &q
		}
	}

	var why []string
	if p99 > stall {
		why = append(why, fmt.Sprintf("had a p99 of %s, above a quarter of the AttemptTimeout (%s)", fmtDur(p99), fmtDur(stall)))
	}
	if n := rep.LongStalls; n > 0 {
		times := "once"
		if n > 1 {
			times = fmt.Sprintf("%d times", n)
		}
		why = append(why, fmt.Sprintf("stalled %s for more than half the AttemptTimeout (%s), up to %s, which times out the attempts in flight whose answers take the other half, on every upstream at once",
			times, fmtDur(long), fmtDur(worst)))
	}
	if len(why) > 0 {
		rep.Starved = true
		rep.Warning = fmt.Sprintf("this machine was too starved of CPU for the drill's figures to mean much: the drill's own scheduling lag (how late a %s sleep woke) %s. "+
			"An answer that came in time but was read late is a timeout to the Transport, counted against its upstream's circuit, "+
			"while the plain caller, with a timeout of %s, does not notice. "+
			"Run the drill on a quieter machine, or read its figures as the machine's, not the Transport's.",
			fmtDur(lagInterval), strings.Join(why, ", and "), fmtDur(o.scaled(callerTimeout)))
	}
	return rep
}

// histQuantile returns the upper bound of the bucket that holds h's q-th
// quantile (the lower bound of an unbounded last one); false when h is
// empty.
func histQuantile(h *rtmetrics.Float64Histogram, q float64) (float64, bool) {
	var total uint64
	for _, c := range h.Counts {
		total += c
	}
	if total == 0 {
		return 0, false
	}
	rank := max(uint64(math.Ceil(q*float64(total))), 1)
	var cum uint64
	for i, c := range h.Counts {
		if cum += c; cum >= rank {
			if hi := h.Buckets[i+1]; !math.IsInf(hi, 1) {
				return hi, true
			}
			return h.Buckets[i], true
		}
	}
	return h.Buckets[len(h.Buckets)-1], true
}
