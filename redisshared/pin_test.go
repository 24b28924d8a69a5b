package redisshared

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failover-go/failover"
)

// A response created through one member of a fleet is continued, through
// another member, only at the upstream that created it: the pin travels
// through Redis.
func TestPinAcrossFleet(t *testing.T) {
	srv := startRedis(t)
	var aDown atomic.Bool
	var aGot atomic.Int32
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		aGot.Add(1)
		if aDown.Load() {
			w.WriteHeader(503)
			return
		}
		io.WriteString(w, `{"id":"resp_a1","object":"response"}`)
	}))
	defer a.Close()
	var bDown atomic.Bool
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bDown.Load() {
			w.WriteHeader(503)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"resp_b1","object":"response"}`)
	}))
	defer b.Close()
	member := func() *failover.Transport {
		tr, err := failover.New(failover.Config{
			Shared:     New(srv.client(t), Options{Prefix: t.Name()}),
			SharedSync: 50 * time.Millisecond,
			Upstreams:  []failover.Upstream{{Name: "a", BaseURL: a.URL + "/v1"}, {Name: "b", BaseURL: b.URL + "/v1"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	one, two := member(), member()
	waitSharing(t, srv, []*failover.Transport{one, two})

	post := func(tr *failover.Transport, body string) (int, string) {
		req, _ := http.NewRequest("POST", a.URL+"/v1/responses", strings.NewReader(body))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(got)
	}
	aDown.Store(true)
	if code, got := post(one, `{"model":"m","input":"x"}`); code != 200 || !strings.Contains(got, "resp_b1") {
		t.Fatalf("create with a down: %d %s", code, got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for metric(two, "failover_pins_learned_total") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the other member did not learn the pin within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	aDown.Store(false)
	bDown.Store(true)
	before := aGot.Load()
	code, got := post(two, `{"model":"m","previous_response_id":"resp_b1","input":"y"}`)
	if code != 503 || aGot.Load() != before {
		t.Errorf("continued through the other member with b down: %d %s, a got %d: want b's 503 alone", code, got, aGot.Load()-before)
	}
}
