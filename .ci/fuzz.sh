#!/usr/bin/env bash
# CI: runs each fuzz target of the package for ${FUZZTIME:-10s}. go test
# -fuzz takes one target per run, so each gets its own. The seed corpus
# (f.Add and testdata/fuzz/<FuzzName>/) runs first; a failure writes the
# failing input to testdata/fuzz/<FuzzName>/ and fails the script after the
# other targets have run.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${FUZZTIME:-10s}
targets=$(go test -list '^Fuzz' . | grep '^Fuzz' || true)
if [ -z "$targets" ]; then
  echo "no fuzz targets found"; exit 1
fi

failed=()
for target in $targets; do
  echo "== $target ($fuzztime)"
  if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" .; then
    failed+=("$target")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets failed: ${failed[*]}"
  exit 1
fi
