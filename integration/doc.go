// Package integration holds no code: its tests and Examples put a
// failover.Transport under the real SDKs (openai-go, anthropic-sdk-go,
// go-openai), otelhttp and a go-vcr recorder, as users do, and read its
// metrics with Prometheus's own parser and linter (prometheus/common's
// expfmt, client_golang's promlint) and through a client_golang registry.
//
// The Examples are the place to start: Example_openai and
// Example_openaiRetries show openai-go's option.WithHTTPClient and why its
// own retries should be turned off under the Transport;
// Example_anthropic shows anthropic-sdk-go's X-Api-Key in Upstream.Header
// and its base URL without /v1; Example_anthropicStreamGuard shows
// Config.StreamGuard failing over a 200 stream that begins with
// overloaded_error; Example_openaiContinue and Example_anthropicContinue
// read one complete answer through a stream cut after its content began
// (Config.Continue); Example_otelhttp puts the upstream that answered on
// otelhttp's span through a failover.Trace.
//
// It is a module of its own (github.com/failover-go/failover/integration),
// so that those SDKs, go-vcr and the Prometheus client are dependencies of
// these tests only, never of a build that imports
// github.com/failover-go/failover. Its tests run
// from the repository's root, through the go.work there:
//
//	go test -race ./integration/...
package integration
