package main

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeAndLint reads each path of -listen's server at base, parses it as
// a Prometheus server does (expfmt's TextParser) and lints it as promtool
// check metrics does (promlint), failing t on any problem, and returns the
// names of the families they had. It is called by drill, through
// options.Scrape, so it reports with Errorf only.
func scrapeAndLint(t *testing.T, base string, paths ...string) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	for _, path := range paths {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Errorf("GET %s: %v", path, err)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d, %v", path, resp.StatusCode, err)
			continue
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			t.Errorf("GET %s: expfmt: %v", path, err)
			continue
		}
		var all []*dto.MetricFamily
		for name, mf := range mfs {
			all = append(all, mf)
			seen[name] = true
			if mf.GetHelp() == "" || mf.GetType() == dto.MetricType_UNTYPED {
				t.Errorf("GET %s: %s: help %q, type %s", path, name, mf.GetHelp(), mf.GetType())
			}
		}
		problems, err := promlint.NewWithMetricFamilies(all).Lint()
		if err != nil {
			t.Errorf("GET %s: promlint: %v", path, err)
		}
		for _, p := range problems {
			t.Errorf("GET %s: promlint: %s: %s", path, p.Metric, p.Text)
		}
	}
	return seen
}
