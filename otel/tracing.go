package failoverotel

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/failover-go/failover"
)

// ScopeName is the instrumentation scope of the spans a [Transport]
// makes.
const ScopeName = "github.com/failover-go/failover/otel"

// The attributes of this package's own (see Transport).
const (
	attrUpstream    = attribute.Key("failover.upstream")
	attrOutcome     = attribute.Key("failover.outcome")
	attrAttempt     = attribute.Key("failover.attempt")
	attrAttempts    = attribute.Key("failover.attempts")
	attrHedge       = attribute.Key("failover.hedge")
	attrLastResort  = attribute.Key("failover.last_resort")
	attrDemoted     = attribute.Key("failover.demoted")
	attrAbandoned   = attribute.Key("failover.abandoned")
	attrRound       = attribute.Key("failover.round")
	attrReason      = attribute.Key("failover.reason")
	attrRetryAfter  = attribute.Key("failover.retry_after")
	attrKey         = attribute.Key("failover.key")
	attrContinuedBy = attribute.Key("failover.continued_by")
	attrCause       = attribute.Key("failover.cause")

	eventSkip      = "failover.skip"
	eventContinued = "failover.continued"
)

// Transport is an http.RoundTripper that traces each request through a
// [failover.Transport], as otelhttp.Transport traces one through a plain
// RoundTripper: one span of kind client for the request, from RoundTrip
// until its answer's body is read to its end or closed, and a child span
// of kind client for each attempt, from its start to its response headers
// or its error. Both follow OpenTelemetry's HTTP client semantic
// conventions: http.request.method, server.address, server.port, url.full
// (without its query), http.response.status_code, error.type (the status
// from 400, else a word such as timeout or circuit_open, else the cause's
// type), and http.request.resend_count on the attempts after the first.
//
// Each attempt span also has failover.upstream (the upstream's Name),
// failover.attempt (its number, from 1), failover.hedge,
// failover.outcome (the classifier's verdict: success, failed, ...) and,
// when they apply, failover.key (the Name of the upstream's key it went
// with), failover.round, failover.last_resort, failover.demoted and
// failover.abandoned. The request span has
// failover.outcome (answered, failed_over, ...), failover.attempts, and
// failover.upstream and failover.attempt of the answer it returns; each
// upstream the request passed over is an event failover.skip on it, with
// failover.upstream, failover.reason and failover.retry_after (seconds).
// A stream that broke after its content began and was continued
// (failover.Config.Continue) is an event failover.continued, with
// failover.upstream (whose stream broke), failover.continued_by (empty
// when none continued it) and failover.cause; the continuation's attempts
// are spans of the request's, numbered after its own, and
// gen_ai.usage.* add up every upstream's answer. No attribute holds a
// query, a header or a credential.
//
// The request span's context is injected into the request's headers
// (traceparent, with the default propagator): every upstream sees the
// request span as its parent, for the Trace's hooks cannot reach an
// attempt's own request.
//
// A [failover.Trace] already in the request's context is called as well.
// Transport is safe for concurrent use by multiple goroutines.
type Transport struct {
	next   *failover.Transport
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	hosts  map[string]hostPort // by upstream Name: where its attempts go
}

type hostPort struct {
	host string
	port int
}

// An Option configures a [Transport].
type Option interface{ apply(*config) }

type config struct {
	tp   trace.TracerProvider
	prop propagation.TextMapPropagator
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithTracerProvider sets the TracerProvider the spans come from; the
// global one (otel.GetTracerProvider) when not given.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithPropagators sets the propagator that writes the request span's
// context into the request's headers; the global one
// (otel.GetTextMapPropagator) when not given.
func WithPropagators(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

// NewTransport returns a Transport that traces the requests it sends
// through t. It panics if t is nil, as its first request would.
func NewTransport(t *failover.Transport, opts ...Option) *Transport {
	if t == nil {
		panic("failoverotel: NewTransport called with a nil Transport")
	}
	var c config
	for _, o := range opts {
		o.apply(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.prop == nil {
		c.prop = otel.GetTextMapPropagator()
	}
	hosts := map[string]hostPort{}
	for _, h := range t.Health() {
		if u, err := url.Parse(h.BaseURL); err == nil {
			hosts[h.Name] = hostPort{u.Hostname(), port(u)}
		}
	}
	return &Transport{
		next:   t,
		tracer: c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:   c.prop,
		hosts:  hosts,
	}
}

// CloseIdleConnections closes the idle connections of the
// failover.Transport's Base.
func (t *Transport) CloseIdleConnections() { t.next.CloseIdleConnections() }

// RoundTrip sends r through the failover.Transport within a span, and a
// child span for each attempt. It does not modify r: the headers it
// propagates go to a copy.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL == nil {
		return t.next.RoundTrip(r) // nothing to trace: the failover.Transport returns its error
	}
	method := methodAttrs(r.Method)
	attrs := append(method, semconv.ServerAddress(r.URL.Hostname()), semconv.ServerPort(port(r.URL)), semconv.URLFull(bare(r.URL)))
	ctx, span := t.tracer.Start(r.Context(), spanName(r.Method), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	rt := &requestTrace{t: t, ctx: ctx, span: span, method: method, name: spanName(r.Method), attempts: map[int]trace.Span{}}
	ctx = failover.WithTrace(ctx, rt.hooks())

	out := r.WithContext(ctx)
	out.Header = r.Header.Clone()
	if out.Header == nil {
		out.Header = http.Header{}
	}
	t.prop.Inject(ctx, propagation.HeaderCarrier(out.Header))
	defer rt.endAttempts()
	resp, err := t.next.RoundTrip(out)
	if err != nil || resp.Body == nil || resp.Body == http.NoBody {
		span.End()
		return resp, err
	}
	if _, ok := resp.Body.(io.Writer); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		span.End() // the body is the connection, which no wrapper may hide
		return resp, nil
	}
	resp.Body = &spanBody{ReadCloser: resp.Body, span: span}
	return resp, nil
}

// requestTrace is one request's spans, and the failover.Trace that makes
// them.
type requestTrace struct {
	t      *Transport
	ctx    context.Context // the request span's
	span   trace.Span
	method []attribute.KeyValue
	name   string

	mu       sync.Mutex
	attempts map[int]trace.Span // the attempts started, not yet done, by number
	in, out  int64              // the usage of the answers so far (a continued stream has several)
}

func (rt *requestTrace) hooks() *failover.Trace {
	return &failover.Trace{
		Skipped:      rt.skipped,
		AttemptStart: rt.attemptStart,
		AttemptDone:  rt.attemptDone,
		Done:         rt.done,
		Usage:        rt.usage,
		Continued:    rt.continued,
	}
}

func (rt *requestTrace) skipped(s failover.TraceSkip) {
	attrs := []attribute.KeyValue{attrUpstream.String(s.Upstream), attrReason.String(string(s.Reason))}
	if s.Round > 0 {
		attrs = append(attrs, attrRound.Int(s.Round))
	}
	if s.RetryAfter > 0 {
		attrs = append(attrs, attrRetryAfter.Float64(s.RetryAfter.Seconds()))
	}
	rt.span.AddEvent(eventSkip, trace.WithAttributes(attrs...))
}

func (rt *requestTrace) attemptStart(a failover.TraceAttempt) {
	attrs := append([]attribute.KeyValue{}, rt.method...)
	if hp, ok := rt.t.hosts[a.Upstream]; ok {
		attrs = append(attrs, semconv.ServerAddress(hp.host), semconv.ServerPort(hp.port))
	}
	attrs = append(attrs, attrUpstream.String(a.Upstream), attrAttempt.Int(a.Attempt), attrHedge.Bool(a.Hedge))
	if a.Attempt > 1 {
		attrs = append(attrs, semconv.HTTPRequestResendCount(a.Attempt-1))
	}
	if a.Round > 0 {
		attrs = append(attrs, attrRound.Int(a.Round))
	}
	if a.Key != "" {
		attrs = append(attrs, attrKey.String(a.Key))
	}
	if a.LastResort {
		attrs = append(attrs, attrLastResort.Bool(true))
	}
	if a.Demoted != "" {
		attrs = append(attrs, attrDemoted.String(string(a.Demoted)))
	}
	_, span := rt.t.tracer.Start(rt.ctx, rt.name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	rt.mu.Lock()
	rt.attempts[a.Attempt] = span
	rt.mu.Unlock()
}

func (rt *requestTrace) attemptDone(d failover.TraceAttemptDone) {
	rt.mu.Lock()
	span, ok := rt.attempts[d.Attempt]
	delete(rt.attempts, d.Attempt)
	rt.mu.Unlock()
	if !ok {
		return
	}
	attrs := []attribute.KeyValue{attrOutcome.String(d.Outcome.String())}
	if d.URL != "" {
		attrs = append(attrs, semconv.URLFull(d.URL))
	}
	if d.StatusCode > 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(d.StatusCode))
	}
	if d.Abandoned {
		attrs = append(attrs, attrAbandoned.Bool(true))
	} else if et := errorType(d.StatusCode, d.Err); et != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(et))
		span.SetStatus(codes.Error, et)
	}
	span.SetAttributes(attrs...)
	span.End()
}

// endAttempts ends the spans of attempts whose AttemptDone never came (a
// hook that panicked): a span left open is never exported.
func (rt *requestTrace) endAttempts() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for n, span := range rt.attempts {
		span.End()
		delete(rt.attempts, n)
	}
}

func (rt *requestTrace) done(d failover.TraceDone) {
	attrs := []attribute.KeyValue{attrOutcome.String(string(d.Outcome)), attrAttempts.Int(d.Attempts)}
	if d.Upstream != "" {
		attrs = append(attrs, attrUpstream.String(d.Upstream), attrAttempt.Int(d.Attempt))
	}
	if d.StatusCode > 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(d.StatusCode))
	}
	if et := errorType(d.StatusCode, d.Err); et != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(et))
		rt.span.SetStatus(codes.Error, et)
	}
	rt.span.SetAttributes(attrs...)
}

func (rt *requestTrace) usage(u failover.Usage) {
	rt.mu.Lock()
	rt.in += u.Input
	rt.out += u.Output
	in, out := rt.in, rt.out
	rt.mu.Unlock()
	rt.span.SetAttributes(semconv.GenAIUsageInputTokens(int(in)), semconv.GenAIUsageOutputTokens(int(out)))
}

// continued records a stream that broke, and who continued it, as an
// event of the request's span.
func (rt *requestTrace) continued(c failover.TraceContinued) {
	attrs := []attribute.KeyValue{attrUpstream.String(c.From), attrContinuedBy.String(c.To)}
	if c.Cause != nil {
		attrs = append(attrs, attrCause.String(errorType(0, c.Cause)))
	}
	rt.span.AddEvent(eventContinued, trace.WithAttributes(attrs...))
}

// spanBody ends the request span when the answer's body is read to its
// end, fails or is closed.
type spanBody struct {
	io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.end(err)
	}
	return n, err
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.end(nil)
	return err
}

func (b *spanBody) end(err error) {
	b.once.Do(func() {
		if err != nil && err != io.EOF {
			et := errorType(0, err)
			b.span.SetAttributes(semconv.ErrorTypeKey.String(et))
			b.span.SetStatus(codes.Error, et)
		}
		b.span.End()
	})
}

// errorType is error.type for an answer's status or an error: the status
// when it is 400 or more, a word for this package's errors, timeouts and
// cancellations, else the type of the cause (never a message, which may
// quote a URL); "" for neither.
func errorType(status int, err error) string {
	var ne net.Error
	switch {
	case err == nil && status >= 400:
		return strconv.Itoa(status)
	case err == nil:
		return ""
	case errors.Is(err, failover.ErrAttemptTimeout):
		return "attempt_timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, failover.ErrCircuitOpen):
		return "circuit_open"
	case errors.Is(err, failover.ErrRateLimited):
		return "rate_limited"
	case errors.Is(err, failover.ErrModelNotServed):
		return "model_not_served"
	case errors.Is(err, failover.ErrUnrouted):
		return "unrouted"
	}
	var ae *failover.AttemptError
	if errors.As(err, &ae) {
		err = ae.Err
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return semconv.ErrorType(err).Value.AsString()
}

// methodAttrs are http.request.method, and http.request.method_original
// for a method the conventions do not know.
func methodAttrs(m string) []attribute.KeyValue {
	switch m {
	case "":
		return []attribute.KeyValue{semconv.HTTPRequestMethodGet}
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace, http.MethodPatch:
		return []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(m)}
	}
	return []attribute.KeyValue{semconv.HTTPRequestMethodOther, semconv.HTTPRequestMethodOriginal(m)}
}

// spanName is the conventions' name of an HTTP client span without a
// URL template: the method, or HTTP for one they do not know.
func spanName(m string) string {
	if a := methodAttrs(m); a[0].Value.AsString() != "_OTHER" {
		return a[0].Value.AsString()
	}
	return "HTTP"
}

// bare is u without its query, fragment and user info.
func bare(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String()
}

// port is u's port, or its scheme's.
func port(u *url.URL) int {
	if p, err := strconv.Atoi(u.Port()); err == nil {
		return p
	}
	switch u.Scheme {
	case "https":
		return 443
	case "http":
		return 80
	}
	return 0
}
