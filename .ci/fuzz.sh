#!/usr/bin/env bash
# CI: runs each fuzz target for ${FUZZTIME:-10s}, in every package of every
# module of the workspace whose tests declare one (the root package and
# internal/ratelimit and internal/sse). go test -fuzz takes one target per
# run, so each gets its own.
# The seed corpus (f.Add and testdata/fuzz/<FuzzName>/) runs first; a
# failure writes the failing input to the package's testdata/fuzz/<FuzzName>/
# and fails the script after the other targets have run.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${FUZZTIME:-10s}
# The directories whose tests declare a fuzz target; go test -list then
# names the targets of each.
dirs=$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u)
targets=()
for dir in $dirs; do
  for target in $(go test -list '^Fuzz' "$dir" | grep '^Fuzz' || true); do
    targets+=("$dir:$target")
  done
done
if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz targets found"; exit 1
fi

# fuzz runs one target of the package in dir, and reruns it when it failed
# the way Go 1.26's fuzzing coordinator fails at the end of -fuzztime under
# CPU contention: "context deadline exceeded" and no failing input written
# (golang/go#75804, fixed in Go 1.27), up to twice. A real finding always
# writes one.
fuzz() {
  local dir=$1 target=$2 log
  log=$(mktemp)
  for attempt in 1 2 3; do
    if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$dir" 2>&1 | tee "$log"; then
      rm -f "$log"; return 0
    fi
    if ! grep -q 'context deadline exceeded' "$log" || grep -q 'Failing input written' "$log"; then
      break
    fi
    echo "== $target: the fuzzing coordinator's deadline race (golang/go#75804), no failing input; once more"
  done
  rm -f "$log"
  return 1
}

failed=()
for t in "${targets[@]}"; do
  dir=${t%%:*} target=${t#*:}
  echo "== $target in $dir ($fuzztime)"
  if ! fuzz "$dir" "$target"; then
    failed+=("$target in $dir")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets failed: ${failed[*]}"
  exit 1
fi
