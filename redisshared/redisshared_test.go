package redisshared

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/failover-go/failover"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the tests that kill the server
	// check failures through errors and metrics instead.
	redis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func load(t *testing.T, s *Store, names ...string) map[failover.SharedKind]failover.SharedEvent {
	t.Helper()
	evs, err := s.Load(context.Background(), names)
	if err != nil {
		t.Fatal(err)
	}
	out := map[failover.SharedKind]failover.SharedEvent{}
	for _, e := range evs {
		out[e.Kind] = e
	}
	return out
}

func publish(t *testing.T, s *Store, e failover.SharedEvent) {
	t.Helper()
	if err := s.Publish(context.Background(), e); err != nil {
		t.Fatal(err)
	}
}

// Open and cooling state is stored with its time left, only ever grows,
// and Closed clears the open state and the probe lease.
func TestStoreState(t *testing.T) {
	srv := startRedis(t)
	s := New(srv.client(t), Options{})
	ctx := context.Background()

	if got := load(t, s, "a"); len(got) != 0 {
		t.Fatalf("empty store loads %v", got)
	}
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedOpen, For: 2 * time.Second, Member: "m1"})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedOpen, For: time.Second, Member: "m2"})
	got := load(t, s, "a", "b")
	if o, ok := got[failover.SharedOpen]; !ok || o.Upstream != "a" || o.For <= 1500*time.Millisecond || o.For > 2*time.Second {
		t.Fatalf("open state %+v; want a, open ~2s (a shorter Open does not shorten it)", got)
	}

	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedCooling, For: 3 * time.Second, Reason: failover.CooldownQuotaExhausted})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedCooling, For: time.Second})
	c, ok := load(t, s, "a")[failover.SharedCooling]
	if !ok || c.For <= 2500*time.Millisecond || c.Reason != failover.CooldownQuotaExhausted {
		t.Fatalf("cooling %+v; want ~3s, quota_exhausted", c)
	}

	for _, tt := range []struct {
		member string
		want   bool
	}{{"m1", true}, {"m2", false}, {"m1", true}} {
		got, err := s.AcquireProbe(ctx, "a", tt.member, time.Minute)
		if err != nil || got != tt.want {
			t.Fatalf("AcquireProbe(%s) = %v, %v; want %v", tt.member, got, err, tt.want)
		}
	}

	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedClosed, Member: "m1"})
	if _, ok := load(t, s, "a")[failover.SharedOpen]; ok {
		t.Fatal("open state survives Closed")
	}
	if got, err := s.AcquireProbe(ctx, "a", "m2", time.Minute); err != nil || !got {
		t.Fatalf("after Closed, another member cannot take the probe: %v %v", got, err)
	}

	// Keys expire with what they say.
	publish(t, s, failover.SharedEvent{Upstream: "b", Kind: failover.SharedOpen, For: 50 * time.Millisecond})
	time.Sleep(150 * time.Millisecond)
	if got := load(t, s, "b"); len(got) != 0 {
		t.Fatalf("expired state still loads: %v", got)
	}
}

// Prefixes keep services apart, and the schema version keeps a release
// from reading what another schema wrote.
func TestStoreIsolation(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.client(t)
	a, b := New(rdb, Options{Prefix: "svc-a"}), New(rdb, Options{Prefix: "svc-b"})
	publish(t, a, failover.SharedEvent{Upstream: "x", Kind: failover.SharedOpen, For: time.Minute})
	if got := load(t, b, "x"); len(got) != 0 {
		t.Fatalf("svc-b reads svc-a's state: %v", got)
	}
	if _, ok := load(t, a, "x")[failover.SharedOpen]; !ok {
		t.Fatal("svc-a lost its own state")
	}
	ctx := context.Background()
	if err := rdb.Set(ctx, "failover:v0:open:x", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got := load(t, New(rdb, Options{}), "x"); len(got) != 0 {
		t.Fatalf("a v0 key is read as state: %v", got)
	}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k != "svc-a:v1:open:x" && k != "failover:v0:open:x" {
			t.Errorf("unexpected key %q", k)
		}
	}
}

// Subscribe delivers every member's events, skips garbage, and returns
// when its context ends.
func TestStoreSubscribe(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.client(t)
	s := New(rdb, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan failover.SharedEvent, 10)
	done := make(chan error)
	go func() { done <- s.Subscribe(ctx, func(e failover.SharedEvent) { got <- e }) }()

	// Publish until the subscription is up (Subscribe has no ready
	// signal), then check what arrives.
	deadline := time.Now().Add(5 * time.Second)
	want := failover.SharedEvent{Upstream: "a", Kind: failover.SharedCooling, For: 1500 * time.Millisecond, Reason: failover.CooldownQuotaExhausted, Member: "m1"}
	var e failover.SharedEvent
wait:
	for {
		rdb.Publish(context.Background(), "failover:v1:events", `not json`)
		rdb.Publish(context.Background(), "failover:v1:events", `{"u":"a","k":"bogus","m":"m9"}`)
		publish(t, s, want)
		select {
		case e = <-got:
			break wait
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no event arrived")
		}
	}
	if e != want {
		t.Fatalf("delivered %+v, want %+v", e, want)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Subscribe did not return after its context ended")
	}
}

// Without a server, every call fails with an error, promptly.
func TestStoreUnreachable(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.client(t)
	srv.Kill()
	s := New(rdb, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := s.Publish(ctx, failover.SharedEvent{Upstream: "a", Kind: failover.SharedOpen, For: time.Second}); err == nil {
		t.Error("Publish succeeded")
	}
	if _, err := s.Load(ctx, []string{"a"}); err == nil {
		t.Error("Load succeeded")
	}
	if _, err := s.AcquireProbe(ctx, "a", "m", time.Second); err == nil {
		t.Error("AcquireProbe succeeded")
	}
	if err := s.Subscribe(ctx, func(failover.SharedEvent) {}); err == nil {
		t.Error("Subscribe succeeded")
	}
	if ctx.Err() != nil {
		t.Error("calls waited for the deadline instead of failing")
	}
}

// Closed leaves a record that the fleet closed the circuit, which Open
// clears; Reset also ends the cooldown; a failure's time and rate travel
// with it.
func TestStoreClosedResetAt(t *testing.T) {
	srv := startRedis(t)
	s := New(srv.client(t), Options{})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedOpen, For: time.Minute})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedClosed, For: 2 * time.Second})
	got := load(t, s, "a")
	if _, open := got[failover.SharedOpen]; open {
		t.Fatal("open after Closed")
	}
	if c, ok := got[failover.SharedClosed]; !ok || c.For <= time.Second || c.For > 2*time.Second {
		t.Fatalf("no record of the close: %v", got)
	}
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedOpen, For: time.Minute})
	if _, closed := load(t, s, "a")[failover.SharedClosed]; closed {
		t.Fatal("Open left the record of the close")
	}

	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedCooling, For: time.Minute})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedReset, For: time.Second})
	got = load(t, s, "a")
	if _, cool := got[failover.SharedCooling]; cool {
		t.Fatal("cooling after Reset")
	}
	if _, open := got[failover.SharedOpen]; open {
		t.Fatal("open after Reset")
	}

	at := time.UnixMicro(time.Now().UnixMicro())
	want := failover.SharedEvent{Upstream: "a", Kind: failover.SharedFailure, Rate: 12.5, At: at, Member: "m", Reason: failover.CooldownRateLimited}
	msg, _ := json.Marshal(message{Upstream: "a", Kind: "failure", Rate: 12.5, AtMicros: micros(at), Member: "m"})
	if e, ok := s.decode(string(msg)); !ok || !e.At.Equal(want.At) || e.Rate != want.Rate || e.Kind != want.Kind || e.Member != want.Member {
		t.Fatalf("decoded %+v, want %+v", e, want)
	}
}

// The member that holds the probe lease renews it: its TTL runs from the
// renewal, so no other member can take it while the holder thinks it has it.
func TestStoreLeaseRenewal(t *testing.T) {
	srv := startRedis(t)
	s := New(srv.client(t), Options{})
	ctx := context.Background()
	if ok, err := s.AcquireProbe(ctx, "a", "m1", 300*time.Millisecond); !ok || err != nil {
		t.Fatal(ok, err)
	}
	time.Sleep(200 * time.Millisecond)
	if ok, err := s.AcquireProbe(ctx, "a", "m1", 300*time.Millisecond); !ok || err != nil {
		t.Fatal("the holder lost its lease", ok, err)
	}
	time.Sleep(200 * time.Millisecond) // 400ms after the first take, 200ms after the renewal
	if ok, _ := s.AcquireProbe(ctx, "a", "m2", 300*time.Millisecond); ok {
		t.Fatal("another member took a renewed lease")
	}
}

// On a Redis Cluster (one node serving every slot) every call works: no
// command spans two slots.
func TestStoreCluster(t *testing.T) {
	srv := startRedis(t, "--cluster-enabled", "yes")
	ctx := context.Background()
	node := srv.client(t)
	if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := node.ClusterInfo(ctx).Result()
		if strings.Contains(info, "cluster_state:ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster did not come up: %s", info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}, MaxRetries: -1})
	defer rdb.Close()
	s := New(rdb, Options{})
	for _, e := range []failover.SharedEvent{
		{Upstream: "x", Kind: failover.SharedOpen, For: time.Minute},
		{Upstream: "x", Kind: failover.SharedCooling, For: time.Minute},
		{Upstream: "x", Kind: failover.SharedFailure, Rate: 1},
		{Upstream: "x", Kind: failover.SharedRate, Rate: 1, For: time.Minute, Member: "m"},
		{Upstream: "x", Kind: failover.SharedClosed, For: time.Minute},
		{Upstream: "x", Kind: failover.SharedReset, For: time.Minute},
	} {
		if err := s.Publish(ctx, e); err != nil {
			t.Fatalf("Publish(%v): %v", e.Kind, err)
		}
	}
	got := load(t, s, "x", "y")
	delete(got, failover.SharedRate)
	if _, ok := got[failover.SharedClosed]; !ok || len(got) != 1 {
		t.Fatalf("after Reset the store holds %v, want only the record of the close", got)
	}
	if ok, err := s.AcquireProbe(ctx, "x", "m", time.Second); !ok || err != nil {
		t.Fatal(ok, err)
	}
}

// Members' rates are stored in one hash per upstream, returned by Load
// until they expire (by the server's clock), and expired ones are dropped
// from the hash by the next writer.
func TestStoreRates(t *testing.T) {
	srv := startRedis(t)
	rdb := srv.client(t)
	s := New(rdb, Options{})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedRate, Rate: 25, For: 150 * time.Millisecond, Member: "m1"})
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedRate, Rate: 12.5, For: time.Minute, Member: "m2"})
	rates := func() map[string]float64 {
		evs, err := s.Load(context.Background(), []string{"a"})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, e := range evs {
			if e.Kind == failover.SharedRate {
				out[e.Member] = e.Rate
			}
		}
		return out
	}
	if got := rates(); got["m1"] != 25 || got["m2"] != 12.5 || len(got) != 2 {
		t.Fatalf("rates %v", got)
	}
	time.Sleep(200 * time.Millisecond)
	if got := rates(); len(got) != 1 || got["m2"] != 12.5 {
		t.Fatalf("after m1's expired: %v", got)
	}
	publish(t, s, failover.SharedEvent{Upstream: "a", Kind: failover.SharedRate, Rate: 30, For: time.Minute, Member: "m3"})
	fields, err := rdb.HKeys(context.Background(), "failover:v1:rates:a").Result()
	if err != nil || len(fields) != 2 {
		t.Fatalf("hash fields %v (%v); m1's expired rate should be gone", fields, err)
	}
}

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
