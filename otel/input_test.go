package failoverotel_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/failover-go/failover"
	failoverotel "github.com/failover-go/failover/otel"
)

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
