package failover

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"github.com/hashicorp/go-retryablehttp"
)

// Outcome is the verdict of a [Classifier] on one attempt: what it says of
// the upstream, and what the [Transport] does next.
type Outcome int

const (
	// Success is a response the upstream served (2xx, 3xx). It counts as
	// healthy and ends the request.
	Success Outcome = iota

	// Rejected is the caller's own error: a 4xx other than 401, 403, 408,
	// 429 and the [Unservable] ones, a provider's content-policy refusal,
	// or a request no upstream could send (an invalid header). Another
	// upstream would answer the same, or should not be asked, so there is
	// no failover; a response counts as healthy.
	Rejected

	// AuthFailed is a 401 or 403: the upstream's key is wrong or revoked.
	// It never counts toward the breaker; the next upstream, which has
	// its own key, is tried.
	AuthFailed

	// RateLimited is a 429. It never counts toward the breaker; the
	// upstream cools down (see [RateLimitConfig]) and the next upstream is
	// tried at once.
	RateLimited

	// Failed is an upstream failure: 408, 5xx (529 included), a transport
	// error or an attempt timeout. It counts toward the breaker and the
	// next upstream is tried.
	Failed

	// Canceled is the caller's context being canceled or past its
	// deadline. Nothing is counted against the upstream and nothing more
	// is tried.
	Canceled

	// Unservable is an answer that says this upstream cannot serve this
	// request while another may, such as a prompt too long for its model.
	// It never counts toward the breaker and the next upstream is tried at
	// once; when none is left, the caller gets the last such answer as it
	// came.
	Unservable
)

var outcomeNames = [...]string{
	Success:     "success",
	Rejected:    "rejected",
	AuthFailed:  "auth_failed",
	RateLimited: "rate_limited",
	Failed:      "failed",
	Canceled:    "canceled",
	Unservable:  "unservable",
}

// String returns the outcome's name as it appears in metrics and health
// output: "success", "rejected", "auth_failed", "rate_limited", "failed",
// "canceled" or "unservable".
func (o Outcome) String() string {
	if o < 0 || int(o) >= len(outcomeNames) {
		return "unknown"
	}
	return outcomeNames[o]
}

// MarshalText encodes the outcome as its [Outcome.String] name.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// A Classifier judges one attempt from its response, or from the error when
// no response was obtained (resp is nil then). It must not read or close
// the response body; for a 400, 403 or 413, [BodyPrefix] gives it the
// body's first bytes. [DefaultClassifier] is used when [Config.Classify] is
// nil; a custom classifier usually handles a few cases and defers to it for
// the rest. An Outcome that is none of those defined counts as
// DefaultClassifier's verdict.
//
// The Transport decides [Canceled] itself when the caller's context is
// done, before calling the classifier, so an error that wraps a context
// error is the upstream's (a dial or header timeout).
type Classifier func(resp *http.Response, err error) Outcome

// checkedClassifier returns c, or DefaultClassifier for a nil c; a c of
// the caller's is wrapped so that an undefined Outcome, which would index
// past the metrics' arrays, counts as DefaultClassifier's.
func checkedClassifier(c Classifier) Classifier {
	if c == nil {
		return DefaultClassifier
	}
	return func(resp *http.Response, err error) Outcome {
		if o := c(resp, err); o >= Success && o <= Unservable {
			return o
		}
		return DefaultClassifier(resp, err)
	}
}

// failingOverContentPolicy returns c, except that an answer c judges
// [Rejected] which is a content-policy refusal ([DefaultClassifier]) is
// [Unservable] (Config.FailoverContentPolicy).
func failingOverContentPolicy(c Classifier) Classifier {
	return func(resp *http.Response, err error) Outcome {
		o := c(resp, err)
		if o == Rejected && resp != nil && contentRefused(resp) {
			return Unservable
		}
		return o
	}
}

// DefaultClassifier classifies as providers of LLM APIs behave:
//
//   - 2xx, 3xx: [Success].
//   - 401, 403: [AuthFailed].
//   - 429, and 402 (the account's credits are spent: OpenRouter,
//     DeepSeek): [RateLimited]; a 402 cools its upstream, or its key, down
//     for RateLimit.MaxCooldown, as an exhausted quota does.
//   - 408, 5xx (529 "overloaded" included): [Failed].
//   - 400 and 413 whose body ([BodyPrefix]) says, in the words of
//     OpenAI, Azure, Anthropic, Gemini, DeepSeek, Mistral, Groq,
//     OpenRouter, vLLM or LiteLLM, that the prompt is too long for the
//     model: [Unservable], for a larger model elsewhere.
//   - 400 and 403 whose body says, in the words of OpenAI, Azure,
//     Anthropic, OpenRouter or LiteLLM, that the provider's content
//     policy refused the request: [Rejected], the caller's answer, which
//     another provider must not overrule (see
//     [Config.FailoverContentPolicy]).
//   - any other 4xx: [Rejected]. Without a BodyPrefix (a [Breaker], a
//     probe), the two above are judged by their status alone.
//   - an error no retry can fix (go-retryablehttp's policy): [Failed] for
//     an untrusted certificate, [Rejected] otherwise (an invalid header).
//   - any other error (refused, reset, TLS, EOF, a malformed answer,
//     timeouts, [ErrAttemptTimeout]): [Failed].
//
// It never returns [Canceled]: the Transport and [Breaker] decide that
// from the caller's context before they classify.
func DefaultClassifier(resp *http.Response, err error) Outcome {
	if err != nil {
		switch {
		case errors.Is(err, ErrAttemptTimeout):
			return Failed
		case permanent(err):
			if certError(err) {
				return Failed
			}
			return Rejected
		}
		return Failed
	}
	switch code := resp.StatusCode; {
	case code < 400:
		return Success
	case code == http.StatusForbidden && contentRefused(resp):
		return Rejected // OpenRouter's moderation
	case code == http.StatusUnauthorized, code == http.StatusForbidden:
		return AuthFailed
	case code == http.StatusTooManyRequests, code == http.StatusPaymentRequired:
		return RateLimited // 402: the account's credits are spent (OpenRouter, DeepSeek)
	case code == http.StatusRequestTimeout, code >= 500:
		return Failed
	case contextTooLong(resp):
		return Unservable
	}
	return Rejected
}

// permanent reports whether go-retryablehttp's retry policy judges err to be
// one that retrying cannot fix: invalid headers, unsupported schemes,
// redirect loops, untrusted certificates. The policy reads *url.Error, which
// http.Client adds and a RoundTripper never sees, so err is wrapped first.
func permanent(err error) bool {
	var oerr *net.OpError
	if errors.As(err, &oerr) {
		return false // dial, read, write: retrying can fix these
	}
	if malformedAnswer(err) {
		return false // the upstream's answer: another upstream's may be well formed
	}
	retry, _ := retryablehttp.ErrorPropagatedRetryPolicy(context.Background(), nil, &url.Error{Op: "", URL: "", Err: err})
	return !retry
}

// malformedAnswer reports whether err is net/http's refusal of what the
// upstream sent (a textproto.ProtocolError, an HTTP/2 stream error), whose
// message quotes the upstream's bytes ("invalid header field name ..."),
// which the retry policy would read as the request's own invalid header.
func malformedAnswer(err error) bool {
	var perr textproto.ProtocolError
	return errors.As(err, &perr) || strings.Contains(err.Error(), "stream error: stream ID ")
}

// certError reports whether err comes from verifying the server's
// certificate.
func certError(err error) bool {
	var (
		verr *tls.CertificateVerificationError
		uerr x509.UnknownAuthorityError
		herr x509.HostnameError
		cerr x509.CertificateInvalidError
	)
	return errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &cerr)
}
