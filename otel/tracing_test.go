package failoverotel_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/failover-go/failover"
	"github.com/failover-go/failover/failovertest"
	failoverotel "github.com/failover-go/failover/otel"
)

const (
	callerKey  = "caller-secret-key"
	primaryKey = "primary-secret-key"
	backupKey  = "backup-secret-key"
	queryKey   = "query-secret-key"
)

// upstream is a loopback server that answers code and keeps the
// traceparent of each request.
type upstream struct {
	*httptest.Server
	mu      sync.Mutex
	parents []string
}

func newUpstream(t *testing.T, code int) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.parents = append(u.parents, r.Header.Get("Traceparent"))
		u.mu.Unlock()
		w.WriteHeader(code)
		io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) traceparents() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.parents...)
}

// tracing returns a traced client over a failover.Transport of the
// upstreams (name, URL), with the recorder of its spans.
func tracing(t *testing.T, cfg failover.Config, ups ...string) (*http.Client, *tracetest.SpanRecorder) {
	t.Helper()
	keys := []string{primaryKey, backupKey}
	for i := 0; i < len(ups); i += 2 {
		cfg.Upstreams = append(cfg.Upstreams, failover.Upstream{Name: ups[i], BaseURL: ups[i+1] + "/v1",
			Header: http.Header{"Authorization": {"Bearer " + keys[i/2%2]}}})
	}
	tr, err := failover.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	ot := failoverotel.NewTransport(tr, failoverotel.WithTracerProvider(tp), failoverotel.WithPropagators(propagation.TraceContext{}))
	return &http.Client{Transport: ot}, spans
}

// post sends a chat completion with the caller's key in a header and in
// the query, and returns the response.
func post(t *testing.T, c *http.Client, ctx context.Context, base string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions?api-key="+queryKey, strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+callerKey)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func attrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// check reports each attribute of want that got lacks or has otherwise
// (a value "-": that got lacks it).
func check(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		g, ok := got[k]
		switch {
		case v == "-" && ok:
			t.Errorf("%s: %s = %q, want none", what, k, g)
		case v != "-" && g != v:
			t.Errorf("%s: %s = %q (present: %v), want %q", what, k, g, ok, v)
		}
	}
}

func hostPort(t *testing.T, rawURL string) (string, string) {
	t.Helper()
	host, port, err := net.SplitHostPort(strings.TrimPrefix(rawURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}

// noSecret fails when a span's name, attributes, events or status hold a
// credential, the query or a header's name.
func noSecret(t *testing.T, spans []sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, s := range spans {
		dump := fmt.Sprintf("%s %v %v %v", s.Name(), s.Attributes(), s.Events(), s.Status())
		for _, bad := range []string{callerKey, primaryKey, backupKey, queryKey, "api-key", "Authorization", "Bearer"} {
			if strings.Contains(dump, bad) {
				t.Errorf("span %s holds %q: %s", s.Name(), bad, dump)
			}
		}
	}
}

// A request that fails over: one request span, ended with the answer's
// body, and two attempt spans under it with the upstream, the outcome and
// the HTTP attributes of each; the upstreams see the request span as
// their parent.
func TestTransportFailover(t *testing.T) {
	primary, backup := newUpstream(t, 503), newUpstream(t, 200)
	client, spans := tracing(t, failover.Config{}, "primary", primary.URL, "backup", backup.URL)
	resp := post(t, client, context.Background(), primary.URL)
	if n := len(spans.Ended()); n != 2 {
		t.Errorf("%d spans ended before the body, want the 2 attempts", n)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	ended := spans.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want 3", len(ended))
	}
	a1, a2, req := ended[0], ended[1], ended[2]
	ph, pp := hostPort(t, primary.URL)
	_, bp := hostPort(t, backup.URL)
	check(t, "request span", attrs(req.Attributes()), map[string]string{
		"http.request.method": "POST", "server.address": ph, "server.port": pp,
		"url.full": primary.URL + "/v1/chat/completions", "http.response.status_code": "200",
		"failover.upstream": "backup", "failover.attempt": "2", "failover.attempts": "2", "failover.outcome": "failed_over",
		"error.type": "-", "http.request.resend_count": "-",
	})
	check(t, "attempt 1", attrs(a1.Attributes()), map[string]string{
		"http.request.method": "POST", "server.address": ph, "server.port": pp,
		"url.full": primary.URL + "/v1/chat/completions", "http.response.status_code": "503", "error.type": "503",
		"failover.upstream": "primary", "failover.attempt": "1", "failover.outcome": "failed", "failover.hedge": "false",
		"http.request.resend_count": "-",
	})
	check(t, "attempt 2", attrs(a2.Attributes()), map[string]string{
		"http.request.method": "POST", "server.port": bp,
		"url.full": backup.URL + "/v1/chat/completions", "http.response.status_code": "200", "error.type": "-",
		"failover.upstream": "backup", "failover.attempt": "2", "failover.outcome": "success", "failover.hedge": "false",
		"http.request.resend_count": "1",
	})
	for _, s := range ended {
		if s.SpanKind() != trace.SpanKindClient || s.Name() != "POST" {
			t.Errorf("span %s of kind %v, want POST of kind client", s.Name(), s.SpanKind())
		}
	}
	for _, a := range []sdktrace.ReadOnlySpan{a1, a2} {
		if a.Parent().SpanID() != req.SpanContext().SpanID() || a.SpanContext().TraceID() != req.SpanContext().TraceID() {
			t.Errorf("attempt %s: parent %v, want the request span %v", a.Name(), a.Parent(), req.SpanContext())
		}
	}
	if a1.Status().Code != codes.Error || a2.Status().Code != codes.Unset || req.Status().Code != codes.Unset {
		t.Errorf("statuses %v %v %v, want Error for the 503, Unset for the rest", a1.Status(), a2.Status(), req.Status())
	}
	want := "00-" + req.SpanContext().TraceID().String() + "-" + req.SpanContext().SpanID().String() + "-01"
	for _, got := range append(primary.traceparents(), backup.traceparents()...) {
		if got != want {
			t.Errorf("an upstream got traceparent %q, want the request span's %q", got, want)
		}
	}
	noSecret(t, ended)
}

// An upstream passed over is an event on the request span, with its
// reason and when it takes requests again; the attempt at the next is the
// request's first.
func TestTransportSkip(t *testing.T) {
	primary, backup := newUpstream(t, 503), newUpstream(t, 200)
	client, spans := tracing(t, failover.Config{Breaker: failover.BreakerConfig{FailureThreshold: 1, Cooldown: time.Hour}},
		"primary", primary.URL, "backup", backup.URL)
	post(t, client, context.Background(), primary.URL).Body.Close() // opens the primary's circuit
	spans2 := len(spans.Ended())
	post(t, client, context.Background(), primary.URL).Body.Close()
	ended := spans.Ended()[spans2:]
	if len(ended) != 2 {
		t.Fatalf("%d spans, want the backup's attempt and the request", len(ended))
	}
	att, req := ended[0], ended[1]
	check(t, "attempt", attrs(att.Attributes()), map[string]string{"failover.upstream": "backup", "failover.attempt": "1", "http.request.resend_count": "-"})
	check(t, "request", attrs(req.Attributes()), map[string]string{"failover.outcome": "failed_over", "failover.upstream": "backup", "failover.attempts": "1"})
	ev := req.Events()
	if len(ev) != 1 || ev[0].Name != "failover.skip" {
		t.Fatalf("events %v, want one failover.skip", ev)
	}
	got := attrs(ev[0].Attributes)
	check(t, "skip event", got, map[string]string{"failover.upstream": "primary", "failover.reason": "circuit_open"})
	if ra, err := strconv.ParseFloat(got["failover.retry_after"], 64); err != nil || ra <= 3500 || ra > 3600 {
		t.Errorf("failover.retry_after = %q, want about an hour in seconds", got["failover.retry_after"])
	}
	noSecret(t, ended)
}

// A request no upstream answers: the request span ends with RoundTrip's
// error, its error.type the attempts' cause; a Trace of the caller's is
// called beside the spans.
func TestTransportError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String()
	l.Close()
	client, spans := tracing(t, failover.Config{Retry: failover.RetryConfig{Off: true}}, "primary", refused)
	var mine []string
	ctx := failover.WithTrace(context.Background(), &failover.Trace{
		AttemptDone: func(d failover.TraceAttemptDone) { mine = append(mine, d.Upstream) },
	})
	req, _ := http.NewRequestWithContext(ctx, "GET", refused+"/v1/models?api-key="+queryKey, nil)
	if _, err := client.Do(req); err == nil {
		t.Fatal("no error")
	}
	ended := spans.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans, want 2", len(ended))
	}
	for _, s := range ended {
		if et := attrs(s.Attributes())["error.type"]; et != "*net.OpError" || s.Status().Code != codes.Error {
			t.Errorf("span %v: error.type %q, status %v; want *net.OpError, Error", attrs(s.Attributes()), et, s.Status())
		}
	}
	check(t, "request", attrs(ended[1].Attributes()), map[string]string{"failover.outcome": "failed", "failover.upstream": "-", "http.response.status_code": "-"})
	if len(mine) != 1 || mine[0] != "primary" {
		t.Errorf("the caller's Trace heard %v, want the primary's attempt", mine)
	}
	noSecret(t, ended)
}

// NewTransport refuses a nil Transport at once, saying so.
func TestNewTransportNil(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "nil Transport") {
			t.Fatalf("NewTransport(nil) panicked with %v; want a panic that names the nil Transport", v)
		}
	}()
	failoverotel.NewTransport(nil)
}

// TestNilURL: the failover.Transport answers a request with no
// URL with an error, as the RoundTripper contract asks; the traced one
// panics on r.URL.Hostname() before it gets there.
func TestNilURL(t *testing.T) {
	up := newUpstream(t, 200)
	c, _ := tracing(t, failover.Config{}, "primary", up.URL)
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("RoundTrip of a request with no URL panicked: %v", p)
		}
	}()
	resp, err := c.Transport.RoundTrip(&http.Request{Method: "GET", Header: http.Header{}})
	if err == nil {
		resp.Body.Close()
		t.Error("RoundTrip of a request with no URL: no error")
	}
}

// An attempt with one of the upstream's keys names the key, never its
// value.
func TestTransportKey(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") }))
	defer srv.Close()
	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{Name: "p", BaseURL: srv.URL + "/v1",
		Keys: []failover.Key{{Name: "team-a", Header: http.Header{"Authorization": {"Bearer " + primaryKey}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	c := &http.Client{Transport: failoverotel.NewTransport(tr, failoverotel.WithTracerProvider(tp))}
	resp := post(t, c, context.Background(), srv.URL)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	ended := spans.Ended()
	var attempt sdktrace.ReadOnlySpan
	for _, s := range ended {
		if s.Parent().IsValid() {
			attempt = s
		}
	}
	if attempt == nil {
		t.Fatalf("no attempt span among %d", len(ended))
	}
	check(t, "attempt", attrs(attempt.Attributes()), map[string]string{"failover.key": "team-a", "failover.upstream": "p"})
	noSecret(t, ended)
}

// A stream cut after its content began and continued by the backup: one
// request span, with the attempts of both and an event
// failover.continued; its usage adds both upstreams'.
func TestTransportContinued(t *testing.T) {
	chunk := func(id, text, finish string) string {
		f := "null"
		if finish != "" {
			f = `"` + finish + `"`
		}
		return `data: {"id":"` + id + `","choices":[{"index":0,"delta":{"content":"` + text + `"},"finish_reason":` + f + "}]}\n\n"
	}
	primary := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chunk("p", "one ", "")}, End: failovertest.EndCut})
	backup := failovertest.NewServer(t, failovertest.Step{Chunks: []string{chunk("b", "two", "stop"),
		`data: {"id":"b","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1}}` + "\n\n", "data: [DONE]\n\n"}})
	tr, err := failover.New(failover.Config{
		Continue:   failover.ContinueConfig{On: true},
		MeterUsage: true,
		Upstreams: []failover.Upstream{
			{Name: "primary", BaseURL: primary.URL + "/v1"},
			{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + backupKey}},
				Prefill: failover.Prefill{Chat: failover.ChatTrailingAssistant}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	client := &http.Client{Transport: failoverotel.NewTransport(tr, failoverotel.WithTracerProvider(tp))}
	resp, err := client.Post(primary.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"count"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(body), "two") {
		t.Fatalf("read %q, %v", body, err)
	}
	ended := spans.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want two attempts and the request", len(ended))
	}
	check(t, "continuation's attempt", attrs(ended[1].Attributes()), map[string]string{"failover.upstream": "backup", "failover.attempt": "2"})
	req := ended[2]
	check(t, "request", attrs(req.Attributes()), map[string]string{"failover.upstream": "primary", "failover.attempts": "1", "gen_ai.usage.input_tokens": "7"})
	ev := req.Events()
	if len(ev) != 1 || ev[0].Name != "failover.continued" {
		t.Fatalf("events %v, want one failover.continued", ev)
	}
	check(t, "continued event", attrs(ev[0].Attributes), map[string]string{"failover.upstream": "primary", "failover.continued_by": "backup"})
	if c := attrs(ev[0].Attributes)["failover.cause"]; c == "" {
		t.Errorf("the event has no failover.cause")
	}
	noSecret(t, ended)
}
