package failover

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// MetricsHandler returns an http.Handler that serves the Transport's
// metrics in the Prometheus text format, as [Transport.WritePrometheus]
// writes them, for a scraper's GET (or HEAD); any other method gets 405.
func (t *Transport) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !readOnly(w, r) {
			return
		}
		var b bytes.Buffer
		t.WritePrometheus(&b)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(b.Bytes())
	})
}

// HealthHandler returns an http.Handler that serves [Transport.Health] as
// a JSON array, for a GET (or HEAD); any other method gets 405. The
// status is 200 when some upstream takes requests (UpstreamHealth.Available),
// else 503, so that a load balancer's or orchestrator's check can read it
// without parsing the body; the body is the same either way.
func (t *Transport) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !readOnly(w, r) {
			return
		}
		hs := t.Health()
		body, err := json.Marshal(hs)
		if err != nil {
			http.Error(w, "failover: health: "+err.Error(), http.StatusInternalServerError)
			return
		}
		code := http.StatusServiceUnavailable
		for _, h := range hs {
			if h.Available {
				code = http.StatusOK
				break
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		w.Write(append(body, '\n'))
	})
}

// readOnly answers 405 to a request other than a GET or a HEAD, and
// reports whether the handler goes on.
func readOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
	return false
}
