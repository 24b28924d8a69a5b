package integration_test

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/failover-go/failover"
)

// transportCollector is a prometheus.Collector of a Transport's metrics,
// for a program whose /metrics is a prometheus/client_golang registry: each
// Collect parses what WritePrometheus writes, help texts and types
// included, and sends every series as a const metric. It is unchecked
// (Describe sends nothing), as the series come and go with upstreams and
// failover pairs.
type transportCollector struct{ t *failover.Transport }

func (transportCollector) Describe(chan<- *prometheus.Desc) {}

func (c transportCollector) Collect(ch chan<- prometheus.Metric) {
	var b bytes.Buffer
	c.t.WritePrometheus(&b)
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(&b)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(prometheus.NewInvalidDesc(err), err)
		return
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var names, values []string
			for _, l := range m.GetLabel() {
				names, values = append(names, l.GetName()), append(values, l.GetValue())
			}
			desc := prometheus.NewDesc(mf.GetName(), mf.GetHelp(), names, nil)
			var pm prometheus.Metric
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				pm, err = prometheus.NewConstMetric(desc, prometheus.CounterValue, m.GetCounter().GetValue(), values...)
			case dto.MetricType_GAUGE:
				pm, err = prometheus.NewConstMetric(desc, prometheus.GaugeValue, m.GetGauge().GetValue(), values...)
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				buckets := map[float64]uint64{}
				for _, b := range h.GetBucket() {
					buckets[b.GetUpperBound()] = b.GetCumulativeCount()
				}
				pm, err = prometheus.NewConstHistogram(desc, h.GetSampleCount(), h.GetSampleSum(), buckets, values...)
			default: // series of Config.Metrics that are not the Transport's, written without a type
				pm, err = prometheus.NewConstMetric(desc, prometheus.UntypedValue, m.GetUntyped().GetValue(), values...)
			}
			if err != nil {
				pm = prometheus.NewInvalidMetric(desc, err)
			}
			ch <- pm
		}
	}
}

// A program whose /metrics is a prometheus/client_golang registry
// registers a Collector that parses the Transport's WritePrometheus
// (transportCollector above, to copy); the registry then serves the
// Transport's families beside its own, with their help texts and types.
func Example_clientGolang() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer upstream.Close()
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{Name: "openai", BaseURL: upstream.URL + "/v1"}}})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	resp, err := (&http.Client{Transport: t}).Post(upstream.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(transportCollector{t})
	// In a server: mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()
	scrape, err := http.Get(metrics.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer scrape.Body.Close()
	body, _ := io.ReadAll(scrape.Body)
	for line := range strings.Lines(string(body)) {
		if strings.Contains(line, "failover_attempts_total") && (strings.HasPrefix(line, "#") || strings.Contains(line, `outcome="success"`)) ||
			strings.Contains(line, "failover_attempt_duration_seconds_count") {
			fmt.Print(line)
		}
	}
	// Output:
	// failover_attempt_duration_seconds_count{upstream="openai"} 1
	// # HELP failover_attempts_total Attempts sent to the upstream, by outcome (success, rejected, auth_failed, rate_limited, failed, canceled, unservable); a request makes one attempt or more.
	// # TYPE failover_attempts_total counter
	// failover_attempts_total{outcome="success",upstream="openai"} 1
}
