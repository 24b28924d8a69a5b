package main

import (
	"math"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestLagReport checks the lag's figures and when the drill calls its
// machine starved, on made-up wake-ups: at the default timescale the
// AttemptTimeout is 138 ms, a stall is a wake-up later than 34.5 ms, a
// long one later than 69 ms.
func TestLagReport(t *testing.T) {
	o := options{Duration: 30 * time.Second, Timescale: 0.05}
	phases := script(o.Duration)
	// wakeups returns n wake-ups, each late by late, from at on, 2 ms apart.
	wakeups := func(at time.Duration, n int, late time.Duration) []lagSample {
		var s []lagSample
		for i := range n {
			s = append(s, lagSample{at: at + time.Duration(i)*lagInterval, late: late})
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		samples []lagSample
		starved bool
		stalls  int
		long    int
		warning []string // in the warning, when starved
	}{
		{"quiet", wakeups(0, 1000, 100*time.Microsecond), false, 0, 0, nil},
		{"one stall", append(wakeups(0, 1000, 100*time.Microsecond), lagSample{at: 6 * time.Second, late: 50 * time.Millisecond}), false, 1, 0, nil},
		{"one long stall", append(wakeups(0, 1000, 100*time.Microsecond), lagSample{at: 6 * time.Second, late: 100 * time.Millisecond}), true, 1, 1,
			[]string{"stalled once for more than half the AttemptTimeout (69 ms), up to 100 ms"}},
		{"lasting lag", append(wakeups(0, 980, 100*time.Microsecond), wakeups(12*time.Second, 20, 40*time.Millisecond)...), true, 20, 0,
			[]string{"had a p99 of 40 ms, above a quarter of the AttemptTimeout (35 ms)"}},
		{"both", append(wakeups(0, 900, 50*time.Millisecond), wakeups(12*time.Second, 3, 200*time.Millisecond)...), true, 903, 3,
			[]string{"had a p99 of", ", and stalled 3 times for more than half the AttemptTimeout (69 ms), up to 200 ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &lagProbe{samples: tc.samples}
			rep := p.report(o, phases)
			if rep.Starved != tc.starved || rep.Stalls != tc.stalls || rep.LongStalls != tc.long {
				t.Errorf("starved %v, %d stalls, %d long ones; want %v, %d, %d", rep.Starved, rep.Stalls, rep.LongStalls, tc.starved, tc.stalls, tc.long)
			}
			if rep.Samples != len(tc.samples) || rep.StallS != 0.0345 || rep.LongStallS != 0.069 || len(rep.Phases) != len(phases) {
				t.Errorf("%d samples, stalls past %gs, long past %gs, %d phases; want %d, 0.0345, 0.069, %d", rep.Samples, rep.StallS, rep.LongStallS, len(rep.Phases), len(tc.samples), len(phases))
			}
			if (rep.Warning != "") != tc.starved {
				t.Errorf("warning %q, starved %v", rep.Warning, rep.Starved)
			}
			for _, w := range tc.warning {
				if !strings.Contains(rep.Warning, w) {
					t.Errorf("warning %q, want it to say %q", rep.Warning, w)
				}
			}
		})
	}

	// The stalls' time, and where they fell.
	p := &lagProbe{samples: append(wakeups(0, 1000, 0), lagSample{at: 12 * time.Second, late: time.Second})}
	rep := p.report(o, phases)
	if got, want := rep.StalledS, 1.0; got != want {
		t.Errorf("stalled %gs, want %gs", got, want)
	}
	if got, want := rep.StalledShare, 1/(1+1001*0.002); math.Abs(got-want) > 1e-9 {
		t.Errorf("stalled share %g, want %g: a second late of 3.002 s probed, 1001 sleeps and the second", got, want)
	}
	h := phaseOf(phases, hang)
	for i, lp := range rep.Phases {
		want := 0
		if i == h {
			want = 1
		}
		if lp.Name != phases[i].name || lp.Stalls != want || lp.LongStalls != want {
			t.Errorf("phase %d: %s with %d stalls, %d long; want %s with %d", i, lp.Name, lp.Stalls, lp.LongStalls, phases[i].name, want)
		}
	}
	if rep.Phases[h].MaxS != 1 || rep.MaxS != 1 || rep.P50S != 0 {
		t.Errorf("hang's worst %gs, worst %gs, p50 %gs; want 1, 1, 0", rep.Phases[h].MaxS, rep.MaxS, rep.P50S)
	}
}

// TestLagProbe runs the probe for a few wake-ups: it records them, no
// more than its sleeps allow, and stops.
func TestLagProbe(t *testing.T) {
	defer goleak.VerifyNone(t)
	start := time.Now()
	p := startLag(start)
	for deadline := start.Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(lagInterval) {
		if _, _, n := p.recent(time.Since(start), time.Hour); n >= 5 {
			break
		}
	}
	p.stop()
	p.stop() // a second stop only waits for the first
	elapsed := time.Since(start)
	rep := p.report(options{Duration: time.Second, Timescale: 0.05}, script(time.Second))
	if most := int(elapsed/lagInterval) + 1; rep.Samples < 5 || rep.Samples > most {
		t.Errorf("%d wake-ups in %s of %s sleeps, want 5 to %d", rep.Samples, elapsed, lagInterval, most)
	}
	// The runtime samples the scheduler's latencies: a few milliseconds
	// may have none to show.
	if p50, p99 := rep.SchedP50S, rep.SchedP99S; (p50 == nil) != (p99 == nil) || p50 != nil && *p99 < *p50 {
		t.Errorf("scheduler p50 %v, p99 %v; want both or neither, in order", p50, p99)
	}
	if _, worst, n := p.recent(elapsed, time.Hour); n != rep.Samples || seconds(worst) != rep.MaxS {
		t.Errorf("recent: %d wake-ups, worst %s; want all %d, %gs", n, worst, rep.Samples, rep.MaxS)
	}
}

// TestHistQuantile checks the quantiles read off the runtime's histogram.
func TestHistQuantile(t *testing.T) {
	h := &rtmetrics.Float64Histogram{
		Buckets: []float64{0, 1, 2, 4, math.Inf(1)},
		Counts:  []uint64{50, 40, 9, 1},
	}
	for _, tc := range []struct {
		q, want float64
	}{{0.5, 1}, {0.9, 2}, {0.99, 4}, {1, 4}, {0, 1}} {
		if got, ok := histQuantile(h, tc.q); !ok || got != tc.want {
			t.Errorf("histQuantile(%g) = %g, %v; want %g", tc.q, got, ok, tc.want)
		}
	}
	if _, ok := histQuantile(&rtmetrics.Float64Histogram{Buckets: []float64{0, 1}, Counts: []uint64{0}}, 0.5); ok {
		t.Errorf("histQuantile of an empty histogram: ok, want not")
	}
}
