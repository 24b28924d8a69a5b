package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// status draws the live status: on a terminal, a block of lines redrawn in
// place four times a second; otherwise one plain line a second.
type status struct {
	w      io.Writer
	tty    bool
	runs   []*run // plain, then the failover runs
	phases []phase
	start  time.Time
	total  time.Duration
	lag    *lagProbe // the drill's scheduling lag; nil: not shown
	drawn  int       // lines of the last frame, to move back over
}

func (s *status) loop(done <-chan struct{}) {
	every := time.Second
	if s.tty {
		every = 250 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-done:
			if s.tty {
				s.draw() // the final state; plain lines have it already
			}
			return
		case <-tick.C:
			s.draw()
		}
	}
}

func (s *status) draw() {
	el := min(time.Since(s.start), s.total)
	p := s.phases[phaseAt(s.phases, el)]
	plain := callerStats(s.runs[0], el)
	lag := ""
	if s.lag != nil {
		if p99, worst, n := s.lag.recent(el, time.Second); n > 0 {
			lag = fmt.Sprintf("lag p99 %s, worst %s", fmtDur(p99), fmtDur(worst))
		}
	}

	if !s.tty {
		// A line per failover run, the first one with the time, the
		// phase and the plain caller.
		for i, r := range s.runs[1:] {
			var ups []string
			for _, h := range health(r) {
				ups = append(ups, fmt.Sprintf("%s %s %.1f%% p99 %s", h.name, h.state, 100*h.success, p99(h.p99, h.window)))
			}
			head := fmt.Sprintf("%5.1fs %-12s | plain %s", el.Seconds(), p.name, plain.short())
			if lag != "" {
				head = fmt.Sprintf("%5.1fs %-12s | %s | plain %s", el.Seconds(), p.name, lag, plain.short())
			}
			if i > 0 {
				head = strings.Repeat(" ", len("  1.0s"))
			}
			var b strings.Builder
			wrap(&b, fmt.Sprintf("%s | %s %s | %s", head, r.name, callerStats(r, el).short(), strings.Join(ups, ", ")), lineWidth)
			io.WriteString(s.w, b.String())
		}
		return
	}
	width := len("plain")
	for _, r := range s.runs {
		width = max(width, len(r.name))
	}
	first := fmt.Sprintf("drill %4.1fs/%.0fs  phase: %s (%.1fs left)", el.Seconds(), s.total.Seconds(), p.name, (p.end - el).Seconds())
	if lag != "" {
		first += "  scheduling " + lag + " (last 1s)"
	}
	lines := []string{
		first,
		fmt.Sprintf("%-*s  caller %s", width, "plain", plain.long()),
	}
	for _, r := range s.runs[1:] {
		lines = append(lines, fmt.Sprintf("%-*s  caller %s", width, r.name, callerStats(r, el).long()))
		for _, h := range health(r) {
			lines = append(lines, fmt.Sprintf("  %-9s %-15s success %5.1f %%  p99 %7s  (last %d attempts)",
				h.name, h.long, 100*h.success, p99(h.p99, h.window), h.window))
		}
	}
	var b strings.Builder
	if s.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", s.drawn) // back to the first line
	}
	for _, l := range lines {
		b.WriteString("\x1b[2K" + clip(l, lineWidth) + "\n")
	}
	s.drawn = len(lines)
	io.WriteString(s.w, b.String())
}

// clip returns line cut to width columns: a line redrawn in place must
// not wrap, or the next frame starts on the wrong line.
func clip(line string, width int) string {
	if utf8.RuneCountInString(line) <= width {
		return line
	}
	return string([]rune(line)[:width])
}

// upstreamStatus is an upstream as the status shows it: one Transport's
// Health, or a fleet's summed up.
type upstreamStatus struct {
	name    string
	state   string // the circuit: "open"; in a fleet, "closed 3, open 7"
	long    string // state, cooldown and suspicion: "cooling 120 ms, suspect"
	success float64
	p99     time.Duration
	window  int
}

// health returns r's upstreams as the status shows them. In a fleet run,
// the states are counted over the members, the success rate is the
// members' over all their recent attempts, and the p99 the worst member's.
func health(r *run) []upstreamStatus {
	var out []upstreamStatus
	states := []map[string]int{}
	cooling, suspect := []int{}, []int{}
	var ok []float64
	for _, m := range r.members {
		for i, h := range m.ft.Health() {
			if i == len(out) {
				out = append(out, upstreamStatus{name: h.Name})
				states, cooling, suspect, ok = append(states, map[string]int{}), append(cooling, 0), append(suspect, 0), append(ok, 0)
			}
			u := &out[i]
			states[i][h.State]++
			cooling[i] += b2i(h.Cooldown > 0)
			suspect[i] += b2i(h.Suspect)
			ok[i] += h.SuccessRate * float64(h.Window)
			u.window += h.Window
			u.p99 = max(u.p99, h.P99)
			if len(r.members) == 1 {
				u.success = h.SuccessRate
				u.long = h.State
				if h.Cooldown > 0 {
					u.long = "cooling " + fmtDur(h.Cooldown)
				}
			}
		}
	}
	for i := range out {
		u := &out[i]
		u.state = countStates(states[i])
		if len(r.members) > 1 {
			u.success = 1 // as Health says of an upstream without attempts
			if u.window > 0 {
				u.success = ok[i] / float64(u.window)
			}
			u.long = u.state
			if cooling[i] > 0 {
				u.long += fmt.Sprintf(", %d cooling", cooling[i])
			}
		}
		switch {
		case suspect[i] > 0 && len(r.members) > 1:
			u.long += fmt.Sprintf(", %d suspect", suspect[i])
		case suspect[i] > 0:
			u.long += ", suspect"
		}
	}
	return out
}

// p99 formats an upstream's p99, "-" before its first attempt.
func p99(d time.Duration, window int) string {
	if window == 0 {
		return "-"
	}
	return fmtDur(d)
}

// caller is what a run's caller saw over the last second.
type caller struct {
	n, ok   int
	p99     time.Duration
	waiting int64
}

func (c caller) long() string {
	if c.n == 0 {
		return fmt.Sprintf("no answers in the last 1s, %d waiting", c.waiting)
	}
	return fmt.Sprintf("success %5.1f %%  p99 %7s  (last 1s), %d waiting", 100*ratio(c.ok, c.n), fmtDur(c.p99), c.waiting)
}

func (c caller) short() string {
	if c.n == 0 {
		return fmt.Sprintf("no answers, %d waiting", c.waiting)
	}
	return fmt.Sprintf("%.1f%% p99 %s, %d waiting", 100*ratio(c.ok, c.n), fmtDur(c.p99), c.waiting)
}

// callerStats returns what r's caller saw over the second before now: the
// requests that ended in it, and those still waiting.
func callerStats(r *run, now time.Duration) caller {
	c := caller{waiting: r.inflight.Load()}
	var lat []time.Duration
	r.mu.Lock()
	for i := len(r.records) - 1; i >= 0; i-- {
		rec := r.records[i]
		if rec.end < now-time.Second {
			break
		}
		c.n++
		if rec.ok {
			c.ok++
		}
		lat = append(lat, rec.latency)
	}
	r.mu.Unlock()
	slices.Sort(lat)
	c.p99 = percentile(lat, 0.99)
	return c
}
