package circuit

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The open time is Cooldown at first, then grows as (age/24s)^1.5 seconds,
// steeper than age: a few seconds a minute into an outage, about a minute
// and a half eight minutes in, and never past the cap.
func TestOpenTimeGrowth(t *testing.T) {
	const base, limit = time.Second, 5 * time.Minute
	for _, tt := range []struct {
		age      time.Duration
		min, max time.Duration
	}{
		{0, base, base},
		{-time.Minute, base, base}, // a clock read out of order
		{10 * time.Second, base, base},
		{24 * time.Second, base, base},
		{60 * time.Second, 3900 * time.Millisecond, 4 * time.Second}, // (2.5)^1.5 = 3.95
		{2 * time.Minute, 11 * time.Second, 11200 * time.Millisecond},
		{8 * time.Minute, 89 * time.Second, 90 * time.Second},
		{10 * time.Minute, 125 * time.Second, 125 * time.Second},
		{20 * time.Minute, limit, limit},
		{1<<63 - 1, limit, limit},
	} {
		if got := OpenTime(tt.age, base, limit, 0); got < tt.min || got > tt.max {
			t.Errorf("OpenTime(%v) = %v, want within [%v, %v]", tt.age, got, tt.min, tt.max)
		}
	}
	prev := time.Duration(0)
	for age := time.Duration(0); age < time.Hour; age += 7 * time.Second {
		got := OpenTime(age, base, limit, 0)
		if got < prev {
			t.Fatalf("OpenTime(%v) = %v, shorter than %v a step before", age, got, prev)
		}
		prev = got
	}
}

// The cap is MaxCooldown, at least Cooldown: a cap below Cooldown makes
// the open time fixed, with no jitter; a Cooldown above the curve wins.
func TestOpenTimeBounds(t *testing.T) {
	for _, tt := range []struct {
		age, base, limit, want time.Duration
	}{
		{time.Hour, 30 * time.Second, time.Second, 30 * time.Second},
		{time.Hour, 30 * time.Second, 30 * time.Second, 30 * time.Second},
		{time.Minute, 30 * time.Second, 5 * time.Minute, 30 * time.Second},
		{time.Hour, 0, 0, 0},
		{1<<63 - 1, time.Second, 1<<63 - 1, 1<<63 - 1},
	} {
		for _, u := range []float64{0, 0.5, 0.999} {
			if tt.limit > tt.base && u > 0 {
				continue // jittered: TestOpenTimeJitter
			}
			if got := OpenTime(tt.age, tt.base, tt.limit, u); got != tt.want {
				t.Errorf("OpenTime(%v, %v, %v, %v) = %v, want %v", tt.age, tt.base, tt.limit, u, got, tt.want)
			}
		}
	}
}

// Jitter only shortens a grown open time, by at most 10 %, and never below
// Cooldown.
func TestOpenTimeJitter(t *testing.T) {
	const base, limit = time.Second, 5 * time.Minute
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		age := time.Duration(rng.Int64N(int64(time.Hour)))
		full := OpenTime(age, base, limit, 0)
		got := OpenTime(age, base, limit, rng.Float64())
		if got > full || got < max(base, full*9/10) {
			t.Fatalf("OpenTime(%v) jittered = %v, want within [max(%v, 90%% of %v), %v]", age, got, base, full, full)
		}
	}
	if got := OpenTime(time.Hour, base, limit, 0); got != limit {
		t.Errorf("past the cap, no jitter gives %v, want the cap %v", got, limit)
	}
	if got := OpenTime(time.Hour, base, limit, 1); got != limit*9/10 {
		t.Errorf("at the cap, the most jitter gives %v, want %v", got, limit*9/10)
	}
	if got := OpenTime(time.Hour, base, limit, 7); got != limit*9/10 {
		t.Errorf("a jitter past 1 gives %v, want it taken as 1 (%v)", got, limit*9/10)
	}
}

// Each healthy moment after the circuit closes takes a share of the
// episode's age off: half the last open time healthy, half the age; as
// long as the last open time, none left.
func TestResumed(t *testing.T) {
	const age, last = 10 * time.Minute, 2 * time.Minute
	for _, tt := range []struct {
		healthy, want time.Duration
	}{
		{0, age},
		{-time.Second, age},
		{time.Minute, age / 2},
		{90 * time.Second, age / 4},
		{last, 0},
		{time.Hour, 0},
	} {
		if got := resumed(age, tt.healthy, last); got != tt.want {
			t.Errorf("resumed(%v, %v, %v) = %v, want %v", age, tt.healthy, last, got, tt.want)
		}
	}
	if got := resumed(0, 0, last); got != 0 {
		t.Errorf("a new episode resumes at %v, want 0", got)
	}
}

// A circuit's open time grows with its failing episode across failed
// probes, and decays once it closes: a trip soon after keeps most of the
// age, one after a healthy last open time starts at Cooldown again, and so
// does one after Reset.
func TestCircuitOpenTimeGrowsAndDecays(t *testing.T) {
	start := time.Now()
	c := newTest(t, Config{MaxCooldown: 5 * time.Minute, ProbeLife: 30 * time.Second})
	fail(t, c, start, 2)
	if s := c.Snapshot(start); s.OpenTime != cooldown || s.OpenFor != cooldown {
		t.Fatalf("first trip: %+v, want open for Cooldown", s)
	}
	// Probe at each end of the open time, failing, for ten minutes.
	now := start
	for now.Sub(start) < 10*time.Minute {
		now = now.Add(c.OpenFor(now))
		p, v := c.Allow(now)
		if v.Refusal != None || !p.Probe() {
			t.Fatalf("at %v: %+v, want the probe", now.Sub(start), v)
		}
		c.Done(p, Failure, now)
	}
	age := now.Sub(start)
	last := c.Snapshot(now).OpenTime
	if want := OpenTime(age, cooldown, 5*time.Minute, 0); last > want || last < want*9/10 {
		t.Fatalf("after failing for %v: open for %v, want about %v", age, last, want)
	}

	// It closes, fails again after a tenth of its last open time: the
	// episode resumes at nine tenths of its age when it closed.
	now = now.Add(last)
	p, _ := c.Allow(now)
	c.Done(p, Success, now)
	closed := now
	now = now.Add(last / 10)
	fail(t, c, now, 2)
	resumedAge := closed.Sub(start) * 9 / 10
	if got, want := c.Snapshot(now).OpenTime, OpenTime(resumedAge, cooldown, 5*time.Minute, 0); got > want || got < want*9/10 {
		t.Errorf("a trip %v after closing: open for %v, want about %v (age %v)", now.Sub(closed), got, want, resumedAge)
	}

	// Healthy for as long as its last open time: Cooldown again.
	now = now.Add(c.OpenFor(now))
	p, _ = c.Allow(now)
	c.Done(p, Success, now)
	now = now.Add(c.Snapshot(now).OpenTime)
	fail(t, c, now, 2)
	if got := c.Snapshot(now).OpenTime; got != cooldown {
		t.Errorf("a trip after a healthy last open time: open for %v, want Cooldown", got)
	}

	// Reset ends the episode.
	for range 3 {
		now = now.Add(time.Minute)
		p, _ = c.Allow(now)
		c.Done(p, Failure, now)
	}
	c.Reset(now)
	fail(t, c, now, 2)
	if got := c.Snapshot(now).OpenTime; got != cooldown {
		t.Errorf("a trip after Reset: open for %v, want Cooldown", got)
	}
}

// An episode starts when the circuit first opens, on the fleet's word
// too: a member that never saw the failures, whose own probe fails, opens
// for the episode's age, not for Cooldown.
func TestCircuitEpisodeFromHoldOpen(t *testing.T) {
	start := time.Now()
	c := newTest(t, Config{MaxCooldown: 5 * time.Minute, ProbeLife: 30 * time.Second})
	c.HoldOpen(start.Add(time.Minute), start)
	now := start.Add(5 * time.Minute)
	p, v := c.Allow(now)
	if v.Refusal != None || !p.Probe() {
		t.Fatalf("after the hold: %+v, want the probe", v)
	}
	c.Done(p, Failure, now)
	if got, want := c.Snapshot(now).OpenTime, OpenTime(5*time.Minute, cooldown, 5*time.Minute, 0); got > want || got < want*9/10 {
		t.Errorf("its own probe failed 5m after it adopted the open circuit: open for %v, want about %v", got, want)
	}
}
