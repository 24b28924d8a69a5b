package failover

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// In an outage at the only upstream, the retries in flight at once stay
// within the budget: 20 % of the requests in flight, and at least 3. The
// others end with the failure, as without the retry. The Base lives in the
// bubble: real connections' I/O does not block durably there.
func TestRetryBudget(t *testing.T) {
	for _, n := range []int{10, 50} {
		synctest.Test(t, func(t *testing.T) {
			var (
				mu                      sync.Mutex
				seen                    = map[string]int{}
				arrived, retrying, most int
			)
			all := make(chan struct{})
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				id := r.Header.Get("X-Id")
				mu.Lock()
				seen[id]++
				first := seen[id] == 1
				if first {
					if arrived++; arrived == n {
						close(all)
					}
				} else {
					retrying++
					most = max(most, retrying)
				}
				mu.Unlock()
				if first {
					<-all // every request is in flight before the first fails
				} else {
					time.Sleep(time.Second)
					mu.Lock()
					retrying--
					mu.Unlock()
				}
				return respond(500, "down"), nil
			})
			tr := newTestTransport(t, Config{Base: base, Breaker: BreakerConfig{FailureThreshold: 1000},
				Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					req := httptestRequest("GET", "http://a.test/v1/models", "")
					req.Header.Set("X-Id", strconv.Itoa(i))
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
				})
			}
			wg.Wait()
			if limit := max(3, n/5); most > limit {
				t.Errorf("%d requests: %d retries in flight at once, want at most %d", n, most, limit)
			}
			t.Logf("%d requests: at most %d retries at once", n, most)
			retries := metricValue(t, tr, `failover_retries_total{upstream="a"}`)
			denied := metricValue(t, tr, `failover_retries_denied_total`)
			if retries < 1 || retries+denied != float64(n) {
				t.Errorf("%d requests: %v retries and %v denied, want some retries and %d in all", n, retries, denied, n)
			}
			if b := &tr.retry.budget; b.active.Load() != 0 || b.retrying.Load() != 0 {
				t.Errorf("%d requests: the budget holds %d requests and %d retries after all ended", n, b.active.Load(), b.retrying.Load())
			}
		})
	}
}

// The rounds of Config.Retries take places in the budget too: without
// one, the request ends with what it got.
func TestRetryBudgetBoundsRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 500, "down")
		tr := newTestTransport(t, Config{Base: n, Retries: 2, Retry: RetryConfig{Off: true},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
		tr.retry.budget.retrying.Store(3) // the floor's places are taken
		code, err := get(t, tr, "http://a.test/")
		if err != nil || code != 500 {
			t.Fatalf("got %d, %v; want the 500", code, err)
		}
		if got := n.count("a.test"); got != 1 {
			t.Errorf("a got %d requests, want 1: no round without a place", got)
		}
		if got := metricValue(t, tr, `failover_retries_denied_total`); got != 1 {
			t.Errorf("failover_retries_denied_total = %v, want 1", got)
		}
	})
}

// New refuses a RetryConfig that can never work, naming the field.
func TestRetryConfigErrors(t *testing.T) {
	for field, rc := range map[string]RetryConfig{
		"Retry.MaxRetryAfter": {MaxRetryAfter: -time.Second},
		"Retry.BudgetRatio":   {BudgetRatio: 1.5},
		"Retry.BudgetMin":     {BudgetMin: -1},
	} {
		_, err := New(Config{Retry: rc, Upstreams: []Upstream{{BaseURL: "http://a.test"}}})
		var cerr *ConfigError
		if !errors.As(err, &cerr) || cerr.Field != field {
			t.Errorf("%+v: got %v, want a ConfigError naming %s", rc, err, field)
		}
	}
	for _, ratio := range []float64{-0.1, math.NaN()} {
		if _, err := New(Config{Retry: RetryConfig{BudgetRatio: ratio}, Upstreams: []Upstream{{BaseURL: "http://a.test"}}}); err == nil {
			t.Errorf("BudgetRatio %v: New took it", ratio)
		}
	}
}
