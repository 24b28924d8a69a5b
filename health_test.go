package failover

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestHealthJSONAndMetrics(t *testing.T) {
	const key = "sk-upstream-secret-abcdef"
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 200, "ok")
	tr := newTestTransport(t, Config{Base: n, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test/v1", Header: http.Header{"Authorization": {"Bearer " + key}}},
		{Name: "b", BaseURL: "http://b.test/v1"},
	}})
	for range 6 {
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	h := tr.Health()
	if h[0].State != "open" || h[0].Trips != 1 || h[0].Requests.Failed != 5 || h[0].SuccessRate != 0 || h[0].OpenFor <= 0 {
		t.Fatalf("a: %+v", h[0])
	}
	if h[1].Requests.Success != 6 || h[1].Window != 6 || h[1].P99 < h[1].P50 {
		t.Fatalf("b: %+v", h[1])
	}
	js, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var decoded []map[string]any
	if err := json.Unmarshal(js, &decoded); err != nil {
		t.Fatal(err)
	}
	if decoded[0]["state"] != "open" || decoded[0]["last_error"] != "HTTP 503 Service Unavailable" {
		t.Fatalf("health JSON: %s", js)
	}

	var m bytes.Buffer
	tr.WritePrometheus(&m)
	out := m.String()
	for _, want := range []string{
		`failover_attempts_total{upstream="a",outcome="failed"} 5`,
		`failover_attempts_total{upstream="b",outcome="success"} 6`,
		`failover_breaker_state{upstream="a"} 1`,
		`failover_breaker_state{upstream="b"} 0`,
		`failover_breaker_trips_total{upstream="a"} 1`,
		`failover_failovers_total{from="a",to="b"} 5`,
		`failover_skipped_total{upstream="a",reason="circuit_open"} 1`,
		`failover_attempt_duration_seconds_count{upstream="b"} 6`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(out+string(js), key) {
		t.Error("a key appears in metrics or health")
	}
}
