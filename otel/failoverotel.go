// Package failoverotel exposes the metrics of a [failover.Transport] to an
// OpenTelemetry MeterProvider. [NewProducer] returns a metric.Producer, which
// a Reader of the SDK's MeterProvider collects beside the instruments of the
// program's own Meters:
//
//	reader := metric.NewPeriodicReader(exporter, metric.WithProducer(failoverotel.NewProducer(t)))
//	mp := metric.NewMeterProvider(metric.WithReader(reader))
//
// Each collection parses what [failover.Transport.WritePrometheus] writes
// and converts it with go.opentelemetry.io/contrib/bridges/prometheus: each
// counter becomes a monotonic cumulative Sum, each gauge a Gauge, the
// attempt duration histogram a Histogram with its bucket bounds. Names are
// the Prometheus ones (failover_attempts_total, ...), descriptions their
// help texts, attributes their labels; the instrumentation scope is the
// bridge's. Series of Config.Metrics that are not the Transport's come as
// Gauges.
//
// It is a module of its own (github.com/failover-go/failover/otel), so
// that OpenTelemetry and the Prometheus client are dependencies of the
// programs that import it, never of those that import the root package.
package failoverotel

import (
	"bytes"
	"cmp"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	otelprom "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel/sdk/metric"

	"github.com/failover-go/failover"
)

// NewProducer returns a metric.Producer of t's metrics, for
// metric.WithProducer on a Reader. It is safe for concurrent use, as
// WritePrometheus is. It panics if t is nil, as each collection would, on
// the Reader's goroutine.
func NewProducer(t *failover.Transport) metric.Producer {
	if t == nil {
		panic("failoverotel: NewProducer called with a nil Transport")
	}
	return otelprom.NewMetricProducer(otelprom.WithGatherer(gatherer{t}))
}

// gatherer is a prometheus.Gatherer of a Transport's metrics: it parses
// what WritePrometheus writes.
type gatherer struct{ t *failover.Transport }

func (g gatherer) Gather() ([]*dto.MetricFamily, error) {
	var b bytes.Buffer
	g.t.WritePrometheus(&b)
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(&b)
	out := make([]*dto.MetricFamily, 0, len(mfs))
	for _, mf := range mfs {
		out = append(out, mf)
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return out, err
}
