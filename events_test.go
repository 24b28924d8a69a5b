package failover

import (
	"net/http"
	"reflect"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestOnStateChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var healthy atomic.Bool
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if healthy.Load() {
				return respond(200, "a"), nil
			}
			return respond(503, "down"), nil
		})
		n.status("b.test", 200, "b")
		var changes []StateChange
		var tr *Transport
		tr = newTestTransport(t, twoUpstreams(n, Config{
			Breaker: BreakerConfig{FailureThreshold: 2, Cooldown: 10 * time.Second},
			OnStateChange: func(c StateChange) {
				tr.Health() // called outside every lock: this must not deadlock
				changes = append(changes, c)
			},
		}))
		start := time.Now()
		get(t, tr, "http://a.test/")
		get(t, tr, "http://a.test/")
		if since := tr.Health()[0].StateSince; !since.Equal(start) {
			t.Fatalf("StateSince %v, want %v", since, start)
		}
		time.Sleep(10 * time.Second)
		healthy.Store(true)
		get(t, tr, "http://a.test/")
		tr.Reset("a") // already closed: no change
		want := []StateChange{
			{"a", Closed, Open, start},
			{"a", Open, HalfOpen, start.Add(10 * time.Second)},
			{"a", HalfOpen, Closed, start.Add(10 * time.Second)},
		}
		if !reflect.DeepEqual(changes, want) {
			t.Fatalf("changes:\n%v\nwant\n%v", changes, want)
		}
	})
}
