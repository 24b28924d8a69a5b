// Drill is an outage drill for the failover transport: it plays the same
// fault script on a primary LLM upstream in several runs at once, to a plain
// http.Client aimed at the primary and to an http.Client on a
// failover.Transport over three upstreams (one such run per routing policy
// asked for), and prints what the caller of each saw, side by side.
//
//	go run ./examples/drill
//	go run ./examples/drill -router all
//	go run ./examples/drill -hedge 700ms
//	go run ./examples/drill -fleet 10
//	go run ./examples/drill -plot drill.svg
//	go run ./examples/drill -only affinity
//	go run ./examples/drill -only continue
//
// The upstreams are local OpenAI-compatible servers (POST
// /v1/chat/completions, streamed when the body says "stream": true) with the
// latency and background error rates that the field reports for real
// providers: p50/p99 340/920 ms at 99.71 %, 180/480 ms at 99.62 % and
// 210/620 ms at 99.45 % success, background errors being 500s and 503s.
// Every time is multiplied by -timescale. Each run has servers of its own;
// the fault script on its primary goes: warm-up, a burst of 503s, a healthy
// gap (long enough for the circuit to close again, so that the hang meets
// hang detection rather than an open circuit), a hang (the request is
// accepted and never answered), a storm of 429s with retry-after-ms and
// Retry-After, 529 overload, and recovery: 5, 4, 2, 4, 4, 3 and 8
// thirtieths of the run (seconds of the default run). Nothing leaves the
// machine unless -upstream says so, and no key is needed.
//
// Every caller sends the same open-loop load (half of it streamed) with a
// client Timeout of 30 s at provider scale. Each failover Transport has an
// AttemptTimeout of three times the slowest p99, the breaker's defaults
// for the backups (5 failures, a 30 s cooldown) and the field's faster
// policy for the primary (its Upstream.Breaker: 3 failures, 15 s), the
// rate limiter's default cooldowns and the default 30 s window of recent
// figures, all scaled, and hang detection that
// suspects an upstream after one p99 without an answer (see hangConfig in
// drill.go). The table's "hang phase" rows count the requests sent to the
// hung primary and the caller's p99 then, next to its p99 in the warm-up.
//
// The table fits 100 columns, its runs' columns in blocks when they do
// not; it ends with the drill's outcome in plain words (the share of
// requests answered with failover and without) and the picture's path.
//
// The flags are:
//
//	-duration d       length of the drill, all runs playing at once (default 30s)
//	-rps n            requests per second of each run (default 200)
//	-timescale f      factor on every latency, timeout and cooldown (default 0.05)
//	-json             write the figures as JSON to stdout instead of the table
//	-plot file        draw success rate, p99 (of successes, failures marked
//	                  apart) and requests per upstream over time to file, PNG
//	                  or SVG by its extension (default failover-drill.png in
//	                  the temporary directory; off: no picture). The table's
//	                  last line says where it is
//	-listen addr      serve /metrics (Prometheus text) and /health (Health() as
//	                  JSON) of the first failover Transport during the drill,
//	                  e.g. :9090, and /metrics/RUN and /health/RUN of each, RUN
//	                  being its policy as in its column: /metrics/score,
//	                  /health/priority+hedge; with -fleet, RUN is fleet or
//	                  fleet+shared (its first member), and /metrics/RUN/I and
//	                  /health/RUN/I serve member I, from 0
//	-upstream spec    name=URL,KEY_ENV: a real OpenAI-compatible provider to fail
//	                  over to, instead of the two local backups; repeatable. The
//	                  key is read from the environment variable KEY_ENV and sent
//	                  as "Authorization: Bearer". The scripted primary stays
//	                  local. With -upstream, -timescale defaults to 1, -rps to 2
//	                  and -duration to 3m, unless given. Each failover run
//	                  sends its own load there.
//	-model name       model in the request bodies (default gpt-4o-mini)
//	-router list      routing policies, a failover run each with servers of its
//	                  own: a comma-separated list of priority (the default),
//	                  weighted, leastlatency and score, or all for the four.
//	                  The default drill's column is "failover"; otherwise
//	                  each is named for its policy: "failover (score)"
//	-hedge d          hedge delay at provider scale (default 0: no hedging):
//	                  adds a run of the first -router policy with
//	                  Config.Hedge{Delay: d scaled}, "failover (priority+hedge)",
//	                  next to the same policy unhedged, and reports the hedges
//	                  each run sent, won and had denied by the budget. Around
//	                  the primary's p95 (700ms) hedges the slow tail; much less
//	                  spends the budget (10 % of requests) before the hang
//	-fleet n          instead of the failover runs, two fleets of n members
//	                  (2 to 100), each member a failover.Transport with an
//	                  http.Transport and state of its own, as n processes of
//	                  one service would have: "fleet, sharing off" and "fleet,
//	                  sharing on", the second with Config.Shared on Redis
//	                  (package redisshared, its keys and channel under a
//	                  prefix of the drill's own, SharedSync 1 s scaled, at
//	                  least 100 ms). Each fleet sends the run's -rps in all,
//	                  its members in turn. Adds the fleet rows: 503s on the
//	                  primary from the burst's start until every member's
//	                  circuit opened, the first and last to open, the probes
//	                  per cooldown in the rest of the burst, the time from
//	                  the faults' end until every member had an answer from
//	                  the primary again, and Redis errors. Takes one -router
//	                  policy; not with -hedge
//	-redis addr       the Redis of -fleet, host:port or a redis:// URL; it must
//	                  answer PING. Without it the drill starts redis-server
//	                  from PATH on a free loopback port, without persistence,
//	                  and stops it at the end
//	-hogs n           run n CPU hogs beside the drill (default 0): child
//	                  processes, each a copy of the drill's binary spinning on
//	                  one thread, competing for the CPUs at the OS level as
//	                  other jobs on the machine do. The drill starts them
//	                  before its servers and ends them when it ends, by any
//	                  path: it kills them, and a hog whose drill died exits
//	                  when its stdin closes. The scheduler shares the CPUs
//	                  per thread and runs a thread that wakes soon, so it
//	                  takes many: on a 2-CPU machine (Linux 6.18), 2 to 16
//	                  hogs left the drill's worst wake-up under 50 ms, while
//	                  20 to 24 starved it as issue 12's other jobs did
//	-only part        run only this part: drill (the outage drill),
//	                  affinity (the prompt-cache affinity part, a few
//	                  seconds, a table only) or continue (the stream
//	                  continuation part, a few seconds, a table only). By
//	                  default all three run, in this order; with -json or
//	                  -upstream the drill only
//	-quiet            no live status on stderr
//	-faults           instead of the drill, play a catalogue of provider
//	                  faults at once, each against servers of its own: a
//	                  silent primary (streamed, and not with a 60 s
//	                  deadline), a stream that stalls or is cut after its
//	                  content, one 500 and one 429 with Retry-After 2 s
//	                  while the backup maps to another model, one 500 while
//	                  the backup is the same, a content-policy 400, both
//	                  upstreams 503, a 5 s blip under 10 requests a second
//	                  and a 60 s outage under a request every 4 s. Each
//	                  goes through a failover.Transport with the default
//	                  Config under openai-go with its defaults, in real
//	                  time (about 80 s); the report gives what the caller
//	                  got, when, the attempts at each upstream, the primary's
//	                  counted failures, and the right conduct. Takes -hogs
//
// Each run adds -rps requests per second to the machine: the default drill
// runs two, -router all five, with -hedge six, and -fleet three. That is
// far from saturating even a 2-CPU machine: there, the six runs of -router all
// -hedge at 200 req/s took a fifth of one CPU in all, and the priority
// column's figures were the same, within the noise from one drill to the
// next, alone and beside the other policies.
//
// After the outage drill, a second part measures prompt-cache affinity:
// agent loops, each turn sending the whole history, through
// failover.Weighted over two equal local upstreams that keep a prompt
// cache each, with the Transport's affinity (its default) and with
// Config.Affinity.Off, both at once; it prints the share of input tokens
// read from the cache, requests per upstream and latency of each (see
// affinity.go).
//
// A third part measures stream continuation: OpenAI chat streams whose
// primary cuts the connection, goes silent past its Timeouts.Idle or ends
// the stream early after a few content chunks, and cuts while the backup
// refuses the continuation with a 400, each through a Transport with
// Config.Continue on and off; it counts the streams the caller read
// complete, those that ended in their original error and those that ended
// like a success with a short answer, and the time a continuation added
// (see continue.go). -only picks one part.
//
// While it runs, stderr shows each upstream's state, success rate and p99,
// redrawn in place on a terminal and as lines each second otherwise.
//
// The drill also measures its own machine: a goroutine sleeps 2 ms in a
// loop and records how late each wake-up comes (the table's "Scheduling
// lag", by phase too, and -json's "lag"), next to the Go runtime's
// /sched/latencies:seconds, the time goroutines wait runnable. A drill
// starved of CPU times out attempts that were answered in time, which
// counts against the upstreams' circuits, while the plain caller's much
// longer timeout does not notice. When the lag's p99 is above a quarter
// of the AttemptTimeout, or any wake-up came later than half of it (a
// stall that times out the attempts in flight whose answers take the
// other half), the drill says that its figures mean little: a WARNING
// line in the table, on stderr with -json, and "starved": true. See
// stallShare in lag.go for what the thresholds rest on.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"
)

// upstreamFlags collects -upstream values.
type upstreamFlags []realUpstream

func (u *upstreamFlags) String() string { return "" }

func (u *upstreamFlags) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" || rest == "" {
		return fmt.Errorf("want name=URL,KEY_ENV, got %q", v)
	}
	base, keyEnv, _ := strings.Cut(rest, ",")
	ru := realUpstream{Name: name, BaseURL: base}
	if keyEnv != "" {
		ru.Key = os.Getenv(keyEnv)
		if ru.Key == "" {
			return fmt.Errorf("%s: environment variable %s is empty", name, keyEnv)
		}
	}
	*u = append(*u, ru)
	return nil
}

func main() {
	hogMain() // returns unless this process is one of a drill's -hogs
	var (
		o      options
		ups    upstreamFlags
		quiet  bool
		faults bool
		only   string
	)
	flag.DurationVar(&o.Duration, "duration", 30*time.Second, "length of the drill; all runs play at once")
	flag.Float64Var(&o.RPS, "rps", 200, "requests per second of each run")
	flag.Float64Var(&o.Timescale, "timescale", 0.05, "factor on every latency, timeout and cooldown")
	flag.BoolVar(&o.JSON, "json", false, "write the figures as JSON instead of the table")
	flag.StringVar(&o.Plot, "plot", defaultPlot(), "draw the drill to this .png or .svg file (off: no picture)")
	flag.StringVar(&o.Listen, "listen", "", "serve /metrics and /health on this address during the drill")
	flag.Var(&ups, "upstream", "name=URL,KEY_ENV: a real provider to fail over to, instead of the local backups (repeatable)")
	flag.StringVar(&o.Model, "model", "gpt-4o-mini", "model in the request bodies")
	flag.StringVar(&o.Router, "router", "priority", "routing policies, a failover run each: comma-separated priority, weighted, leastlatency, score, or all")
	flag.DurationVar(&o.Hedge, "hedge", 0, "hedge delay at provider scale: adds a run of the first -router policy with hedging (0: none)")
	flag.IntVar(&o.Fleet, "fleet", 0, "two fleets of this many Transports, sharing state through Redis and not (0: no fleets)")
	flag.StringVar(&o.Redis, "redis", "", "Redis of -fleet, host:port or redis:// URL (default: start redis-server from PATH)")
	flag.IntVar(&o.Hogs, "hogs", 0, "run this many CPU hogs (child processes spinning) beside the drill, started and ended by it")
	flag.BoolVar(&o.NoLastResort, "no-last-resort", false, "turn the Transport's last resort off (Config.LastResort.Off): a request every circuit refuses fails at once")
	flag.StringVar(&only, "only", "", "run only this part: drill, affinity or continue (default: all three, in this order)")
	flag.BoolVar(&quiet, "quiet", false, "no live status on stderr")
	flag.BoolVar(&faults, "faults", false, "instead of the drill, play the catalogue of provider faults, one request each, default Config, under openai-go (takes 80s)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "drill: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	switch {
	case only != "" && only != "drill" && only != "affinity" && only != "continue":
		fmt.Fprintf(os.Stderr, "drill: -only %q: want drill, affinity or continue\n", only)
		os.Exit(2)
	case (only == "affinity" || only == "continue") && (faults || o.JSON || len(ups) > 0):
		fmt.Fprintf(os.Stderr, "drill: -only %s takes none of -faults, -json and -upstream\n", only)
		os.Exit(2)
	}
	o.Upstreams = ups
	if o.Plot == "off" {
		o.Plot = ""
	}
	if len(ups) > 0 {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["timescale"] {
			o.Timescale = 1
		}
		if !set["rps"] {
			o.RPS = 2
		}
		if !set["duration"] {
			o.Duration = 3 * time.Minute
		}
		runs := 1
		if policies, err := parseRouters(o.Router); err == nil {
			runs = len(policies) + b2i(o.Hedge > 0)
		}
		if o.Fleet > 0 {
			runs = 2
		}
		var b strings.Builder
		wrap(&b, fmt.Sprintf("drill: failing over to real providers: about %.0f requests may reach them (-rps %g, -duration %s, %d failover runs)",
			0.6*o.RPS*o.Duration.Seconds()*float64(runs), o.RPS, o.Duration, runs), lineWidth)
		os.Stderr.WriteString(b.String())
	}
	o.Warn = os.Stderr
	if !quiet {
		o.Status = os.Stderr
		o.StatusTTY = isTerminal(os.Stderr) && os.Getenv("TERM") != "dumb"
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	var err error
	switch {
	case faults:
		err = faultDrill(ctx, o.Hogs, os.Stdout)
	case only == "affinity":
		err = affinityDrill(ctx, defaultAffinity(o), os.Stdout)
	case only == "continue":
		err = contDrill(ctx, defaultContinue(o), os.Stdout)
	default:
		err = drill(ctx, o, os.Stdout)
		if err == nil && only == "" && !o.JSON && len(ups) == 0 {
			fmt.Println()
			err = affinityDrill(ctx, defaultAffinity(o), os.Stdout)
			if err == nil {
				fmt.Println()
				err = contDrill(ctx, defaultContinue(o), os.Stdout)
			}
		}
	}
	stop()
	switch {
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "drill: interrupted")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "drill:", err)
		os.Exit(1)
	}
}

// defaultPlot is where the drill draws its picture unless -plot says
// otherwise: the temporary directory, which any checkout can write.
func defaultPlot() string { return filepath.Join(os.TempDir(), "failover-drill.png") }

// isTerminal reports whether f is a character device, as a terminal is.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
