package main

import (
	"testing"
	"time"
)

// TestBinsAlignWithPhases checks that the plot's bins are a second or
// shorter and that every phase of the script begins on the edge of a bin,
// so that a phase's shading covers exactly the bins of its requests.
func TestBinsAlignWithPhases(t *testing.T) {
	for _, d := range []time.Duration{time.Second, 3 * time.Second, 30 * time.Second, 45 * time.Second, 61 * time.Second, 90 * time.Second, 7 * time.Minute} {
		n := binCount(d)
		if w := d / time.Duration(n); w > time.Second || n%30 != 0 {
			t.Errorf("-duration %v: got %d bins of %v, want a multiple of 30 bins of at most 1s", d, n, w)
		}
		for _, p := range script(d) {
			i := binOf(p.start, d, n)
			if edge := time.Duration(int64(i) * int64(d) / int64(n)); edge != p.start {
				t.Errorf("-duration %v: %s starts at %v inside bin %d, which starts at %v", d, p.name, p.start, i, edge)
			}
			if p.start > 0 {
				if got := binOf(p.start-1, d, n); got != i-1 {
					t.Errorf("-duration %v: a request due 1ns before %s is in bin %d, want %d", d, p.name, got, i-1)
				}
			}
		}
		if got := binOf(d, d, n); got != n-1 {
			t.Errorf("-duration %v: a request due at the end is in bin %d, want the last, %d", d, got, n-1)
		}
	}
}

// TestBinRunKeepsFailuresApart checks that a bin's p99 line is of its
// successes only, that failures get a p99 of their own, and that a bin
// without successes has no success p99 at all (rather than the fast
// failures' latency).
func TestBinRunKeepsFailuresApart(t *testing.T) {
	ms := time.Millisecond
	r := &run{names: []string{"primary"}, records: []record{
		{start: 100 * ms, latency: 40 * ms, ok: true},
		{start: 200 * ms, latency: 50 * ms, ok: true},
		{start: 300 * ms, latency: 5 * ms},             // a fast 503
		{start: 1100 * ms, latency: 5 * ms},            // the second second: failures only
		{start: 1200 * ms, latency: 1500 * ms},         // a timeout
		{start: 2500 * ms, latency: 30 * ms, ok: true}, // the third: successes only
	}}
	b := binRun(r, 3*time.Second, 3)
	want := []struct {
		success, ok, failed maybe
	}{
		{maybe{100 * ratio(2, 3), true}, maybe{50, true}, maybe{5, true}},
		{maybe{0, true}, maybe{}, maybe{1500, true}},
		{maybe{100, true}, maybe{30, true}, maybe{}},
	}
	for i, w := range want {
		if b.success[i] != w.success || b.okP99[i] != w.ok || b.failedP99[i] != w.failed {
			t.Errorf("bin %d: got success %v, p99 of successes %v, of failures %v; want %v, %v, %v",
				i, b.success[i], b.okP99[i], b.failedP99[i], w.success, w.ok, w.failed)
		}
	}
	if b.failed != 3 || b.okOverall != 50*ms {
		t.Errorf("got %d failed and a p99 of successes of %v over the run, want 3 and 50ms", b.failed, b.okOverall)
	}
}
