package integration_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/failover-go/failover"
)

// These tests read the Transport's exposition as a Prometheus server
// does, with expfmt's TextParser, and lint it as promtool check metrics
// does, with promlint: every family needs its # HELP and # TYPE, and its
// name must follow Prometheus's conventions.

// parseAndLint parses an exposition in the Prometheus text format and
// lints it, failing t on any problem, and returns its families by name.
func parseAndLint(t *testing.T, exposition []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(exposition))
	if err != nil {
		t.Fatalf("expfmt: %v\n%s", err, exposition)
	}
	var all []*dto.MetricFamily
	for _, mf := range mfs {
		all = append(all, mf)
		if mf.GetHelp() == "" || mf.GetType() == dto.MetricType_UNTYPED {
			t.Errorf("%s: help %q, type %s", mf.GetName(), mf.GetHelp(), mf.GetType())
		}
	}
	problems, err := promlint.NewWithMetricFamilies(all).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	return mfs
}

// readmeFamily is a row of docs/observability.md's list of metrics.
type readmeFamily struct {
	name, typ string
	labels    []string
}

// readmeFamilies returns docs/observability.md's list of metrics, which the root
// package's TestDocsMetrics keeps equal to the families the Transport
// registers.
func readmeFamilies(t *testing.T) []readmeFamily {
	t.Helper()
	readme, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(failover_\\w+)(?:\\{([\\w,]*)\\})?` \\| (\\w+) \\|")
	var out []readmeFamily
	for _, m := range row.FindAllSubmatch(readme, -1) {
		f := readmeFamily{name: string(m[1]), typ: string(m[3])}
		if len(m[2]) > 0 {
			f.labels = strings.Split(string(m[2]), ",")
		}
		out = append(out, f)
	}
	if len(out) < 20 {
		t.Fatalf("docs/observability.md lists %d metrics; its list is gone or its format changed", len(out))
	}
	return out
}

// localShared is a Shared for one process: it tells each event it is
// published to its subscribers, stores nothing and grants every probe
// lease.
type localShared struct {
	mu   sync.Mutex
	subs map[int]func(failover.SharedEvent)
	next int
}

func (s *localShared) Publish(ctx context.Context, e failover.SharedEvent) error {
	s.mu.Lock()
	subs := make([]func(failover.SharedEvent), 0, len(s.subs))
	for _, d := range s.subs {
		subs = append(subs, d)
	}
	s.mu.Unlock()
	for _, deliver := range subs {
		deliver(e)
	}
	return nil
}

func (s *localShared) Load(ctx context.Context, upstreams []string) ([]failover.SharedEvent, error) {
	return nil, nil
}

func (s *localShared) Subscribe(ctx context.Context, deliver func(failover.SharedEvent)) error {
	s.mu.Lock()
	if s.subs == nil {
		s.subs = map[int]func(failover.SharedEvent){}
	}
	id := s.next
	s.next++
	s.subs[id] = deliver
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	delete(s.subs, id)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *localShared) AcquireProbe(ctx context.Context, upstream, member string, ttl time.Duration) (bool, error) {
	return true, nil
}

// scripted is an upstream whose answer to a chat request the test sets
// as it goes (answer); it answers probes (GET /v1/models) with a 401,
// which counts in failover_probes_total and leaves its circuit alone,
// and closes probed at the first.
type scripted struct {
	*httptest.Server
	answer atomic.Pointer[http.HandlerFunc]
	probed chan struct{}
	once   sync.Once
}

func newScripted(t *testing.T) *scripted {
	t.Helper()
	s := &scripted{probed: make(chan struct{})}
	s.set(status(http.StatusOK))
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
			s.once.Do(func() { close(s.probed) })
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		(*s.answer.Load())(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *scripted) set(h http.HandlerFunc) { s.answer.Store(&h) }

// status answers code, with header pairs kv.
func status(code int, kv ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, `{"id":"chatcmpl-test","object":"chat.completion","model":"gpt-test","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}`)
	}
}

// hang answers nothing until the client gives up.
func hang(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }

// driven returns a Transport with Hedge, Probe, Shared and priced
// upstreams (usage metering) that has been through a hedge, failovers,
// circuits that open, a cooldown, the last resort, probes, answers that
// report their usage and a stream that does not.
func driven(t *testing.T) *failover.Transport {
	t.Helper()
	a, b, c := newScripted(t), newScripted(t), newScripted(t)
	tr, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{
			{Name: "a", BaseURL: a.URL + "/v1", Cost: failover.Cost{Input: 2.5, Output: 10}},
			{Name: "b", BaseURL: b.URL + "/v1", Cost: failover.Cost{Input: 0.3, Output: 2.5}},
			{Name: "c", BaseURL: c.URL + "/v1"},
		},
		Breaker: failover.BreakerConfig{FailureThreshold: 2, Cooldown: time.Hour},
		Hedge:   &failover.HedgeConfig{Delay: 50 * time.Millisecond},
		Probe:   failover.ProbeConfig{Interval: 100 * time.Millisecond},
		Shared:  &localShared{},
		// On for its family: the exposition lists every family.
		Continue: failover.ContinueConfig{On: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	client := &http.Client{Transport: tr}
	ctx := testContext(t)
	send := func() int {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-test","messages":[]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// until sends requests until the named upstream's circuit is open.
	until := func(name string) {
		t.Helper()
		for range 20 {
			send()
			for _, h := range tr.Health() {
				if h.Name == name && h.State == "open" {
					return
				}
			}
		}
		t.Fatalf("%s's circuit did not open in 20 requests", name)
	}

	// a streams: the first byte its caller reads is timed, and the
	// stream reports no usage.
	a.set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	})
	if code := send(); code != http.StatusOK {
		t.Fatalf("stream: %d", code)
	}
	// a hangs: the hedge to b answers.
	a.set(hang)
	if code := send(); code != http.StatusOK {
		t.Fatalf("hedged request: %d", code)
	}
	// a fails: the requests fail over to b until a's circuit opens.
	a.set(status(http.StatusServiceUnavailable))
	until("a")
	// b rate-limits: it cools down, and the request fails over to c.
	b.set(status(http.StatusTooManyRequests, "Retry-After", "60"))
	send()
	// c fails until its circuit opens: then every upstream refuses, and
	// the last resort goes to a, the first to open.
	c.set(status(http.StatusServiceUnavailable))
	until("c")
	a.set(status(http.StatusOK))
	if code := send(); code != http.StatusOK {
		t.Fatalf("last resort: %d", code)
	}
	for _, s := range []*scripted{a, b, c} {
		select {
		case <-s.probed:
		case <-ctx.Done():
			t.Fatal("an upstream was never probed")
		}
	}
	// The upstream's server has seen a probe; its verdict is counted when
	// the prober has read the answer, a moment later.
	for _, name := range []string{"a", "b", "c"} {
		series := `failover_probes_total{upstream="` + name + `",outcome="auth_failed"} `
		for !probeCounted(tr, series) {
			select {
			case <-ctx.Done():
				t.Fatalf("%s's probe was never counted", name)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}

	return tr
}

// probeCounted reports whether tr's exposition has series (a sample
// line's name and labels, and a space) at a value other than 0.
func probeCounted(tr *failover.Transport, series string) bool {
	var b strings.Builder
	tr.WritePrometheus(&b)
	for line := range strings.Lines(b.String()) {
		if v, ok := strings.CutPrefix(line, series); ok {
			return strings.TrimSpace(v) != "0"
		}
	}
	return false
}

// TestPrometheusExposition parses and lints the exposition of a driven
// Transport: no problem, every family of docs/observability.md's list present with its
// type and labels, and the traffic counted.
func TestPrometheusExposition(t *testing.T) {
	tr := driven(t)
	var out bytes.Buffer
	tr.WritePrometheus(&out)
	mfs := parseAndLint(t, out.Bytes())
	// The families of keys and of affinity, which need a keyed upstream
	// and a balancing Router: another Transport, its own Set.
	other, err := failover.New(failover.Config{Router: &failover.Weighted{}, Upstreams: []failover.Upstream{
		{Name: "k", BaseURL: "http://k.test/v1", Keys: []failover.Key{{Name: "one", Header: http.Header{"Authorization": {"Bearer k-0123456789"}}}}},
		{Name: "w", BaseURL: "http://w.test/v1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	out.Reset()
	other.WritePrometheus(&out)
	for name, mf := range parseAndLint(t, out.Bytes()) {
		if mfs[name] == nil {
			mfs[name] = mf
		}
	}
	for _, f := range readmeFamilies(t) {
		mf := mfs[f.name]
		if mf == nil {
			t.Errorf("%s: not in the exposition", f.name)
			continue
		}
		if got := strings.ToLower(mf.GetType().String()); got != f.typ {
			t.Errorf("%s: type %s, docs/observability.md says %s", f.name, got, f.typ)
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName())
			}
			if !slices.Equal(labels, f.labels) {
				t.Errorf("%s: labels %v, docs/observability.md says %v", f.name, labels, f.labels)
				break
			}
		}
	}
	// What the traffic above made happen, as the metrics count it.
	for _, s := range []struct {
		family string
		labels map[string]string
	}{
		{"failover_hedges_total", nil},
		{"failover_hedge_wins_total", nil},
		{"failover_failovers_total", map[string]string{"from": "a", "to": "b"}},
		{"failover_failovers_total", map[string]string{"from": "b", "to": "c"}},
		{"failover_breaker_trips_total", map[string]string{"upstream": "a"}},
		{"failover_breaker_trips_total", map[string]string{"upstream": "c"}},
		{"failover_skipped_total", map[string]string{"upstream": "a", "reason": "circuit_open"}},
		{"failover_skipped_total", map[string]string{"upstream": "b", "reason": "rate_limited"}},
		{"failover_cooldowns_total", map[string]string{"upstream": "b", "reason": "rate_limited"}},
		{"failover_cooldown_seconds", map[string]string{"upstream": "b"}},
		{"failover_last_resort_total", map[string]string{"upstream": "a"}},
		{"failover_probes_total", map[string]string{"upstream": "c", "outcome": "auth_failed"}},
		{"failover_attempts_total", map[string]string{"upstream": "a", "outcome": "failed"}},
		{"failover_attempt_duration_seconds", map[string]string{"upstream": "b"}},
		{"failover_shared_events_total", map[string]string{"direction": "out"}},
		{"failover_tokens_total", map[string]string{"upstream": "b", "model": "gpt-test", "kind": "input"}},
		{"failover_cost_total", map[string]string{"upstream": "a", "model": "gpt-test"}},
		{"failover_usage_unreported_total", map[string]string{"upstream": "a"}},
	} {
		if v := value(mfs[s.family], s.labels); v <= 0 {
			t.Errorf("%s%v = %v, want more than 0", s.family, s.labels, v)
		}
	}
}

// value returns the value of the series of mf with labels (a histogram's
// count); -1 when there is none.
func value(mf *dto.MetricFamily, labels map[string]string) float64 {
	for _, m := range mf.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) != len(labels) {
			continue
		}
		match := true
		for k, v := range labels {
			match = match && got[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// TestClientGolangCollector registers the Example's transportCollector of
// a driven Transport in a pedantic client_golang registry, beside a
// program's own counter: the registry gathers every family and series of
// the exposition, with the same counts, and lints clean.
func TestClientGolangCollector(t *testing.T) {
	tr := driven(t)
	tr.Close() // no probe nor fleet call moves a counter between the two reads
	reg := prometheus.NewPedanticRegistry()
	own := prometheus.NewCounter(prometheus.CounterOpts{Name: "app_jobs_total", Help: "Jobs done."})
	reg.MustRegister(transportCollector{tr}, own)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	gathered, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tr.WritePrometheus(&out)
	want := parseAndLint(t, out.Bytes())
	if len(gathered) != len(want)+1 {
		t.Errorf("the registry gathered %d families, want the exposition's %d and app_jobs_total", len(gathered), len(want))
	}
	for _, mf := range gathered {
		w := want[mf.GetName()]
		if mf.GetName() == "app_jobs_total" {
			continue
		}
		if w == nil || mf.GetHelp() != w.GetHelp() || mf.GetType() != w.GetType() || len(mf.GetMetric()) != len(w.GetMetric()) {
			t.Errorf("%s: %s %s, %d series; the exposition has %v", mf.GetName(), mf.GetType(), mf.GetHelp(), len(mf.GetMetric()), w)
			continue
		}
		if mf.GetType() == dto.MetricType_GAUGE {
			continue // a cooldown left moves between the two reads
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got := m.GetCounter().GetValue()
			if h := m.GetHistogram(); h != nil {
				got = float64(h.GetSampleCount())
			}
			if v := value(w, labels); got != v {
				t.Errorf("%s%v = %v, the exposition says %v", mf.GetName(), labels, got, v)
			}
		}
	}
}
