#!/usr/bin/env bash
# bench/drill.sh: the outage drill on the machine as it is and beside CPU
# hogs (issue 12), RUNS drills each, interleaved, and one line per drill:
# the retention of the plain caller and of the failover caller, the trips
# (false ones), the drill's own scheduling lag, whether it called its
# machine starved, and, beside hogs, whether it meets issue 12's target
# (the failover caller keeps at least the plain caller's retention, and at
# least 99 %).
#
#   bench/drill.sh                          # 3 drills each of -hogs 0 and 2: about 3.5 minutes
#   HOGS="0 2 24" bench/drill.sh            # and 24 hogs: a starved 2-CPU machine
#   RUNS=5 ARGS="-router all" bench/drill.sh
#
# On an otherwise quiet 2-CPU machine (Linux 6.18), 2 hogs hardly starve
# the drill: the scheduler runs a thread that wakes soon, and the drill
# sleeps most of the time. 20 to 24 hogs starve it as the other jobs of
# issue 12 did; see -hogs in examples/drill/main.go.
#
# Each drill is, from the repository's root:
#
#   go run ./examples/drill -quiet -json -hogs H $ARGS
#
# run from a binary built once. -hogs starts H child processes, copies of
# the drill's binary spinning on one thread each, and ends them with the
# drill. Needs Go (1.26).
#
# Settings (environment):
#   RUNS   drills per hogs count (3)
#   HOGS   hogs counts, a drill of each in turn, so that drift in the
#          machine's load spreads over all alike ("0 2")
#   ARGS   more drill flags ("")
#   OUT    where the reports stay: drill-h<H>-<run>.json, .err (its stderr:
#          the warning of a starved machine) and .load (the 1-minute load
#          average before it) (a new temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
HOGS=${HOGS:-0 2}
ARGS=${ARGS:-}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/failover-drill.XXXXXX")}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

load() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || uptime | sed 's/.*load average[s]*: *//; s/,.*//'; }

go version
echo "os:    $(uname -srm), $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?') logical CPUs, load $(load)"
echo "repo:  $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- '*.go' 2>/dev/null || echo ' + uncommitted changes to .go files')"
echo "run:   RUNS=$RUNS HOGS=\"$HOGS\" ARGS=\"$ARGS\""

bin="$OUT/drill"
go build -o "$bin" ./examples/drill
for i in $(seq "$RUNS"); do
	for h in $HOGS; do
		name="$OUT/drill-h$h-$i"
		load >"$name.load"
		t0=$(date +%s)
		# shellcheck disable=SC2086 # ARGS is a list of flags
		"$bin" -quiet -json -hogs "$h" $ARGS >"$name.json" 2>"$name.err"
		echo "drill $i/$RUNS, -hogs $h: $(($(date +%s) - t0)) s (load $(cat "$name.load") before)"
	done
done

echo
files=()
for h in $HOGS; do
	for i in $(seq "$RUNS"); do files+=("$OUT/drill-h$h-$i.json"); done
done
go run bench/drilltargets.go "${files[@]}"
echo
echo "load $(load); reports in $OUT"
