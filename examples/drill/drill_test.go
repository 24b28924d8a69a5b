package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	_ "image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestDrill runs a short drill in-process and checks what it is for: the
// failover caller keeps far more of its requests than the plain one, and
// the primary's circuit opened. The bounds are wide so that a loaded
// machine passes.
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
	// The plain run's warm-up involves no fault and no failover: when its
	// median is far off the profile's, the machine is too starved to keep
	// the drill's time (attempt timeouts of a few dozen milliseconds), and
	// nothing below would say anything about the Transport.
	if got, p50 := plain.Phases[0].P50S, rep.Upstreams[0].P50S; got > 10*p50 {
		t.Skipf("machine too loaded for a timed drill: warm-up p50 %.3fs, profile p50 %.3fs", got, p50)
	}
	want := int(o.Duration.Seconds() * o.RPS)
	for _, r := range rep.Runs {
		if r.Requests != want {
			t.Errorf("%s run sent %d requests, want %d", r.Name, r.Requests, want)
		}
	}
	// The primary fails for 16 of the 30 thirtieths: the plain caller
	// keeps about 47 %, the failover caller nearly all.
	if plain.Retention > 0.7 {
		t.Errorf("plain retention %.3f, want at most 0.7 with the primary down half the run", plain.Retention)
	}
	if fo.Retention < 0.85 || fo.Retention < plain.Retention+0.25 {
		t.Errorf("failover retention %.3f, want at least 0.85 and well above plain's %.3f", fo.Retention, plain.Retention)
	}
	if fo.DetectionS == nil {
		t.Errorf("the primary's circuit never opened")
	}
	if fo.Trips == nil || *fo.Trips < 1 || len(fo.Health) == 0 || fo.Health[0].Trips < 1 {
		t.Errorf("no trip of the primary: trips %v, health %+v", fo.Trips, fo.Health)
	}
	if plain.DetectionS != nil || plain.Trips != nil {
		t.Errorf("plain run has breaker figures: %+v", plain)
	}
	if got := fo.PerUpstream[0].Attempts; got >= plain.PerUpstream[0].Attempts {
		t.Errorf("failover sent %d attempts to the primary, plain %d: want fewer", got, plain.PerUpstream[0].Attempts)
	}
	if !strings.Contains(status.String(), "backup1") {
		t.Errorf("live status never named backup1:\n%s", status.String())
	}
}

// TestTablePlotListen checks that the table names every row of the report,
// that -plot writes a PNG, and that -listen's server ends with the drill.
func TestTablePlotListen(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out bytes.Buffer
	png := filepath.Join(t.TempDir(), "drill.png")
	o := options{Duration: time.Second, RPS: 50, Timescale: 0.02, Plot: png, Listen: "127.0.0.1:0"}
	if err := drill(context.Background(), o, &out); err != nil {
		t.Fatalf("drill: %v", err)
	}
	for _, row := range []string{"detection", "false trips", "recovery", "throughput retention", "latency p99", "primary", "backup1", "backup2", "503 burst", "hang", "429 storm", "529 overload"} {
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
	if err != nil || format != "png" || cfg.Width < 500 {
		t.Errorf("plot: %v, %s %dx%d; want a PNG", err, format, cfg.Width, cfg.Height)
	}
}
