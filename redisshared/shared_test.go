package redisshared

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failover-go/failover"
	"github.com/redis/go-redis/v9"
)

// pair is a primary and a backup on loopback; the primary answers with
// whatever answer holds, and counts its requests.
type pair struct {
	primary, backup *httptest.Server
	answer          atomic.Value // func(http.ResponseWriter)
	hits            atomic.Int64
}

func newPair(t *testing.T) *pair {
	p := &pair{}
	p.answer.Store(func(w http.ResponseWriter) { io.WriteString(w, "primary") })
	p.primary = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		p.hits.Add(1)
		p.answer.Load().(func(http.ResponseWriter))(w)
	}))
	p.backup = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "backup")
	}))
	t.Cleanup(p.primary.Close)
	t.Cleanup(p.backup.Close)
	return p
}

const primaryKey, backupKey = "sk-primary-SECRET-1234", "sk-backup-SECRET-5678"

// member is one process's Transport on p, sharing through srv.
func (p *pair) member(t *testing.T, srv *redisServer) *failover.Transport {
	base := &http.Transport{}
	tr, err := failover.New(failover.Config{
		Base: base,
		Upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: p.primary.URL, Header: http.Header{"Authorization": {"Bearer " + primaryKey}}},
			{Name: "backup", BaseURL: p.backup.URL, Header: http.Header{"Authorization": {"Bearer " + backupKey}}},
		},
		Breaker:    failover.BreakerConfig{FailureThreshold: 2, Cooldown: time.Minute},
		Shared:     New(srv.client(t), Options{Prefix: "test"}),
		SharedSync: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tr.Close()
		base.CloseIdleConnections()
	})
	return tr
}

func send(t *testing.T, tr *failover.Transport, url string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitShared waits until every member's shared state answers.
func waitShared(t *testing.T, members ...*failover.Transport) {
	t.Helper()
	for _, m := range members {
		eventually(t, "shared state up", func() bool { return metric(m, "failover_shared_up") == 1 })
	}
	time.Sleep(100 * time.Millisecond) // the subscriptions follow the first call
}

// A 429 with Retry-After that one member meets cools the upstream down for
// the whole fleet: the others never send it a request until it ends.
func TestSharedCooldown(t *testing.T) {
	srv := startRedis(t)
	p := newPair(t)
	a, b := p.member(t, srv), p.member(t, srv)
	waitShared(t, a, b)
	p.answer.Store(func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	if got := send(t, a, p.primary.URL+"/x"); got != "backup" {
		t.Fatalf("a got %q", got)
	}
	eventually(t, "b learns the cooldown", func() bool { return b.Health()[0].Cooldown > 25*time.Second })
	before := p.hits.Load()
	for range 5 {
		if got := send(t, b, p.primary.URL+"/x"); got != "backup" {
			t.Fatalf("b got %q", got)
		}
	}
	if got := p.hits.Load() - before; got != 0 {
		t.Fatalf("the primary got %d requests from b during the fleet's cooldown", got)
	}
	if b.Health()[0].CooldownReason != failover.CooldownRateLimited {
		t.Errorf("reason %q", b.Health()[0].CooldownReason)
	}
}

// A circuit one member opens is open for all; a member that starts later
// adopts it from the store; an operator's Reset on one member closes it
// everywhere.
func TestSharedOpenAndReset(t *testing.T) {
	srv := startRedis(t)
	p := newPair(t)
	a, b := p.member(t, srv), p.member(t, srv)
	waitShared(t, a, b)
	p.answer.Store(func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	send(t, a, p.primary.URL+"/x")
	send(t, a, p.primary.URL+"/x")
	if a.Health()[0].State != "open" {
		t.Fatalf("a did not trip: %+v", a.Health()[0])
	}
	eventually(t, "b opens", func() bool { return b.Health()[0].State == "open" })
	if left := b.Health()[0].OpenFor; left < 50*time.Second {
		t.Errorf("b is open for %v, want the time a has left (about 1m)", left)
	}
	late := p.member(t, srv)
	eventually(t, "a member that starts later adopts the open circuit", func() bool { return late.Health()[0].State == "open" })

	p.answer.Store(func(w http.ResponseWriter) { io.WriteString(w, "primary") })
	if err := b.Reset("primary"); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*failover.Transport{a, late} {
		eventually(t, "Reset closes every member", func() bool { return m.Health()[0].State == "closed" })
	}
	if got := send(t, late, p.primary.URL+"/x"); got != "primary" {
		t.Fatalf("after Reset: %q", got)
	}
}

// Nothing secret reaches Redis: no key, header or URL in its keys, values
// or messages, only names and durations.
func TestSharedNothingSecret(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var messages []string
	ps := rdb.PSubscribe(ctx, "*")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for msg := range ps.Channel() {
			mu.Lock()
			messages = append(messages, msg.Channel+" "+msg.Payload)
			mu.Unlock()
		}
	})

	p := newPair(t)
	a, b := p.member(t, srv), p.member(t, srv)
	waitShared(t, a, b)
	p.answer.Store(func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	send(t, a, p.primary.URL+"/x?key="+primaryKey)
	p.answer.Store(func(w http.ResponseWriter) { w.WriteHeader(http.StatusBadGateway) })
	a.Reset("primary") // ends a's cooldown: a's next requests fail and trip it
	send(t, a, p.primary.URL+"/x")
	send(t, a, p.primary.URL+"/x")
	eventually(t, "events published", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(messages) >= 3
	})

	var all []string
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		// "rates" is a hash, stored once a period has run since a's
		// second request: whether it exists yet is a matter of timing.
		var v string
		if typ, _ := rdb.Type(ctx, k).Result(); typ == "hash" {
			h, err := rdb.HGetAll(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			v = fmt.Sprint(h)
		} else if v, err = rdb.Get(ctx, k).Result(); err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		all = append(all, k+" "+v)
	}
	ps.Close()
	wg.Wait()
	all = append(all, messages...)
	host := strings.TrimPrefix(p.primary.URL, "http://")
	for _, s := range all {
		for _, secret := range []string{"SECRET", "Bearer", host} {
			if strings.Contains(s, secret) {
				t.Errorf("Redis holds %q", s)
			}
		}
	}
	t.Logf("what Redis saw: %q", all)
}
