package integration_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3/option"
)

// traceSpan is a RoundTripper between otelhttp and the failover.Transport:
// it attaches a failover.Trace to each request that writes, on the span
// otelhttp started for it, which upstream answered and how many attempts
// it took (attributes), and each attempt (events). otelhttp's own
// attributes name the URL the caller addressed, the primary's, even when
// the answer came from the backup; these say where it went.
type traceSpan struct{ next http.RoundTripper }

func (s traceSpan) RoundTrip(r *http.Request) (*http.Response, error) {
	span := trace.SpanFromContext(r.Context())
	ctx := failover.WithTrace(r.Context(), &failover.Trace{
		Skipped: func(sk failover.TraceSkip) {
			span.AddEvent("failover.skipped", trace.WithAttributes(
				attribute.String("failover.upstream", sk.Upstream), attribute.String("failover.reason", string(sk.Reason))))
		},
		AttemptDone: func(a failover.TraceAttemptDone) {
			span.AddEvent("failover.attempt", trace.WithAttributes(
				attribute.String("failover.upstream", a.Upstream), attribute.Int("failover.attempt", a.Attempt),
				attribute.String("failover.outcome", a.Outcome.String()), attribute.Int("http.response.status_code", a.StatusCode)))
		},
		Done: func(d failover.TraceDone) {
			span.SetAttributes(attribute.String("failover.upstream", d.Upstream), attribute.Int("failover.attempts", d.Attempts),
				attribute.String("failover.outcome", string(d.Outcome)))
		},
	})
	return s.next.RoundTrip(r.WithContext(ctx))
}

// otelhttp above the Transport makes one span per request, which names the
// URL the caller addressed; a failover.Trace puts on that span the
// upstream whose answer the caller got and every attempt.
//
// For a span per attempt as well, following OpenTelemetry's HTTP client
// conventions, use failoverotel.NewTransport (module
// github.com/failover-go/failover/otel) instead of this wrapper.
func Example_otelhttp() {
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	defer primary.Close()
	backup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"object":"list","data":[]}`)
	}))
	defer backup.Close()

	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1"},
	}})
	if err != nil {
		panic(err)
	}
	defer t.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	client := &http.Client{Transport: otelhttp.NewTransport(traceSpan{next: t}, otelhttp.WithTracerProvider(tp))}

	resp, err := client.Get(primary.URL + "/v1/models")
	if err != nil {
		panic(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // otelhttp ends the span when the body is done

	for _, s := range spans.Ended() {
		fmt.Println(s.Name(), s.Status().Code)
		for _, kv := range s.Attributes() {
			if strings.HasPrefix(string(kv.Key), "failover.") {
				fmt.Printf("  %s=%s\n", kv.Key, kv.Value.Emit())
			}
		}
		for _, e := range s.Events() {
			fmt.Print("  event ", e.Name)
			for _, kv := range e.Attributes {
				fmt.Printf(" %s=%s", kv.Key, kv.Value.Emit())
			}
			fmt.Println()
		}
	}
	// Output:
	// HTTP GET Unset
	//   failover.upstream=backup
	//   failover.attempts=2
	//   failover.outcome=failed_over
	//   event failover.attempt failover.upstream=primary failover.attempt=1 failover.outcome=failed http.response.status_code=503
	//   event failover.attempt failover.upstream=backup failover.attempt=2 failover.outcome=success http.response.status_code=200
}

// Under otelhttp, through openai-go: the span names the backup that
// answered, and no key, the caller's or an upstream's, reaches any span.
func TestOtelhttpSpanNamesTheUpstream(t *testing.T) {
	var log requestLog
	primary := fakeUpstream(t, &log, "primary", apiError(http.StatusServiceUnavailable, "server_error", "overloaded"))
	backup := fakeUpstream(t, &log, "backup", completion("from the backup"))
	tr := newFailover(t, primary.URL+"/v1", backup.URL+"/v1", failover.Config{})
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	client := newOpenAIClient(t, otelhttp.NewTransport(traceSpan{next: tr}, otelhttp.WithTracerProvider(tp)), primary.URL+"/v1", option.WithMaxRetries(0))
	if _, err := client.Chat.Completions.New(context.Background(), chatParams()); err != nil {
		t.Fatal(err)
	}
	ended := spans.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans, want 1", len(ended))
	}
	s := ended[0]
	attrs := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		attrs[kv.Key] = kv.Value.Emit()
	}
	if attrs["failover.upstream"] != "backup" || attrs["failover.attempts"] != "2" || attrs["failover.outcome"] != "failed_over" {
		t.Errorf("span attributes %v, want the backup after 2 attempts", attrs)
	}
	if !strings.Contains(attrs["url.full"], primary.URL) {
		t.Errorf("url.full = %q; the test expects otelhttp to name the primary the caller addressed", attrs["url.full"])
	}
	dump := fmt.Sprintf("%v %v %v", s.Attributes(), s.Events(), s.Status())
	for _, key := range []string{callerKey, primaryKey, backupKey} {
		if strings.Contains(dump, key) {
			t.Errorf("a span carries %q: %s", key, dump)
		}
	}
	if n := len(log.all()); n != 2 {
		t.Errorf("the upstreams saw %d requests, want 2", n)
	}
}
