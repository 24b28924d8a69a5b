#!/usr/bin/env bash
# bench/run.sh: what the hot path costs, side by side with a bare
# http.Transport, failsafehttp and go-retryablehttp, in one run (issue 5).
#
#   bench/run.sh                          # 8 to 9 minutes on 2 cores
#   COUNT=10 BENCHTIME=1s bench/run.sh    # tighter figures, slower
#   BENCH=BenchmarkRoundTrip CALLGRIND=0 bench/run.sh
#
# Needs Go (1.26) and the Go module proxy (benchstat comes from it, and is
# installed into a temporary GOBIN); valgrind for the instruction counts,
# which are skipped, saying so, without it.
#
# Settings (environment):
#   COUNT      runs of every benchmark (6); the runs are interleaved, so that
#              drift on the machine spreads over all variants alike
#   BENCHTIME  -benchtime of each run (500ms)
#   CPU        -cpu list (1,2)
#   BENCH      -bench pattern (.)
#   OUT        where the results stay: bench.txt, benchstat.txt,
#              callgrind.txt (a new temporary directory)
#   MEMTEST    0 skips the memory test (1,000,000 requests, a few seconds)
#   CALLGRIND  0 skips the instruction counts
#   CG_IMPLS   impls of BenchmarkRoundTrip to count instructions of
#              ("bare floor failover failsafehttp retryablehttp")
#   CG_DECISION  impls of BenchmarkDecision to count instructions of
#              ("floor sketch sketch_full failover"; impl=floor is the
#              least a credential-swapping wrapper does, the floor of
#              issue 15; impl=sketch the floor with the package's
#              per-request steps in their least form; impl=sketch_full
#              the sketch with every feature's check on the path too)
#   CG_REPS    callgrind measures per impl, the median is kept (3)
#   CG_N1 CG_N2  the two -benchtime counts whose difference is measured
#              (1000 and 3000)
set -euo pipefail
cd "$(dirname "$0")/.."

COUNT=${COUNT:-6}
BENCHTIME=${BENCHTIME:-500ms}
CPU=${CPU:-1,2}
BENCH=${BENCH:-.}
MEMTEST=${MEMTEST:-1}
CALLGRIND=${CALLGRIND:-1}
CG_IMPLS=${CG_IMPLS:-bare floor failover failsafehttp retryablehttp}
CG_DECISION=${CG_DECISION:-floor sketch sketch_full failover}
CG_REPS=${CG_REPS:-3}
CG_N1=${CG_N1:-1000}
CG_N2=${CG_N2:-3000}

work=$(mktemp -d "${TMPDIR:-/tmp}/failover-bench-work.XXXXXX")
trap 'rm -rf "$work"' EXIT
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/failover-bench.XXXXXX")}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
start=$(date +%s)

section() { printf '\n== %s (at %d s)\n' "$*" $(($(date +%s) - start)); }

section "machine"
go version
echo "os:    $(uname -srm)"
cpu_model=$( (grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//') || true)
[ -n "$cpu_model" ] || cpu_model=$(sysctl -n machdep.cpu.brand_string 2>/dev/null || echo unknown)
echo "cpu:   $cpu_model, $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?') logical CPUs"
echo "run:   COUNT=$COUNT BENCHTIME=$BENCHTIME CPU=$CPU BENCH=$BENCH"
# Wall time needs an idle machine; allocations and instruction counts do not.
load() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || uptime | sed 's/.*load average[s]*: *//; s/,.*//'; }
busy() { awk -v l="$(load)" -v n="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)" 'BEGIN {exit !(l + 0 > n / 2)}'; }
echo "load:  $(load) (1-minute load average)"
if busy; then
	echo "       warning: the machine is busy; time/op figures will be noisy (allocs/op, B/op and instruction counts are not affected)"
fi
echo "repo:  $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- '*.go' 2>/dev/null || echo ' + uncommitted changes to .go files')"

section "installing benchstat (golang.org/x/perf/cmd/benchstat@latest)"
mkdir -p "$work/bin"
# Outside the module, so that its go.mod is neither read nor changed.
(cd "$work" && GOBIN="$work/bin" GOFLAGS= go install golang.org/x/perf/cmd/benchstat@latest)
benchstat="$work/bin/benchstat"
echo "ok"

section "building the test binary"
bin="$work/failover.test"
go test -c -o "$bin" .
echo "ok"

section "benchmarks: $COUNT interleaved runs of -bench '$BENCH' -benchmem -cpu $CPU -benchtime $BENCHTIME"
: >"$OUT/bench.txt"
for i in $(seq "$COUNT"); do
	t0=$(date +%s)
	"$bin" -test.run '^$' -test.bench "$BENCH" -test.benchmem -test.count 1 \
		-test.cpu "$CPU" -test.benchtime "$BENCHTIME" -test.timeout 30m >"$work/run.txt"
	cat "$work/run.txt" >>"$OUT/bench.txt"
	echo "run $i/$COUNT: $(grep -c '^Benchmark' "$work/run.txt") results in $(($(date +%s) - t0)) s"
done

section "benchstat"
{
	echo "-- Healthy path end to end, ratios to bare (impl=failover: one upstream with its own Authorization, the caller setting its own)"
	"$benchstat" -filter '.name:RoundTrip' -col '/impl@(bare floor failover failover_2up failsafehttp retryablehttp)' "$OUT/bench.txt"
	echo
	echo "-- Decision path, no I/O (Base answers at once; impl=canned is the Base alone, impl=floor the least credential-swapping wrapper)"
	"$benchstat" -filter '.name:Decision' -col '/impl@(canned floor failover failover_2up failover_2up_hedged)' "$OUT/bench.txt"
	echo
	echo "-- Scale: 1, 8 and 64 upstreams under the default order, each Router and an unfired Hedge (mode=serial)"
	"$benchstat" -filter '.name:Scale /mode:serial' -row /router -col /upstreams "$OUT/bench.txt"
	echo
	echo "-- Contention: parallelism 1, 16 and 256 per CPU, -cpu 2 against -cpu 1"
	"$benchstat" -filter '.name:Contention' -col /gomaxprocs "$OUT/bench.txt"
	echo
	echo "-- Decision path, -cpu 2 against -cpu 1 (the first column, unnamed, is -cpu 1)"
	"$benchstat" -filter '.name:Decision -/impl:canned' -col /gomaxprocs "$OUT/bench.txt"
	echo
	echo "-- Failover cost, ratios to case=direct (the same request straight to the backup)"
	"$benchstat" -filter '.name:Failover' -col '/case@(direct refused open 429 429_each dial_refused)' "$OUT/bench.txt"
} 2>&1 | tee "$OUT/benchstat.txt"

section "memory: heap in use after 1,000,000 decision-path requests vs after 10,000"
if [ "$MEMTEST" = 0 ]; then
	echo "skipped (MEMTEST=0)"
else
	FAILOVER_MEMTEST=1 "$bin" -test.run '^TestDecisionPathMemory$' -test.v -test.count 1 | grep -v '^=== RUN' || true
fi

# callgrind_table BENCH IMPLS BASE OUTFILE: for each impl of benchmark
# BENCH (mode=serial, -cpu 1, GOMAXPROCS=1), the instructions per request
# as (instructions at CG_N2 requests - at CG_N1) / (CG_N2 - CG_N1), CG_REPS
# times; prints each impl's median, its ratio to impl BASE and every
# measure, and appends "impl median" lines to OUTFILE.
# GODEBUG=asyncpreemptoff=1: callgrind asserts on the signals that Go uses
# to preempt goroutines.
callgrind_table() {
	local bench=$1 impls=$2 base=$3 outfile=$4 all="$work/callgrind.$1.all"
	: >"$all"
	for impl in $impls; do
		local per=()
		for rep in $(seq "$CG_REPS"); do
			local totals=()
			for n in "$CG_N1" "$CG_N2"; do
				local f="$work/callgrind.$bench.$impl.$n.$rep"
				GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 valgrind --tool=callgrind --callgrind-out-file="$f" \
					"$bin" -test.run '^$' -test.bench "^$bench\$/^impl=$impl\$/^mode=serial\$" \
					-test.benchtime "${n}x" -test.cpu 1 >"$f.log" 2>&1 || true
				totals+=("$(awk '/^totals:/ {print $2}' "$f" 2>/dev/null)")
			done
			if [ -z "${totals[0]}" ] || [ -z "${totals[1]}" ]; then
				echo "impl=$impl: valgrind failed; the end of its log:"
				tail -20 "$f.log"
				continue
			fi
			per+=($(((totals[1] - totals[0]) / (CG_N2 - CG_N1))))
		done
		[ "${#per[@]}" -gt 0 ] || continue
		local med
		med=$(printf '%s\n' "${per[@]}" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
		echo "$impl $med ${per[*]}" >>"$all"
		echo "$impl $med" >>"$outfile"
	done
	awk -v b="$base" 'NR == FNR { if ($1 == b) base = $2; next }
		FNR == 1 { printf "%-16s %14s %14s   %s\n", "impl", "instr/request", "ratio to " b, "each measure" }
		{ all = ""; for (i = 3; i <= NF; i++) all = all " " $i
		  printf "%-16s %14d %14s  %s\n", $1, $2, base ? sprintf("%.3fx", $2 / base) : "-", all }' \
		"$all" "$all" 2>/dev/null || echo "no measure succeeded"
}

section "instructions per request (callgrind; client and in-process server together)"
: >"$OUT/callgrind.txt"
: >"$OUT/callgrind-decision.txt"
if [ "$CALLGRIND" = 0 ]; then
	echo "skipped (CALLGRIND=0)"
elif ! command -v valgrind >/dev/null 2>&1; then
	echo "skipped: valgrind is not installed (apt-get install valgrind, or brew install valgrind, then rerun)"
else
	echo "BenchmarkRoundTrip/impl=.../mode=serial at -cpu 1, GOMAXPROCS=1; (instructions at ${CG_N2}x - at ${CG_N1}x) / $((CG_N2 - CG_N1)); median of $CG_REPS"
	echo "(under valgrind a request takes ~50x longer, so work done on a wall-clock period, e.g. every 250 ms, counts ~50x more per request than it costs natively)"
	callgrind_table BenchmarkRoundTrip "$CG_IMPLS" bare "$OUT/callgrind.txt"
fi

section "instructions per decision-path request (callgrind), against impl=floor"
if [ "$CALLGRIND" = 0 ] || ! command -v valgrind >/dev/null 2>&1; then
	echo "skipped (CALLGRIND=0 or no valgrind)"
else
	echo "BenchmarkDecision/impl=.../mode=serial, as above; the ratio is to impl=floor"
	callgrind_table BenchmarkDecision "$CG_DECISION" floor "$OUT/callgrind-decision.txt"
fi

section "targets of issues 5 and 15 (medians)"
go run bench/targets.go "$OUT/bench.txt" "$OUT/callgrind.txt" "$OUT/callgrind-decision.txt"

section "done in $(($(date +%s) - start)) s; load $(load); results in $OUT"
