package failoverotel_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/failover-go/failover"
	failoverotel "github.com/failover-go/failover/otel"
)

// newTransport returns a Transport over a primary that answers 503 and a
// backup that answers 200, after one request that failed over.
func newTransport(t *testing.T) *failover.Transport {
	t.Helper()
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[]}`)
	}))
	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tr.Close()
		primary.Close()
		backup.Close()
	})
	resp, err := (&http.Client{Transport: tr}).Post(primary.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return tr
}

// collect reads what a ManualReader with the Transport's producer
// collects, beside a counter of the program's own, and returns the
// Transport's metrics by name.
func collect(t *testing.T, tr *failover.Transport) map[string]metricdata.Metrics {
	t.Helper()
	reader := metric.NewManualReader(metric.WithProducer(failoverotel.NewProducer(tr)))
	mp := metric.NewMeterProvider(metric.WithReader(reader))
	defer mp.Shutdown(t.Context())
	jobs, err := mp.Meter("app").Int64Counter("jobs")
	if err != nil {
		t.Fatal(err)
	}
	jobs.Add(t.Context(), 3)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]metricdata.Metrics{}
	var own bool
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch {
			case sm.Scope.Name == "app" && m.Name == "jobs":
				own = true
			case strings.HasPrefix(m.Name, "failover_"):
				got[m.Name] = m
			default:
				t.Errorf("scope %s: metric %s", sm.Scope.Name, m.Name)
			}
		}
	}
	if !own {
		t.Error("the program's own counter was not collected")
	}
	return got
}

// TestProducer checks what an OpenTelemetry reader gets: every family of
// the exposition with its help text as description, counters as
// monotonic cumulative Sums with their labels as attributes, gauges as
// Gauges, the attempt duration as a Histogram with its bounds.
func TestProducer(t *testing.T) {
	tr := newTransport(t)
	got := collect(t, tr)

	var b bytes.Buffer
	tr.WritePrometheus(&b)
	families := 0
	for line := range strings.Lines(b.String()) {
		rest, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "# HELP ")
		if !ok {
			continue
		}
		families++
		name, help, _ := strings.Cut(rest, " ")
		if m, ok := got[name]; !ok || m.Description != help {
			t.Errorf("%s: collected %v, description %q; want %q", name, ok, m.Description, help)
		}
	}
	if len(got) != families || families < 17 {
		t.Errorf("%d metrics collected, want the exposition's %d families", len(got), families)
	}

	sum := func(name string, attrs ...attribute.KeyValue) float64 {
		t.Helper()
		s, ok := got[name].Data.(metricdata.Sum[float64])
		if !ok || !s.IsMonotonic || s.Temporality != metricdata.CumulativeTemporality {
			t.Fatalf("%s: %T %+v, want a monotonic cumulative Sum", name, got[name].Data, s)
		}
		want := attribute.NewSet(attrs...)
		for _, dp := range s.DataPoints {
			if dp.Attributes.Equals(&want) {
				return dp.Value
			}
		}
		return -1
	}
	up := func(name string) attribute.KeyValue { return attribute.String("upstream", name) }
	for _, tt := range []struct {
		name  string
		attrs []attribute.KeyValue
		want  float64
	}{
		{"failover_attempts_total", []attribute.KeyValue{up("primary"), attribute.String("outcome", "failed")}, 1},
		{"failover_attempts_total", []attribute.KeyValue{up("backup"), attribute.String("outcome", "success")}, 1},
		{"failover_failovers_total", []attribute.KeyValue{attribute.String("from", "primary"), attribute.String("to", "backup")}, 1},
		{"failover_unrouted_requests_total", nil, 0},
	} {
		if v := sum(tt.name, tt.attrs...); v != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.name, tt.attrs, v, tt.want)
		}
	}
	if g, ok := got["failover_breaker_state"].Data.(metricdata.Gauge[float64]); !ok || len(g.DataPoints) != 2 {
		t.Errorf("failover_breaker_state: %T %+v, want a Gauge of 2 upstreams", got["failover_breaker_state"].Data, g)
	}
	h, ok := got["failover_attempt_duration_seconds"].Data.(metricdata.Histogram[float64])
	if !ok || len(h.DataPoints) != 2 {
		t.Fatalf("failover_attempt_duration_seconds: %T %+v, want a Histogram of 2 upstreams", got["failover_attempt_duration_seconds"].Data, h)
	}
	for _, dp := range h.DataPoints {
		if dp.Count != 1 || len(dp.Bounds) != 14 || len(dp.BucketCounts) != 15 || dp.Bounds[0] != 0.005 || dp.Bounds[13] != 120 {
			t.Errorf("failover_attempt_duration_seconds%v: count %d, bounds %v, buckets %v; want 1 attempt, 14 bounds from 0.005 to 120", dp.Attributes.ToSlice(), dp.Count, dp.Bounds, dp.BucketCounts)
		}
	}
}

// NewProducer refuses a nil Transport at once, saying so: the producer it
// returned panicked in every collection, on the Reader's goroutine, which
// for a PeriodicReader ends the program.
func TestNewProducerNil(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "nil Transport") {
			t.Fatalf("NewProducer(nil) panicked with %v; want a panic that names the nil Transport", v)
		}
	}()
	failoverotel.NewProducer(nil)
}

// A series of Config.Metrics whose name the Prometheus text grammar
// refuses (VictoriaMetrics takes dots in names and label names, and colons
// in label names) is left out, and only it: the text parser stopped at it,
// Gather returned its error, and the bridge then dropped every metric of
// the collection, the Transport's included.
func TestProducerUnparseableSeries(t *testing.T) {
	set := metrics.NewSet()
	set.NewCounter(`app.jobs_total{kind="x"}`).Inc()
	set.NewCounter(`app_runs_total{job.kind="x"}`).Inc()
	set.NewCounter(`app_tries_total{job:kind="x"}`).Inc()
	set.NewCounter(`app_ok_total{kind="a \"quoted\" {value}, with a.dot"}`).Add(2)
	set.NewCounter(`zz_jobs_total`).Inc()
	tr, err := failover.New(failover.Config{Metrics: set, Upstreams: []failover.Upstream{{Name: "p", BaseURL: "http://127.0.0.1:1/v1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	reader := metric.NewManualReader(metric.WithProducer(failoverotel.NewProducer(tr)))
	mp := metric.NewMeterProvider(metric.WithReader(reader))
	defer mp.Shutdown(t.Context())
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	own := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			own[m.Name] = true
		}
	}
	for name, want := range map[string]bool{"failover_attempts_total": true, "failover_unrouted_requests_total": true, "failover_breaker_state": true, "app_ok_total": true, "zz_jobs_total": true, "app.jobs_total": false, "app_runs_total": false, "app_tries_total": false} {
		if own[name] != want {
			t.Errorf("%s collected: %v, want %v", name, own[name], want)
		}
	}
}
