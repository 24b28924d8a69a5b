package failover

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

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

func TestWeightedRouter(t *testing.T) {
	n := newFakeNet()
	for _, h := range []string{"a.test", "b.test", "c.test"} {
		n.status(h, 200, h)
	}
	tr := newTestTransport(t, threeUpstreams(n, Config{Router: &Weighted{}}, 6, 3, 1))
	for range 1000 {
		get(t, tr, "http://a.test/")
	}
	for h, want := range map[string]int{"a.test": 600, "b.test": 300, "c.test": 100} {
		if got := n.count(h); got != want {
			t.Errorf("%s got %d of 1000, want %d (smooth weighted round robin is exact)", h, got, want)
		}
	}
}

// Weighted skips a cooling upstream like the default order does, and its
// share goes to the others.
func TestWeightedSkipsCooling(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 429, "busy", "Retry-After", "60")
	n.status("b.test", 200, "b")
	n.status("c.test", 200, "c")
	tr := newTestTransport(t, threeUpstreams(n, Config{Router: &Weighted{}}, 1, 1, 1))
	for range 300 {
		if code, err := get(t, tr, "http://a.test/"); err != nil || code != 200 {
			t.Fatalf("%d %v", code, err)
		}
	}
	if a := n.count("a.test"); a != 1 {
		t.Fatalf("a got %d requests, want the one 429", a)
	}
	if b, c := n.count("b.test"), n.count("c.test"); b < 140 || c < 140 {
		t.Fatalf("b %d, c %d: the cooling upstream's share is not split", b, c)
	}
}

// LeastLatency sends less traffic to a slow upstream without cutting it off.
func TestLeastLatencyRouter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			time.Sleep(250 * time.Millisecond)
			return respond(200, "a"), nil
		})
		for _, h := range []string{"b.test", "c.test"} {
			n.handle(h, func(*http.Request) (*http.Response, error) {
				time.Sleep(50 * time.Millisecond)
				return respond(200, "b"), nil
			})
		}
		tr := newTestTransport(t, threeUpstreams(n, Config{Router: LeastLatency{}}))
		for range 600 {
			get(t, tr, "http://a.test/")
		}
		a, b, c := n.count("a.test"), n.count("b.test"), n.count("c.test")
		if a > 100 || a == 0 || b < 200 || c < 200 {
			t.Fatalf("a (5x slower) got %d, b %d, c %d; want a little traffic on a, most on b and c", a, b, c)
		}
	})
}

// Score prefers the cheaper of two equally fast and healthy upstreams.
func TestScoreRouter(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", 200, "a")
	n.status("b.test", 200, "b")
	cfg := twoUpstreams(n, Config{Router: Score{}})
	cfg.Upstreams[0].Cost = Cost{Input: 10, Output: 30}
	cfg.Upstreams[1].Cost = Cost{Input: 1, Output: 3}
	tr := newTestTransport(t, cfg)
	for range 50 {
		get(t, tr, "http://a.test/")
	}
	if a, b := n.count("a.test"), n.count("b.test"); b < 45 {
		t.Fatalf("expensive a got %d, cheap b %d", a, b)
	}
}

func TestRouterConfigErrors(t *testing.T) {
	for _, u := range []Upstream{
		{BaseURL: "http://a.test", Weight: -1},
		{BaseURL: "http://a.test", Cost: Cost{Input: -1}},
	} {
		if _, err := New(Config{Upstreams: []Upstream{u}}); err == nil {
			t.Errorf("New accepted %+v", u)
		}
	}
}
