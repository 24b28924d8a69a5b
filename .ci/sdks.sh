#!/usr/bin/env bash
# CI: the Examples hold against each SDK's newest release. In a temporary
# copy of the integration module (workspace off, the root module replaced
# by this checkout or the directory given as $1), go get moves
# anthropic-sdk-go/v2, openai-go/v3 and go-openai to the latest version of
# the major that the module requires, as a user's
# `go get github.com/anthropics/anthropic-sdk-go/v2@latest` would; then
# go vet compiles every test and Example there, and go test runs the
# Examples. An SDK release that removes or changes what an Example uses
# (anthropic-sdk-go v2.18.0 removed ModelClaudeSonnet4_5) fails here
# rather than in a user's build. The repository is left unchanged. Asking
# for latest needs the Go module proxy; modules already in the module
# cache are not downloaded again. It also says when an SDK has published
# a next major, which this check does not follow by itself.
set -euo pipefail

repo=$(cd "${1:-$(dirname "$0")/..}" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/failover-sdks.XXXXXX")
trap 'rc=$?; rm -rf "$dir"; [ $rc -eq 0 ] || echo "sdks: FAIL: see the output above"' EXIT
export GOWORK=off

cp -R "$repo/integration" "$dir/integration"
cd "$dir/integration"
go mod edit -replace=github.com/failover-go/failover="$repo"

# Each SDK as the module requires it (its current major), and the path of
# the next major, for the notice.
sdks=(
  "github.com/anthropics/anthropic-sdk-go/v2 github.com/anthropics/anthropic-sdk-go/v3"
  "github.com/openai/openai-go/v3 github.com/openai/openai-go/v4"
  "github.com/sashabaranov/go-openai github.com/sashabaranov/go-openai/v2"
)
get=()
for s in "${sdks[@]}"; do
  read -r mod next <<<"$s"
  pinned=$(go list -m -f '{{.Version}}' "$mod")
  latest=$(go list -m -f '{{.Version}}' "$mod@latest")
  echo "sdks: $mod: integration/go.mod has $pinned, the latest is $latest"
  get+=("$mod@$latest")
  if v=$(go list -m -f '{{.Version}}' "$next@latest" 2>/dev/null); then
    echo "sdks: NOTE: $next $v is out; the Examples still use $mod"
  fi
done
go get "${get[@]}"
go mod tidy
go vet ./...
go test -count=1 -run 'Example' ./...
echo "sdks: ok: the Examples build and pass against ${get[*]}"
