package failover

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// numbered numbers candidates by their position.
func numbered(cs ...Candidate) []Candidate {
	for i := range cs {
		cs[i].Index = i
		cs[i].Name = fmt.Sprint("u", i)
	}
	return cs
}

// checkOrder reports whether got holds every candidate's Index exactly
// once, and marks t failed when not. It may run on any goroutine.
func checkOrder(t testing.TB, got []int, cs []Candidate) bool {
	t.Helper()
	want := make([]int, 0, len(cs))
	for _, c := range cs {
		want = append(want, c.Index)
	}
	slices.Sort(want)
	sorted := slices.Sorted(slices.Values(got))
	if !slices.Equal(sorted, want) {
		t.Errorf("Order = %v, not each of %v once", got, want)
		return false
	}
	return true
}

type orderCase struct {
	name  string
	cands []Candidate
	want  []int
}

// runOrder checks the order that r gives each case, that Order appends to
// what dst already holds, and that it leaves cands alone.
func runOrder(t *testing.T, r func() Router, cases []orderCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Helper()
			before := fmt.Sprint(tc.cands)
			got := r().Order([]int{-7}, tc.cands)
			if got[0] != -7 {
				t.Fatalf("Order overwrote dst: got %v", got)
			}
			if after := fmt.Sprint(tc.cands); after != before {
				t.Errorf("Order changed cands: %s, was %s", after, before)
			}
			got = got[1:]
			if checkOrder(t, got, tc.cands) && !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRouterRecovering checks that LeastLatency and Score send a recovering
// upstream that would go first a tenth of the traffic, and the rest to the
// next best of its group.
func TestRouterRecovering(t *testing.T) {
	ms := time.Millisecond
	cs := numbered(
		Candidate{Latency: ms, P50: ms, SuccessRate: 1, Recovering: true},
		Candidate{Latency: 90 * ms, P50: 90 * ms, SuccessRate: 1},
		Candidate{Latency: 99 * ms, P50: 99 * ms, SuccessRate: 1, Demoted: ReasonDegraded},
	)
	for _, r := range []Router{LeastLatency{}, Score{}} {
		t.Run(fmt.Sprintf("%T", r), func(t *testing.T) {
			const n = 20000
			got := firstPicks(r, cs, n)
			checkShare(t, "recovering", float64(got[0]), 0.1*n, n, 0.02)
			checkShare(t, "next", float64(got[1]), 0.9*n, n, 0.02)

			// With no other usable candidate it keeps its place.
			alone := slices.Clone(cs)
			alone[1].Demoted = ReasonDegraded
			if got := firstPicks(r, alone, 100); got[0] != 100 {
				t.Errorf("picks %v, want the recovering one first alone in its group", got)
			}
		})
	}
}

// TestRouterGroups checks every router's order on a mix of usable,
// degraded and open candidates: usable first, degraded next, open last.
func TestRouterGroups(t *testing.T) {
	cs := numbered(
		Candidate{State: Open, SuccessRate: 1},
		Candidate{Demoted: ReasonDegraded, Latency: time.Millisecond, SuccessRate: 1, Weight: 5},
		Candidate{State: HalfOpen, Latency: time.Second, SuccessRate: 0.5},
		Candidate{Demoted: ReasonDegraded, State: Open},
		Candidate{Latency: 2 * time.Second, SuccessRate: 0.9},
		Candidate{Demoted: ReasonDegraded, Latency: 3 * time.Second, SuccessRate: 0.1},
	)
	groups := []int{groupOpen, groupDegraded, groupUsable, groupOpen, groupUsable, groupDegraded}
	for _, r := range []Router{Priority{}, new(Weighted), LeastLatency{}, Score{}} {
		t.Run(fmt.Sprintf("%T", r), func(t *testing.T) {
			for range 100 {
				got := r.Order(nil, cs)
				if !checkOrder(t, got, cs) {
					return
				}
				for i := 1; i < len(got); i++ {
					if groups[got[i-1]] > groups[got[i]] {
						t.Fatalf("got %v: %d (group %d) before %d (group %d)", got, got[i-1], groups[got[i-1]], got[i], groups[got[i]])
					}
				}
			}
		})
	}
}

// TestRoutersConcurrent calls each router from many goroutines at once
// (run with -race). Weighted's picks stay exact: its steps are serialized.
func TestRoutersConcurrent(t *testing.T) {
	cs := numbered(
		Candidate{Weight: 5, Latency: 10 * time.Millisecond, InFlight: 2, P50: 100 * time.Millisecond, SuccessRate: 1},
		Candidate{Weight: 3, Latency: 20 * time.Millisecond, P50: 200 * time.Millisecond, SuccessRate: 0.9, Cost: Cost{Input: 1, Output: 2}},
		Candidate{Weight: 2, Latency: 30 * time.Millisecond, P50: 300 * time.Millisecond, SuccessRate: 0.8, Recovering: true},
		Candidate{Weight: 1, State: Open},
	)
	const goroutines, calls = 16, 500
	for _, r := range []Router{Priority{}, new(Weighted), LeastLatency{}, Score{}} {
		t.Run(fmt.Sprintf("%T", r), func(t *testing.T) {
			var mu sync.Mutex
			count := make([]int, len(cs))
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					local := make([]int, len(cs))
					dst := make([]int, 0, len(cs))
					for range calls {
						got := r.Order(dst[:0], cs)
						if !checkOrder(t, got, cs) {
							return
						}
						local[got[0]]++
					}
					mu.Lock()
					for i, c := range local {
						count[i] += c
					}
					mu.Unlock()
				})
			}
			wg.Wait()
			if _, ok := r.(*Weighted); ok {
				// 8000 picks over cycles of 5+3+0.9 (recovering capped
				// at a ninth of 8): about 56 %, 34 %, 10 %.
				const n = goroutines * calls
				checkShare(t, "u0", float64(count[0]), n*5/8.8889, n, 0.01)
				checkShare(t, "u2", float64(count[2]), n*0.8889/8.8889, n, 0.01)
			}
		})
	}
}

func TestRoutersAllocs(t *testing.T) {
	cs := numbered(
		Candidate{Weight: 2, Latency: 10 * time.Millisecond, InFlight: 1, P50: 100 * time.Millisecond, SuccessRate: 1, Recovering: true},
		Candidate{Weight: 1, Latency: 20 * time.Millisecond, P50: 200 * time.Millisecond, SuccessRate: 0.9, Cost: Cost{Input: 1, Output: 2}},
		Candidate{Weight: 3, Latency: 30 * time.Millisecond, P50: 300 * time.Millisecond, SuccessRate: 0.8, Demoted: ReasonDegraded},
		Candidate{State: Open},
	)
	dst := make([]int, 0, len(cs))
	for _, r := range []Router{Priority{}, new(Weighted), LeastLatency{}, Score{}} {
		r.Order(dst, cs) // Weighted sizes its state on first use
		if n := testing.AllocsPerRun(100, func() { r.Order(dst, cs) }); n != 0 {
			t.Errorf("%T: %v allocations per Order, want 0", r, n)
		}
	}
}

func BenchmarkRouterOrder(b *testing.B) {
	cs := numbered(
		Candidate{Weight: 5, Latency: 300 * time.Millisecond, InFlight: 4, P50: 340 * time.Millisecond, SuccessRate: 0.9971, Cost: Cost{Input: 1.25, Output: 10}},
		Candidate{Weight: 3, Latency: 400 * time.Millisecond, InFlight: 1, P50: 410 * time.Millisecond, SuccessRate: 0.9918, Cost: Cost{Input: 3, Output: 15}},
		Candidate{Weight: 2, Latency: 180 * time.Millisecond, InFlight: 2, P50: 180 * time.Millisecond, SuccessRate: 0.9962, Cost: Cost{Input: 0.3, Output: 2.5}},
	)
	for _, tc := range []struct {
		name string
		r    Router
	}{{"Priority", Priority{}}, {"Weighted", new(Weighted)}, {"LeastLatency", LeastLatency{}}, {"Score", Score{}}} {
		name, r := tc.name, tc.r
		b.Run(name, func(b *testing.B) {
			dst := make([]int, 0, len(cs))
			b.ReportAllocs()
			for b.Loop() {
				dst = r.Order(dst[:0], cs)
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				dst := make([]int, 0, len(cs))
				for pb.Next() {
					dst = r.Order(dst[:0], cs)
				}
			})
		})
	}
}

func BenchmarkPeakEWMA(b *testing.B) {
	var e peakEWMA
	now := time.Now()
	b.Run("observe", func(b *testing.B) {
		for b.Loop() {
			e.observe(100*time.Millisecond, now)
		}
	})
	b.Run("value", func(b *testing.B) {
		for b.Loop() {
			_ = e.value(now)
		}
	})
}

func threeUpstreams(n *fakeNet, cfg Config, weights ...float64) Config {
	cfg.Base = n
	for i, h := range []string{"a", "b", "c"} {
		u := Upstream{Name: h, BaseURL: "http://" + h + ".test"}
		if i < len(weights) {
			u.Weight = weights[i]
		}
		cfg.Upstreams = append(cfg.Upstreams, u)
	}
	return cfg
}

func TestRouterConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		u     Upstream
		field string // the error names it
	}{
		{Upstream{BaseURL: "http://a.test", Weight: -1}, "Weight"},
		{Upstream{BaseURL: "http://a.test", Cost: Cost{Input: -1}}, "Cost"},
		{Upstream{BaseURL: "http://a.test", Cost: Cost{Output: math.Inf(1)}}, "Cost"},
		{Upstream{BaseURL: "http://a.test", Cost: Cost{CachedInput: math.NaN()}}, "Cost"},
		{Upstream{BaseURL: "http://a.test", Cost: Cost{CacheWrite: -0.5}}, "Cost"},
	} {
		_, err := New(Config{Upstreams: []Upstream{tc.u}})
		if err == nil || !strings.Contains(err.Error(), "Upstreams[0]."+tc.field) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.u, err, tc.field)
		}
	}
}

// scaleTransport is a Transport over n upstreams u0.test, u1.test, ... that
// answer 200 from memory, routed by r (nil: the configured order), u0
// weighing 1e6 so that Weighted sends it nearly every request.
func scaleTransport(t *testing.T, n int, r Router) *Transport {
	t.Helper()
	cfg := Config{Router: r, Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	})}
	for i := range n {
		cfg.Upstreams = append(cfg.Upstreams, Upstream{Name: fmt.Sprint("u", i), BaseURL: fmt.Sprintf("http://u%d.test", i)})
	}
	cfg.Upstreams[0].Weight = 1e6
	return newTestTransport(t, cfg)
}

// requestAllocs returns the allocations of one request through tr, sent
// again and again.
func requestAllocs(t *testing.T, tr *Transport) float64 {
	t.Helper()
	req := httptestRequest("GET", "http://u0.test/v1/x", "")
	send := func() {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for range 10 {
		send() // Weighted sizes its state, Score and Weighted take a snapshot
	}
	// The median of the requests that took nothing new from a pool: a
	// refill (after a collection, and under -race at random) falls on
	// some, and an average would count a share of it.
	counts, _ := perRequestAllocs(t, 401, send)
	return float64(counts[len(counts)/2])
}

// TestRoutersAllocsScale checks that this package's Routers cost a
// request at 64 upstreams the allocations of the default order, whose
// request the first upstream serves: no Candidate for each upstream, no
// order of all of them. LeastLatency spreads the requests over all 64 by
// design (an answer from an upstream the request was not addressed to
// costs a few allocations of its own): its count at 64 is its count at 8,
// where nearly every request is served by another than u0 too.
func TestRoutersAllocsScale(t *testing.T) {
	want := requestAllocs(t, scaleTransport(t, 64, nil))
	for _, r := range []Router{Priority{}, new(Weighted), Score{}} {
		if got := requestAllocs(t, scaleTransport(t, 64, r)); got != want {
			t.Errorf("%T at 64 upstreams: got %v allocations per request, want %v as the default order", r, got, want)
		}
	}
	// With u0's circuit open, every request is served by another, at 8
	// and at 64 alike: else the count at 64, a request in 64 served by u0
	// (one allocation less), lies a little under the next integer, and
	// read 5 against 4 at 8 once in about 15 runs.
	spread := func(n int) *Transport {
		tr := scaleTransport(t, n, LeastLatency{})
		now := time.Now()
		tr.upstreams[0].circuit.HoldOpen(now.Add(time.Hour), now) // open throughout
		return tr
	}
	eight := requestAllocs(t, spread(8))
	if got := requestAllocs(t, spread(64)); got > eight {
		t.Errorf("LeastLatency at 64 upstreams: got %v allocations per request, want at most %v as at 8", got, eight)
	}
}

// embeddedPriority embeds Priority but orders the upstreams backward: a
// Router of the user's own, which gets every Candidate and its own Order.
type embeddedPriority struct{ Priority }

func (embeddedPriority) Order(dst []int, cands []Candidate) []int {
	for i := len(cands) - 1; i >= 0; i-- {
		dst = append(dst, cands[i].Index)
	}
	return dst
}

// TestRouterEmbeddedOwnOrder checks that a Router embedding one of this
// package's is asked its own Order, not the fast path of the one it embeds.
func TestRouterEmbeddedOwnOrder(t *testing.T) {
	n := newFakeNet()
	for _, h := range []string{"a.test", "b.test", "c.test"} {
		n.status(h, 200, h)
	}
	tr := newTestTransport(t, threeUpstreams(n, Config{Router: embeddedPriority{}}))
	get(t, tr, "http://a.test/")
	if a, c := n.count("a.test"), n.count("c.test"); a != 0 || c != 1 {
		t.Errorf("a got %d requests, c %d: want the embedding Router's order, c first", a, c)
	}
}

// TestRouterFirstAsOrder checks, on upstreams in random states (circuit
// open, cooling down, degraded, recovering), that the upstream each Router
// of this package sends a request to first is the one its Order puts
// first over the Candidates as they are, and that the others follow in
// Order's order when it fails: for Priority exactly, and for Score, whose
// ranking Recovering can change, when none is recovering.
func TestRouterFirstAsOrder(t *testing.T) {
	for _, r := range []Router{Priority{}, Score{}} {
		t.Run(fmt.Sprintf("%T", r), func(t *testing.T) {
			for seed := range 200 {
				synctest.Test(t, func(t *testing.T) { checkFirstAsOrder(t, r, uint64(seed)) })
			}
		})
	}
}

func checkFirstAsOrder(t *testing.T, r Router, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	const n = 6
	var tried []int
	cfg := Config{Router: r, Degraded: DegradedConfig{SuccessRate: 0.9, MinSamples: 1}, Breaker: BreakerConfig{FailureThreshold: 1}}
	cfg.Base = roundTripFunc(func(req *http.Request) (*http.Response, error) {
		i, _ := strconv.Atoi(strings.TrimPrefix(strings.TrimSuffix(req.URL.Host, ".test"), "u"))
		tried = append(tried, i)
		if req.Header.Get("X-Fail") != "" {
			return respond(503, "down"), nil
		}
		return respond(200, "ok"), nil
	})
	for i := range n {
		cfg.Upstreams = append(cfg.Upstreams, Upstream{BaseURL: fmt.Sprintf("http://u%d.test", i), Cost: Cost{Input: float64(rng.IntN(3))}})
	}
	tr := newTestTransport(t, cfg)
	now := time.Now()
	for _, u := range tr.upstreams {
		switch rng.IntN(4) {
		case 1: // failing: degraded (its circuit stays closed only in the window's view)
			u.window.add(Failed, time.Duration(rng.IntN(500))*time.Millisecond, mono.Of(now))
			u.window.add(Success, time.Duration(rng.IntN(500))*time.Millisecond, mono.Of(now))
		case 2: // cooling down
			u.cd.extend(now, time.Minute, CooldownRateLimited)
		case 3: // served, at some latency
			u.window.add(Success, time.Duration(1+rng.IntN(500))*time.Millisecond, mono.Of(now))
		}
	}
	cands := make([]Candidate, n)
	for i, u := range tr.upstreams {
		cands[i] = tr.candidate(i, u, "", now)
	}
	want := slices.DeleteFunc(r.Order(nil, cands), func(i int) bool { return cands[i].Unavailable != "" })
	req := httptestRequest("GET", "http://u0.test/", "")
	req.Header.Set("X-Fail", "1")
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	if !slices.Equal(tried, want) {
		t.Errorf("seed %d: tried %v, want %v (Order over %+v)", seed, tried, want, cands)
	}
}

// orderOnly hides its Router's type from the Transport, which then asks
// its Order with every Candidate, as it asks a Router of the user's own.
type orderOnly struct{ Router }

// orderFunc is a Router of the user's own that orders by a func.
type orderFunc func(dst []int, cands []Candidate) []int

func (f orderFunc) Order(dst []int, cands []Candidate) []int { return f(dst, cands) }

// TestRouterOwnBadOrder checks that a Router of the user's own that breaks
// Order's contract (an Index out of range or negative, one given twice,
// one left out, none at all) neither panics the request, nor sends it
// twice in a round to one upstream, nor leaves an upstream untried.
func TestRouterOwnBadOrder(t *testing.T) {
	for name, order := range map[string][]int{
		"out of range": {5, 1},
		"negative":     {-1, 0},
		"twice":        {0, 0, 0},
		"left out":     {0},
		"none":         {},
	} {
		t.Run(name, func(t *testing.T) {
			a := newUpstreamServer(t, 503, "a")
			b := newUpstreamServer(t, 200, "b")
			r := orderFunc(func(dst []int, _ []Candidate) []int { return append(dst, order...) })
			tr := newTestTransport(t, Config{Router: r, Upstreams: []Upstream{{BaseURL: a.URL}, {BaseURL: b.URL}}})
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Fatalf("RoundTrip panicked: %v", v)
					}
				}()
				if body := readBody(t, mustGet(t, tr, a.URL+"/v1/models")); body != "b" {
					t.Errorf("got %q, want b's answer", body)
				}
			}()
			if a.count() > 1 || b.count() != 1 {
				t.Errorf("a got %d requests, b %d: want at most 1 and 1", a.count(), b.count())
			}
		})
	}
	// A Router may return a slice of its own, kept between requests:
	// the Transport reads it, never writes it.
	kept := []int{1, 1, 7}
	a := newUpstreamServer(t, 503, "a")
	b := newUpstreamServer(t, 200, "b")
	r := orderFunc(func([]int, []Candidate) []int { return kept })
	tr := newTestTransport(t, Config{Router: r, Upstreams: []Upstream{{BaseURL: a.URL}, {BaseURL: b.URL}}})
	for range 3 {
		if body := readBody(t, mustGet(t, tr, a.URL+"/v1/models")); body != "b" {
			t.Errorf("got %q, want b's answer", body)
		}
	}
	if !slices.Equal(kept, []int{1, 1, 7}) {
		t.Errorf("the Router's own slice is now %v", kept)
	}
}

// A Router's own slice, which Order may return and keep (see Router), is
// never reused behind its back: handed to another Router as dst, another
// Transport's Router would write it, and this one's requests would go
// where that one's order says. Before the fix, 196-199 of 200 requests
// went to the wrong upstream first.
func TestRouterKeptOrderNotReused(t *testing.T) {
	kept := []int{1, 0} // b, then a
	keeps := orderFunc(func([]int, []Candidate) []int { return kept })
	appends := orderFunc(func(dst []int, cands []Candidate) []int {
		for i := range cands {
			dst = append(dst, cands[i].Index)
		}
		return dst
	})
	na, nb := newFakeNet(), newFakeNet()
	for _, n := range []*fakeNet{na, nb} {
		n.status("a.test", 200, "a")
		n.status("b.test", 200, "b")
	}
	ups := []Upstream{{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test"}}
	ta := newTestTransport(t, Config{Base: na, Router: keeps, Upstreams: ups})
	tb := newTestTransport(t, Config{Base: nb, Router: appends, Upstreams: ups})
	const n = 200
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the other Transport, at the same time (a data race under -race before the fix)
		defer wg.Done()
		for range n {
			readBody(t, mustGet(t, tb, "http://a.test/v1/models"))
		}
	}()
	for range n {
		readBody(t, mustGet(t, ta, "http://a.test/v1/models"))
		readBody(t, mustGet(t, tb, "http://a.test/v1/models"))
	}
	wg.Wait()
	if got := na.count("a.test"); got != 0 {
		t.Errorf("%d of %d requests went to a first, want none: the Router's order puts b first", got, n)
	}
	if !slices.Equal(kept, []int{1, 0}) {
		t.Errorf("the Router's own slice is now %v", kept)
	}
}
