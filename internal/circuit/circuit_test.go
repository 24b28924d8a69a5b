package circuit

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/failover-go/failover/internal/clocktest"
)

const cooldown = time.Second

func newTest(t *testing.T, cfg Config) *Circuit {
	t.Helper()
	if cfg.FailureThreshold == 0 && cfg.FailureRate == 0 {
		cfg.FailureThreshold = 2
	}
	if cfg.Cooldown == 0 {
		cfg.Cooldown = cooldown
	}
	if cfg.SuccessThreshold == 0 {
		cfg.SuccessThreshold = 1
	}
	return New(cfg)
}

// fail sends n failures through c at now.
func fail(t *testing.T, c *Circuit, now time.Time, n int) {
	t.Helper()
	for range n {
		p, v := c.Allow(now)
		if v.Refusal != None {
			t.Fatalf("refused a failure to count: %+v", v)
		}
		c.Done(p, Failure, now)
	}
}

// The time a circuit sees is the time it is given: it opens on failures at
// one instant, stays open until Cooldown after it, and admits one probe.
func TestOpenUntilCooldown(t *testing.T) {
	start := time.Now()
	c := newTest(t, Config{})
	fail(t, c, start, 2)
	if s := c.Snapshot(start); s.State != Open || s.OpenFor != cooldown || s.Trips != 1 || !s.Since.Equal(start) {
		t.Fatalf("after 2 failures: %+v, want open for the whole cooldown, 1 trip, since the failure", s)
	}
	if v := c.Check(start.Add(999 * time.Millisecond)); v.Refusal != Opened || v.Wait != time.Millisecond {
		t.Fatalf("1ms before the end: %+v, want open for 1ms", v)
	}
	end := start.Add(cooldown)
	if s := c.Status(end); s != HalfOpen {
		t.Fatalf("at the end of the cooldown the state reads %v, want half-open", s)
	}
	p, v := c.Allow(end)
	if v.Refusal != None || !p.Probe() {
		t.Fatalf("at the end of the cooldown: %+v %+v, want the probe", p, v)
	}
	if _, v := c.Allow(end); v.Refusal != Probing {
		t.Fatalf("a second request during the probe: %+v, want Probing", v)
	}
	c.Done(p, Success, end)
	if s := c.Status(end); s != Closed {
		t.Fatalf("after the probe succeeded: %v", s)
	}
	if !c.Recovering(end.Add(cooldown-1)) || c.Recovering(end.Add(cooldown)) {
		t.Error("Recovering does not last exactly one cooldown after closing")
	}
}

// A wall-clock step (NTP, a resumed VM) of an hour either way changes
// nothing: not how long an open circuit stays open, not when the probe
// goes, not how long the probe gate holds. Readings carry the monotonic
// clock, as time.Now's do; clocktest moves their wall clock only.
func TestWallClockStep(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour} {
		start := time.Now()
		at := func(d time.Duration) time.Time { return clocktest.StepWall(start.Add(d), step) }
		c := newTest(t, Config{})
		fail(t, c, start, 2)
		if v := c.Check(at(500 * time.Millisecond)); v.Refusal != Opened || v.Wait != 500*time.Millisecond {
			t.Fatalf("step %v: 500ms after opening: %+v, want open for 500ms more", step, v)
		}
		if s := c.Snapshot(at(500 * time.Millisecond)); s.OpenFor != 500*time.Millisecond || !s.Since.Equal(start) {
			t.Fatalf("step %v: snapshot %+v", step, s)
		}
		p, v := c.Allow(at(cooldown))
		if v.Refusal != None || !p.Probe() {
			t.Fatalf("step %v: at the end of the cooldown: %+v, want the probe", step, v)
		}
		if v := c.Check(at(cooldown + 999*time.Millisecond)); v.Refusal != Probing {
			t.Fatalf("step %v: the probe gate opened early: %+v", step, v)
		}
		if v := c.Check(at(2 * cooldown)); v.Refusal != None {
			t.Fatalf("step %v: a probe out for a whole cooldown still holds the gate: %+v", step, v)
		}
	}
}

// A probe that ends with no verdict hands the gate to the next request
// without recording anything.
func TestNeutralProbeHandsOn(t *testing.T) {
	now := time.Now()
	c := newTest(t, Config{})
	fail(t, c, now, 2)
	now = now.Add(cooldown)
	p, _ := c.Allow(now)
	c.Done(p, Neutral, now)
	q, v := c.Allow(now)
	if v.Refusal != None || !q.Probe() || q == p {
		t.Fatalf("after a neutral probe: %+v %+v, want a new probe", q, v)
	}
	if c.Status(now) != HalfOpen {
		t.Fatalf("a neutral probe changed the state to %v", c.Status(now))
	}
}

// SuccessThreshold 3 still sends one probe at a time, and closes after the
// third success in a row.
func TestSuccessThresholdOneAtATime(t *testing.T) {
	now := time.Now()
	c := newTest(t, Config{SuccessThreshold: 3})
	fail(t, c, now, 2)
	now = now.Add(cooldown)
	for i := range 3 {
		p, v := c.Allow(now)
		if v.Refusal != None || !p.Probe() {
			t.Fatalf("probe %d: %+v", i, v)
		}
		if _, v := c.Allow(now); v.Refusal != Probing {
			t.Fatalf("probe %d: a second request went through beside it: %+v", i, v)
		}
		c.Done(p, Success, now)
	}
	if s := c.Status(now); s != Closed {
		t.Fatalf("after 3 successful probes: %v", s)
	}
}

// A result from before the last state change is dropped: a slow success
// admitted while closed cannot close a circuit that opened meanwhile.
func TestLateResultDropped(t *testing.T) {
	now := time.Now()
	c := newTest(t, Config{})
	slow, _ := c.Allow(now)
	fail(t, c, now, 2)
	c.Done(slow, Success, now)
	if s := c.Status(now); s != Open {
		t.Fatalf("a late success moved the circuit to %v", s)
	}
}

// Release hands the gate on once; a second Release, or one after another
// probe took the gate, changes nothing.
func TestRelease(t *testing.T) {
	now := time.Now()
	c := newTest(t, Config{})
	fail(t, c, now, 2)
	now = now.Add(cooldown)
	p, _ := c.Allow(now)
	c.Release(p)
	q, _ := c.Allow(now)
	c.Release(p) // stale: q holds the gate
	if _, v := c.Allow(now); v.Refusal != Probing {
		t.Fatalf("a stale Release freed the gate of the next probe: %+v", v)
	}
	c.Release(q)
	c.Release(Permit{}) // not a probe: nothing
}

// OnChange runs after the lock is released, so a listener that calls back
// into the circuit does not deadlock, and it sees every change in order.
func TestOnChangeOutsideLock(t *testing.T) {
	now := time.Now()
	var c *Circuit
	var got []Change
	c = newTest(t, Config{OnChange: func(ch Change) {
		got = append(got, ch)
		c.Snapshot(ch.At) // takes no lock, but Check/Status would deadlock under one
		c.Check(ch.At)
	}})
	fail(t, c, now, 2)
	c.Reset(now)
	if len(got) != 2 || got[0].From != Closed || got[0].To != Open || got[1].To != Closed || !got[0].At.Equal(now) {
		t.Fatalf("changes %+v, want closed→open→closed at now", got)
	}
}

// A listener that panics while the probe is taken leaves the gate free and
// the circuit usable.
func TestOnChangePanicReleasesProbe(t *testing.T) {
	now := time.Now()
	boom := false
	c := newTest(t, Config{OnChange: func(ch Change) {
		if boom {
			panic("listener")
		}
	}})
	fail(t, c, now, 2)
	now = now.Add(cooldown)
	boom = true
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the listener's panic did not reach the caller")
			}
		}()
		c.Allow(now) // open → half-open calls the listener
	}()
	boom = false
	p, v := c.Allow(now)
	if v.Refusal != None || !p.Probe() {
		t.Fatalf("after the panic: %+v, want the probe free and the lock free", v)
	}
}

// The fleet's API: HoldOpen opens for at least the fleet's time and only
// lengthens; CloseRemote closes; both are remote changes. Trip is a local
// one.
func TestFleetAPI(t *testing.T) {
	now := time.Now()
	var changes []Change
	c := newTest(t, Config{OnChange: func(ch Change) { changes = append(changes, ch) }})
	c.HoldOpen(now.Add(5*time.Second), now)
	if s := c.Snapshot(now); s.State != Open || s.OpenFor != 5*time.Second || !s.Held {
		t.Fatalf("held open: %+v", s)
	}
	c.HoldOpen(now.Add(time.Second), now) // shorter: ignored
	if got := c.OpenFor(now); got != 5*time.Second {
		t.Fatalf("a shorter hold shortened the circuit to %v", got)
	}
	c.HoldOpen(now, now) // already over: ignored
	c.CloseRemote(now)
	if c.Status(now) != Closed || c.Held() {
		t.Fatalf("CloseRemote left %v, held %v", c.Status(now), c.Held())
	}
	c.Trip(now)
	if c.Status(now) != Open || c.OpenFor(now) != cooldown || c.Held() {
		t.Fatalf("Trip: %v for %v", c.Status(now), c.OpenFor(now))
	}
	c.Trip(now) // not closed: nothing
	want := []bool{true, true, false}
	if len(changes) != 3 {
		t.Fatalf("changes %+v, want 3", changes)
	}
	for i, ch := range changes {
		if ch.Remote != want[i] {
			t.Errorf("change %d %v→%v remote %v, want %v", i, ch.From, ch.To, ch.Remote, want[i])
		}
	}
}

// The Lease gates the probe: Check asks it without asking for the lease,
// Allow asks for it.
func TestLease(t *testing.T) {
	now := time.Now()
	var asked, held bool
	c := newTest(t, Config{Lease: func(_ time.Time, ask bool) bool {
		asked = asked || ask
		return held
	}})
	fail(t, c, now, 2)
	now = now.Add(cooldown)
	if v := c.Check(now); v.Refusal != Elsewhere || asked {
		t.Fatalf("Check: %+v, asked %v; want Elsewhere without asking", v, asked)
	}
	if _, v := c.Allow(now); v.Refusal != Elsewhere || !asked {
		t.Fatalf("Allow: %+v, asked %v; want Elsewhere, having asked", v, asked)
	}
	held = true
	if p, v := c.Allow(now); v.Refusal != None || !p.Probe() {
		t.Fatalf("with the lease: %+v", v)
	}
}

// Probed: an active probe's failure reopens a half-open circuit, its
// success moves an open one to half-open at once.
func TestProbed(t *testing.T) {
	now := time.Now()
	c := newTest(t, Config{})
	fail(t, c, now, 2)
	c.Probed(Success, now)
	if c.Status(now) != HalfOpen {
		t.Fatalf("a successful active probe left %v", c.Status(now))
	}
	c.Probed(Failure, now)
	if c.Status(now) != Open {
		t.Fatalf("a failed active probe left %v", c.Status(now))
	}
	c.Reset(now)
	c.Probed(Success, now)
	c.Probed(Failure, now)
	if s := c.Snapshot(now); s.State != Closed || s.Failures != 1 {
		t.Fatalf("closed after a probe failure: %+v, want 1 failure counted", s)
	}
}

// A failure rate trips on its share of a window, not on consecutive
// failures.
func TestFailureRate(t *testing.T) {
	now := time.Now()
	c := newTest(t, Config{FailureRate: 0.5, MinRequests: 4, FailurePeriod: time.Minute})
	if c.Counting() {
		t.Fatal("a FailureRate circuit says it counts consecutive failures")
	}
	for _, r := range []Result{Failure, Success, Failure, Success} {
		p, _ := c.Allow(now)
		c.Done(p, r, now)
	}
	if c.Status(now) != Open {
		t.Fatalf("2 failures in 4 at rate 0.5: %v", c.Status(now))
	}
}

// Concurrent requests through a closed and a flapping circuit (run with
// -race).
func TestConcurrent(t *testing.T) {
	c := newTest(t, Config{FailureThreshold: 3})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				now := time.Now()
				p, v := c.Allow(now)
				if v.Refusal != None {
					continue
				}
				r := Success
				if (g+i)%3 == 0 {
					r = Failure
				}
				c.Done(p, r, now)
				c.Snapshot(now)
			}
		}()
	}
	wg.Wait()
}

// A success of a request sent before the fault, arriving after its first
// failures, is older evidence than they are: it counts for nothing, and
// the circuit opens after FailureThreshold failures of requests sent
// since. A success sent after the latest failure does count.
func TestOlderSuccessResetsNothing(t *testing.T) {
	start := time.Now()
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	c := newTest(t, Config{FailureThreshold: 3})
	early, _ := c.Allow(at(0)) // in flight when the fault begins
	for i := 1; i <= 2; i++ {
		p, _ := c.Allow(at(10 * i))
		c.Done(p, Failure, at(10*i+1))
	}
	c.Done(early, Success, at(25)) // answers late
	p, _ := c.Allow(at(30))
	c.Done(p, Failure, at(31))
	if s := c.Status(at(31)); s != Open {
		t.Fatalf("after 3 failures and a success sent before them: %v, want open", s)
	}

	c.Reset(at(40))
	for i := range 2 {
		p, _ := c.Allow(at(50 + i))
		c.Done(p, Failure, at(50+i))
	}
	newer, _ := c.Allow(at(60)) // sent after the failures: newer evidence
	c.Done(newer, Success, at(61))
	p, _ = c.Allow(at(70))
	c.Done(p, Failure, at(71))
	if s := c.Snapshot(at(71)); s.State != Closed || s.Failures != 2 {
		t.Fatalf("a newer success did not count: %+v, want closed with 2 failures in the last 3", s)
	}
}

// Streak counts the failures in a row of a closed circuit: a success that
// counts ends it, one older than the latest failure does not, a trip
// starts it again, and a failure rate keeps none.
func TestStreak(t *testing.T) {
	now := time.Now()
	c := newTest(t, Config{FailureThreshold: 4})
	old, _ := c.Allow(now)
	now = now.Add(time.Millisecond)
	fail(t, c, now, 2)
	if got := c.Streak(); got != 2 {
		t.Fatalf("Streak after 2 failures: %d", got)
	}
	c.Done(old, Success, now) // sent before them: older evidence
	if got := c.Streak(); got != 2 {
		t.Fatalf("Streak after an older success: %d, want 2", got)
	}
	p, _ := c.Allow(now)
	c.Done(p, Success, now)
	if got := c.Streak(); got != 0 {
		t.Fatalf("Streak after a success: %d", got)
	}
	fail(t, c, now, 4)
	if got, st := c.Streak(), c.Status(now); got != 0 || st != Open {
		t.Fatalf("after a trip: Streak %d, %v", got, st)
	}
	r := newTest(t, Config{FailureRate: 0.5, MinRequests: 10, FailurePeriod: time.Minute})
	fail(t, r, now, 3)
	if got := r.Streak(); got != 0 {
		t.Fatalf("Streak under a failure rate: %d", got)
	}
}

// A success that Done counts without the lock (countSuccess) leaves the
// circuit as the locked path leaves it: over random sequences of
// permits settled out of order, failures, neutral results, fleet
// changes and time, a circuit whose every success takes the lock
// (settle, as Done did before succ) agrees at each step on the state,
// the failures counted, whether the last one failed and the trips.
func TestCountSuccessAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		cfg := Config{FailureThreshold: uint(1 + rng.IntN(8)), Cooldown: cooldown, SuccessThreshold: uint(1 + rng.IntN(2))}
		fast, locked := New(cfg), New(cfg)
		now := time.Now()
		type held struct{ fast, locked Permit }
		var out []held
		for step := range 400 {
			switch k := rng.IntN(100); {
			case k < 45:
				pf, vf := fast.Allow(now)
				pl, vl := locked.Allow(now)
				if vf != vl || pf != pl {
					t.Fatalf("trial %d step %d: Allow %+v %+v, want %+v %+v", trial, step, pf, vf, pl, vl)
				}
				if vf.Refusal == None {
					out = append(out, held{pf, pl})
				}
			case k < 92 && len(out) > 0:
				i := rng.IntN(len(out))
				h := out[i]
				out = slices.Delete(out, i, i+1)
				r := Success
				switch x := rng.IntN(100); {
				case x < 20:
					r = Failure
				case x < 25:
					r = Neutral
				}
				fast.Done(h.fast, r, now)
				if r == Success && (h.locked.probe != 0 || !locked.clean.Load()) {
					locked.settle(h.locked, r, now)
				} else {
					locked.Done(h.locked, r, now)
				}
			case k < 94:
				until := now.Add(time.Duration(rng.IntN(3)) * cooldown)
				fast.HoldOpen(until, now)
				locked.HoldOpen(until, now)
			case k < 95:
				fast.Reset(now)
				locked.Reset(now)
			case k < 96:
				fast.Trip(now)
				locked.Trip(now)
			default:
				now = now.Add(time.Duration(rng.IntN(int(cooldown/2))) + time.Millisecond)
			}
			// Streak first: Snapshot hands the pending successes to cb.
			if f, l := fast.Streak(), locked.Streak(); f != l {
				t.Fatalf("trial %d step %d (threshold %d): Streak %d, want %d", trial, step, cfg.FailureThreshold, f, l)
			}
			if f, l := fast.Snapshot(now), locked.Snapshot(now); f != l {
				t.Fatalf("trial %d step %d (threshold %d): %+v, want %+v", trial, step, cfg.FailureThreshold, f, l)
			}
			if f, l := fast.Check(now), locked.Check(now); f != l {
				t.Fatalf("trial %d step %d: Check %+v, want %+v", trial, step, f, l)
			}
		}
	}
}

// Successes counted without the lock, from many goroutines at once
// beside failures under the lock, are all handed to the breaker: after
// the goroutines end, the window holds what its last results say.
func TestCountSuccessConcurrent(t *testing.T) {
	c := newTest(t, Config{FailureThreshold: 1000})
	now := time.Now()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 5000 {
				p, v := c.Allow(now)
				if v.Refusal != None {
					t.Errorf("refused: %+v", v)
					return
				}
				r := Success
				if g == 0 && i%50 == 0 {
					r = Failure
				}
				c.Done(p, r, now)
			}
		})
	}
	wg.Wait()
	s := c.Snapshot(now)
	if s.State != Closed || s.Failures > 100 {
		t.Fatalf("after 40000 results, 100 of them failures: %+v, want closed with at most 100 failures counted", s)
	}
	if m := c.cb.Metrics(); m.Executions() != 1000 || m.Successes()+m.Failures() != 1000 {
		t.Fatalf("the window holds %d results, %d successes and %d failures, want 1000", m.Executions(), m.Successes(), m.Failures())
	}
	later := now.Add(time.Millisecond) // after every failure: each success counts
	for range 999 {
		p, _ := c.Allow(later)
		c.Done(p, Success, later)
	}
	if s := c.Snapshot(later); s.Failures > 1 {
		t.Fatalf("after 999 successes more: %d failures counted, want at most 1", s.Failures)
	}
	p, _ := c.Allow(later)
	c.Done(p, Success, later)
	if s := c.Snapshot(later); s.Failures != 0 || s.Failing {
		t.Fatalf("after 1000 successes more: %+v, want no failure counted", s)
	}
	if !c.clean.Load() {
		t.Fatal("the window is clean, and clean says not")
	}
}
