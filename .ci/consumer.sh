#!/usr/bin/env bash
# CI: proves the module boundary. A throwaway consumer module (go 1.25.0,
# built with whatever Go GOTOOLCHAIN names) in a temporary directory, with
# the workspace off, imports only the root package and openai-go, pinned
# at v3.8.1; it requires github.com/failover-go/failover through a replace
# to this checkout (or to the directory given as $1). After
# go mod tidy and go build, it fails unless its build list holds none of the
# nested modules' dependencies (gonum/plot, go-redis, go-openai,
# anthropic-sdk-go, go-vcr, OpenTelemetry, the Prometheus client and its
# parser) and openai-go is still v3.8.1. It prints the size of the
# consumer's build list and go.sum; before the nested modules (b8130f4),
# the same consumer had 72 modules and 70 go.sum lines, and openai-go
# moved to v3.98.0.
set -euo pipefail

repo=$(cd "${1:-$(dirname "$0")/..}" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/failover-consumer.XXXXXX")
trap 'rm -rf "$dir"' EXIT
export GOWORK=off

cat >"$dir/go.mod" <<MOD
module example.com/consumer

go 1.25.0

require (
	github.com/failover-go/failover v0.0.0-00010101000000-000000000000
	github.com/openai/openai-go/v3 v3.8.1
)

replace github.com/failover-go/failover => $repo
MOD
cat >"$dir/main.go" <<'GO'
package main

import (
	"net/http"

	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func main() {
	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "openai", BaseURL: "https://api.openai.com/v1"},
	}})
	if err != nil {
		panic(err)
	}
	_ = openai.NewClient(option.WithHTTPClient(&http.Client{Transport: t}))
}
GO

cd "$dir"
go mod tidy
go build -o /dev/null .
modules=$(go list -m all)
echo "consumer: $(echo "$modules" | wc -l) modules in go list -m all, $(wc -l <go.sum) lines in go.sum"

failed=0
for m in gonum.org/v1/plot github.com/redis/go-redis github.com/sashabaranov/go-openai github.com/anthropics/anthropic-sdk-go gopkg.in/dnaeon/go-vcr go.opentelemetry.io/ github.com/prometheus/; do
  if found=$(echo "$modules" | grep -F "$m"); then
    echo "consumer: the build list has $found, which only a nested module needs"
    failed=1
  fi
done
openai=$(go list -m -f '{{.Version}}' github.com/openai/openai-go/v3)
if [ "$openai" != v3.8.1 ]; then
  echo "consumer: go mod tidy moved openai-go from v3.8.1 to $openai"
  failed=1
fi
if [ "$failed" -ne 0 ]; then
  echo "consumer: FAIL: a user of the root package gets what only the nested modules need"
  exit 1
fi
echo "consumer: ok (openai-go still $openai; no plot, go-redis, go-openai, anthropic-sdk-go, go-vcr, OpenTelemetry or prometheus)"
