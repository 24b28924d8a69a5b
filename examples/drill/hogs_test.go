package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain lets the test binary be a hog of -hogs, as the drill's own
// binary is: startHogs runs copies of whichever binary it is in.
func TestMain(m *testing.M) {
	hogMain()
	os.Exit(m.Run())
}

// TestHogs starts two hogs, checks that they spin, and that stop ends
// them.
func TestHogs(t *testing.T) {
	defer goleak.VerifyNone(t)
	h, err := startHogs(2)
	if err != nil {
		t.Fatal(err)
	}
	cmds := h.cmds
	if len(cmds) != 2 {
		h.stop()
		t.Fatalf("%d hogs, want 2", len(cmds))
	}
	time.Sleep(300 * time.Millisecond)
	h.stop()
	for i, cmd := range cmds {
		ps := cmd.ProcessState
		if ps == nil {
			t.Fatalf("hog %d: not waited for", i)
		}
		// An idle copy of the binary uses a few milliseconds of CPU to
		// start; a spinning one, as much of the 300 ms as the machine
		// gives it.
		if cpu := ps.UserTime() + ps.SystemTime(); cpu < 20*time.Millisecond {
			t.Errorf("hog %d used %s of CPU in 300ms, want it to spin", i, cpu)
		}
	}
	if h.cmds != nil {
		t.Errorf("stop left %d hogs", len(h.cmds))
	}
}

// TestHogsEndWithStdin checks that a hog ends by itself once its stdin
// closes, as it does when the drill dies without stopping it.
func TestHogsEndWithStdin(t *testing.T) {
	defer goleak.VerifyNone(t)
	h, err := startHogs(1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.stop()
	h.stdin[0].Close()
	ended := make(chan error, 1)
	go func() { ended <- h.cmds[0].Wait() }()
	select {
	case err := <-ended:
		if err != nil {
			t.Errorf("hog ended with %v, want exit status 0", err)
		}
		h.cmds, h.stdin = nil, nil // waited for
	case <-time.After(5 * time.Second):
		t.Errorf("hog still spinning 5s after its stdin closed")
		h.cmds[0].Process.Kill()
		<-ended
		h.cmds, h.stdin = nil, nil
	}
}

// TestHogsFlag checks -hogs' bounds, which the drill checks before it
// starts anything.
func TestHogsFlag(t *testing.T) {
	for _, n := range []int{-1, maxHogs + 1} {
		o := options{Duration: time.Second, RPS: 10, Timescale: 0.05, Hogs: n}
		if err := drill(context.Background(), o, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "-hogs") {
			t.Errorf("-hogs %d: drill = %v, want an error naming -hogs", n, err)
		}
	}
}

// TestDrillHogs is issue 12's target, and not run unless
// FAILOVER_DRILL_HOGS gives the number of hogs:
//
//	FAILOVER_DRILL_HOGS=2 go test ./examples/drill -run TestDrillHogs -v
//
// It runs the default drill (30 s at 200 req/s, timescale 0.05) beside
// that many CPU hogs, and wants the failover caller to keep at least as
// many requests as the plain one, and at least 99 %, a healthy backup
// being there all along: a resilience layer must never be worse than
// none. The drill's lag measurement is logged, not used to skip: the
// machine is meant to be starved. On an otherwise quiet 2-CPU machine,
// two hogs (the issue's) hardly starve the drill; 24 starve it as the
// issue's other jobs did (see -hogs in main.go).
func TestDrillHogs(t *testing.T) {
	v := os.Getenv("FAILOVER_DRILL_HOGS")
	if v == "" {
		t.Skip("set FAILOVER_DRILL_HOGS=2 to run the default drill beside 2 CPU hogs (issue 12's target, 30 s)")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxHogs {
		t.Fatalf("FAILOVER_DRILL_HOGS=%q: want a number of hogs, 1 to %d", v, maxHogs)
	}
	defer goleak.VerifyNone(t)
	var out bytes.Buffer
	o := options{Duration: 30 * time.Second, RPS: 200, Timescale: 0.05, Hogs: n, JSON: true}
	if err := drill(context.Background(), o, &out); err != nil {
		t.Fatalf("drill: %v", err)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	l := rep.Lag
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	t.Logf("%d hogs: scheduling lag p50 %s, p99 %s, worst %s, %d stalls (%s in all), %d long ones; starved %v",
		rep.Hogs, fmtDur(sec(l.P50S)), fmtDur(sec(l.P99S)), fmtDur(sec(l.MaxS)), l.Stalls, fmtDur(sec(l.StalledS)), l.LongStalls, l.Starved)
	plain := rep.Runs[0]
	for _, r := range rep.Runs[1:] {
		t.Logf("%s: retention %.2f %% (plain %.2f %%), %d trips, %d false", r.Name, 100*r.Retention, 100*plain.Retention, *r.Trips, *r.FalseTrips)
		if r.Retention < plain.Retention || r.Retention < 0.99 {
			t.Errorf("%s kept %.2f %% of its requests beside %d CPU hogs, the plain caller %.2f %%; want at least as many, and at least 99 %%",
				r.Name, 100*r.Retention, n, 100*plain.Retention)
		}
	}
}
