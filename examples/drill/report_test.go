package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// fakeReport returns the report of a 30 s drill at 1000 req/s whose runs
// are named names after the plain one, each with its figures set to the
// widest the drill prints: every phase and upstream, breaker and spend
// rows, a lag with its warning, and with fleet > 0 the fleet rows.
// Run i keeps retention[i] of its requests.
func fakeReport(fleet int, retention []float64, names ...string) *report {
	const n = 30000
	rep := &report{DurationS: 30, RPS: 1000, Timescale: 0.05, CallerTimeoutS: 1.5, AttemptTimeoutS: 0.138, BreakerCooldownS: 1.5,
		HangMultiple: 1, HangFloorS: 0.005, BreakerThreshold: 5, PrimaryBreakerThreshold: 3, PrimaryBreakerCooldownS: 0.75,
		Hogs: 24, CPUs: 2, GOMAXPROCS: 2, Plot: "/tmp/failover-drill.png"}
	if fleet > 0 {
		rep.Fleet, rep.Redis, rep.RedisStarted, rep.SharedSyncS = fleet, "127.0.0.1:40123", true, 0.1
	}
	for i, p := range profiles {
		rep.Upstreams = append(rep.Upstreams, upstreamInfo{Name: p.name, Kind: p.kind, P50S: 0.017, P99S: 0.046, Success: 0.9971 - float64(i)/1000})
	}
	sch, lag := ptr(0.0001), &lagReport{IntervalS: 0.002, Samples: 11647, P50S: 0.0005, P99S: 0.0024, MaxS: 0.236, StallS: 0.035, Stalls: 20,
		StalledS: 1.6, StalledShare: 0.053, LongStallS: 0.069, LongStalls: 9, Starved: true,
		Warning: strings.Repeat("this machine was too starved of CPU for the drill's figures to mean much, ", 6)}
	lag.SchedP50S, lag.SchedP99S = sch, sch
	rep.Lag = lag
	for _, p := range script(30 * time.Second) {
		rep.Phases = append(rep.Phases, phaseInfo{Name: p.name, Fault: p.fault != healthy, StartS: p.start.Seconds(), EndS: p.end.Seconds()})
		lag.Phases = append(lag.Phases, lagPhase{Name: p.name, P99S: 0.0331, MaxS: 0.236, Stalls: 10, LongStalls: 4})
	}
	for i, name := range append([]string{"plain"}, names...) {
		ok := int(retention[i] * n)
		r := runReport{Name: name, Requests: n, Successes: ok, Retention: float64(ok) / n}
		r.Latency.P50, r.Latency.P95, r.Latency.P99 = 0.018, 1.5, 1.6612
		r.HangPhase = hangResult{PrimaryAttempts: 4000, P99S: 1.85, WarmUpP99S: 0.116}
		for _, p := range rep.Phases {
			pr := phaseResult{Name: p.Name, Requests: 4000, Successes: 3996, SuccessRate: 0.999, PrimaryAttempts: 4000}
			if i > 0 && p.Fault {
				pr.BeforeOpen = ptr(1234)
			}
			r.Phases = append(r.Phases, pr)
		}
		for _, u := range rep.Upstreams {
			r.PerUpstream = append(r.PerUpstream, upstreamCount{Name: u.Name, Attempts: 29999, Answers: 29999, Tokens: 389987, Spend: 0.000082})
		}
		if i > 0 {
			r.DetectionS, r.RecoveryS, r.Trips, r.FalseTrips = ptr(0.024), ptr(0.081), ptr(12), ptr(10)
			r.HangPhase.CircuitAtStart, r.HangPhase.BeforeOpen = "closed 7, half-open 2, open 1", ptr(1234)
			for _, u := range rep.Upstreams {
				r.Breakers = append(r.Breakers, breakerReport{Name: u.Name, FailureThreshold: 5, CooldownS: 1.5, Trips: 12})
			}
			r.Hedges = &hedgeCounts{Sent: 3000, Won: 2999, Denied: 29999}
			rep.HedgeDelayS = 0.035
		}
		if i > 0 && fleet > 0 {
			r.Fleet = &fleetResult{Members: fleet, Opened: fleet - 1, FirstOpenS: ptr(0.012), FailedBeforeStop: 2345, ProbesPerCooldown: ptr(12.5), Recovered: fleet - 3, SharedErrors: ptr(uint64(1234))}
		}
		rep.Runs = append(rep.Runs, r)
	}
	return rep
}

// checkWidth fails t for each line of out wider than lineWidth columns.
func checkWidth(t *testing.T, out string) {
	t.Helper()
	for i, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > lineWidth {
			t.Errorf("line %d is %d columns wide, want at most %d:\n%s", i+1, n, lineWidth, line)
		}
	}
}

// TestTableFitsTerminal checks that every line of the table fits a
// terminal of lineWidth columns, with figures as wide as a long drill
// makes them, for the default drill, every routing policy and a hedged
// run, and fleets; that every run's column is still there (the table
// splits its columns into blocks); and that it ends with the summary and
// the picture's path.
func TestTableFitsTerminal(t *testing.T) {
	for _, tc := range []struct {
		fleet int
		names []string
	}{
		{0, []string{"failover"}},
		{0, []string{"failover (priority)", "failover (weighted)", "failover (leastlatency)", "failover (score)", "failover (priority+hedge)"}},
		{100, []string{"fleet, sharing off", "fleet, sharing on"}},
	} {
		retention := []float64{0.4988, 0.986, 0.9, 0.8, 0.7, 0.6}
		rep := fakeReport(tc.fleet, retention, tc.names...)
		var b strings.Builder
		if err := writeTable(&b, rep); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		checkWidth(t, out)
		if !strings.Contains(strings.Join(strings.Fields(out), " "), summary(rep)) {
			t.Errorf("%v: the table does not have the summary %q:\n%s", tc.names, summary(rep), out)
		}
		for _, name := range tc.names {
			if !strings.Contains(out, name) {
				t.Errorf("%v: the table has no column %q:\n%s", tc.names, name, out)
			}
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if last := lines[len(lines)-1]; !strings.HasPrefix(last, "Picture: /tmp/failover-drill.png") {
			t.Errorf("%v: the table's last line is %q, want the picture's path", tc.names, last)
		}
		if i := strings.LastIndex(out, "In short: with "); i < strings.LastIndex(out, "p99 at provider scale") {
			t.Errorf("%v: no summary after the figures:\n%s", tc.names, out)
		}
		if testing.Verbose() {
			t.Logf("%v:\n%s", tc.names, out)
		}
	}
}

// TestSummary checks that the summary's figures are the report's: the
// share of requests each run had answered, its p99, and the time the
// primary failed, which change with the report.
func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		retention []float64
		names     []string
		want      string
	}{
		{[]float64{0.5, 1}, []string{"failover"},
			"In short: with failover, 100.0 % of requests were answered (30000 of 30000, p99 1.66 s); " +
				"without failover, 50.0 % (15000 of 30000, p99 1.66 s). The primary failed for 15.0 s of the 30 s."},
		{[]float64{0.25, 0.731, 0.999}, []string{"failover (score)", "failover (priority+hedge)"},
			"In short: with failover (score), 73.1 % of requests were answered (21930 of 30000, p99 1.66 s); " +
				"with failover (priority+hedge), 99.9 % (29970 of 30000, p99 1.66 s); " +
				"without failover, 25.0 % (7500 of 30000, p99 1.66 s). The primary failed for 15.0 s of the 30 s."},
		{[]float64{0.5, 0.6, 0.7}, []string{"fleet, sharing off", "fleet, sharing on"},
			"In short: with fleet (sharing off), 60.0 % of requests were answered (18000 of 30000, p99 1.66 s); " +
				"with fleet (sharing on), 70.0 % (21000 of 30000, p99 1.66 s); " +
				"without failover, 50.0 % (15000 of 30000, p99 1.66 s). The primary failed for 15.0 s of the 30 s."},
	} {
		rep := fakeReport(0, tc.retention, tc.names...)
		if got := summary(rep); got != tc.want {
			t.Errorf("%v:\ngot  %s\nwant %s", tc.names, got, tc.want)
		}
	}
	rep := fakeReport(0, []float64{0.5, 1}, "failover")
	rep.Runs[1].Latency.P99 = 0.045
	rep.Phases[1].EndS = 10 // the burst a second longer
	if got, want := summary(rep), "with failover, 100.0 % of requests were answered (30000 of 30000, p99 45 ms)"; !strings.Contains(got, want) {
		t.Errorf("got %s, want it to contain %q", got, want)
	}
	if got, want := summary(rep), fmt.Sprintf("failed for %.1f s", 16.0); !strings.Contains(got, want) {
		t.Errorf("got %s, want it to contain %q", got, want)
	}
}
