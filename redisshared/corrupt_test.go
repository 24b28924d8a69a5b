package redisshared

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/failover-go/failover"
	"github.com/redis/go-redis/v9"
)

// A duration past maxFor in a message is corrupt, however it is written:
// one whose milliseconds overflow time.Duration is refused, not read as
// whatever it wraps around to (18446747673710 ms wraps to about 1h).
func TestDecodeOverflow(t *testing.T) {
	s := &Store{} // decode uses no client
	for _, ms := range []string{"18446747673710", "9223372036855", "9223372036854775807"} {
		payload := `{"u":"a","k":"open","ms":` + ms + `,"m":"m9"}`
		if e, ok := s.decode(payload); ok {
			t.Errorf("decode(%s) = %+v, true; want it refused", payload, e)
		}
	}
}

// A rate whose expiry another process wrote far in the future is corrupt:
// Load drops it instead of returning a For that overflowed.
func TestLoadRateOverflow(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.client(t)
	s := New(rdb, Options{})
	ctx := context.Background()
	for member, until := range map[string]string{
		"wraps":  "18446747673710000",
		"years":  strconv.FormatInt(time.Now().Add(24*365*time.Hour).UnixMilli(), 10),
		"maxint": "9223372036854775807",
	} {
		if err := rdb.HSet(ctx, "failover:v1:rates:a", member, "5 "+until).Err(); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := s.Load(ctx, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.For <= 0 || e.For > maxFor {
			t.Errorf("Load returned %+v: For outside (0, %v]", e, maxFor)
		}
	}
}

// A member's open circuit or cooldown longer than maxFor (a Breaker
// Cooldown of 48h, a MaxCooldown of 36h for a daily quota) is shared for
// maxFor, not dropped by every reader as corrupt.
func TestPublishPastMaxFor(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.client(t)
	s := New(rdb, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ps := rdb.Subscribe(ctx, "failover:v1:events")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedOpen, For: 48 * time.Hour, Member: "m1"})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedCooling, For: 36 * time.Hour, Reason: failover.CooldownQuotaExhausted, Member: "m1"})
	for _, kind := range []failover.SharedKind{failover.SharedOpen, failover.SharedCooling} {
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if e, ok := s.decode(msg.Payload); !ok || e.Kind != kind || e.For != maxFor {
			t.Errorf("message %s decodes as %+v, %v; want %v for %v", msg.Payload, e, ok, kind, maxFor)
		}
	}
	got := load(t, New(rdb, Options{}), "a")
	for _, kind := range []failover.SharedKind{failover.SharedOpen, failover.SharedCooling} {
		if e, ok := got[kind]; !ok || e.For < maxFor-time.Minute || e.For > maxFor {
			t.Errorf("Load: %v %+v (%v); want it for about %v", kind, e, ok, maxFor)
		}
	}
}

// Garbage that another process left in the keys (a TTL of years, no TTL,
// a key of another type) neither wedges an upstream's state nor fails the
// reads of the others: the next write replaces it.
func TestGarbageKeys(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.client(t)
	s := New(rdb, Options{})
	ctx := context.Background()
	years := 5 * 365 * 24 * time.Hour
	for _, err := range []error{
		rdb.Set(ctx, "failover:v1:open:a", "x", years).Err(),
		rdb.Set(ctx, "failover:v1:cool:a", "x", years).Err(),
		rdb.Set(ctx, "failover:v1:probe:a", "ghost", 0).Err(), // no TTL
		rdb.HSet(ctx, "failover:v1:cool:b", "f", "v").Err(),   // a hash
		rdb.Set(ctx, "failover:v1:rates:b", "5 9", 0).Err(),   // a string
		rdb.LPush(ctx, "failover:v1:probe:b", "m2").Err(),     // a list
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The others' state still loads.
	publish(t, s, failover.SharedEvent{Upstream: "c", Kind: failover.SharedOpen, For: time.Minute})
	if _, ok := load(t, s, "a", "b", "c")[failover.SharedOpen]; !ok {
		t.Fatal("c's open circuit does not load beside the garbage")
	}
	for _, u := range []string{"a", "b"} {
		publish(t, s, failover.SharedEvent{Upstream: u, Kind: failover.SharedOpen, For: time.Minute})
		publish(t, s, failover.SharedEvent{Upstream: u, Kind: failover.SharedCooling, For: time.Minute, Reason: failover.CooldownQuotaExhausted})
		publish(t, s, failover.SharedEvent{Upstream: u, Kind: failover.SharedRate, Rate: 5, For: time.Minute, Member: "m1"})
		got := load(t, s, u)
		for _, kind := range []failover.SharedKind{failover.SharedOpen, failover.SharedCooling, failover.SharedRate} {
			if e, ok := got[kind]; !ok || e.For <= 50*time.Second || e.For > time.Minute {
				t.Errorf("%s: %v %+v (%v); want it for about a minute", u, kind, e, ok)
			}
		}
		if r := got[failover.SharedCooling].Reason; r != failover.CooldownQuotaExhausted {
			t.Errorf("%s: cooling reason %q", u, r)
		}
		if ok, err := s.AcquireProbe(ctx, u, "m1", time.Minute); !ok || err != nil {
			t.Errorf("%s: AcquireProbe = %v, %v; want the lease", u, ok, err)
		}
		if ok, err := s.AcquireProbe(ctx, u, "m2", time.Minute); ok || err != nil {
			t.Errorf("%s: m2 took m1's lease: %v, %v", u, ok, err)
		}
	}
}

// A member whose rates are good for less (a shorter SharedSync) does not
// cut the hash's life short: the others' rates stay until they expire.
func TestRateKeepsLongerMembers(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.client(t)
	s := New(rdb, Options{})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedRate, Rate: 2, For: time.Minute, Member: "slow"})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedRate, Rate: 50, For: 300 * time.Millisecond, Member: "fast"})
	left, err := rdb.PTTL(context.Background(), "failover:v1:rates:a").Result()
	if err != nil {
		t.Fatal(err)
	}
	if left < 50*time.Second {
		t.Fatalf("the rates hash expires in %v, taking the slow member's rate (good for 1m) with it", left)
	}
}

// New refuses a nil client, saying so, instead of returning a Store whose
// every call panics (which a Transport would count as an unreachable store,
// silently running unshared).
func TestNewNilClient(t *testing.T) {
	for _, rdb := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil)} {
		func() {
			defer func() {
				if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "nil client") {
					t.Errorf("New(%T(nil)) panicked with %v; want a panic that names the nil client", rdb, v)
				}
			}()
			New(rdb, Options{})
		}()
	}
}
