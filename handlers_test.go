package failover

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// serve sends a request of method to h behind a loopback server and
// returns the response, its body read.
func serve(t *testing.T, h http.Handler, method string) (*http.Response, string) {
	t.Helper()
	s := httptest.NewServer(h)
	defer s.Close()
	req, err := http.NewRequest(method, s.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// samples parses a Prometheus text exposition into its series' values.
func samples(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("sample line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// failingTransport returns a Transport over two loopback upstreams, a
// answering 503 and b 200, after one request that failed over from a to
// b and opened a's circuit; with bothDown, b answers 503 too and both
// circuits are open.
func failingTransport(t *testing.T, bothDown bool) *Transport {
	t.Helper()
	a := newUpstreamServer(t, 503, "down")
	b := newUpstreamServer(t, 200, `{"ok":true}`)
	if bothDown {
		b = newUpstreamServer(t, 503, "down")
	}
	tr := newTestTransport(t, Config{
		Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Hour},
		Upstreams: []Upstream{
			{Name: "a", BaseURL: a.URL + "/v1"},
			{Name: "b", BaseURL: b.URL + "/v1"},
		},
	})
	resp := mustPost(t, tr, a.URL+"/v1/chat/completions", chatBody)
	resp.Body.Close()
	return tr
}

// The metrics handler serves WritePrometheus's text with the exposition's
// content type, to GET and HEAD only.
func TestMetricsHandler(t *testing.T) {
	tr := failingTransport(t, false)
	h := tr.MetricsHandler()
	resp, body := serve(t, h, "GET")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("GET: %d %q, want 200 text/plain; version=0.0.4; charset=utf-8", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	got := samples(t, body)
	for series, want := range map[string]float64{
		`failover_failovers_total{from="a",to="b"}`:               1,
		`failover_attempts_total{upstream="a",outcome="failed"}`:  1,
		`failover_attempts_total{upstream="b",outcome="success"}`: 1,
		`failover_breaker_state{upstream="a"}`:                    1,
	} {
		if v, ok := got[series]; !ok || v != want {
			t.Errorf("%s = %v (present: %v), want %v", series, v, ok, want)
		}
	}
	if resp, body := serve(t, h, "HEAD"); resp.StatusCode != 200 || body != "" {
		t.Errorf("HEAD: %d with %d bytes, want 200 without a body", resp.StatusCode, len(body))
	}
	for _, m := range []string{"POST", "DELETE"} {
		if resp, _ := serve(t, h, m); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: %d, Allow %q; want 405, Allow GET, HEAD", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
}

// The health handler serves Health as a JSON array: 200 while an upstream
// takes requests, 503 when none does, to GET and HEAD only.
func TestHealthHandler(t *testing.T) {
	for _, tt := range []struct {
		bothDown bool
		code     int
		avail    []bool
	}{
		{false, 200, []bool{false, true}},
		{true, 503, []bool{false, false}},
	} {
		tr := failingTransport(t, tt.bothDown)
		h := tr.HealthHandler()
		resp, body := serve(t, h, "GET")
		if resp.StatusCode != tt.code || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("both down %v: %d %q, want %d application/json", tt.bothDown, resp.StatusCode, resp.Header.Get("Content-Type"), tt.code)
		}
		var got []struct {
			Name      string `json:"name"`
			State     string `json:"state"`
			Available bool   `json:"available"`
			Trips     int    `json:"trips"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		if len(got) != 2 || got[0].Name != "a" || got[0].State != "open" || got[0].Trips != 1 || got[1].Name != "b" ||
			got[0].Available != tt.avail[0] || got[1].Available != tt.avail[1] {
			t.Errorf("both down %v: %+v, want a open (1 trip) and b, available %v", tt.bothDown, got, tt.avail)
		}
		if resp, body := serve(t, h, "HEAD"); resp.StatusCode != tt.code || body != "" {
			t.Errorf("HEAD: %d with %d bytes, want %d without a body", resp.StatusCode, len(body), tt.code)
		}
		if resp, _ := serve(t, h, "PUT"); resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("PUT: %d, want 405", resp.StatusCode)
		}
	}
}
