package failover

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// SDK retries. The Stainless SDKs (openai-go, anthropic-sdk-go) retry a
// 408, 409, 429 or 5xx answer and every RoundTrip error, unless the
// answer says "X-Should-Retry: false". After the Transport failed over,
// such a retry would send the request round the upstreams again: one
// SDK retry multiplies every attempt. So the end of the request path
// (forSDK) marks such answers, and turns the Transport's own errors into
// answers for callers that send the Stainless headers.

// forSDK is RoundTrip's last step, unless Config.SDKRetries: an answer
// after more than one attempt, or after an upstream was skipped
// (retried), whose status an SDK retries, says X-Should-Retry: false;
// and for a Stainless SDK, an error the Transport made itself becomes an
// answer that says the same (errorAnswer).
func (t *Transport) forSDK(req *http.Request, resp *http.Response, err error, retried bool) (*http.Response, error) {
	if t.sdkRetries {
		return resp, err
	}
	if resp != nil {
		if retried && sdkRetries(resp.StatusCode) {
			if resp.Header == nil {
				resp.Header = http.Header{}
			}
			resp.Header.Set("X-Should-Retry", "false")
		}
		return resp, nil
	}
	if stainless(req) {
		if a := errorAnswer(req, err); a != nil {
			return a, nil
		}
	}
	return nil, err
}

// sdkRetries reports whether the Stainless SDKs retry an answer with
// status code.
func sdkRetries(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusConflict || code == http.StatusTooManyRequests || code >= 500
}

// stainless reports whether req comes from a Stainless SDK, which sends
// both headers with every request by default.
func stainless(req *http.Request) bool {
	return len(req.Header["X-Stainless-Lang"]) > 0 || len(req.Header["X-Stainless-Retry-Count"]) > 0
}

// errorAnswer is the answer that stands for err, which RoundTrip would
// return for req, when err is one the Transport made itself; nil
// otherwise. Its status says what err says: 502 when every upstream
// failed, 503 (with Retry-After when known) when every upstream was
// skipped as open or cooling down (or shed), 504 when the attempts timed out, 421
// for a request addressed to no upstream. Its body is a JSON error in
// the shape the SDKs read their message from (OpenAI's and Anthropic's
// "error" object), holding err's message, which names upstreams and
// never a credential.
func errorAnswer(req *http.Request, err error) *http.Response {
	var (
		status     int
		typ, code  string
		retryAfter time.Duration
		ferr       *Error
		uerr       *UnroutedError
	)
	switch {
	case errors.As(err, &uerr):
		status, typ, code = http.StatusMisdirectedRequest, "invalid_request_error", "failover_unrouted"
	case errors.As(err, &ferr):
		status = errorStatus(ferr)
		switch status {
		case http.StatusServiceUnavailable:
			typ, code, retryAfter = "api_error", "failover_unavailable", ferr.RetryAfter()
		case http.StatusGatewayTimeout:
			typ, code = "timeout_error", "failover_timeout"
		default:
			typ, code = "api_error", "failover_no_answer"
		}
	default:
		return nil
	}
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e.Type, e.Error.Type, e.Error.Code, e.Error.Message = "error", typ, code, err.Error()
	body, _ := json.Marshal(e) // strings only: it cannot fail
	h := http.Header{
		"Content-Type":   {"application/json"},
		"X-Should-Retry": {"false"},
	}
	if retryAfter > 0 {
		h["Retry-After"] = []string{strconv.FormatInt(int64((retryAfter+time.Second-1)/time.Second), 10)}
	}
	return &http.Response{
		Status:        strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req.WithContext(context.WithValue(req.Context(), answerErrorKey{}, err)),
	}
}

// errorStatus is the status of the answer that stands for e: 503 when
// every upstream was skipped as open, cooling down or short of headroom
// for a sheddable request, 504 when every
// attempt sent timed out, 502 otherwise.
func errorStatus(e *Error) int {
	var skipped, timedOut, other int
	for _, a := range e.Attempts {
		switch {
		case errors.Is(a, ErrCircuitOpen), errors.Is(a, ErrRateLimited), errors.Is(a, ErrShed):
			skipped++
		case timeout(a.Err):
			timedOut++
		default:
			other++
		}
	}
	switch {
	case other > 0:
		return http.StatusBadGateway
	case timedOut > 0:
		return http.StatusGatewayTimeout
	case skipped > 0:
		return http.StatusServiceUnavailable
	}
	return http.StatusBadGateway
}

// timeout reports whether err is an attempt that timed out.
func timeout(err error) bool {
	var nerr net.Error
	return errors.Is(err, ErrAttemptTimeout) || errors.Is(err, ErrFirstContentTimeout) || errors.Is(err, ErrFirstByteTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &nerr) && nerr.Timeout()
}

// answerErrorKey is the context key, in an answer's Request, of the error
// the answer stands for.
type answerErrorKey struct{}

// AnswerError returns the error that resp stands for, when the
// [Transport] answered a Stainless SDK's request (openai-go,
// anthropic-sdk-go) with resp instead of returning an [*Error] or an
// [*UnroutedError] (see [Config.SDKRetries]); nil for any other
// response. The SDK's error keeps resp as its Response, so that
// errors.As still finds the Transport's error.
func AnswerError(resp *http.Response) error {
	if resp == nil || resp.Request == nil {
		return nil
	}
	err, _ := resp.Request.Context().Value(answerErrorKey{}).(error)
	return err
}
