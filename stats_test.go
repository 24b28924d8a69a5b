package failover

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

func TestPeakEWMA(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	e1 := math.Exp(-1)

	// A step observes sample at t0+when, unless it only reads, then
	// checks the value at t0+when.
	type step struct {
		sample, when, want time.Duration
		read               bool
	}
	decayed := func(v time.Duration, w float64) time.Duration { return time.Duration(float64(v) * w) }
	for _, tc := range []struct {
		name  string
		decay time.Duration
		steps []step
	}{
		{"first sample", 0, []step{{sample: 100 * ms, want: 100 * ms}}},
		{"reads decay toward zero", 0, []step{
			{sample: 100 * ms, want: 100 * ms},
			{read: true, when: 10 * time.Second, want: decayed(100*ms, e1)},
		}},
		{"long silence reads zero", 0, []step{{sample: time.Second, want: time.Second}, {read: true, when: time.Hour}}},
		{"peak replaces at once", 0, []step{{sample: 100 * ms, want: 100 * ms}, {sample: 900 * ms, when: ms, want: 900 * ms}}},
		{"peak after a decay", 0, []step{{sample: 100 * ms, want: 100 * ms}, {sample: 150 * ms, when: 20 * time.Second, want: 150 * ms}}},
		// v·w + d·(1−w), w = e^(−Δ/decay); read at once, no discount.
		{"smaller sample pulls by time", 0, []step{{sample: 100 * ms, want: 100 * ms}, {sample: 0, when: 10 * time.Second, want: decayed(100*ms, e1)}}},
		{"smaller sample right away moves nothing", 0, []step{{sample: 100 * ms, want: 100 * ms}, {sample: 0, want: 100 * ms}}},
		{"between sample and average", 0, []step{
			{sample: 400 * ms, want: 400 * ms},
			{sample: 100 * ms, when: 5 * time.Second, want: decayed(400*ms, math.Exp(-0.5)) + decayed(100*ms, 1-math.Exp(-0.5))},
		}},
		{"own decay", time.Second, []step{
			{sample: 100 * ms, want: 100 * ms},
			{sample: 10 * ms, when: time.Second, want: decayed(100*ms, e1) + decayed(10*ms, 1-e1)},
			{read: true, when: 2 * time.Second, want: decayed(decayed(100*ms, e1)+decayed(10*ms, 1-e1), e1)},
		}},
		{"sample timed before the last counts as simultaneous", 0, []step{
			{sample: 100 * ms, when: 10 * time.Second, want: 100 * ms},
			{sample: 10 * ms, when: 9 * time.Second, want: 100 * ms},        // no time to pull
			{sample: 300 * ms, when: 9 * time.Second, want: 300 * ms},       // a peak still is one
			{read: true, when: 20 * time.Second, want: decayed(300*ms, e1)}, // from the stamp at 10 s
		}},
		{"negative sample is zero", 0, []step{{sample: 100 * ms, want: 100 * ms}, {sample: -time.Hour, when: 10 * time.Second, want: decayed(100*ms, e1)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newPeakEWMA(tc.decay)
			if got := e.value(t0); got != 0 {
				t.Fatalf("before any sample: got %v, want 0", got)
			}
			for i, s := range tc.steps {
				if !s.read {
					e.observe(s.sample, at(s.when))
				}
				got := e.value(at(s.when))
				if d := got - s.want; d < -2*time.Microsecond || d > 2*time.Microsecond {
					t.Errorf("step %d: got %v, want %v", i, got, s.want)
				}
			}
		})
	}
}

// TestPeakEWMAWrap checks that the millisecond stamps, modulo 2^32, work
// across the wrap.
func TestPeakEWMAWrap(t *testing.T) {
	before := time.UnixMilli(1<<32*400 - 2000)
	var e peakEWMA
	e.observe(time.Second, before)
	after := before.Add(10 * time.Second)
	want := time.Duration(math.Exp(-1) * float64(time.Second))
	if got := e.value(after); got < want-time.Microsecond || got > want+time.Microsecond {
		t.Errorf("got %v, want %v", got, want)
	}
	e.observe(0, after)
	if got := e.value(after); got < want-time.Microsecond || got > want+time.Microsecond {
		t.Errorf("after a sample across the wrap: got %v, want %v", got, want)
	}
}

// TestPeakEWMAConcurrent observes and reads from many goroutines (run with
// -race): the average stays within the samples.
func TestPeakEWMAConcurrent(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var e peakEWMA
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				e.observe(time.Duration(10+g)*time.Millisecond, now)
				if v := e.value(now); v > 17*time.Millisecond {
					t.Errorf("value %v above every sample", v)
					return
				}
			}
		})
	}
	wg.Wait()
	if v := e.value(t0.Add(999 * time.Millisecond)); v < 10*time.Millisecond || v > 17*time.Millisecond {
		t.Errorf("value %v outside the samples' range", v)
	}
}

// TestWindowRate checks rate's binary search against a scan of the whole
// ring (what it replaced) over random histories: fewer attempts than the
// ring holds and more, bursts at one instant, a since before, inside and
// after them, and canceled attempts, which take no place in the ring.
func TestWindowRate(t *testing.T) {
	scan := func(w *window, now, since time.Time) float64 { return w.scanRate(mono.Of(since), mono.Of(now)) }
	r := rand.New(rand.NewPCG(1, 2))
	t0 := time.Now()
	for run := range 300 {
		w := new(window)
		at := t0
		n := r.IntN(3 * windowSize)
		if run%10 == 0 {
			n = r.IntN(4) // the few attempts that make no rate
		}
		for range n {
			if r.IntN(4) > 0 { // a burst shares its instant
				at = at.Add(time.Duration(r.IntN(20)) * time.Millisecond)
			}
			o := Success
			switch r.IntN(10) {
			case 0:
				o = Failed
			case 1:
				o = Canceled
			}
			w.add(o, time.Millisecond, mono.Of(at))
		}
		end := at.Add(time.Duration(r.IntN(100)) * time.Millisecond)
		for _, back := range []time.Duration{0, time.Millisecond, time.Second, rateWindow, time.Hour, time.Duration(r.Int64N(int64(at.Sub(t0) + 1)))} {
			since := end.Add(-back)
			if got, want := w.rate(end, since), scan(w, end, since); got != want {
				t.Fatalf("run %d, %d attempts, since %v before the last: rate %v, a scan of the ring %v", run, n, back, got, want)
			}
		}
	}
}

// BenchmarkWindowRate is the cost of u.rate, which every failure told to
// the fleet pays (and every failure the fleet tells), on a full ring.
func BenchmarkWindowRate(b *testing.B) {
	w := new(window)
	t0 := time.Now()
	for i := range 3 * windowSize {
		w.add(Success, time.Millisecond, mono.Of(t0.Add(time.Duration(i)*time.Millisecond)))
	}
	now := t0.Add(3 * windowSize * time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		w.rate(now, now.Add(-rateWindow))
	}
}

// A writer that laps the ring between rate's search and its read of the
// oldest attempt wrote over that attempt with a new one: rate searches
// again rather than take a span of nothing (a rate of thousands of
// millions a second) or a negative one (none).
func TestWindowRateLapped(t *testing.T) {
	for _, lap := range []int{1, 2, windowSize / 2, windowSize - 1, windowSize} {
		w := new(window)
		t0 := time.Now()
		at := t0
		add := func(n int) {
			for range n {
				at = at.Add(time.Millisecond)
				w.add(Success, time.Millisecond, mono.Of(at))
			}
		}
		add(2 * windowSize)
		now := at.Add(time.Duration(lap+1) * time.Millisecond) // after the lap
		hooked := 0
		testHookRate = func() {
			if hooked++; hooked == 1 {
				add(lap)
			}
		}
		got := w.rate(now, now.Add(-rateWindow))
		testHookRate = nil
		// Read again, it is what the ring holds now.
		if want := w.scanRate(mono.Of(now.Add(-rateWindow)), mono.Of(now)); got != want {
			t.Errorf("lapped by %d attempts: rate %v, a scan of the ring %v", lap, got, want)
		}
	}
}
