package failoverotel_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/failover-go/failover"
	failoverotel "github.com/failover-go/failover/otel"
)

// The Transport's metrics reach an OpenTelemetry pipeline through a
// Reader's producer: here a ManualReader, in a program a PeriodicReader
// with an exporter.
func ExampleNewProducer() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer backup.Close()
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	resp, err := (&http.Client{Transport: t}).Post(primary.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()

	reader := metric.NewManualReader(metric.WithProducer(failoverotel.NewProducer(t)))
	mp := metric.NewMeterProvider(metric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[float64]); ok && m.Name == "failover_failovers_total" {
				dp := s.DataPoints[0]
				from, _ := dp.Attributes.Value("from")
				to, _ := dp.Attributes.Value("to")
				fmt.Printf("%s{from=%s,to=%s} %v: %s\n", m.Name, from.AsString(), to.AsString(), dp.Value, m.Description)
			}
		}
	}
	// Output: failover_failovers_total{from=primary,to=backup} 1: Attempts that moved on from one upstream to another; a pair's series appears at its first.
}
