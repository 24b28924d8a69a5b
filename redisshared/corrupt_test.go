package redisshared

import (
	"context"
	"strconv"
	"testing"
	"time"
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
