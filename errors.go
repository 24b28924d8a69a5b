package failover

import (
	"errors"
	"reflect"
	"strings"
	"time"
)

// Errors that RoundTrip returns, wrapped, when no upstream produced a
// response. Match them with errors.Is.
var (
	// ErrCircuitOpen means an upstream was skipped because its circuit
	// is open or its half-open probe is in flight.
	ErrCircuitOpen = errors.New("failover: circuit open")

	// ErrRateLimited means an upstream was skipped because it cools down
	// after a 429.
	ErrRateLimited = errors.New("failover: rate limited")

	// ErrAttemptTimeout means an upstream sent no response headers within
	// the attempt's bound: [Timeouts.Headers] for a streamed request,
	// [Timeouts.Attempt] for one that is not, or [WithAttemptTimeout]'s.
	ErrAttemptTimeout = errors.New("failover: attempt timed out")

	// ErrModelNotServed means an upstream was skipped because its
	// Upstream.Models does not map the model the request asks for.
	ErrModelNotServed = errors.New("failover: upstream does not serve the requested model")

	// ErrBodyNotReplayable means the request's body could not be sent
	// again (no GetBody and larger than [Config.MaxBodyBuffer]), so the
	// request's one attempt failed without failing over.
	ErrBodyNotReplayable = errors.New("failover: request body cannot be replayed")

	// ErrNoCredentials means an upstream refused a request (401, 403)
	// that reached it without credentials: its Upstream.Header sets
	// none, and the caller's were held back, being for the upstream the
	// caller addressed. Its refusal is not the caller's answer, and does
	// not count against its key ([AuthConfig]). Only under a Config.Base
	// that is nil or a plain *http.Transport is an upstream known to
	// have no credentials: any other Base may add them (oauth2, SigV4),
	// so there a 401 or 403 is AuthFailed as from any upstream.
	ErrNoCredentials = errors.New("failover: no credentials for this upstream")

	// ErrAuthorize means an upstream's [Authorizer] failed (returned an
	// error, or panicked), so nothing was sent there: the request went
	// on to the next upstream, blaming none. The error wraps the
	// Authorizer's too.
	ErrAuthorize = errors.New("failover: Authorizer failed")

	// ErrShed means a sheddable request ([WithSheddable]) was refused
	// at once, for the interactive requests to keep what capacity is
	// left: no upstream it may use took it (see [ShedConfig]). The
	// [*Error] matches it, and its RetryAfter says when capacity is
	// expected back, when known. An upstream passed over for shedding
	// has it as its [AttemptError]'s cause.
	ErrShed = errors.New("failover: request shed")

	// ErrBaseGoexit means that [Config.Base] called runtime.Goexit (as a
	// t.Fatal in a test's Base does) on a hedge's goroutine (see
	// [HedgeConfig]): the request ends, blaming no upstream.
	ErrBaseGoexit = errors.New("failover: Base ended its goroutine (runtime.Goexit)")
)

// RetryAfterError is implemented by errors that know when to come back:
// RetryAfter returns how long until the first skipped upstream can take a
// request again (0 when unknown).
type RetryAfterError interface {
	error
	RetryAfter() time.Duration
}

// unavailableError is an upstream skipped without sending it anything.
type unavailableError struct {
	err        error // ErrCircuitOpen or ErrRateLimited
	retryAfter time.Duration
}

func (e *unavailableError) Error() string {
	if e.retryAfter > 0 {
		return e.err.Error() + " (retry after " + e.retryAfter.Round(time.Millisecond).String() + ")"
	}
	return e.err.Error()
}

func (e *unavailableError) Unwrap() error             { return e.err }
func (e *unavailableError) RetryAfter() time.Duration { return e.retryAfter }

// AttemptError is what happened at one upstream: an attempt that got no
// response, or an upstream skipped. Err is the cause ([ErrCircuitOpen],
// [ErrRateLimited], [ErrAttemptTimeout], or Base's error as returned).
// Err's own message is not scrubbed of credentials; log the AttemptError,
// whose message is.
type AttemptError struct {
	Upstream string // the upstream's Name
	Err      error

	msg string // Err's message with every known secret scrubbed
}

// Error returns "upstream NAME: CAUSE", with every configured credential
// and every credential of the request scrubbed from CAUSE.
func (e *AttemptError) Error() string {
	msg := e.msg
	if msg == "" {
		msg = e.Err.Error()
	}
	return "upstream " + e.Upstream + ": " + msg
}

// Unwrap returns the cause.
func (e *AttemptError) Unwrap() error { return e.Err }

// RetryAfter returns how long until the upstream takes requests again, when
// it was skipped (0 otherwise).
func (e *AttemptError) RetryAfter() time.Duration {
	var ra RetryAfterError
	if errors.As(e.Err, &ra) {
		return ra.RetryAfter()
	}
	return 0
}

// Error is returned by [Transport.RoundTrip] when no upstream produced a
// response. It carries the cause of every attempt and every skipped
// upstream, in order, and the misconfigurations behind them, as [*AttemptError] values; errors.Is matches any of
// them (ErrCircuitOpen, ErrRateLimited, ErrAttemptTimeout, syscall errors,
// ...). It never contains a URL, a header value or a key.
type Error struct {
	Attempts []*AttemptError

	// Problems are the misconfigurations that failed the request, as
	// [UpstreamHealth.Problems] says them.
	Problems []string

	retry time.Duration
	shed  bool // a sheddable request refused (ErrShed)
}

// Error lists the attempts.
func (e *Error) Error() string {
	var b strings.Builder
	if e.shed {
		b.WriteString("failover: sheddable request refused")
	} else {
		b.WriteString("failover: no upstream answered")
	}
	for i, a := range e.Attempts {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(a.Error())
	}
	for _, p := range e.Problems {
		b.WriteString("; ")
		b.WriteString(p)
	}
	return b.String()
}

// Unwrap returns the attempts' errors, for errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	errs := make([]error, len(e.Attempts))
	for i, a := range e.Attempts {
		errs[i] = a
	}
	return errs
}

// Is reports whether target is [ErrShed] and e refused a sheddable
// request. (Unwrap matches the rest.)
func (e *Error) Is(target error) bool { return target == ErrShed && e.shed }

// RetryAfter returns how long until the first skipped upstream takes
// requests again, or 0 when no upstream was skipped or the time is unknown.
func (e *Error) RetryAfter() time.Duration { return e.retry }

// ConfigError is the error [New], [NewBreaker] and [NewRateLimiter] return
// for a configuration that can never work. Field names the field as a Go
// expression under Config ("Upstreams[1].BaseURL", "Breaker.Cooldown").
type ConfigError struct {
	Field  string
	Reason string
}

// Error returns "failover: Config.FIELD REASON".
func (e *ConfigError) Error() string { return "failover: Config." + e.Field + " " + e.Reason }

func configError(field, reason string) error { return &ConfigError{Field: field, Reason: reason} }

// nilValue reports whether v, an interface field's value, is non-nil but
// holds a nil pointer, func, map, chan or slice, such as
// (*http.Transport)(nil), which panics at its first request.
func nilValue(v any) bool {
	if v == nil {
		return false
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Chan, reflect.Slice, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
