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
	// [Config.AttemptTimeout].
	ErrAttemptTimeout = errors.New("failover: attempt timed out")

	// ErrModelNotServed means an upstream was skipped because its
	// Upstream.Models does not map the model the request asks for.
	ErrModelNotServed = errors.New("failover: upstream does not serve the requested model")

	// ErrBodyNotReplayable means the request's body could not be sent
	// again (no GetBody and larger than [Config.MaxBodyBuffer]), so the
	// request had one attempt, and that attempt failed in a way that would
	// otherwise have moved on to the next upstream.
	ErrBodyNotReplayable = errors.New("failover: request body cannot be replayed")

	// ErrBaseGoexit means that [Config.Base] ended the goroutine that
	// called it (runtime.Goexit, as a t.Fatal in a test's Base does)
	// during a hedge (see [HedgeConfig]): the request ends with it,
	// blaming no upstream. When the goroutine Base ends is the caller's,
	// RoundTrip does not return, as without hedging, and the rest of
	// the round ends without waiting for that attempt.
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
// response, or an upstream skipped. Err wraps the cause ([ErrCircuitOpen],
// [ErrRateLimited], [ErrAttemptTimeout], or the transport's error).
//
// Err is the cause as Base returned it, for errors.Is and errors.As, and
// its own message is not scrubbed: a Base of the caller's that quotes the
// URL it was sent (with a key in its query) quotes it there. Log the
// AttemptError (or the [Error] that holds it), whose message is scrubbed,
// rather than Err.
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
// upstream, in order, as [*AttemptError] values; errors.Is matches any of
// them (ErrCircuitOpen, ErrRateLimited, ErrAttemptTimeout, syscall errors,
// ...). It never contains a URL, a header value or a key.
type Error struct {
	Attempts []*AttemptError
	retry    time.Duration
}

// Error lists the attempts.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("failover: no upstream answered")
	for i, a := range e.Attempts {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(a.Error())
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

// nilValue reports whether v, the value of an interface field, is a nil
// pointer, func, map, chan or slice: an interface that is not nil, whose
// methods would find nil ((*http.Transport)(nil) panics at its first
// request).
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
