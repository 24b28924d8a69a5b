package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	_ "image/png"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/failover-go/failover"
)

// timed collects the failures of the checks that hold only on a machine
// that keeps the drill's time: on a starved one, answers read late are
// timeouts to the Transport, circuits open on every upstream, and the
// failover caller keeps fewer requests than the bounds want, however
// wide, while the plain caller's long timeout hides the lag. done fails
// the test with them, unless the drill's own lag measurement says its
// machine was starved (lagReport.Starved): then it skips, saying why and
// what the checks found.
type timed struct {
	t      *testing.T
	failed []string
}

func (c *timed) Errorf(format string, args ...any) {
	c.t.Helper()
	c.failed = append(c.failed, fmt.Sprintf(format, args...))
}

func (c *timed) done(rep *report) {
	c.t.Helper()
	if len(c.failed) == 0 {
		return
	}
	if rep.Lag != nil && rep.Lag.Starved {
		c.t.Skipf("%s\nThe timed checks that failed:\n\t%s", rep.Lag.Warning, strings.Join(c.failed, "\n\t"))
	}
	for _, f := range c.failed {
		c.t.Error(f)
	}
	var table strings.Builder
	if err := writeTable(&table, rep); err == nil {
		c.t.Logf("the drill's table:\n%s", table.String())
	}
}

// TestDrill runs a short drill in-process and checks what it is for: the
// failover caller keeps far more of its requests than the plain one, and
// the primary's circuit opened. The bounds are wide so that a loaded
// machine passes; on one too starved to keep the drill's time, as its
// lag measurement says, their failures are a skip (see timed).
func TestDrill(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out, status bytes.Buffer
	o := options{
		Duration:  3 * time.Second,
		RPS:       100,
		Timescale: 0.05,
		JSON:      true,
		Status:    &status, // read by no one until drill returns
		StatusTTY: true,
	}
	if err := drill(context.Background(), o, &out); err != nil {
		t.Fatalf("drill: %v", err)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	if len(rep.Runs) != 2 || rep.Runs[0].Name != "plain" || rep.Runs[1].Name != "failover" {
		t.Fatalf("runs %+v, want plain and failover", rep.Runs)
	}
	plain, fo := rep.Runs[0], rep.Runs[1]
	want := int(o.Duration.Seconds() * o.RPS)
	for _, r := range rep.Runs {
		if r.Requests != want {
			t.Errorf("%s run sent %d requests, want %d", r.Name, r.Requests, want)
		}
	}
	if l := rep.Lag; l == nil || l.Samples == 0 || len(l.Phases) != len(rep.Phases) || l.MaxS < l.P99S || l.P99S < l.P50S {
		t.Errorf("lag %+v, want samples, a phase each, p50 <= p99 <= max", l)
	}
	if rep.Hogs != 0 || rep.CPUs < 1 || rep.GOMAXPROCS < 1 {
		t.Errorf("hogs %d, cpus %d, gomaxprocs %d; want 0 and positive", rep.Hogs, rep.CPUs, rep.GOMAXPROCS)
	}
	// A stall of the drill moves the requests due in a phase into the
	// next, the plain caller's too: what its phases saw is timed.
	tc := &timed{t: t}
	// The primary fails for 15 of the 30 thirtieths: the plain caller
	// keeps about half, the failover caller nearly all.
	if plain.Retention > 0.7 {
		tc.Errorf("plain retention %.3f, want at most 0.7 with the primary down half the run", plain.Retention)
	}
	if fo.Retention < 0.85 || fo.Retention < plain.Retention+0.25 {
		tc.Errorf("failover retention %.3f, want at least 0.85 and well above plain's %.3f", fo.Retention, plain.Retention)
	}
	if fo.DetectionS == nil {
		tc.Errorf("the primary's circuit never opened")
	}
	if fo.Trips == nil || *fo.Trips < 1 || len(fo.Health) == 0 || fo.Health[0].Trips < 1 {
		tc.Errorf("no trip of the primary: trips %v, health %+v", fo.Trips, fo.Health)
	}
	if plain.DetectionS != nil || plain.Trips != nil || plain.Breakers != nil {
		t.Errorf("plain run has breaker figures: %+v", plain)
	}
	// The primary has the field's faster breaker, the backups the
	// defaults, as the Transport's Health says; the trips are the
	// primary's.
	wantBreakers := []breakerReport{{"primary", 3, 0.75, 0}, {"backup1", 5, 1.5, 0}, {"backup2", 5, 1.5, 0}}
	if len(fo.Breakers) != len(wantBreakers) {
		t.Fatalf("breakers %+v, want %+v", fo.Breakers, wantBreakers)
	}
	for i, w := range wantBreakers {
		if got := fo.Breakers[i]; got.Name != w.Name || got.FailureThreshold != w.FailureThreshold || got.CooldownS != w.CooldownS {
			t.Errorf("breaker %d: %+v, want %s after %d failures, open %gs", i, got, w.Name, w.FailureThreshold, w.CooldownS)
		}
	}
	if fo.Trips != nil && fo.Breakers[0].Trips+fo.Breakers[1].Trips+fo.Breakers[2].Trips != *fo.Trips {
		t.Errorf("trips per upstream %+v do not sum to the run's %d", fo.Breakers, *fo.Trips)
	}
	if rep.PrimaryBreakerThreshold != 3 || rep.PrimaryBreakerCooldownS != 0.75 || rep.BreakerThreshold != 5 || rep.BreakerCooldownS != 1.5 {
		t.Errorf("report's breakers: primary %d, %gs; backups %d, %gs; want 3, 0.75s; 5, 1.5s",
			rep.PrimaryBreakerThreshold, rep.PrimaryBreakerCooldownS, rep.BreakerThreshold, rep.BreakerCooldownS)
	}
	if got := fo.PerUpstream[0].Attempts; got >= plain.PerUpstream[0].Attempts {
		tc.Errorf("failover sent %d attempts to the primary, plain %d: want fewer", got, plain.PerUpstream[0].Attempts)
	}
	// Every hang-phase request of the plain caller waits on the hung
	// primary; the failover caller leaves few there, the breaker or hang
	// detection turning the rest away.
	h := phaseOf(script(o.Duration), hang)
	if got, want := plain.HangPhase.PrimaryAttempts, plain.Phases[h].Requests; got != want {
		tc.Errorf("plain sent %d hang-phase requests to the primary, want all %d", got, want)
	}
	if got, n := fo.HangPhase.PrimaryAttempts, fo.Phases[h].Requests; got > n/2 {
		tc.Errorf("failover sent %d of %d hang-phase requests to the hung primary, want at most half", got, n)
	}
	if fo.HangPhase.CircuitAtStart == "" || plain.HangPhase.CircuitAtStart != "" {
		t.Errorf("circuit at the hang's start: plain %q, failover %q; want none and a state", plain.HangPhase.CircuitAtStart, fo.HangPhase.CircuitAtStart)
	}
	if fo.Hedges != nil {
		t.Errorf("hedges %+v without -hedge", fo.Hedges)
	}
	// Every answer the failover caller got whole reported its usage (the
	// streams ask for it), at the upstream's price; the plain run has no
	// meter.
	var answers uint64
	for i, u := range fo.PerUpstream {
		answers += u.Answers
		p := profiles[i].cost
		if want := float64(u.Answers) * (promptTokens*p.Input + completionTokens*p.Output) / 1e6; math.Abs(u.Spend-want) > 1e-9 || u.Tokens != int64(u.Answers)*(promptTokens+completionTokens) {
			t.Errorf("%s: %d answers, %d tokens, spend %g; want %d tokens each, spend %g", u.Name, u.Answers, u.Tokens, u.Spend, promptTokens+completionTokens, want)
		}
	}
	if answers < uint64(fo.Successes) {
		t.Errorf("%d answers reported usage, want every one of the %d successes", answers, fo.Successes)
	}
	if plain.PerUpstream[0].Answers != 0 || plain.PerUpstream[0].Spend != 0 {
		t.Errorf("the plain run metered usage: %+v", plain.PerUpstream)
	}
	// The status redraws in place: a line wider than the terminal wraps
	// and moves the next frame.
	checkWidth(t, regexp.MustCompile("\x1b\\[[0-9]*[AK]").ReplaceAllString(status.String(), ""))
	if !strings.Contains(status.String(), "backup1") || !strings.Contains(status.String(), "scheduling lag p99") {
		t.Errorf("live status never named backup1 or the scheduling lag:\n%s", status.String())
	}
	tc.done(&rep)
}

// TestRoutersHedge runs every routing policy and a hedged run side by
// side, and checks that each has its column, its own load and figures,
// and that only the hedged run hedges, within its budget. The timed
// checks are a skip on a starved machine (see timed).
func TestRoutersHedge(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out bytes.Buffer
	o := options{
		Duration:  2 * time.Second,
		RPS:       50,
		Timescale: 0.05,
		Router:    "all",
		Hedge:     100 * time.Millisecond, // 5 ms scaled: below the primary's p50, so hedges are sure
		JSON:      true,
	}
	if err := drill(context.Background(), o, &out); err != nil {
		t.Fatalf("drill: %v", err)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	wantNames := []string{"plain", "failover (priority)", "failover (weighted)", "failover (leastlatency)", "failover (score)", "failover (priority+hedge)"}
	var names []string
	for _, r := range rep.Runs {
		names = append(names, r.Name)
	}
	if !slices.Equal(names, wantNames) {
		t.Fatalf("runs %q, want %q", names, wantNames)
	}
	wantRequests := int(o.Duration.Seconds() * o.RPS)
	h := phaseOf(script(o.Duration), hang)
	tc := &timed{t: t}
	for i, r := range rep.Runs {
		if r.Requests != wantRequests {
			t.Errorf("%s sent %d requests, want %d", r.Name, r.Requests, wantRequests)
		}
		if i == 0 {
			continue
		}
		if wantRouter := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(r.Name, "failover ("), ")"), "+hedge"); r.Router != wantRouter {
			t.Errorf("%s: router %q, want %q", r.Name, r.Router, wantRouter)
		}
		if r.Trips == nil || len(r.Health) != 3 || len(r.PerUpstream) != 3 {
			t.Errorf("%s: no breaker figures, health or per-upstream counts: %+v", r.Name, r)
		}
		t.Logf("%s: %d of %d hang-phase requests to the primary, circuit %s at the start; hedges %+v",
			r.Name, r.HangPhase.PrimaryAttempts, r.Phases[h].Requests, r.HangPhase.CircuitAtStart, r.Hedges)
		// Weighted sends a third of the requests to the primary while its
		// circuit is closed, half when a backup is suspect on a loaded
		// machine; none should keep sending it most of them.
		if got, n := r.HangPhase.PrimaryAttempts, r.Phases[h].Requests; got > 3*n/4 {
			tc.Errorf("%s sent %d of %d hang-phase requests to the hung primary, want at most three quarters", r.Name, got, n)
		}
		hedged := i == len(rep.Runs)-1
		switch {
		case !hedged && r.Hedges != nil:
			t.Errorf("%s hedged without -hedge: %+v", r.Name, r.Hedges)
		case hedged && r.Hedges == nil:
			t.Errorf("%s has no hedge figures", r.Name)
		case hedged:
			// The default budget: 10 % of the requests and a burst of 10.
			budget := uint64(10 + r.Requests/10 + 1)
			if r.Hedges.Sent > budget || r.Hedges.Won > r.Hedges.Sent {
				t.Errorf("%s hedges %+v; want at most %d sent, no more won than sent", r.Name, *r.Hedges, budget)
			}
			if r.Hedges.Sent == 0 {
				tc.Errorf("%s sent no hedge", r.Name)
			}
		}
	}
	tc.done(&rep)
	if rep.HedgeDelayS != 0.005 {
		t.Errorf("hedge_delay_s %g, want 0.005", rep.HedgeDelayS)
	}

	var table bytes.Buffer
	if err := writeTable(&table, &rep); err != nil {
		t.Fatal(err)
	}
	checkWidth(t, table.String())
	for _, want := range append(wantNames[1:], "plain client", "hedges sent / won / denied", "hang phase", "requests sent to the primary", "latency p99 in warm-up", "all 6 runs at once") {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table has no %q:\n%s", want, table.String())
		}
	}
}

// TestScriptGap checks that at the default duration and timescale the
// primary's circuit, opened by the 503 burst, has time to close before the
// hang: the healthy gap outlasts the breaker's cooldown, with room for the
// probe, so that the hang meets hang detection.
func TestScriptGap(t *testing.T) {
	o := options{Duration: 30 * time.Second, Timescale: 0.05}
	phases := script(o.Duration)
	var names []string
	for _, p := range phases {
		names = append(names, p.name)
	}
	want := []string{"warm-up", "503 burst", "healthy gap", "hang", "429 storm", "529 overload", "recovery"}
	if !slices.Equal(names, want) {
		t.Fatalf("phases %q, want %q", names, want)
	}
	if last := phases[len(phases)-1]; last.end != o.Duration {
		t.Errorf("script ends at %s, want %s", last.end, o.Duration)
	}
	for i := 1; i < len(phases); i++ {
		if phases[i].start != phases[i-1].end {
			t.Errorf("%s starts at %s, %s ended at %s", phases[i].name, phases[i].start, phases[i-1].name, phases[i-1].end)
		}
	}
	// The last probe that the burst fails is at most at its end; the
	// next comes a cooldown later and, the gap being healthy, closes the
	// circuit.
	h := phaseOf(phases, hang)
	gap := phases[h].start - phases[h-1].start
	if phases[h-1].fault != healthy || phases[h-2].fault != burst503 {
		t.Fatalf("the hang does not follow a healthy gap after the 503 burst: %+v", phases)
	}
	if room := o.primaryBreaker().Cooldown + o.attemptTimeout(); gap < room+250*time.Millisecond {
		t.Errorf("healthy gap %s, want at least the cooldown and a probe (%s) and 250ms to spare", gap, room)
	}
}

// TestParseRouters checks -router's lists.
func TestParseRouters(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", []string{"priority"}},
		{"priority", []string{"priority"}},
		{"score", []string{"score"}},
		{"Score, priority,score", []string{"score", "priority"}},
		{"all", []string{"priority", "weighted", "leastlatency", "score"}},
		{"score,all", []string{"score", "priority", "weighted", "leastlatency"}},
	} {
		got, err := parseRouters(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseRouters(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"random", "priority,", "priority,,score"} {
		if got, err := parseRouters(in); err == nil {
			t.Errorf("parseRouters(%q) = %q, want an error", in, got)
		}
	}
}

// TestMetricsMux checks -listen's paths: the first failover run at
// /metrics and /health, each at /metrics/KEY and /health/KEY, and a fleet
// run's members at /metrics/KEY/I and /health/KEY/I.
func TestMetricsMux(t *testing.T) {
	var runs []*run
	for _, sp := range []runSpec{{policy: "priority"}, {policy: "score"}, {policy: "priority", hedge: true}, {policy: "priority", fleet: 2}} {
		r := &run{spec: sp}
		for i := range max(sp.fleet, 1) {
			name := sp.key()
			if sp.fleet > 0 {
				name += "-" + strconv.Itoa(i)
			}
			ft, err := failover.New(failover.Config{Upstreams: []failover.Upstream{{Name: name, BaseURL: "http://127.0.0.1:1/v1"}}})
			if err != nil {
				t.Fatal(err)
			}
			r.members = append(r.members, &member{ft: ft})
		}
		runs = append(runs, r)
	}
	mux := metricsMux(runs)
	for _, tc := range []struct {
		path     string
		code     int
		contains string
	}{
		{"/metrics", 200, `upstream="priority"`},
		{"/health", 200, `"priority"`},
		{"/metrics/score", 200, `upstream="score"`},
		{"/health/score", 200, `"score"`},
		{"/health/priority+hedge", 200, `"priority+hedge"`},
		{"/metrics/random", 404, ""},
		{"/metrics/fleet", 200, `upstream="fleet-0"`},
		{"/metrics/fleet/1", 200, `upstream="fleet-1"`},
		{"/health/fleet/0", 200, `"fleet-0"`},
		{"/health/fleet/2", 404, ""},
		{"/health/fleet/01", 404, ""},
		{"/metrics/score/0", 200, `upstream="score"`},
		{"/metrics/random/0", 404, ""},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.contains) {
			t.Errorf("GET %s: %d %q, want %d with %q", tc.path, rec.Code, rec.Body.String(), tc.code, tc.contains)
		}
	}
}

// TestTablePlotListen checks that the table names every row and column of
// the report, that -plot writes a PNG with a panel per failover run, that
// -listen's /metrics of each run parses and lints clean after the drill's
// traffic (what promtool check metrics would say), and that its server
// ends with the drill.
func TestTablePlotListen(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out bytes.Buffer
	png := filepath.Join(t.TempDir(), "drill.png")
	var families map[string]bool
	o := options{Duration: time.Second, RPS: 50, Timescale: 0.02, Plot: png, Listen: "127.0.0.1:0", Router: "priority,score", Hedge: 700 * time.Millisecond,
		Scrape: func(base string) {
			families = scrapeAndLint(t, base, "/metrics", "/metrics/priority", "/metrics/score", "/metrics/priority+hedge")
		}}
	if err := drill(context.Background(), o, &out); err != nil {
		t.Fatalf("drill: %v", err)
	}
	for _, f := range []string{"failover_attempts_total", "failover_attempt_duration_seconds", "failover_failovers_total", "failover_breaker_trips_total", "failover_hedges_total"} {
		if !families[f] {
			t.Errorf("-listen's /metrics has no %s: %v", f, families)
		}
	}
	checkWidth(t, out.String())
	if !strings.Contains(out.String(), "Picture: "+png) {
		t.Errorf("the table does not say where the picture is:\n%s", out.String())
	}
	for _, row := range []string{"detection", "false trips", "recovery", "throughput retention", "latency p99", "hedges sent / won / denied",
		"trips per upstream (its breaker)", "primary (3 failures, open 300 ms)", "backup1 (5 failures, open 600 ms)",
		"primary", "backup1", "backup2", "503 burst", "healthy gap", "hang", "429 storm", "529 overload",
		"hang phase", "primary's circuit at its start", "requests sent to the primary", "latency p99 in warm-up",
		"spend per upstream", "answers)", "Spend is the usage the answers reported", "Machine: ", "no CPU hogs", "Scheduling lag (how late", "Scheduling lag by phase", "plain client", "failover (priority)", "failover (score)", "failover (priority+hedge)"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("table has no %q row:\n%s", row, out.String())
		}
	}
	f, err := os.Open(png)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, format, err := image.DecodeConfig(f)
	// Two panels for all runs and one per failover run: taller than wide.
	if err != nil || format != "png" || cfg.Width < 500 || cfg.Height <= cfg.Width {
		t.Errorf("plot: %v, %s %dx%d; want a PNG taller than wide", err, format, cfg.Width, cfg.Height)
	}
}

// requireRedisServer skips the test, saying why, when there is no
// redis-server on PATH for the drill to start, unless FAILOVER_REQUIRE_REDIS
// is set (as CI sets it), in which case the test fails.
func requireRedisServer(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("FAILOVER_REQUIRE_REDIS") != "" {
			t.Fatalf("FAILOVER_REQUIRE_REDIS is set and there is no redis-server: %v", err)
		}
		t.Skip("no redis-server on PATH for the fleet drill (apt-get install redis-server); set FAILOVER_REQUIRE_REDIS=1 to fail instead")
	}
}

// TestFleet runs a short fleet drill on a redis-server of its own: both
// fleets have their columns and figures, keep nearly every request, and
// the sharing fleet stops sending to the primary in the 503 burst after no
// more 503s than the other. The bounds are wide so that a loaded machine
// passes (on one too starved to keep the drill's time, their failures are
// a skip: see timed); the default drill shows the gap (50 against 5 with
// -fleet 10).
func TestFleet(t *testing.T) {
	requireRedisServer(t)
	defer goleak.VerifyNone(t)
	var out, status bytes.Buffer
	o := options{
		Duration:  6 * time.Second,
		RPS:       100,
		Timescale: 0.03, // the primary's cooldown of 0.45 s: the members come back to it within the run
		Fleet:     5,
		JSON:      true,
		Status:    &status,
		StatusTTY: true,
		Listen:    "127.0.0.1:0",
	}
	var families map[string]bool
	o.Scrape = func(base string) {
		families = scrapeAndLint(t, base, "/metrics/fleet/0", "/metrics/fleet+shared", "/metrics/fleet+shared/4")
	}
	if err := drill(context.Background(), o, &out); err != nil {
		t.Fatalf("drill: %v", err)
	}
	if !families["failover_shared_up"] || !families["failover_shared_events_total"] {
		t.Errorf("-listen's /metrics of the sharing fleet has no failover_shared_ families: %v", families)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	var names []string
	for _, r := range rep.Runs {
		names = append(names, r.Name)
	}
	if want := []string{"plain", "fleet, sharing off", "fleet, sharing on"}; !slices.Equal(names, want) {
		t.Fatalf("runs %q, want %q", names, want)
	}
	if rep.Fleet != 5 || rep.Redis == "" || !rep.RedisStarted || rep.SharedSyncS < minSharedSync.Seconds() {
		t.Errorf("fleet %d, redis %q (started %v), shared sync %gs; want 5, an address, started, at least %v", rep.Fleet, rep.Redis, rep.RedisStarted, rep.SharedSyncS, minSharedSync)
	}
	plain, off, on := rep.Runs[0], rep.Runs[1], rep.Runs[2]
	if plain.Fleet != nil || off.Fleet == nil || on.Fleet == nil {
		t.Fatalf("fleet figures: plain %+v, off %+v, on %+v; want none, some, some", plain.Fleet, off.Fleet, on.Fleet)
	}
	for _, r := range rep.Runs[1:] {
		figures, _ := json.Marshal(r.Fleet)
		t.Logf("%s: %s", r.Name, figures)
	}
	want := int(o.Duration.Seconds() * o.RPS)
	tc := &timed{t: t}
	for _, r := range rep.Runs[1:] {
		if r.Requests != want {
			t.Errorf("%s sent %d requests, want %d", r.Name, r.Requests, want)
		}
		if r.Retention < 0.85 {
			tc.Errorf("%s: retention %.3f, want at least 0.85 (plain %.3f)", r.Name, r.Retention, plain.Retention)
		}
		if r.Fleet.Members != 5 || r.Health != nil {
			t.Errorf("%s: %d members, health %v; want 5, none", r.Name, r.Fleet.Members, r.Health)
		}
		if r.Fleet.Opened < 1 {
			tc.Errorf("%s: no circuit opened in the burst", r.Name)
		}
		members := map[int]bool{}
		for _, e := range r.Events {
			if e.Member == nil {
				t.Fatalf("%s: event %+v names no member", r.Name, e)
			}
			members[*e.Member] = true
		}
		if len(members) != 5 {
			// A member has events when its circuits change, which
			// takes failures seen in time: as timed as Opened.
			tc.Errorf("%s: events of %d members, want 5", r.Name, len(members))
		}
	}
	if off.Fleet.Shared || off.Fleet.SharedErrors != nil || !on.Fleet.Shared || on.Fleet.SharedErrors == nil {
		t.Errorf("sharing: off %v (errors %v), on %v (errors %v)", off.Fleet.Shared, off.Fleet.SharedErrors, on.Fleet.Shared, on.Fleet.SharedErrors)
	}
	if on.Fleet.FailedBeforeStop > off.Fleet.FailedBeforeStop {
		tc.Errorf("503s on the primary before the fleet stopped: %d with sharing, %d without; want no more with it", on.Fleet.FailedBeforeStop, off.Fleet.FailedBeforeStop)
	}

	var table bytes.Buffer
	if err := writeTable(&table, &rep); err != nil {
		t.Fatal(err)
	}
	checkWidth(t, table.String())
	for _, row := range []string{"fleet, sharing off", "fleet, sharing on", "Fleets: 5 members", "503s on the primary until all open",
		"circuits open after (first / last)", "then probes per breaker cooldown", "until all are back on the primary", "Redis errors"} {
		if !strings.Contains(table.String(), row) {
			t.Errorf("table has no %q:\n%s", row, table.String())
		}
	}
	if !strings.Contains(status.String(), "fleet, sharing on") {
		t.Errorf("live status never named the sharing fleet:\n%s", status.String())
	}
	tc.done(&rep)
}

// TestFleetFlags checks the errors of -fleet and -redis, which come before
// the drill starts anything.
func TestFleetFlags(t *testing.T) {
	defer goleak.VerifyNone(t)
	// A port that refuses connections.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	base := options{Duration: time.Second, RPS: 10, Timescale: 0.05}
	for _, tc := range []struct {
		name     string
		set      func(o *options)
		contains string
	}{
		{"one member", func(o *options) { o.Fleet = 1 }, "-fleet 1"},
		{"negative", func(o *options) { o.Fleet = -3 }, "-fleet -3"},
		{"too many", func(o *options) { o.Fleet = maxFleet + 1 }, "want 2 to"},
		{"redis alone", func(o *options) { o.Redis = closed }, "-redis needs -fleet"},
		{"with hedge", func(o *options) { o.Fleet, o.Hedge = 3, time.Second }, "-hedge"},
		{"two policies", func(o *options) { o.Fleet, o.Router = 3, "priority,score" }, "one routing policy"},
		{"bad URL", func(o *options) { o.Fleet, o.Redis = 3, "redis://%zz" }, "-redis"},
		{"no answer", func(o *options) { o.Fleet, o.Redis = 3, closed }, "no answer to PING"},
	} {
		o := base
		tc.set(&o)
		err := drill(context.Background(), o, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.contains) {
			t.Errorf("%s: drill = %v, want an error with %q", tc.name, err, tc.contains)
		}
	}

	// Without -redis nor redis-server on PATH, the error says what to do.
	t.Setenv("PATH", t.TempDir())
	o := base
	o.Fleet = 3
	if err := drill(context.Background(), o, io.Discard); !errors.Is(err, errNoRedis) || !strings.Contains(err.Error(), "-redis") || !strings.Contains(err.Error(), "redis-server") {
		t.Errorf("drill without Redis = %v, want %v", err, errNoRedis)
	}
}
