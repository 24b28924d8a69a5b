package failover

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// fleetOf returns n Transports over net sharing s.
func fleetOf(t *testing.T, n int, net *fakeNet, s Shared, logs *logBuffer) []*Transport {
	var out []*Transport
	for range n {
		cfg := twoUpstreams(net, Config{Shared: s, SharedSync: 100 * time.Millisecond, Breaker: BreakerConfig{FailureThreshold: 2, Cooldown: time.Second}})
		if logs != nil {
			cfg.Logger = newLogger(logs)
		}
		tr := newTestTransport(t, cfg)
		t.Cleanup(func() { tr.Close() })
		out = append(out, tr)
	}
	return out
}

// One member trips; the others open at once for the time it has left; at
// the end of the cooldown exactly one member probes, and its verdict closes
// every circuit. Changes a member adopts are not published again.
func TestSharedSingleProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		s := newMemShared()
		fleet := fleetOf(t, 3, n, s, nil)
		synctest.Wait()
		get(t, fleet[0], "http://a.test/")
		get(t, fleet[0], "http://a.test/")
		synctest.Wait()
		for i, tr := range fleet {
			if h := tr.Health()[0]; h.State != "open" || h.OpenFor != time.Second {
				t.Fatalf("member %d: %s for %v, want open for the 1s member 0 has left", i, h.State, h.OpenFor)
			}
		}
		if got := s.published(SharedOpen); got != 1 {
			t.Errorf("%d Open events published, want 1: adopted changes are not published again", got)
		}

		// The cooldown ends while the primary is still down: one member
		// probes, and its failure reopens every circuit.
		time.Sleep(time.Second)
		before := n.count("a.test")
		for range 5 {
			for _, tr := range fleet {
				get(t, tr, "http://a.test/")
			}
			synctest.Wait()
		}
		if got := n.count("a.test") - before; got != 1 {
			t.Fatalf("%d probes reached the down primary, want 1 for the fleet", got)
		}
		for i, tr := range fleet {
			if h := tr.Health()[0]; h.State != "open" {
				t.Errorf("member %d is %s after the fleet's probe failed", i, h.State)
			}
		}

		n.status("a.test", 200, "a")
		time.Sleep(time.Second)
		for range 3 { // the lease is taken in the background: the first requests go elsewhere
			for _, tr := range fleet {
				get(t, tr, "http://a.test/")
				synctest.Wait()
			}
		}
		for i, tr := range fleet {
			if h := tr.Health()[0]; h.State != "closed" {
				t.Errorf("member %d is %s after the probe succeeded", i, h.State)
			}
		}
		if got := s.published(SharedClosed); got != 1 {
			t.Errorf("%d Closed events, want 1: one probe in the fleet", got)
		}
	})
}

// With the store down from the start, members run on their own: each
// probes for itself, requests never wait on the store, the errors are
// counted and each member logs the outage once. When the store comes back
// they share again.
func TestSharedStoreDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newMemShared()
		s.down.Store(true)
		n, fleet, logs := failingFleet(t, s)
		time.Sleep(time.Second) // several failed reconciles
		trippedAlone(t, fleet, 2)
		time.Sleep(time.Second)
		before := n.count("a.test")
		for _, tr := range fleet {
			get(t, tr, "http://a.test/")
		}
		if got := n.count("a.test") - before; got != 2 {
			t.Errorf("%d probes with the store down, want one per member", got)
		}
		if got := strings.Count(logs.String(), "shared state unreachable"); got != 2 {
			t.Errorf("%d outage log lines, want one per member:\n%s", got, logs.String())
		}
		if m, down := storeDown(fleet[0]); !down {
			t.Errorf("metrics do not show the outage:\n%s", m)
		}

		s.down.Store(false)
		time.Sleep(time.Second)
		if got := strings.Count(logs.String(), "shared state reachable again"); got != 2 {
			t.Errorf("%d recovery log lines, want 2", got)
		}
		n.status("a.test", 429, "slow down", "Retry-After", "30")
		fleet[0].Reset("a")
		get(t, fleet[0], "http://a.test/")
		synctest.Wait()
		if cd := fleet[1].Health()[0].Cooldown; cd < 29*time.Second {
			t.Errorf("member 1 cools down for %v after the store came back; want the fleet's 30s", cd)
		}
	})
}

// A Shared store that panics is a store that fails: the fleet's
// goroutine, which calls it, would otherwise end the process. Requests
// are served on each member's own state, and the failures are counted.
func TestSharedStorePanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newMemShared()
		s.panics.Store(true)
		_, fleet, logs := failingFleet(t, s)
		time.Sleep(time.Second) // several reconciles and subscriptions, each panicking
		trippedAlone(t, fleet, 3)
		for i, tr := range fleet {
			if m, down := storeDown(tr); !down {
				t.Errorf("member %d's metrics do not show the store failing:\n%s", i, m)
			}
		}
		if !strings.Contains(logs.String(), "Shared panicked") {
			t.Errorf("the store's panic is not logged:\n%s", logs.String())
		}
	})
}

// failingFleet is a fleet of two members sharing s, in front of a.test,
// which fails, and b.test, which answers; and the log both write.
func failingFleet(t *testing.T, s *memShared) (*fakeNet, []*Transport, *logBuffer) {
	t.Helper()
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 200, "b")
	logs := new(logBuffer)
	return n, fleetOf(t, 2, n, s, logs), logs
}

// trippedAlone sends each member of fleet n requests for a.test, which
// fails (b.test answers them), and checks that each member opened a's
// circuit on its own.
func trippedAlone(t *testing.T, fleet []*Transport, n int) {
	t.Helper()
	for _, tr := range fleet {
		for range n {
			if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
				t.Fatalf("%d %v", code, err)
			}
		}
	}
	synctest.Wait()
	for i, tr := range fleet {
		if tr.Health()[0].State != "open" {
			t.Fatalf("member %d did not trip on its own", i)
		}
	}
}

// storeDown returns tr's metrics, and whether they show the shared store
// failing.
func storeDown(tr *Transport) (string, bool) {
	var m strings.Builder
	tr.WritePrometheus(&m)
	return m.String(), strings.Contains(m.String(), "failover_shared_up 0") && !strings.Contains(m.String(), "failover_shared_errors_total 0\n")
}

// A member that learned of an open circuit from the fleet closes it when
// the store says the fleet closed it (the Closed message was lost), but not
// a circuit it opened itself; and a store that lost its state (a restart,
// FLUSHALL) closes nothing.
func TestSharedReconcile(t *testing.T) {
	for _, tt := range []struct {
		name  string
		lose  func(s *memShared)
		want1 string
	}{
		{"closed message lost", func(s *memShared) {
			delete(s.open, "a")
			s.closed["a"] = time.Now().Add(time.Second)
		}, "closed"},
		{"store emptied", func(s *memShared) { clear(s.open) }, "open"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				n.status("a.test", 503, "down")
				n.status("b.test", 200, "b")
				s := newMemShared()
				fleet := fleetOf(t, 2, n, s, nil)
				synctest.Wait()
				get(t, fleet[0], "http://a.test/")
				get(t, fleet[0], "http://a.test/")
				synctest.Wait()
				if fleet[1].Health()[0].State != "open" {
					t.Fatal("setup: member 1 did not adopt the open circuit")
				}
				s.mu.Lock()
				tt.lose(s)
				s.mu.Unlock()
				time.Sleep(200 * time.Millisecond)
				if got := fleet[1].Health()[0].State; got != tt.want1 {
					t.Errorf("member 1 is %s, want %s", got, tt.want1)
				}
				if got := fleet[0].Health()[0].State; got != "open" {
					t.Errorf("member 0 is %s; it opened the circuit itself", got)
				}
			})
		})
	}
}

// Reset on one member closes the circuit and ends the cooldown everywhere,
// and the store does not bring the cooldown back.
func TestSharedReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 429, "slow down", "Retry-After", "30")
		n.status("b.test", 200, "b")
		s := newMemShared()
		fleet := fleetOf(t, 2, n, s, nil)
		synctest.Wait()
		get(t, fleet[0], "http://a.test/")
		synctest.Wait()
		if fleet[1].Health()[0].Cooldown < 29*time.Second {
			t.Fatal("setup: member 1 did not adopt the cooldown")
		}
		fleet[0].Reset("a")
		time.Sleep(500 * time.Millisecond) // several reconciles
		for i, tr := range fleet {
			if cd := tr.Health()[0].Cooldown; cd != 0 {
				t.Errorf("member %d still cools down for %v after Reset", i, cd)
			}
		}
	})
}

// After Close, an open circuit still probes on its own: no lease is
// waited for from a fleet that is no longer listened to.
func TestSharedAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		tr := fleetOf(t, 1, n, newMemShared(), nil)[0]
		synctest.Wait()
		get(t, tr, "http://a.test/")
		get(t, tr, "http://a.test/")
		tr.Close()
		n.status("a.test", 200, "a")
		time.Sleep(time.Second)
		get(t, tr, "http://a.test/")
		if h := tr.Health()[0]; h.State != "closed" {
			t.Errorf("after Close and the cooldown, the circuit is %s; no probe went", h.State)
		}
	})
}

// deafShared is a store whose Load, once deaf is set, ignores its context:
// it returns, with an open circuit for "a", only when release is closed.
type deafShared struct {
	*memShared
	deaf    atomic.Bool
	loading chan struct{} // closed when a deaf Load begins
	release chan struct{}
}

func (d *deafShared) Load(ctx context.Context, names []string) ([]SharedEvent, error) {
	if !d.deaf.Load() {
		return d.memShared.Load(ctx, names)
	}
	close(d.loading)
	<-d.release
	return []SharedEvent{{Upstream: "a", Kind: SharedOpen, For: time.Minute}}, nil
}

// Close returns within the bound of a call and closeGrace even when a call
// to the store ignores its context; the goroutine that made it ends when
// the call returns, and adopts nothing of what it returned.
func TestSharedCloseBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 200, "a")
		n.status("b.test", 200, "b")
		s := &deafShared{memShared: newMemShared(), loading: make(chan struct{}), release: make(chan struct{})}
		var logs logBuffer
		tr := newTestTransport(t, twoUpstreams(n, Config{Shared: s, SharedSync: 100 * time.Millisecond, Logger: newLogger(&logs)}))
		synctest.Wait()
		s.deaf.Store(true)
		<-s.loading // the next reconcile's Load
		start := time.Now()
		tr.Close()
		if got, want := time.Since(start), minCallBound+closeGrace; got > want {
			t.Errorf("Close took %v, want at most %v", got, want)
		}
		if !strings.Contains(logs.String(), "goes on past its bound") {
			t.Errorf("Close did not log the call it left: %q", logs.String())
		}
		close(s.release)
		synctest.Wait() // the fleet's goroutine ends, or synctest.Test fails
		if h := tr.Health()[0]; h.State != "closed" {
			t.Errorf("the circuit is %s: what a call returned after Close was adopted", h.State)
		}
	})
}

// With FailureRate, the fleet's failures do not trip a process: each
// judges its own.
func TestSharedFailureRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var i atomic.Int32
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if i.Add(1)%8 == 0 {
				return respond(503, "stray"), nil
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		s := newMemShared()
		var fleet []*Transport
		for range 3 {
			cfg := twoUpstreams(n, Config{Shared: s, SharedSync: 100 * time.Millisecond,
				Breaker: BreakerConfig{FailureRate: 0.5, MinRequests: 20, FailurePeriod: time.Minute}})
			tr := newTestTransport(t, cfg)
			t.Cleanup(func() { tr.Close() })
			fleet = append(fleet, tr)
		}
		synctest.Wait()
		for range 40 {
			for _, tr := range fleet {
				get(t, tr, "http://a.test/")
			}
			time.Sleep(time.Millisecond)
		}
		for j, tr := range fleet {
			if h := tr.Health()[0]; h.State != "closed" {
				t.Errorf("member %d: %s at 12.5 %% failures under a 50 %% FailureRate", j, h.State)
			}
		}
		if s.published(SharedFailure) != 0 {
			t.Errorf("%d failures published under FailureRate", s.published(SharedFailure))
		}
	})
}

// Failures queued while the store hung are not told when it answers
// again: told together, they would look like a burst and trip the fleet.
func TestSharedStaleFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var i atomic.Int32
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if i.Add(1)%5 == 0 || r.Header.Get("X-Fail") != "" {
				return respond(503, "stray"), nil
			}
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		s := newMemShared()
		var fleet []*Transport
		for range 2 {
			tr := newTestTransport(t, twoUpstreams(n, Config{Shared: s, SharedSync: 100 * time.Millisecond}))
			t.Cleanup(func() { tr.Close() })
			fleet = append(fleet, tr)
		}
		synctest.Wait()
		s.stall.Store(true)
		for range 500 { // 5s at 100 requests/s, one in 5 failing: never dense
			get(t, fleet[0], "http://a.test/")
			get(t, fleet[1], "http://a.test/")
			time.Sleep(10 * time.Millisecond)
		}
		// Member 1's last attempt fails: it would count a burst.
		req := httptestRequest("GET", "http://a.test/", "")
		req.Header.Set("X-Fail", "1")
		resp, err := fleet[1].RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s.stall.Store(false)
		time.Sleep(time.Second) // the queue drains
		for j, tr := range fleet {
			if h := tr.Health()[0]; h.State != "closed" || h.Trips != 0 {
				t.Errorf("member %d: %s, %d trips", j, h.State, h.Trips)
			}
		}
	})
}

// A store that flaps (down, one period up, down again) is one outage: each
// member logs it once and its end once, and one call that fails alone
// does not turn a member to its own state. Before, the log-once rule
// flipped back at a single successful call, and a flapping reconnect
// logged the outage again (TestFleetRedisKilled: 41 members logged an
// outage of one Redis, on a loaded machine).
func TestSharedStoreFlapsLogsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 200, "a")
		n.status("b.test", 200, "b")
		s := newMemShared()
		var logs logBuffer
		fleet := fleetOf(t, 2, n, s, &logs)
		time.Sleep(time.Second)
		s.down.Store(true)
		time.Sleep(time.Second)
		s.down.Store(false)
		time.Sleep(150 * time.Millisecond) // about one period up
		s.down.Store(true)
		time.Sleep(time.Second)
		s.down.Store(false)
		time.Sleep(time.Second)
		if got := strings.Count(logs.String(), "shared state unreachable"); got != len(fleet) {
			t.Errorf("%d outage log lines for one flapping outage, want one per member:\n%s", got, logs.String())
		}
		if got := strings.Count(logs.String(), "shared state reachable again"); got != len(fleet) {
			t.Errorf("%d recovery log lines, want one per member:\n%s", got, logs.String())
		}
		var m strings.Builder
		fleet[0].WritePrometheus(&m)
		if !strings.Contains(m.String(), "failover_shared_up 1") {
			t.Errorf("the store is back, but shared_up is not 1")
		}

		// One failed call alone is not an outage.
		before := logs.String()
		s.stall.Store(true) // Publish waits for its bound and fails
		fleet[0].Reset("a")
		synctest.Wait()
		time.Sleep(150 * time.Millisecond)
		s.stall.Store(false)
		time.Sleep(time.Second)
		if logs.String() != before {
			t.Errorf("one failed call logged:\n%s", strings.TrimPrefix(logs.String(), before))
		}
	})
}

// Members that disagree on an upstream's breaker do not fight: each opens
// for the time the member that opened it has left, an open circuit's
// time only lengthens, and the probe's verdict decides for everyone.
// Member 0 opens the primary for its 1 s, member 1 holds it for that 1 s
// (not its own 3 s); member 1's probe fails and reopens it for its 3 s,
// which member 0 holds in turn (not its own 1 s); member 0's probe then
// closes it everywhere. Two Open events in all, one Closed.
func TestSharedPolicyDisagreement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		s := newMemShared()
		var fleet []*Transport
		for _, cooldown := range []time.Duration{time.Second, 3 * time.Second} {
			cfg := Config{Base: n, Shared: s, SharedSync: 100 * time.Millisecond, Upstreams: []Upstream{
				{Name: "a", BaseURL: "http://a.test", Breaker: &BreakerConfig{FailureThreshold: 2, Cooldown: cooldown}},
				{Name: "b", BaseURL: "http://b.test"},
			}}
			tr := newTestTransport(t, cfg)
			t.Cleanup(func() { tr.Close() })
			fleet = append(fleet, tr)
		}
		openFor := func(want time.Duration, when string) {
			t.Helper()
			for i, tr := range fleet {
				if h := tr.Health()[0]; h.State != "open" || h.OpenFor != want {
					t.Errorf("%s: member %d is %s for %v, want open for %v", when, i, h.State, h.OpenFor, want)
				}
			}
		}
		synctest.Wait()
		get(t, fleet[0], "http://a.test/")
		get(t, fleet[0], "http://a.test/")
		synctest.Wait()
		openFor(time.Second, "member 0 tripped")
		if c := fleet[1].Health()[0].Breaker.Cooldown; c != 3*time.Second {
			t.Errorf("member 1's Health shows a Cooldown of %v, want its own 3s", c)
		}

		time.Sleep(time.Second)
		for range 2 { // the lease is taken in the background: the first request goes elsewhere
			get(t, fleet[1], "http://a.test/")
			synctest.Wait()
		}
		openFor(3*time.Second, "member 1's probe failed")

		time.Sleep(2900 * time.Millisecond)
		openFor(100*time.Millisecond, "100ms before member 1's 3s end")
		n.status("a.test", 200, "a")
		time.Sleep(100 * time.Millisecond)
		for range 3 { // until the probe's verdict
			if fleet[0].Health()[0].State == "closed" {
				break
			}
			get(t, fleet[0], "http://a.test/")
			synctest.Wait()
		}
		for i, tr := range fleet {
			if h := tr.Health()[0]; h.State != "closed" {
				t.Errorf("member %d is %s after member 0's probe succeeded", i, h.State)
			}
		}
		if got := s.published(SharedOpen); got != 2 {
			t.Errorf("%d Open events, want 2: the trip and the failed probe", got)
		}
		if got := s.published(SharedClosed); got != 1 {
			t.Errorf("%d Closed events, want 1", got)
		}
		if got := n.count("a.test"); got != 4 {
			t.Errorf("the primary got %d requests, want 4: 2 to trip, one probe per cooldown", got)
		}
	})
}

// A cooldown adopted from the fleet is capped by this member's own
// RateLimit.MaxCooldown, as one it started on a provider's word is: a
// member allowed longer cooldowns (or a store that says a year) kept the
// upstream out of every member's rotation for as long. The cap holds
// across reconciles: the store still says the cooldown has minutes to go
// each SharedSync, and adopting that again, capped afresh, kept the
// upstream cooling as long as the store held it (600s) while its Health
// never showed more than 60s.
func TestSharedCoolingCappedByMaxCooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 429, "slow down", "Retry-After", "600")
		n.status("b.test", 200, "b")
		s := newMemShared()
		var fleet []*Transport
		for _, max := range []time.Duration{time.Hour, 0} { // 0: 60s
			cfg := twoUpstreams(n, Config{Shared: s, SharedSync: 100 * time.Millisecond, RateLimit: RateLimitConfig{MaxCooldown: max}})
			tr := newTestTransport(t, cfg)
			t.Cleanup(func() { tr.Close() })
			fleet = append(fleet, tr)
		}
		synctest.Wait()
		get(t, fleet[0], "http://a.test/")
		synctest.Wait()
		if cd := fleet[0].Health()[0].Cooldown; cd != 600*time.Second {
			t.Fatalf("setup: member 0 cools down for %v, want the 600s asked for", cd)
		}
		if cd := fleet[1].Health()[0].Cooldown; cd != defaultMaxCooldown {
			t.Errorf("member 1 adopted a cooldown of %v, want its MaxCooldown, %v", cd, defaultMaxCooldown)
		}
		time.Sleep(500 * time.Millisecond) // several reconciles, from the store
		if cd := fleet[1].Health()[0].Cooldown; cd > defaultMaxCooldown {
			t.Errorf("member 1 cools down for %v after reconciling, past its MaxCooldown", cd)
		}
		time.Sleep(defaultMaxCooldown + time.Second)
		if cd := fleet[1].Health()[0].Cooldown; cd != 0 {
			t.Errorf("member 1 still cools down for %v, %v after adopting a cooldown capped at %v", cd, defaultMaxCooldown+time.Second+500*time.Millisecond, defaultMaxCooldown)
		}
	})
}

// The member that holds the fleet's probe lease probes once for it: an Open
// that reaches it meanwhile (its own, read back from the store before it
// expires, or another member's, late) does not hold its circuit open
// again, which would drop its probe's verdict and send a second probe
// under the same lease.
func TestSharedOpenSparesTheProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var probing atomic.Bool
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if probing.Load() {
				time.Sleep(50 * time.Millisecond) // the probe is in flight for a while
			}
			return respond(503, "down"), nil
		})
		n.status("b.test", 200, "b")
		s := newMemShared()
		fleet := fleetOf(t, 1, n, s, nil)
		tr := fleet[0]
		synctest.Wait()
		get(t, tr, "http://a.test/")
		get(t, tr, "http://a.test/")
		synctest.Wait()
		if h := tr.Health()[0]; h.State != "open" {
			t.Fatalf("setup: the primary is %s, want open", h.State)
		}
		time.Sleep(time.Second) // the cooldown ends
		probing.Store(true)
		before := n.count("a.test")
		// The lease is taken in the background: the first request goes
		// elsewhere and asks for it, the next probes.
		get(t, tr, "http://a.test/")
		synctest.Wait()
		done := make(chan struct{})
		go func() {
			defer close(done)
			get(t, tr, "http://a.test/")
		}()
		time.Sleep(10 * time.Millisecond)
		if got := n.count("a.test") - before; got != 1 {
			t.Fatalf("setup: %d requests reached the primary, want its probe", got)
		}
		// Another member's Open, late, while the probe is in flight.
		s.Publish(context.Background(), SharedEvent{Upstream: "a", Kind: SharedOpen, For: 20 * time.Millisecond, Member: "other", At: time.Now()})
		synctest.Wait()
		<-done
		time.Sleep(100 * time.Millisecond) // past the late Open, within the lease
		for range 5 {
			get(t, tr, "http://a.test/")
			synctest.Wait()
		}
		if got := n.count("a.test") - before; got != 1 {
			t.Errorf("%d probes under one lease, want 1", got)
		}
		if h := tr.Health()[0]; h.State != "open" || h.OpenFor < 800*time.Millisecond {
			t.Errorf("after its probe failed, the primary is %s for %v, want open for about the cooldown", h.State, h.OpenFor)
		}
	})
}

// scriptShared is a memShared that a test scripts: every Load answers
// with the events said last too, AcquireProbe refuses while deny is set,
// and Subscribe keeps its deliver, which tell calls when the test likes
// (from many goroutines, after Close), as a store's own goroutine might.
type scriptShared struct {
	*memShared
	deny    atomic.Bool
	mu      sync.Mutex
	said    []SharedEvent
	deliver func(SharedEvent)
}

func newScriptShared() *scriptShared { return &scriptShared{memShared: newMemShared()} }

// say makes every Load from now on answer evs too.
func (s *scriptShared) say(evs ...SharedEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.said = evs
}

// tell delivers e, through the deliver of the latest Subscribe.
func (s *scriptShared) tell(e SharedEvent) {
	s.mu.Lock()
	deliver := s.deliver
	s.mu.Unlock()
	deliver(e)
}

func (s *scriptShared) Load(ctx context.Context, names []string) ([]SharedEvent, error) {
	evs, err := s.memShared.Load(ctx, names)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(evs, s.said...), nil
}

func (s *scriptShared) Subscribe(ctx context.Context, deliver func(SharedEvent)) error {
	s.mu.Lock()
	s.deliver = deliver
	s.mu.Unlock()
	return s.memShared.Subscribe(ctx, deliver)
}

func (s *scriptShared) AcquireProbe(ctx context.Context, upstream, member string, ttl time.Duration) (bool, error) {
	if s.deny.Load() {
		return false, nil
	}
	return s.memShared.AcquireProbe(ctx, upstream, member, ttl)
}

// scriptedMember is one Transport in front of a.test and b.test sharing s,
// with a Breaker.Cooldown of 1 s, FailureThreshold 2, and a MaxCooldown of
// 1 s unless cfg says.
func scriptedMember(t *testing.T, n *fakeNet, s Shared, cfg Config) *Transport {
	t.Helper()
	cfg.Shared, cfg.SharedSync = s, 100*time.Millisecond
	if cfg.RateLimit.MaxCooldown == 0 {
		cfg.RateLimit.MaxCooldown = time.Second
	}
	cfg.Breaker = BreakerConfig{FailureThreshold: 2, Cooldown: time.Second, MaxCooldown: time.Second}
	tr := newTestTransport(t, twoUpstreams(n, cfg))
	t.Cleanup(func() { tr.Close() })
	return tr
}

// What a store says keeps an upstream out for no longer than this member's
// cap, counted from when it first adopted it, however often the store says
// it again, moves its end or makes it longer: 1 s here (MaxCooldown for a
// cooldown; for an open circuit, that or Breaker.MaxCooldown, whichever is
// longer). Before, a store that answered every Load with "cooling, 1 h
// left" kept the upstream cooling for good: each answer's end, a period
// later than the last, was taken after 1 s of drift for a new cooldown,
// capped afresh; and an open circuit the store repeated was held open as
// long as it said.
func TestSharedClaimsBounded(t *testing.T) {
	cooling := func(d time.Duration) SharedEvent {
		return SharedEvent{Upstream: "b", Kind: SharedCooling, For: d, Member: "other"}
	}
	open := func(d time.Duration) SharedEvent {
		return SharedEvent{Upstream: "a", Kind: SharedOpen, For: d, Member: "other"}
	}
	for _, tt := range []struct {
		name     string
		upstream int
		said     SharedEvent             // answered at every Load
		told     func(i int) SharedEvent // delivered every 10ms
		tellers  int                     // goroutines telling at once
	}{
		{name: "cooling 1h at every Load", upstream: 1, said: cooling(time.Hour)},
		{name: "cooling a period at every Load", upstream: 1, said: cooling(100 * time.Millisecond)},
		{name: "cooling without end at every Load", upstream: 1, said: cooling(maxDuration)},
		{name: "cooling told longer each time", upstream: 1, told: func(i int) SharedEvent { return cooling(time.Hour + time.Duration(i)*time.Second) }, tellers: 1},
		{name: "cooling told from 8 goroutines", upstream: 1, told: func(i int) SharedEvent { return cooling(time.Duration(1+i%7) * 100 * time.Millisecond) }, tellers: 8},
		{name: "open 1h at every Load", upstream: 0, said: open(time.Hour)},
		{name: "open a period at every Load", upstream: 0, said: open(100 * time.Millisecond)},
		{name: "open without end at every Load", upstream: 0, said: open(maxDuration)},
		{name: "open told longer each time", upstream: 0, told: func(i int) SharedEvent { return open(time.Hour + time.Duration(i)*time.Second) }, tellers: 1},
		{name: "open told from 8 goroutines", upstream: 0, told: func(i int) SharedEvent { return open(time.Duration(1+i%7) * 100 * time.Millisecond) }, tellers: 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				n.status("a.test", 200, "a")
				n.status("b.test", 200, "b")
				s := newScriptShared()
				tr := scriptedMember(t, n, s, Config{})
				synctest.Wait()
				start := time.Now()
				if tt.said.Kind != 0 {
					s.say(tt.said)
					time.Sleep(100 * time.Millisecond) // the next reconcile
					start = time.Now()
				}
				stop := make(chan struct{})
				var wg sync.WaitGroup
				defer func() {
					close(stop)
					wg.Wait()
				}()
				for range tt.tellers {
					wg.Go(func() {
						for i := 0; ; i++ {
							select {
							case <-stop:
								return
							default:
							}
							s.tell(tt.told(i))
							time.Sleep(10 * time.Millisecond)
						}
					})
				}
				synctest.Wait()
				if h := tr.Health()[tt.upstream]; h.Available {
					t.Fatalf("setup: %s did not adopt what the store said", h.Name)
				}
				// Requests let the circuit, once free of the store, ask for
				// the probe's lease and probe.
				for time.Since(start) < 6*time.Second {
					get(t, tr, "http://a.test/")
					synctest.Wait()
					if h := tr.Health()[tt.upstream]; !h.Available && time.Since(start) > 1200*time.Millisecond {
						t.Fatalf("%v after the store first said it, %s is %s, unavailable (%s), cooling %v, open %v: past the 1s cap", time.Since(start), h.Name, h.State, h.Unavailable, h.Cooldown, h.OpenFor)
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
		})
	}
}

// A claim is one episode through every repetition within slack of the end
// said last, however it moves the end, and never held past its limit from
// the first, even for a repetition read before it; one said after a lapse
// is a new episode.
func TestClaimHold(t *testing.T) {
	var c claim
	at := mono.Of(time.Now())
	for _, tt := range []struct {
		now  time.Duration // after at
		d    time.Duration
		want time.Duration
	}{
		{0, time.Hour, time.Second},
		{-time.Millisecond, time.Hour, time.Second}, // read before the first, locked after
		{500 * time.Millisecond, time.Hour, 500 * time.Millisecond},
		{900 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond},
		{time.Second, time.Hour, 0},
		{time.Hour + 2*time.Second, 10 * time.Millisecond, 0},       // within slack of 1h+1s: its end moves to 1h+2.01s
		{time.Hour + 3100*time.Millisecond, time.Hour, time.Second}, // lapsed: a new one
	} {
		if got := c.hold(at.Add(tt.now), tt.d, time.Second, time.Second); got != tt.want {
			t.Errorf("at +%v, said for %v: held %v, want %v", tt.now, tt.d, got, tt.want)
		}
	}
}

// Past its cap, a state the store goes on saying is adopted again once
// this member saw it for itself: its own 429 or trip starts a new episode,
// capped afresh, so that a fleet still rate-limited or down goes on
// sharing it.
func TestSharedClaimsAfterOwnEvidence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 429, "slow down", "retry-after-ms", "200")
		n.status("b.test", 200, "b")
		s := newScriptShared()
		tr := scriptedMember(t, n, s, Config{})
		synctest.Wait()
		s.say(SharedEvent{Upstream: "a", Kind: SharedCooling, For: time.Hour})
		time.Sleep(100 * time.Millisecond) // adopted, for the 1s cap
		time.Sleep(time.Second)
		if h := tr.Health()[0]; h.Cooldown != 0 {
			t.Fatalf("setup: a cools down for %v past the cap", h.Cooldown)
		}
		get(t, tr, "http://a.test/") // a 429 of its own, for 200ms
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if h := tr.Health()[0]; h.Cooldown < 500*time.Millisecond {
			t.Errorf("after a 429 of its own, a cools down for %v; want the fleet's, capped afresh at 1s", h.Cooldown)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		s := newScriptShared()
		tr := scriptedMember(t, n, s, Config{RateLimit: RateLimitConfig{MaxCooldown: 2 * time.Second}})
		synctest.Wait()
		s.say(SharedEvent{Upstream: "a", Kind: SharedOpen, For: time.Hour})
		time.Sleep(100 * time.Millisecond) // adopted, for the 2s cap
		time.Sleep(2 * time.Second)
		for range 2 { // the lease, then the probe, which fails
			get(t, tr, "http://a.test/")
			synctest.Wait()
		}
		if h := tr.Health()[0]; h.State != "open" || n.count("a.test") != 1 {
			t.Fatalf("setup: a is %s after %d probes", h.State, n.count("a.test"))
		}
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if h := tr.Health()[0]; h.OpenFor < 1500*time.Millisecond {
			t.Errorf("after its own probe failed, a is open for %v; want the fleet's, capped afresh at 2s", h.OpenFor)
		}
	})
}

// A store that refuses every probe lease, and never tells a verdict, keeps
// an upstream whose circuit opened from probing for no longer than a
// probe's lifetime (Cooldown or 30s, whichever is longer): then the member
// probes on its own, as it would
// with the store down. Before, it waited for the lease for good, the
// upstream skipped as probed elsewhere.
func TestSharedLeaseRefusedBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		s := newScriptShared()
		s.deny.Store(true)
		tr := scriptedMember(t, n, s, Config{})
		synctest.Wait()
		get(t, tr, "http://a.test/")
		get(t, tr, "http://a.test/")
		if h := tr.Health()[0]; h.State != "open" {
			t.Fatalf("setup: a is %s, want open", h.State)
		}
		n.status("a.test", 200, "a")
		time.Sleep(time.Second) // the cooldown ends: the lease is asked for, and refused
		start := time.Now()
		for tr.Health()[0].State != "closed" && time.Since(start) < 33*time.Second {
			get(t, tr, "http://a.test/")
			synctest.Wait()
			time.Sleep(50 * time.Millisecond)
		}
		if h := tr.Health()[0]; h.State != "closed" || time.Since(start) < 29*time.Second || time.Since(start) > 30100*time.Millisecond {
			t.Errorf("%v after its cooldown, with every lease refused, a is %s (%s); want closed by its own probe a probe's lifetime (30s) after the first refusal", time.Since(start), h.State, h.Unavailable)
		}
	})
}

// healthAfterClose is what Health says of an upstream that the store must
// not change once Close was called.
type healthAfterClose struct {
	State       string
	Available   bool
	Unavailable Reason
	OpenFor     time.Duration
	Cooldown    time.Duration
	Reason      CooldownReason
	Trips       uint64
}

func healthOf(tr *Transport) []healthAfterClose {
	var out []healthAfterClose
	for _, h := range tr.Health() {
		out = append(out, healthAfterClose{h.State, h.Available, h.Unavailable, h.OpenFor, h.Cooldown, h.CooldownReason, h.Trips})
	}
	return out
}

// After Close, nothing the store delivers changes routing or Health: not
// an event a goroutine of the store's own delivers late, nor one
// delivered while Close waits for the fleet's goroutines, nor the fleet's
// failures heard before Close, which a failure after it would have
// completed into a trip. Before, each was adopted: a Closed closed a
// circuit this member had opened, an Open or Cooling skipped a healthy
// upstream.
func TestSharedNothingAfterClose(t *testing.T) {
	t.Run("delivered late", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			n.status("a.test", 503, "down")
			n.status("b.test", 200, "b")
			s := newScriptShared()
			tr := scriptedMember(t, n, s, Config{})
			synctest.Wait()
			get(t, tr, "http://a.test/")
			get(t, tr, "http://a.test/") // a opens, its own
			tr.Close()
			before := healthOf(tr)
			for _, e := range []SharedEvent{
				{Upstream: "a", Kind: SharedClosed, For: time.Second},
				{Upstream: "a", Kind: SharedReset, For: time.Second},
				{Upstream: "b", Kind: SharedOpen, For: time.Minute},
				{Upstream: "b", Kind: SharedCooling, For: time.Minute},
			} {
				e.Member = "other"
				s.tell(e)
			}
			synctest.Wait()
			if got := healthOf(tr); !slices.Equal(got, before) {
				t.Errorf("events delivered after Close changed Health:\n got %+v\nwant %+v", got, before)
			}
			if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
				t.Errorf("after Close, a request got %d %v, want b's 200", code, err)
			}
		})
	})
	t.Run("loaded while closing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			n.status("a.test", 200, "a")
			n.status("b.test", 200, "b")
			s := newScriptShared()
			entered, release := make(chan struct{}), make(chan struct{})
			tr := scriptedMember(t, n, s, Config{OnStateChange: func(c StateChange) {
				if c.Upstream == "a" && c.To == Open {
					close(entered)
					<-release
				}
			}})
			synctest.Wait()
			// The next reconcile adopts a's Open, and waits in its
			// OnStateChange, with b's Cooling still to adopt.
			s.say(SharedEvent{Upstream: "a", Kind: SharedOpen, For: time.Minute}, SharedEvent{Upstream: "b", Kind: SharedCooling, For: time.Minute})
			<-entered
			closed := make(chan struct{})
			go func() {
				tr.Close()
				close(closed)
			}()
			synctest.Wait() // Close waits for the reconcile
			close(release)
			<-closed
			if h := tr.Health()[1]; h.Cooldown != 0 {
				t.Errorf("b cools down for %v: a Load's event was adopted while Close waited", h.Cooldown)
			}
		})
	})
	t.Run("failures heard before", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			n := newFakeNet()
			var fail atomic.Bool
			n.handle("a.test", func(*http.Request) (*http.Response, error) {
				if fail.Load() {
					return respond(503, "down"), nil
				}
				return respond(200, "a"), nil
			})
			n.status("b.test", 200, "b")
			s := newScriptShared()
			tr := scriptedMember(t, n, s, Config{})
			for range 5 { // a rate of its own, and the fleet's rates known
				get(t, tr, "http://a.test/")
				time.Sleep(100 * time.Millisecond)
			}
			synctest.Wait()
			s.tell(SharedEvent{Upstream: "a", Kind: SharedFailure, Rate: 1000, At: time.Now(), Member: "other"})
			synctest.Wait()
			tr.Close()
			fail.Store(true)
			get(t, tr, "http://a.test/") // one failure: half of a's threshold
			if h := tr.Health()[0]; h.State != "closed" || h.Trips != 0 {
				t.Errorf("after Close, one failure of its own and one of the fleet's heard before left a %s, %d trips; want closed", h.State, h.Trips)
			}
		})
	})
}

// A Cooling whose reason is not one of the package's is adopted as
// rate_limited: Health showed whatever the store said.
func TestSharedCoolingReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 200, "a")
		n.status("b.test", 200, "b")
		s := newScriptShared()
		tr := scriptedMember(t, n, s, Config{})
		synctest.Wait()
		for _, e := range []SharedEvent{
			{Upstream: "a", Kind: SharedCooling, For: 500 * time.Millisecond, Reason: "<script>", Member: "other"},
			{Upstream: "b", Kind: SharedCooling, For: 500 * time.Millisecond, Reason: CooldownQuotaExhausted, Member: "other"},
			{Upstream: "c", Kind: SharedCooling, For: time.Minute, Member: "other"},
			{Upstream: "a", Kind: SharedKind(99), For: time.Minute, Member: "other"},
			{Upstream: "b", Kind: SharedOpen, For: -time.Minute, Member: "other"},
		} {
			s.tell(e)
		}
		synctest.Wait()
		for i, want := range []CooldownReason{CooldownRateLimited, CooldownQuotaExhausted} {
			if h := tr.Health()[i]; h.CooldownReason != want || h.Cooldown != 500*time.Millisecond || h.State != "closed" {
				t.Errorf("%s: cooling %v for %q, %s; want 500ms for %q, closed", h.Name, h.Cooldown, h.CooldownReason, h.State, want)
			}
		}
	})
}

// The fleet's failures count a member's rate only when it is one: a
// negative rate from the store made the fleet's rate look small, and
// failures a second apart look dense.
func TestFleetStateRates(t *testing.T) {
	now := time.Now()
	for _, rate := range []float64{-999.9, math.NaN(), math.Inf(1), math.Inf(-1), 0} {
		var s fleetState
		s.dense(now, "m", rate, 1000, 2)
		if s.dense(now.Add(time.Second), "m", rate, 1000, 2) {
			t.Errorf("rate %v: 2 failures 1s apart dense at 1000 requests/s of this member's own", rate)
		}
	}
	// Rates of members gone quiet are dropped as others come.
	var s fleetState
	for i := range 5000 {
		s.noteRate(fmt.Sprint("m", i), 1, now.Add(time.Duration(i)*10*time.Millisecond))
	}
	if len(s.members) > 1001 {
		t.Errorf("%d members' rates kept, want those of the last %v, 1001", len(s.members), rateWindow)
	}
}

// T3, fleet-wide: three members sharing one store, each with the default
// Config and one request every 4 s, staggered, through a 10-minute outage
// of the primary: by the outage's end the fleet sends it at most one probe
// a minute. A member that adopts the open circuit starts its failing
// episode then, so that its own failed probe opens for the episode's age,
// not for Cooldown. With a fixed 30s open time the fleet probed twice a
// minute.
func TestSharedProbesThinOutInLongOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const outage, every = 10 * time.Minute, 4 * time.Second
		o := newOutageNet(outage)
		s := newMemShared()
		var fleet []*Transport
		for range 3 {
			tr := newTestTransport(t, twoUpstreams(o.fakeNet, Config{Shared: s}))
			t.Cleanup(func() { tr.Close() })
			fleet = append(fleet, tr)
		}
		var wg sync.WaitGroup
		var served atomic.Int64 // since the recovery, the first answer of the primary; 0: none yet
		for i, tr := range fleet {
			wg.Go(func() {
				time.Sleep(every * time.Duration(i) / time.Duration(len(fleet)))
				for time.Since(o.end) < 5*time.Minute {
					if readBody(t, mustGet(t, tr, "http://a.test/")) == "a" {
						served.CompareAndSwap(0, int64(time.Since(o.end)))
					}
					time.Sleep(every)
				}
			})
		}
		wg.Wait()
		hits := o.attempts()
		late := gaps(hits, outage-2*time.Minute)
		t.Logf("10m outage, 3 members each a request every 4s: %d attempts reached the primary down, %d in the last 2 minutes, gaps before them %v; the fleet served again %v after recovery",
			len(hits), len(late), late, time.Duration(served.Load()))
		if len(late) == 0 {
			t.Fatal("no probe in the outage's last 2 minutes")
		}
		for _, g := range late {
			if g < time.Minute {
				t.Errorf("probes %v apart in the outage's last 2 minutes, want at least a minute fleet-wide", g)
			}
		}
		if served.Load() == 0 {
			t.Error("the primary served nothing within 5 minutes of its recovery")
		}
	})
}

// T2, fleet-wide: three members sharing one store, each with the default
// Config and one request every 4 s, staggered, through a 60 s outage of
// the primary: the fleet carries traffic to it again within 10 s of its
// recovery. The probe's lease lasts a probe's lifetime, so that the
// member that took it probes with its next request, and ends with the
// open time its failed probe starts, so that the next probe may be any
// member's: a lease as short as the open time lapsed before its holder's
// next request, and no member probed.
func TestSharedRecoveryAfterMinute(t *testing.T) {
	for phase := range 4 {
		synctest.Test(t, func(t *testing.T) {
			const outage, every = time.Minute, 4 * time.Second
			o := newOutageNet(outage)
			s := newMemShared()
			var fleet []*Transport
			for range 3 {
				tr := newTestTransport(t, twoUpstreams(o.fakeNet, Config{Shared: s}))
				t.Cleanup(func() { tr.Close() })
				fleet = append(fleet, tr)
			}
			time.Sleep(time.Duration(phase) * time.Second)
			var wg sync.WaitGroup
			var served atomic.Int64 // since the recovery, the first answer of the primary; 0: none yet
			for i, tr := range fleet {
				wg.Go(func() {
					time.Sleep(every * time.Duration(i) / time.Duration(len(fleet)))
					for served.Load() == 0 && time.Since(o.end) < time.Hour {
						if readBody(t, mustGet(t, tr, "http://a.test/")) == "a" {
							served.CompareAndSwap(0, int64(max(1, time.Since(o.end))))
						}
						time.Sleep(every)
					}
				})
			}
			wg.Wait()
			lost := time.Duration(served.Load())
			t.Logf("60s outage, 3 members each a request every 4s from %ds: attempts while down at %v; the fleet served again %v after recovery", phase, o.attempts(), lost)
			if lost > 10*time.Second {
				t.Errorf("the fleet's primary serves again %v after a 60s outage ended, want within 10s", lost)
			}
		})
	}
}
