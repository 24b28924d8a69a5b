// Package failoverotel brings a [failover.Transport] to OpenTelemetry: its
// requests and their attempts as spans, its metrics to a MeterProvider.
//
// [NewTransport] wraps the Transport as otelhttp.NewTransport wraps a
// plain one, with a span for each request and a child span for each
// attempt, which name the upstream and how it answered:
//
//	client := &http.Client{Transport: failoverotel.NewTransport(t)}
//
// [NewProducer] returns a metric.Producer, which a Reader of the SDK's
// MeterProvider collects beside the instruments of the program's own
// Meters:
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
// Gauges, but for those whose metric or label names the Prometheus text
// format does not allow (VictoriaMetrics takes dots, and colons in label
// names): they are left out, and each collection tells otel.Handle how
// many.
//
// It is a module of its own (github.com/failover-go/failover/otel), so
// that OpenTelemetry and the Prometheus client are dependencies of the
// programs that import it, never of those that import the root package.
package failoverotel

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	otelprom "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel"
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
	text, dropped, first := parseable(b.Bytes())
	if dropped > 0 {
		otel.Handle(fmt.Errorf("failoverotel: %d series left out, whose names the Prometheus text format does not allow, the first %q", dropped, first))
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(text))
	out := make([]*dto.MetricFamily, 0, len(mfs))
	for _, mf := range mfs {
		out = append(out, mf)
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return out, err
}

// parseable returns the exposition text without the lines whose metric or
// label names the Prometheus text format does not allow, how many sample
// lines it left out and the metric name of the first (only the name: a
// label's value is the program's to show). VictoriaMetrics takes dots in
// both, and colons in label names, in the series of Config.Metrics; the
// text parser stops with an error at the first such line, and the bridge
// then drops every metric of the collection, the Transport's included.
func parseable(text []byte) (out []byte, dropped int, first string) {
	out = text[:0:0]
	for line := range bytes.Lines(text) {
		if !validLine(bytes.TrimSuffix(line, []byte("\n"))) {
			if line[0] != '#' {
				if dropped == 0 {
					first = string(line[:max(0, bytes.IndexAny(line, "{ \n"))])
				}
				dropped++
			}
			continue
		}
		out = append(out, line...)
	}
	if dropped == 0 {
		return text, 0, ""
	}
	return out, dropped, first
}

// validLine reports whether the names in line, a line of an exposition
// that VictoriaMetrics validated, are Prometheus names.
func validLine(line []byte) bool {
	if rest, ok := bytes.CutPrefix(line, []byte("#")); ok {
		f := bytes.Fields(rest)
		if len(f) < 2 || string(f[0]) != "HELP" && string(f[0]) != "TYPE" {
			return true // a comment
		}
		return model.IsValidLegacyMetricName(string(f[1]))
	}
	end := bytes.IndexAny(line, "{ ")
	if end < 0 {
		return len(line) == 0
	}
	if !model.IsValidLegacyMetricName(string(line[:end])) {
		return false
	}
	if line[end] != '{' {
		return true
	}
	// name{label="value",...} value: each label's name is checked, its
	// value skipped up to its unescaped closing quote.
	rest := line[end+1:]
	for {
		rest = bytes.TrimLeft(rest, " ")
		if len(rest) > 0 && rest[0] == '}' {
			return true
		}
		eq := bytes.IndexByte(rest, '=')
		if eq < 0 || !model.LabelName(bytes.TrimSpace(rest[:eq])).IsValidLegacy() {
			return false
		}
		rest = rest[eq+1:]
		if len(rest) == 0 || rest[0] != '"' {
			return false
		}
		i := 1
		for i < len(rest) && rest[i] != '"' {
			if rest[i] == '\\' {
				i++
			}
			i++
		}
		if i >= len(rest) {
			return false
		}
		rest = bytes.TrimLeft(rest[i+1:], " ")
		switch {
		case len(rest) > 0 && rest[0] == ',':
			rest = rest[1:]
		case len(rest) > 0 && rest[0] == '}':
			return true
		default:
			return false
		}
	}
}
