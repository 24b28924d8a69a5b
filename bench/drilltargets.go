//go:build ignore

// Drilltargets sums up the drills of bench/drill.sh: one line per drill
// (the machine's load, the hogs, the retention of the plain caller and of
// each failover run, the trips and false ones, the drill's scheduling lag),
// and, for each drill beside CPU hogs, whether it meets the target of
// issue 12: every failover run keeps at least the plain caller's
// retention, and at least 99 %, a healthy backup being there all along.
//
//	go run bench/drilltargets.go drill-*.json
//
// Each file is the -json output of one drill; a file beside it with the
// extension .load instead (bench/drill.sh writes it) gives the 1-minute
// load average before it.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
)

// drill is what this reads of the drill's -json report.
type drill struct {
	Hogs            int     `json:"hogs"`
	AttemptTimeoutS float64 `json:"attempt_timeout_s"`
	Lag             *struct {
		P50S         float64 `json:"p50_s"`
		P99S         float64 `json:"p99_s"`
		MaxS         float64 `json:"max_s"`
		Stalls       int     `json:"stalls"`
		StalledShare float64 `json:"stalled_share"`
		LongStalls   int     `json:"long_stalls"`
		Starved      bool    `json:"starved"`
	} `json:"lag"`
	Runs []struct {
		Name       string  `json:"name"`
		Retention  float64 `json:"retention"`
		Trips      *int    `json:"trips"`
		FalseTrips *int    `json:"false_trips"`
	} `json:"runs"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go run bench/drilltargets.go drill.json...")
		os.Exit(2)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "drill\tload\thogs\tplain\tfailover (trips, false)\tlag p50/p99/worst\tstalls (of time)\tlong stalls\tstarved\tissue 12")
	missed, judged := 0, 0
	for _, path := range os.Args[1:] {
		load, d, err := read(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(1)
		}
		if len(d.Runs) < 2 || d.Lag == nil {
			fmt.Fprintf(os.Stderr, "%s: not a drill report with a lag measurement (runs %d)\n", path, len(d.Runs))
			os.Exit(1)
		}
		plain := d.Runs[0]
		var fos []string
		ok := true
		for _, r := range d.Runs[1:] {
			trips := "-"
			if r.Trips != nil && r.FalseTrips != nil {
				trips = fmt.Sprintf("%d, %d", *r.Trips, *r.FalseTrips)
			}
			name := ""
			if len(d.Runs) > 2 {
				name = r.Name + " "
			}
			fos = append(fos, fmt.Sprintf("%s%.2f %% (%s)", name, 100*r.Retention, trips))
			ok = ok && r.Retention >= plain.Retention && r.Retention >= 0.99
		}
		verdict := "-"
		if d.Hogs > 0 {
			judged++
			verdict = "meets"
			if !ok {
				verdict = "misses"
				missed++
			}
		}
		l := d.Lag
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f %%\t%s\t%s/%s/%s\t%d (%.1f %%)\t%d\t%v\t%s\n",
			strings.TrimSuffix(filepath.Base(path), ".json"), load, d.Hogs, 100*plain.Retention, strings.Join(fos, "; "),
			ms(l.P50S), ms(l.P99S), ms(l.MaxS), l.Stalls, 100*l.StalledShare, l.LongStalls, l.Starved, verdict)
	}
	tw.Flush()
	if judged > 0 {
		fmt.Printf("\nissue 12's target (beside CPU hogs, every failover run keeps at least the plain caller's retention and at least 99 %%): %d of %d drills meet it\n",
			judged-missed, judged)
	}
}

// read returns the report at path and the load average of the .load file
// beside it ("?" without one).
func read(path string) (string, *drill, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	var d drill
	if err := json.Unmarshal(data, &d); err != nil {
		return "", nil, err
	}
	load := "?"
	if b, err := os.ReadFile(strings.TrimSuffix(path, ".json") + ".load"); err == nil {
		load = strings.TrimSpace(string(b))
	}
	return load, &d, nil
}

// ms formats seconds as milliseconds.
func ms(s float64) string {
	if s < 0.01 {
		return fmt.Sprintf("%.1f ms", 1000*s)
	}
	return fmt.Sprintf("%.0f ms", 1000*s)
}
