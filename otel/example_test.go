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
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

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

// A traced request that fails over: a span for the request, and under it
// one for each attempt, which says where it went and how it ended.
func ExampleNewTransport() {
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

	spans := tracetest.NewSpanRecorder() // in a program, a BatchSpanProcessor with an exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	client := &http.Client{Transport: failoverotel.NewTransport(t, failoverotel.WithTracerProvider(tp))}

	resp, err := client.Post(primary.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // the request span ends with the body

	for _, s := range spans.Ended() {
		kind := "attempt"
		if !s.Parent().IsValid() {
			kind = "request"
		}
		fmt.Print(s.Name(), " ", kind)
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "failover.upstream", "failover.outcome", "failover.attempts", "http.response.status_code", "http.request.resend_count":
				fmt.Printf(" %s=%s", kv.Key, kv.Value.Emit())
			}
		}
		fmt.Println()
	}
	// Output:
	// POST attempt failover.upstream=primary failover.outcome=failed http.response.status_code=503
	// POST attempt failover.upstream=backup http.request.resend_count=1 failover.outcome=success http.response.status_code=200
	// POST request failover.outcome=failed_over failover.attempts=2 failover.upstream=backup http.response.status_code=200
}
