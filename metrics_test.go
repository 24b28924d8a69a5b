package failover

import (
	"bytes"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// TestFamilies checks the table itself: unique names as Prometheus wants
// them (a counter's ending in _total, no other's), label names, and help
// texts of one line that need no escaping.
func TestFamilies(t *testing.T) {
	name := regexp.MustCompile(`^failover_[a-z0-9_]*[a-z0-9]$`)
	label := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	seen := map[string]bool{}
	for id, f := range families {
		switch {
		case !name.MatchString(f.name):
			t.Errorf("row %d: name %q", id, f.name)
		case seen[f.name]:
			t.Errorf("%s: two rows", f.name)
		case f.typ != "counter" && f.typ != "gauge" && f.typ != "histogram":
			t.Errorf("%s: type %q", f.name, f.typ)
		case (f.typ == "counter") != strings.HasSuffix(f.name, "_total"):
			t.Errorf("%s: a %s, and the _total suffix is for counters only", f.name, f.typ)
		case f.help == "" || strings.ContainsAny(f.help, "\\\n"):
			t.Errorf("%s: help %q, want one line without a backslash", f.name, f.help)
		}
		seen[f.name] = true
		for _, l := range f.labels {
			if !label.MatchString(l) || l == "le" {
				t.Errorf("%s: label %q", f.name, l)
			}
		}
	}
}

// TestSeries checks the series names a family's row makes, escaping
// included, and that a registration with the wrong number of label values
// panics.
func TestSeries(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{famUnrouted.series(), "failover_unrouted_requests_total"},
		{famBreakerState.series("a"), `failover_breaker_state{upstream="a"}`},
		{famFailovers.series(`a"b`, "c\\d\ne"), `failover_failovers_total{from="a\"b",to="c\\d\ne"}`},
	} {
		if tt.got != tt.want {
			t.Errorf("got %s, want %s", tt.got, tt.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("famSkipped.series with one value did not panic")
		}
	}()
	famSkipped.series("a")
}

// exposed is a Transport's exposition, checked line by line: each family
// of the table that has samples has its # HELP and # TYPE lines once,
// right before its first sample, and its samples all together; every
// failover_ sample is of a family of the table.
func exposed(t *testing.T, tr *Transport) (out string, present map[string]bool) {
	t.Helper()
	var b bytes.Buffer
	tr.WritePrometheus(&b)
	out = b.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	present = map[string]bool{}
	done := map[familyID]bool{}
	cur := familyID(-1)
	for i, line := range lines {
		if strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:metricNameEnd([]byte(line))]
		id, ours := exposition.byName[name]
		if !ours {
			if strings.HasPrefix(name, "failover_") {
				t.Errorf("line %d: %s is of no family of the table", i+1, line)
			}
			cur = -1
			continue
		}
		if id == cur {
			continue
		}
		f := families[id]
		if done[id] {
			t.Errorf("line %d: %s, after other families' samples", i+1, line)
		}
		done[id], cur, present[f.name] = true, id, true
		if want := strings.Split(string(exposition.meta[id]), "\n")[:2]; i < 2 || !slices.Equal(lines[i-2:i], want) {
			t.Errorf("line %d: %s, not after\n%s", i+1, line, strings.Join(want, "\n"))
		}
	}
	for _, f := range families {
		if n := strings.Count(out, "# HELP "+f.name+" "); n > 1 || !present[f.name] && n > 0 {
			t.Errorf("%d HELP lines of %s, with samples: %v", n, f.name, present[f.name])
		}
	}
	return out, present
}

// TestWritePrometheusMetadata drives a Transport with Hedge, Shared and
// MeterUsage until every family has samples: before the first failover,
// the first stream and the first usage, failover_failovers_total,
// failover_stream_first_byte_seconds and the usage families are not
// written at all, metadata included (nor the duration of an outcome that
// has not occurred); after them, every family of the table is, each with
// its # HELP and # TYPE.
func TestWritePrometheusMetadata(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 200, "ok")
		n.status("b.test", 200, "ok")
		// Weighted, for affinity's family, with b's share too small to
		// be drawn: the requests go to a first; b has a key, for the
		// key families.
		cfg := twoUpstreams(n, Config{Hedge: &HedgeConfig{Delay: time.Minute}, Shared: newMemShared(), MeterUsage: true, Router: &Weighted{}, Continue: ContinueConfig{On: true}})
		cfg.Upstreams[1].Weight = 1e-12
		cfg.Upstreams[1].Keys = []Key{{Name: "k", Header: http.Header{"Authorization": {"Bearer b-key-0123456789"}}}}
		tr := newTestTransport(t, cfg)
		t.Cleanup(func() { tr.Close() })
		get(t, tr, "http://a.test/")
		synctest.Wait()
		out, present := exposed(t, tr)
		for _, lazy := range []string{"failover_failovers_total", "failover_stream_first_byte_seconds", "failover_tokens_total", "failover_cost_total", "failover_usage_unreported_total"} {
			if present[lazy] || strings.Contains(out, lazy) {
				t.Errorf("%s written before its first use:\n%s", lazy, grepLines(out, lazy))
			}
		}
		if strings.Contains(grepLines(out, "failover_request_duration"), `outcome="failed_over"`) {
			t.Errorf("the duration of failed_over requests written before there was one:\n%s", grepLines(out, "failover_request_duration"))
		}

		n.status("a.test", 200, "data: {}\n\n", "Content-Type", "text/event-stream")
		readBody(t, mustGet(t, tr, "http://a.test/")) // a stream without usage
		n.status("a.test", 200, `{"usage":{"prompt_tokens":2,"completion_tokens":1}}`, "Content-Type", "application/json")
		readBody(t, mustGet(t, tr, "http://a.test/"))
		n.status("a.test", 503, "down")
		get(t, tr, "http://a.test/")
		synctest.Wait()
		_, present = exposed(t, tr)
		for _, f := range families {
			if !present[f.name] {
				t.Errorf("%s not written", f.name)
			}
		}
	})
}

// TestWritePrometheusForeign checks that series of Config.Metrics that
// are not the Transport's are written as the Set writes them, and that
// metrics.ExposeMetadata, a switch of the whole process, changes nothing
// the Transport writes: its bare "# HELP name" lines are replaced, not
// doubled.
func TestWritePrometheusForeign(t *testing.T) {
	s := metrics.NewSet()
	s.GetOrCreateCounter(`app_jobs_total{queue="q"}`).Add(3)
	s.GetOrCreateGauge(`zz_temperature`, func() float64 { return 21 })
	n := newFakeNet()
	n.status("a.test", 503, "down")
	n.status("b.test", 200, "ok")
	tr := newTestTransport(t, twoUpstreams(n, Config{Metrics: s}))
	get(t, tr, "http://a.test/")
	out, _ := exposed(t, tr)
	for _, want := range []string{"app_jobs_total{queue=\"q\"} 3\n", "\nzz_temperature 21\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("exposition lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "# HELP app_") || strings.Contains(out, "# TYPE zz_") {
		t.Errorf("metadata written for series that are not the Transport's:\n%s", out)
	}

	metrics.ExposeMetadata(true)
	defer metrics.ExposeMetadata(false)
	with, _ := exposed(t, tr)
	got := strings.NewReplacer("# HELP app_jobs_total\n# TYPE app_jobs_total counter\n", "", "# HELP zz_temperature\n# TYPE zz_temperature gauge\n", "").Replace(with)
	if got != out || got == with {
		t.Errorf("with metrics.ExposeMetadata(true):\n%s\nwant, besides the Set's own metadata of app_jobs_total and zz_temperature:\n%s", with, out)
	}
}

// TestWriteExposition checks the rewrite on a Set's output as it comes:
// the Set's own metadata, a comment of the user's, a histogram's series
// and a last line without its newline.
func TestWriteExposition(t *testing.T) {
	h := families[famAttemptDuration].name
	in := "app_a 1\n" +
		"# HELP failover_breaker_state\n# TYPE failover_breaker_state gauge\n" +
		"failover_breaker_state{upstream=\"a\"} 0\nfailover_breaker_state{upstream=\"b\"} 1\n" +
		"# a comment of the user's\n" +
		h + "_bucket{upstream=\"a\",le=\"+Inf\"} 1\n" + h + "_sum{upstream=\"a\"} 0.5\n" + h + "_count{upstream=\"a\"} 1\n" +
		h + "_bucket{upstream=\"b\",le=\"+Inf\"} 0\n" + h + "_sum{upstream=\"b\"} 0\n" + h + "_count{upstream=\"b\"} 0\n" +
		"failover_unrouted_requests_total 2\n" +
		"zz 1"
	want := "app_a 1\n" +
		string(exposition.meta[famBreakerState]) +
		"failover_breaker_state{upstream=\"a\"} 0\nfailover_breaker_state{upstream=\"b\"} 1\n" +
		"# a comment of the user's\n" +
		string(exposition.meta[famAttemptDuration]) +
		h + "_bucket{upstream=\"a\",le=\"+Inf\"} 1\n" + h + "_sum{upstream=\"a\"} 0.5\n" + h + "_count{upstream=\"a\"} 1\n" +
		h + "_bucket{upstream=\"b\",le=\"+Inf\"} 0\n" + h + "_sum{upstream=\"b\"} 0\n" + h + "_count{upstream=\"b\"} 0\n" +
		string(exposition.meta[famUnrouted]) +
		"failover_unrouted_requests_total 2\n" +
		"zz 1"
	var b bytes.Buffer
	writeExposition(&b, []byte(in))
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/observability.md's list of metrics from the table")

// metricsDoc is the page whose list of metrics is made from the table.
const metricsDoc = "docs/observability.md"

// The markers around the list of metrics.
const (
	docsBegin = "<!-- metrics: made from metrics.go's families; go test -run TestDocsMetrics -update-docs rewrites it -->\n"
	docsEnd   = "<!-- end of metrics -->\n"
)

// docsMetrics is the list of metrics, made from the table: a row per
// family with its labels, type and help text.
func docsMetrics() string {
	var b strings.Builder
	b.WriteString("| Metric | Type | Meaning |\n| --- | --- | --- |\n")
	for _, f := range families {
		name := f.name
		if len(f.labels) > 0 {
			name += "{" + strings.Join(f.labels, ",") + "}"
		}
		b.WriteString("| `" + name + "` | " + f.typ + " | " + f.help + " |\n")
	}
	return b.String()
}

// TestDocsMetrics checks that docs/observability.md lists every family of
// the table with its labels, type and help text (go test -run
// TestDocsMetrics -update-docs writes the list), and that wherever the
// README or a page of docs/ names a failover_ metric, it is one of the
// table's, a histogram's _bucket, _sum or _count included, with the
// family's labels when it gives labels.
func TestDocsMetrics(t *testing.T) {
	raw, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := strings.Cut(string(raw), docsBegin)
	list, after, ok2 := strings.Cut(rest, docsEnd)
	if !ok || !ok2 {
		t.Fatalf("%s has no list of metrics between\n%s and\n%s", metricsDoc, docsBegin, docsEnd)
	}
	if want := docsMetrics(); list != want {
		if *updateDocs {
			if err := os.WriteFile(metricsDoc, []byte(before+docsBegin+want+docsEnd+after), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: the list of metrics rewritten", metricsDoc)
		} else {
			t.Errorf("%s's list of metrics is not the table's (go test -run TestDocsMetrics -update-docs rewrites it); want:\n%s", metricsDoc, want)
		}
	}

	byName := map[string]*family{}
	for i := range families {
		byName[families[i].name] = &families[i]
	}
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	// A failover_ name not after "=" (impl=failover_2up, a benchmark's) or
	// a letter, with its labels when braces follow.
	mention := regexp.MustCompile(`(^|[^=\w/-])(failover_\w+)(\{[^}]*\})?`)
	for _, page := range append([]string{"README.md"}, pages...) {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mention.FindAllStringSubmatch(string(text), -1) {
			name, labels := m[2], m[3]
			f := byName[name]
			if f == nil {
				for _, sfx := range []string{"_bucket", "_sum", "_count"} {
					if h := byName[strings.TrimSuffix(name, sfx)]; h != nil && h.typ == "histogram" && strings.HasSuffix(name, sfx) {
						f = h
					}
				}
			}
			switch {
			case f == nil:
				t.Errorf("%s names %s, which is no metric of the table", page, name)
			case labels != "" && !strings.Contains(labels, "=") && labels != "{"+strings.Join(f.labels, ",")+"}":
				t.Errorf("%s names %s%s; its labels are {%s}", page, name, labels, strings.Join(f.labels, ","))
			}
		}
	}
}
