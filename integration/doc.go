// Package integration holds no code: its tests put a failover.Transport
// under the real SDKs (openai-go, go-openai) and a go-vcr recorder, as
// users do, and read its metrics with Prometheus's own parser and linter
// (prometheus/common's expfmt, client_golang's promlint) and through a
// client_golang registry.
//
// It is a module of its own (github.com/failover-go/failover/integration),
// so that those SDKs, go-vcr and the Prometheus client are dependencies of
// these tests only, never of a build that imports
// github.com/failover-go/failover. Its tests run
// from the repository's root, through the go.work there:
//
//	go test -race ./integration/...
package integration
